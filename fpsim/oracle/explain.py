"""Explain one conversion (:func:`explain_value`) or one block (:func:`explain_block`) step by step."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .._arrays import as_float32
from ..codecs import Rounding, decode, encode
from ..dispatch import quantize
from ..formats import get_format
from ..packing import unpack_fp4
from ..schemes import BlockScheme, Kind, ScaleRule, get_scheme
from .common import F32, FLT_MAX, code_bits, code_info, f32_fields, fmin_nan, hex32, positive_codes

__all__ = ["explain_block", "explain_value"]


def _position(p: Fraction) -> dict:
    """Where a value lies in its step (``p``: the exact fraction of the step above the lower grid point)."""
    return {"fraction_of_step": float(p), "round_bit": int(p >= Fraction(1, 2)), "sticky": bool((2 * p) % 1 != 0)}


def _rounding_rule(spec, mode: Rounding, saturate: bool, code: int, a: float, lo: float, hi: float,
                   top: float) -> tuple[str, dict, list[str]]:
    """The rule that rounded |y| = ``a`` (strictly between grid points ``lo`` < a < ``hi``) to ``code``, where
    it lies in the step (exact fractions), and notes."""
    notes = []
    p = (Fraction(a) - Fraction(lo)) / (Fraction(hi) - Fraction(lo))
    if p > 1:  # beyond the virtual point: no rounding choice left
        p = Fraction(1)
    rb = p >= Fraction(1, 2)
    position = _position(p)
    mag = code & spec.magnitude_mask
    nearest = mode in (Rounding.RNE, Rounding.RNA)
    if (spec.has_inf and mag == spec.inf_code) or (spec.has_nan and mag == spec.nan_code):
        rule = "overflow to inf" if spec.has_inf else "overflow to NaN"
        notes.append("no saturation (__NV_NOSAT): past max + half a step the value overflows")
    elif a > top and mag == spec.max_code and (p > Fraction(1, 2) or mode in (Rounding.RUP, Rounding.RDOWN,
                                                                             Rounding.RNA)):
        rule = "saturation"
        notes.append("beyond max: .satfinite gives ±max" if saturate else "rounds back to max")
    elif p == Fraction(1, 2) and nearest:
        rule = "tie-to-even" if mode is Rounding.RNE else "tie away from zero"
        if mode is Rounding.RNE:
            notes.append(f"exactly halfway: the even code 0x{code:X} wins")
    elif nearest:
        rule = "sticky bits" if rb else "below midpoint"
        notes.append("round bit 1 and sticky bits ≠ 0: above the midpoint, rounds away from zero" if rb else
                     "round bit 0: below the midpoint, rounds toward zero")
    else:
        rule = f"directed rounding ({mode.value})"
    if spec.subnormals and 0 < a < spec.min_normal:
        notes.append(f"subnormal range of {spec.name} (spacing {spec.min_subnormal:g})")
    if mag == 0 and a != 0:
        notes.append("underflow to ±0")
    return rule, position, notes


def explain_value(x, fmt, rounding="rne", saturate: bool = True, scale=None, *, k: int | None = None,
                  r: int | None = None) -> dict:
    """Explain the conversion of one value to element format ``fmt`` (SPEC §2).

    Follows :func:`fpsim.encode` (NVIDIA's conventions): the code in the result
    *is* ``encode(fl(x·scale), fmt, rounding, saturate)``; the rest of the dict
    says why.

    Parameters
    ----------
    x
        The value; converted to float32 first (RNE).
    fmt
        Element format name or alias.
    rounding
        ``rne`` (default), ``rtz``, ``rup``, ``rdown``, ``rna`` or ``sr``
        (stochastic, SPEC §3: t = fl(|y| + r · ulp/2^k), then truncation; ``k``
        random bits, default the format's).  With ``r`` (0 ≤ r < 2^k) the code is
        that draw's; without, ``result`` is None and ``outcomes`` lists the two
        neighbours with their probabilities (``stochastic``: the threshold on r,
        p_k and the unbounded-bits p).
    saturate
        ``.satfinite`` (default) or ``__NV_NOSAT``.
    scale
        Optional multiplier applied before encoding, as a block-scaled encoder
        does (NVFP4's ``enc_b``, MX's ``2^-E``): the encoded value is ``fl(x · scale)``.

    Returns
    -------
    dict
        ``input`` (and ``scale``, ``scaled``): float32 fields; ``below`` /
        ``above``: the neighbouring grid points (value, code) of ``|fl(x·scale)|``
        with the input's sign (``above`` is the virtual point one step past max
        when the value lies beyond max); ``position``: where the value lies
        between them (``round_bit``, ``sticky``); ``rule``: the rule that decided;
        ``notes``; ``result``: code (int, hex, fields in binary) and decoded value.

    Examples
    --------
    >>> d = explain_value(0.75, "e2m1")
    >>> d["rule"], d["result"]["hex"], d["result"]["value"]
    ('tie-to-even', '0x2', 1.0)
    """
    spec = get_format(fmt)
    if spec.is_passthrough:
        raise ValueError("float32 is the input format itself: nothing is rounded")
    mode = Rounding.parse(rounding)
    K = _sr_bits(spec, mode, saturate, k, r)
    x32 = F32(as_float32(x).reshape(()))
    out: dict = {"format": spec.name, "rounding": mode.value, "saturate": bool(saturate), "input": f32_fields(x32)}
    y = x32
    if scale is not None:
        s32 = F32(as_float32(scale).reshape(()))
        with np.errstate(all="ignore"):
            y = F32(x32 * s32)
        out["scale"] = f32_fields(s32)
        out["scaled"] = {**f32_fields(y), "formula": "fl(x · scale)"}
    if K is None:
        code = int(encode(np.array([y], np.float32), spec, mode, bool(saturate))[0])
    else:
        rb = np.array([0 if r is None else int(r)], np.uint32)
        code = int(encode(np.array([y], np.float32), spec, mode, True, rbits=rb, k=K)[0])
        out["k"] = K
    out["result"] = code_info(code, spec)
    notes: list[str] = []
    vals, pcodes = positive_codes(spec)
    neg = bool(np.signbit(y)) and spec.signed
    sbit = spec.sign_mask if neg else 0
    sign = -1.0 if neg else 1.0
    out["below"] = out["above"] = out["position"] = None

    def point(i):
        if i < 0:
            return None
        if i >= len(vals):  # one quantum of the top binade past max: where overflow starts
            top = 2.0 ** (spec.emax - spec.mbits)
            return {"value": sign * (vals[-1] + top), "code": None, "hex": None, "note": "one step past max (virtual)"}
        c = int(pcodes[i]) | sbit
        return {"value": sign * float(vals[i]), "code": c, "hex": code_info(c, spec)["hex"]}

    if np.isnan(y):
        kind = "canonical NaN" if spec.has_nan else "the positive max: the format has no NaN"
        out["rule"] = "NaN policy"
        notes.append(f"NaN → 0x{spec.nan_code:X} ({kind}), whatever the sign and payload (NVIDIA)")
    elif np.isinf(y):
        if saturate or not (spec.has_inf or spec.has_nan):
            out["rule"] = "saturation"
            notes.append("±inf → ±max finite (.satfinite)" if saturate else
                         f"{spec.name} has no inf or NaN: it always saturates")
        else:
            out["rule"] = "overflow to inf" if spec.has_inf else "overflow to NaN"
    else:
        a = abs(float(y))
        i = int(np.searchsorted(vals, a, side="right")) - 1
        lo, hi = point(i), point(i + 1)
        out["below"], out["above"] = lo, hi
        if not spec.subnormals and i < 0:
            out["rule"] = "underflow (no zero)"
            notes.append(f"{spec.name} has no zero: values ≤ its smallest value {vals[0]:g} give code 0x00")
        elif a == vals[i]:
            out["rule"] = "exact"
            if a == 0:
                notes.append("zero keeps its sign" if spec.signed else "zero")
        elif K is not None and a <= float(vals[-1]):
            out["rule"], out["position"], out["stochastic"], more = _stochastic(a, float(vals[i]), abs(hi["value"]),
                                                                               K, r)
            notes += more
            if r is None:
                out["result"] = None
                pk = out["stochastic"]["p_away_k"]
                out["outcomes"] = [{**lo, "probability": 1.0 - pk}, {**hi, "probability": pk}]
        elif K is not None:
            out["rule"] = "saturation"
            notes.append("beyond max: stochastic rounding saturates (.satfinite) to ±max")
        else:
            out["rule"], out["position"], more = _rounding_rule(spec, mode, saturate, code, a, float(vals[i]),
                                                                abs(hi["value"]), float(vals[-1]))
            notes += more
    out["notes"] = notes
    return out


def _sr_bits(spec, mode: Rounding, saturate: bool, k: int | None, r: int | None) -> int | None:
    """The random bits K of a stochastic rounding (None for the other modes), its arguments checked."""
    if mode is not Rounding.SR:
        if k is not None or r is not None:
            raise ValueError("k and r are stochastic rounding's: give rounding='sr' (--rounding sr)")
        return None
    if not saturate:
        raise ValueError("stochastic rounding saturates (.satfinite): drop saturate=False")
    K = int(k) if k is not None else int(spec.sr_bits)
    if not 1 <= K <= 24:
        raise ValueError("k must be in 1..24")
    if r is not None and not 0 <= int(r) < (1 << K):
        raise ValueError(f"r must be in 0..{(1 << K) - 1} (k = {K} random bits)")
    return K


def _stochastic(a: float, lo: float, hi: float, k: int, r: int | None) -> tuple[str, dict, dict, list[str]]:
    """Stochastic rounding of |y| = ``a`` strictly between grid points ``lo`` < a < ``hi`` with ``k`` random bits:
    the smallest r that rounds away (fl(a + r · ulp/2^k) ≥ hi, found on float32 arithmetic as the kernels do it:
    the sum is monotone in r), the probabilities, and where the draw ``r`` goes."""
    step = F32((hi - lo) / (1 << k))  # ulp / 2^k: a power of two, so r · step is exact
    a32, hi32 = F32(a), F32(hi)
    lo_r, hi_r = 0, 1 << k  # invariant: r < lo_r stays, r ≥ hi_r goes away
    while lo_r < hi_r:
        mid = (lo_r + hi_r) // 2
        if F32(a32 + F32(mid) * step) >= hi32:
            hi_r = mid
        else:
            lo_r = mid + 1
    t = lo_r
    p = (Fraction(a) - Fraction(lo)) / (Fraction(hi) - Fraction(lo))
    pk = Fraction((1 << k) - t, 1 << k)
    position = _position(p)
    info = {"k": k, "threshold": t, "p_away_k": float(pk), "p_away": float(p), "r": r}
    notes = [f"rounds away from zero when r ≥ {t} of 0…{(1 << k) - 1} (fl(|y| + r·ulp/2^{k}) reaches the next code): "
             f"probability {(1 << k) - t}/{1 << k} = {float(pk):.6g}; with unbounded random bits {float(p):.6g}"]
    if r is not None:
        notes.append(f"r = {r}: " + ("away from zero" if r >= t else "toward zero"))
    return "stochastic rounding", position, info, notes


def _step(name, formula, v) -> dict:
    v = F32(v)
    return {"name": name, "formula": formula, "value": float(v), "hex": hex32(v)}


def _byte_step(name, formula, code, spec) -> dict:
    info = code_info(int(code), spec)
    return {"name": name, "formula": formula, "value": info["value"], "hex": info["hex"], "code": int(code)}


def _block_cross_check(xb: np.ndarray, sch: BlockScheme, amax) -> tuple[np.ndarray, int | float]:
    """Codes and scale of the block from :func:`fpsim.quantize` (the tensor amax forced by a second block)."""
    BR, BC = sch.block
    X = np.zeros((BR, 2 * BC), np.float32)
    X[: xb.shape[0], : xb.shape[1]] = xb
    if amax is not None:
        X[0, BC] = amax
    q = quantize(X, sch)
    codes = unpack_fp4(q.data) if sch.element.bits == 4 else q.data
    return codes[: xb.shape[0], : xb.shape[1]].reshape(-1), q.scales[0, 0]


def _two_level_steps(sch: BlockScheme, flat: np.ndarray, vmax, tensor_amax, steps: list) -> tuple:
    """SPEC §4 step by step: (amax, scaled, codes, decoded, scale byte, formulas)."""
    el = sch.element
    with np.errstate(all="ignore"):
        sc = sch.scale
        s_enc = s_dec = F32(1.0)
        amax = None
        if sch.tensor_scale:
            amax = vmax if tensor_amax is None else F32(tensor_amax)
            if not np.isnan(amax) and not np.isnan(vmax) and amax < vmax:
                raise ValueError(f"tensor amax {float(amax):g} is below the block amax {float(vmax):g}")
            num = F32(el.max) * F32(sc.max)
            steps.append(_step("amax", "tensor amax (max |x| over the tensor)", amax))
            s_raw = num / amax
            s_enc = fmin_nan(s_raw, FLT_MAX)
            rule = f"min(fl({num:g} / amax), FLT_MAX)"
            if amax == 0 or s_enc == 0:
                s_enc = F32(1.0)
                rule += "; 1 because amax == 0 or the quotient is 0"
            steps.append(_step("S_enc", rule, s_enc))
            s_dec = F32(1.0) / s_enc
            steps.append(_step("S_dec", "fl(1 / S_enc)", s_dec))
        inv = F32(1.0) / F32(el.max)
        steps.append(_step(f"fl(1/{el.max:g})", f"fl(1 / {el.max:g})", inv))
        k = s_enc * inv
        steps.append(_step(f"S_enc·fl(1/{el.max:g})", f"fl(S_enc · fl(1/{el.max:g}))  (TE order: this first)", k))
        prod = vmax * k
        steps.append(_step("vmax·(…)", f"fl(vmax · fl(S_enc · fl(1/{el.max:g})))", prod))
        sdb = fmin_nan(prod, F32(sc.max))
        steps.append(_step("sdb", f"min(…, {sc.max:g})", sdb))
        sb = int(encode(np.array([sdb], np.float32), sc)[0])
        steps.append(_byte_step("s_b", f"{sc.name} RNE satfinite of sdb (stored byte; no lower clamp)", sb, sc))
        sbv = F32(decode(np.array([sb]), sc)[0])
        p = sbv * s_dec
        steps.append(_step("f32(s_b)·S_dec", "fl(f32(s_b) · S_dec)", p))
        enc = fmin_nan(F32(1.0) / p, FLT_MAX)
        steps.append(_step("enc_b", "min(fl(1 / fl(f32(s_b) · S_dec)), FLT_MAX)", enc))
        ys = (flat * enc).astype(np.float32)
        codes = encode(ys, el)
        dec = ((decode(codes, el) * sbv).astype(np.float32) * s_dec).astype(np.float32)
        scale_code: int | float = sb
        formula = "fl(x · enc_b)"
        dec_formula = "fl((e(code) · f32(s_b)) · S_dec)"
    return amax, ys, codes, dec, scale_code, formula, dec_formula


def _pow2_steps(sch: BlockScheme, flat: np.ndarray, vmax, tensor_amax, steps: list) -> tuple:
    """SPEC §5 step by step (E8M0 scale rules on the amax's fields)."""
    el = sch.element
    with np.errstate(all="ignore"):
        rule = sch.scale_rule
        e8 = sch.scale
        amax = None
        if np.isnan(vmax):
            sb = 0xFF
            steps.append(_byte_step("scale byte", "NaN amax → 0xFF", sb, e8))
        elif np.isinf(vmax):
            sb = 0xFE
            steps.append(_byte_step("scale byte", "inf amax → 0xFE (satfinite)", sb, e8))
        else:
            if rule is ScaleRule.RCEIL:
                inv = F32(1.0) / F32(el.max)
                steps.append(_step(f"fl(1/{el.max:g})", f"fl(1 / {el.max:g})", inv))
                t = vmax * inv
                steps.append(_step("t", f"fl(vmax · fl(1/{el.max:g}))", t))
                sb = int(encode(np.array([t], np.float32), e8, "rup")[0])
                steps.append(_byte_step("scale byte", "cvt.rp.satfinite.ue8m0(t) = 127 + ceil(log2 t), "
                                        "clamped to [0, 254]", sb, e8))
            else:
                if vmax == 0:
                    ex = -127
                    why = "amax 0: log2 = -inf → clamped"
                else:
                    m, e = math.frexp(float(vmax))  # exact: vmax = m·2^e, m in [0.5, 1)
                    fl2 = e - 1
                    why = f"floor(log2 amax) = {fl2} (exponent field)"
                    if rule is ScaleRule.CEIL and m != 0.5:
                        fl2 += 1
                        why += "; +1: amax is not a power of two"
                    elif rule is ScaleRule.EVEN:
                        q = Fraction(1, 2 ** (el.mbits + 1))
                        if (Fraction(m) / q + Fraction(1, 2)) // 1 * q >= 1:
                            fl2 += 1
                            why += f"; +1: amax rounded to {el.mbits} mantissa bits carries"
                    ex = fl2 - el.emax
                    why += f"; − emax_elem {el.emax}"
                sb = min(max(ex, -127), 127) + 127
                steps.append(_byte_step("scale byte", f"{rule.value}: {why}; clamp to [−127, 127]; +127", sb, e8))
        scale_code = sb
        if sb == 0xFF:
            codes = np.full(flat.shape, el.nan_code, el.code_dtype)
            ys = np.full(flat.shape, np.nan, np.float32)
            dec = np.full(flat.shape, np.nan, np.float32)
        else:
            mul = F32(np.ldexp(np.float64(1.0), 127 - sb))
            steps.append(_step("2^-E", "element multiplier, an exact power of two", mul))
            ys = (flat * mul).astype(np.float32)
            codes = encode(ys, el)
            dec = (decode(codes, el) * F32(np.ldexp(np.float64(1.0), sb - 127))).astype(np.float32)
        formula = "fl(x · 2^-E)"
        dec_formula = "fl(e(code) · 2^E)"
    return amax, ys, codes, dec, scale_code, formula, dec_formula


def _fp32_steps(sch: BlockScheme, flat: np.ndarray, vmax, tensor_amax, steps: list) -> tuple:
    """SPEC §6 step by step (FP32 scale d = fl(amax / max))."""
    el = sch.element
    with np.errstate(all="ignore"):
        amax = None
        d = vmax / F32(el.max)
        why = f"fl(amax / {el.max:g})"
        if not np.isnan(d) and (d == 0 or np.isinf(d)):
            d = F32(1.0)
            why += "; 1 because it is 0 or inf"
        steps.append(_step("d", why, d))
        ys = (flat / d).astype(np.float32)
        codes = encode(ys, el)
        dec = (decode(codes, el) * d).astype(np.float32)
        scale_code = float(d)
        formula = "fl(x / d)"
        dec_formula = "fl(e(code) · d)"
    return amax, ys, codes, dec, scale_code, formula, dec_formula


def explain_block(x_block, scheme="nvfp4", tensor_amax=None) -> dict:
    """Every step of quantizing one block (SPEC §4 for NVFP4, §5 for MX, §6 for FP32 scales).

    Parameters
    ----------
    x_block
        The block's values (1-D, at most the block width; for 2-D tiles a 2-D
        array of at most the tile shape); missing values are the zero padding.
    scheme
        Preset name or :class:`~fpsim.scaling.BlockScheme` (RNE element rounding).
    tensor_amax
        Two-level schemes: the tensor amax that sets S_enc (default: the
        block's own amax, i.e. the block is the whole tensor).  Must not be
        below the block amax (NaN allowed: it propagates, SPEC §9).

    Returns
    -------
    dict
        ``steps``: a list of ``{name, formula, value, hex}`` (every FP32
        intermediate, the scale byte with its ``code``); ``elements``: per
        element the input, the scaled value, the code and the decoded value;
        ``scale_code``; ``agrees_with_quantize``: the same codes and scale come
        out of :func:`fpsim.quantize` (a self-check; always True unless fpsim has a bug).

    Examples
    --------
    >>> d = explain_block([6.0, 0.75], "nvfp4", tensor_amax=2688.0)
    >>> [s["hex"] for s in d["steps"] if s["name"] == "s_b"], [e["code_hex"] for e in d["elements"]]
    (['0x38'], ['0x7', '0x2'])
    """
    sch = get_scheme(scheme)
    kind = sch.kind
    if kind is Kind.CAST:
        raise ValueError(f"{sch.name} is a plain cast without scales: use explain_value")
    if sch.rounding is not Rounding.RNE:
        raise ValueError("explain_block covers RNE element rounding (stochastic rounding needs the random bits)")
    if sch.four_over_six or sch.per_row_scale:
        raise ValueError("explain_block does not cover the four-over-six and per-row variants")
    el = sch.element
    xb = as_float32(x_block)
    BR, BC = sch.block if sch.block is not None else (1, max(xb.size, 1))
    if xb.ndim == 1 or xb.ndim == 0:
        xb = xb.reshape(1, -1)
    if xb.ndim != 2 or xb.shape[0] > BR or xb.shape[1] > BC or xb.size == 0:
        raise ValueError(f"a block of {sch.name} holds at most {BR}×{BC} values, got shape {tuple(np.shape(x_block))}")
    flat = xb.reshape(-1)
    with np.errstate(all="ignore"):
        vmax = F32(np.max(np.abs(flat)))  # NaN propagates (SPEC §9)
    steps = [_step("vmax", "max |x| over the block", vmax)]
    out: dict = {"scheme": sch.name, "block": list(sch.block) if sch.block else None}
    with np.errstate(all="ignore"):
        run = {Kind.TWO_LEVEL: _two_level_steps, Kind.POW2: _pow2_steps}.get(kind, _fp32_steps)
        amax, ys, codes, dec, scale_code, formula, dec_formula = run(sch, flat, vmax, tensor_amax, steps)
    out["steps"] = steps
    out["scale_code"] = scale_code
    out["element_formula"] = formula
    out["decode_formula"] = dec_formula
    out["elements"] = [
        {
            "index": i,
            "x": float(flat[i]),
            "x_hex": hex32(flat[i]),
            "scaled": float(ys[i]),
            "scaled_hex": hex32(ys[i]),
            "code": int(codes[i]),
            "code_hex": code_info(int(codes[i]), el)["hex"],
            "code_binary": code_bits(int(codes[i]), el),
            "decoded": float(dec[i]),
            "decoded_hex": hex32(dec[i]),
        }
        for i in range(flat.size)
    ]
    if sch.block is not None:
        qc, qs = _block_cross_check(xb, sch, amax if (tensor_amax is not None and sch.tensor_scale) else None)
        same_scale = (np.asarray(qs).tobytes() == np.asarray(scale_code, qs.dtype).tobytes())
        out["agrees_with_quantize"] = bool(np.array_equal(qc.astype(np.int64), codes.astype(np.int64)) and same_scale)
    else:
        q = quantize(flat, sch)
        out["agrees_with_quantize"] = bool(np.array_equal(q.data, codes) and float(q.scales) == scale_code)
    return out
