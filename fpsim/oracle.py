"""fpsim as a reference oracle: explain one conversion, diff another kernel's output, export golden vectors.

The commonest bug report in this field is "implementations X and Y give different
bytes for the same input".  This module answers it with fpsim's conventions
(SPEC.md: NVIDIA's rules, Transformer Engine's NVFP4 operation order, MX ``rceil``):

* :func:`explain_value` — one float32 → element code, step by step: the input
  bits, the two neighbouring grid points and their codes, the rule that decided
  (exact, tie to even, sticky bits, subnormal range, saturation, overflow, NaN policy);
* :func:`explain_block` — one block of a block-scaled scheme: the block amax and
  every FP32 intermediate of SPEC §4 (NVFP4) or §5 (MX) in hex and decimal, and
  each element's code;
* :func:`diff` — someone else's codes and scales against fpsim's, with a likely
  cause per mismatch (:data:`CAUSES`);
* :func:`write_vectors` / :func:`read_vectors` — golden test vectors of named
  edge cases in ``.npz`` and as raw little-endian ``.bin`` files + a JSON manifest.

Values are float32 throughout (inputs are converted by RNE first, SPEC §9).
Results are plain dicts / dataclasses; :func:`jsonable` turns them into JSON-safe
data (non-finite floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from ._arrays import as_float32
from .codecs import Rounding, decode, encode
from .dispatch import quantize
from .formats import FormatSpec, get_format
from .packing import unpack_fp4
from .scaling import swizzle_scales, unswizzle_scales
from .schemes import BlockScheme, Kind, ScaleRule, get_scheme

__all__ = [
    "CAUSES",
    "DiffReport",
    "diff",
    "explain_block",
    "explain_value",
    "jsonable",
    "load_arrays",
    "read_vectors",
    "vector_cases",
    "write_vectors",
]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)

# ---------------------------------------------------------------------------
# small helpers


def jsonable(obj):
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts.

    Non-finite floats become the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"`` (plain ``json.dumps`` would write invalid bare ``NaN``);
    numpy scalars and arrays become Python numbers and lists; tuples become lists.
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    return obj


def _hex32(v) -> str:
    return f"0x{int(np.asarray(v, np.float32).view(np.uint32)):08X}"


def _f32_fields(v) -> dict:
    """The float32 ``v``: value, bits in hex, sign / exponent / mantissa fields and class."""
    v = F32(v)
    b = int(np.asarray(v).view(np.uint32))
    s, e, m = b >> 31, (b >> 23) & 0xFF, b & 0x7FFFFF
    if e == 0xFF:
        cls = "nan" if m else "inf"
    elif e == 0:
        cls = "subnormal" if m else "zero"
    else:
        cls = "normal"
    return {
        "value": float(v),
        "hex": f"0x{b:08X}",
        "sign": s,
        "exponent_field": e,
        "mantissa_field": f"0x{m:06X}",
        "unbiased_exponent": (e - 127) if cls == "normal" else (-126 if cls == "subnormal" else None),
        "class": cls,
    }


def _code_bits(code: int, spec: FormatSpec) -> str:
    """Code as its fields separated by dots: s.ee.m for E2M1, eeeeeeee for E8M0."""
    b = format(code, f"0{spec.bits}b")
    parts = []
    i = 0
    if spec.signed:
        parts.append(b[0])
        i = 1
    parts.append(b[i : i + spec.ebits])
    if spec.mbits:
        parts.append(b[i + spec.ebits :])
    return ".".join(parts)


def _code_info(code: int, spec: FormatSpec) -> dict:
    return {
        "code": int(code),
        "hex": f"0x{code:0{(spec.bits + 3) // 4}X}",
        "binary": _code_bits(int(code), spec),
        "value": float(decode(np.array([code]), spec)[0]),
    }


def _positive_codes(spec: FormatSpec) -> tuple[np.ndarray, np.ndarray]:
    """Finite non-negative grid values (ascending, float64) and the positive code of each."""
    table = spec.decode_table()
    n = 1 << (spec.bits - 1 if spec.signed else spec.bits)
    vals, codes = [], []
    for c in range(n):
        v = float(table[c])
        if math.isfinite(v) and (not vals or v > vals[-1]):
            vals.append(v)
            codes.append(c)
    return np.array(vals), np.array(codes)


def _fmin(a, b):
    """min with a NaN first argument propagating (CUDA ``fminf`` would drop it)."""
    return a if (a != a or a <= b) else b


# ---------------------------------------------------------------------------
# explain_value


def explain_value(x, fmt, rounding="rne", saturate: bool = True, scale=None) -> dict:
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
        ``rne`` (default), ``rtz``, ``rup``, ``rdown`` or ``rna`` (stochastic
        rounding needs random bits and is not explained here).
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
    if mode is Rounding.SR:
        raise ValueError("explain does not cover stochastic rounding (it needs the random bits); "
                         "use rne, rtz, rup, rdown or rna")
    x32 = F32(as_float32(x).reshape(()))
    out: dict = {"format": spec.name, "rounding": mode.value, "saturate": bool(saturate), "input": _f32_fields(x32)}
    y = x32
    if scale is not None:
        s32 = F32(as_float32(scale).reshape(()))
        with np.errstate(all="ignore"):
            y = F32(x32 * s32)
        out["scale"] = _f32_fields(s32)
        out["scaled"] = {**_f32_fields(y), "formula": "fl(x · scale)"}
    code = int(encode(np.array([y], np.float32), spec, mode, bool(saturate))[0])
    out["result"] = _code_info(code, spec)
    notes: list[str] = []
    vals, pcodes = _positive_codes(spec)
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
        return {"value": sign * float(vals[i]), "code": c, "hex": _code_info(c, spec)["hex"]}

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
        else:
            lo_v = Fraction(float(vals[i]))
            hi_v = Fraction(abs(hi["value"]))
            p = (Fraction(a) - lo_v) / (hi_v - lo_v)
            if p > 1:  # beyond the virtual point: no rounding choice left
                p = Fraction(1)
            rb = p >= Fraction(1, 2)
            sticky = (2 * p) % 1 != 0
            out["position"] = {"fraction_of_step": float(p), "round_bit": int(rb), "sticky": bool(sticky)}
            res_mag = code & spec.magnitude_mask
            overflowed = (spec.has_inf and res_mag == spec.inf_code) or (spec.has_nan and res_mag == spec.nan_code)
            beyond = a > vals[-1]
            if overflowed:
                out["rule"] = "overflow to inf" if spec.has_inf else "overflow to NaN"
                notes.append("no saturation (__NV_NOSAT): past max + half a step the value overflows")
            elif beyond and res_mag == spec.max_code and (p > Fraction(1, 2) or mode in (Rounding.RUP, Rounding.RDOWN,
                                                                                       Rounding.RNA)):
                out["rule"] = "saturation"
                notes.append("beyond max: .satfinite gives ±max" if saturate else "rounds back to max")
            elif p == Fraction(1, 2) and mode in (Rounding.RNE, Rounding.RNA):
                if mode is Rounding.RNE:
                    out["rule"] = "tie-to-even"
                    notes.append(f"exactly halfway: the even code 0x{code:X} wins")
                else:
                    out["rule"] = "tie away from zero"
            elif mode in (Rounding.RNE, Rounding.RNA):
                if rb:
                    out["rule"] = "sticky bits"
                    notes.append("round bit 1 and sticky bits ≠ 0: above the midpoint, rounds away from zero")
                else:
                    out["rule"] = "below midpoint"
                    notes.append("round bit 0: below the midpoint, rounds toward zero")
            else:
                out["rule"] = f"directed rounding ({mode.value})"
            if spec.subnormals and 0 < a < spec.min_normal:
                notes.append(f"subnormal range of {spec.name} (spacing {spec.min_subnormal:g})")
            if code & spec.magnitude_mask == 0 and a != 0:
                notes.append("underflow to ±0")
    out["notes"] = notes
    return out


# ---------------------------------------------------------------------------
# explain_block


def _step(name, formula, v) -> dict:
    v = F32(v)
    return {"name": name, "formula": formula, "value": float(v), "hex": _hex32(v)}


def _byte_step(name, formula, code, spec) -> dict:
    info = _code_info(int(code), spec)
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
        if kind is Kind.TWO_LEVEL:
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
                s_enc = _fmin(s_raw, FLT_MAX)
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
            sdb = _fmin(prod, F32(sc.max))
            steps.append(_step("sdb", f"min(…, {sc.max:g})", sdb))
            sb = int(encode(np.array([sdb], np.float32), sc)[0])
            steps.append(_byte_step("s_b", f"{sc.name} RNE satfinite of sdb (stored byte; no lower clamp)", sb, sc))
            sbv = F32(decode(np.array([sb]), sc)[0])
            p = sbv * s_dec
            steps.append(_step("f32(s_b)·S_dec", "fl(f32(s_b) · S_dec)", p))
            enc = _fmin(F32(1.0) / p, FLT_MAX)
            steps.append(_step("enc_b", "min(fl(1 / fl(f32(s_b) · S_dec)), FLT_MAX)", enc))
            ys = (flat * enc).astype(np.float32)
            codes = encode(ys, el)
            dec = ((decode(codes, el) * sbv).astype(np.float32) * s_dec).astype(np.float32)
            scale_code: int | float = sb
            formula = "fl(x · enc_b)"
            dec_formula = "fl((e(code) · f32(s_b)) · S_dec)"
        elif kind is Kind.POW2:
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
        else:  # FP32 scales
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
    out["steps"] = steps
    out["scale_code"] = scale_code
    out["element_formula"] = formula
    out["decode_formula"] = dec_formula
    out["elements"] = [
        {
            "index": i,
            "x": float(flat[i]),
            "x_hex": _hex32(flat[i]),
            "scaled": float(ys[i]),
            "scaled_hex": _hex32(ys[i]),
            "code": int(codes[i]),
            "code_hex": _code_info(int(codes[i]), el)["hex"],
            "code_binary": _code_bits(int(codes[i]), el),
            "decoded": float(dec[i]),
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


# ---------------------------------------------------------------------------
# diff

#: Likely causes :func:`diff` assigns to a mismatch (the ``cause`` field), with what each means.
CAUSES: dict[str, str] = {
    "tie rounding": "the scaled value lies exactly halfway between two grid points and the candidate did not "
    "round to the even code (e.g. ties away from zero)",
    "scale operation order": "the candidate's block scale equals the one computed with another FP32 operation "
    "order (SPEC §4 normative: fl(vmax · fl(S_enc · fl(1/6))))",
    "scale clamp": "the candidate clamps small (subnormal or zero) block scales to a minimum; fpsim does not",
    "MX scale rule": "the candidate's E8M0 byte is the one of another scale rule (floor / ceil / even vs rceil)",
    "tensor amax": "the candidate's tensor amax differs, and its scale follows from that amax",
    "±0 sign": "both codes are zero and differ in the sign bit only",
    "NaN handling": "the block or the tensor amax holds a NaN and the candidate treats it differently (SPEC §9)",
    "nibble packing order": "swapping the two nibbles of each candidate byte fixes the code (fpsim: element 2j "
    "in the low nibble)",
    "swizzled scale layout": "the candidate's scales are ours in the Blackwell swizzled layout (or the plain "
    "layout where swizzled was declared)",
    "zero-scale block": "the block scale is 0 and the candidate did not cap enc_b = 1/0 at FLT_MAX: "
    "0·inf = NaN gives the NaN code (SPEC §4: enc_b = min(fl(1/…), FLT_MAX))",
    "rounding mode": "the candidate's code is the one of another rounding mode (truncation, directed rounding)",
    "saturation": "the candidate does not saturate (gives inf/NaN where fpsim gives ±max)",
    "other": "no known pattern; look at the input bits and both codes",
}


@dataclass
class DiffReport:
    """Result of :func:`diff`: mismatch counts and rates, first mismatches, a cause per mismatch.

    ``code_mismatches`` / ``scale_mismatches`` hold the first ``show`` entries
    (dicts); ``causes`` counts the cause of *every* mismatch (codes and scales);
    ``findings`` are whole-tensor diagnoses (packing order, swizzled layout, amax).
    """

    scheme: str
    n_elements: int
    n_code_mismatches: int
    n_blocks: int
    n_scale_mismatches: int
    amax_ours: float | list | None
    amax_candidate: float | list | None
    amax_match: bool | None
    code_mismatches: list = field(default_factory=list)
    scale_mismatches: list = field(default_factory=list)
    causes: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @property
    def code_mismatch_rate(self) -> float:
        return self.n_code_mismatches / self.n_elements if self.n_elements else 0.0

    @property
    def scale_mismatch_rate(self) -> float:
        return self.n_scale_mismatches / self.n_blocks if self.n_blocks else 0.0

    @property
    def identical(self) -> bool:
        return self.n_code_mismatches == 0 and self.n_scale_mismatches == 0 and self.amax_match is not False

    def to_dict(self) -> dict:
        """JSON-safe dict (non-finite floats as the strings "NaN", "Infinity", "-Infinity")."""
        return jsonable(
            {
                "scheme": self.scheme,
                "identical": self.identical,
                "elements": self.n_elements,
                "code_mismatches": self.n_code_mismatches,
                "code_mismatch_rate": self.code_mismatch_rate,
                "blocks": self.n_blocks,
                "scale_mismatches": self.n_scale_mismatches,
                "scale_mismatch_rate": self.scale_mismatch_rate,
                "amax": {"ours": self.amax_ours, "candidate": self.amax_candidate, "match": self.amax_match},
                "causes": self.causes,
                "findings": self.findings,
                "first_code_mismatches": self.code_mismatches,
                "first_scale_mismatches": self.scale_mismatches,
            }
        )

    def format_table(self) -> str:
        """A human-readable report."""
        lines = [
            f"scheme {self.scheme}: "
            + ("IDENTICAL" if self.identical else "DIFFERENT"),
            f"codes:  {self.n_code_mismatches} / {self.n_elements} differ ({100 * self.code_mismatch_rate:.4g} %)",
            f"scales: {self.n_scale_mismatches} / {self.n_blocks} differ ({100 * self.scale_mismatch_rate:.4g} %)",
        ]
        if self.amax_match is not None:
            lines.append(f"amax:   ours {self.amax_ours}  candidate {self.amax_candidate}  "
                         + ("match" if self.amax_match else "DIFFER"))
        for f in self.findings:
            lines.append(f"finding: {f}")
        if self.causes:
            lines.append("likely causes (all mismatches): "
                         + ", ".join(f"{k} ×{v}" for k, v in sorted(self.causes.items(), key=lambda kv: -kv[1])))
        if self.scale_mismatches:
            lines.append("")
            lines.append(f"{'block':<14} {'vmax (hex)':<12} {'ours':>6} {'cand':>6}  cause")
            for m in self.scale_mismatches:
                lines.append(f"{str(tuple(m['block'])):<14} {m['vmax_hex']:<12} {m['ours_hex']:>6} "
                             f"{m['candidate_hex']:>6}  {m['cause']}"
                             + (f" ({m['detail']})" if m.get("detail") else ""))
        if self.code_mismatches:
            lines.append("")
            lines.append(f"{'index':<14} {'x':>14} {'x (hex)':<11} {'scaled (hex)':<12} {'ours':>5} {'cand':>5}  cause")
            for m in self.code_mismatches:
                lines.append(f"{str(tuple(m['index'])):<14} {m['x']:>14.7g} {m['x_hex']:<11} {m['scaled_hex']:<12} "
                             f"{m['ours_hex']:>5} {m['candidate_hex']:>5}  {m['cause']}"
                             + (f" ({m['detail']})" if m.get("detail") else ""))
        return "\n".join(lines)


def _block_vmax(X: np.ndarray, BR: int, BC: int, nb: int) -> np.ndarray:
    """NaN-propagating block (tile) amax of the [R, C] view, shape [R, nb] (tiles repeated on their rows)."""
    R, C = X.shape
    Rp = BR * -(-R // BR)
    P = np.zeros((Rp, nb * BC), np.float32)
    P[:R, :C] = np.abs(X)
    t = P.reshape(Rp // BR, BR, nb, BC).max(axis=(1, 3))
    return np.repeat(t, BR, axis=0)[:R]


def _scale_orders(sch: BlockScheme, vmax, amax, s_enc, s_dec) -> dict[str, np.ndarray]:
    """sdb under other FP32 operation orders found in the wild (before the min with the scale max)."""
    f = F32
    M = f(sch.element.max)
    inv = f(1.0) / M
    num = M * f(sch.scale.max)
    with np.errstate(all="ignore"):
        alts = {
            "fl(fl(vmax·S_enc)·fl(1/6))": (vmax * s_enc) * inv,
            "fl(fl(vmax·S_enc)/6)": (vmax * s_enc) / M,
            "fl(fl(vmax/6)·S_enc)": (vmax / M) * s_enc,
            "fl(fl(vmax·fl(1/6))·S_enc)": (vmax * inv) * s_enc,
            "fl(fl(vmax/6)/S_dec)": (vmax / M) / s_dec,
            "fl(fl(vmax/6)/fl(amax/2688))": (vmax / M) / (amax / num),
        }
    return {k.replace("6", f"{sch.element.max:g}").replace("2688", f"{num:g}"): v for k, v in alts.items()}


def _orig_index(r: int, c: int, moved: tuple[int, ...], axis: int) -> list[int]:
    lead = list(np.unravel_index(r, moved[:-1])) if len(moved) > 1 else []
    lead = [int(i) for i in lead]
    return lead[:axis] + [int(c)] + lead[axis:]


def diff(
    candidate_codes,
    candidate_scales,
    x,
    scheme="nvfp4",
    axis: int = -1,
    candidate_amax=None,
    packed: bool = True,
    swizzled: bool = False,
    show: int = 10,
) -> DiffReport:
    """Compare another implementation's codes and scales with fpsim's, and guess why they differ.

    fpsim quantizes ``x`` with ``scheme`` (SPEC §4–§6) and compares element by
    element and block by block.  Each mismatch gets one likely cause from
    :data:`CAUSES`, found by recomputing it under the alternative convention
    (another FP32 operation order of the NVFP4 scale, a clamped scale, another
    MX scale rule, ties away from zero, swapped nibbles, a swizzled scale
    layout, …).  Elements whose block scale differs inherit the block's cause
    when their code follows from the candidate's scale.

    Parameters
    ----------
    candidate_codes
        Element codes in fpsim's layout: the quantized axis last
        (``np.moveaxis(x, axis, -1)``), one row per row of that view, each row
        either exactly ``C`` codes long or padded to whole blocks; for 4-bit
        elements two codes per byte (element 2j in the low nibble) unless
        ``packed=False`` (one code per byte).
    candidate_scales
        Raw scale bytes, one per block, ``[rows, blocks]`` (float32 for FP32
        scales); with ``swizzled=True`` the 1-D Blackwell layout (SPEC §4).
    x
        The input both sides quantized (converted to float32 first).
    scheme, axis
        As for :func:`fpsim.quantize` (block-scaled schemes only).
    candidate_amax
        Optional candidate tensor amax (float32) of two-level schemes.
    show
        How many mismatches of each kind to keep in the report.

    Returns
    -------
    DiffReport
    """
    sch = get_scheme(scheme)
    kind = sch.kind
    if kind is Kind.CAST or sch.block is None:
        raise ValueError(f"diff compares block-scaled schemes (nvfp4, mx*, fp8_block128), not {sch.name}")
    if sch.rounding is Rounding.SR:
        raise ValueError("diff compares deterministic (RNE) quantization; stochastic rounding needs the same bits")
    el = sch.element
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("x needs at least one axis")
    q = quantize(x32, sch, axis=axis)
    ax = q.axis
    moved = tuple(x32.shape[:ax] + x32.shape[ax + 1 :] + (x32.shape[ax],))
    R, C = math.prod(moved[:-1]), moved[-1]
    BR, BC = sch.block
    nb = -(-C // BC)
    four = el.bits == 4
    ours = (unpack_fp4(q.data) if four else q.data).reshape(R, nb * BC)[:, :C].astype(np.int64)
    ours_s = np.ascontiguousarray(q.scales).reshape(R, nb)
    findings: list[str] = []

    # -- candidate codes: shape checks, unpacking, packing-order hypothesis
    cc = np.asarray(candidate_codes)
    if cc.dtype.kind not in "iu":
        raise ValueError(f"candidate codes must be integers (raw code bytes), got dtype {cc.dtype}")
    is_packed = four and packed
    lengths = ({-(-C // 2), nb * BC // 2} if is_packed else {C, nb * BC})
    if R == 0 or cc.size % max(R, 1) or cc.size // max(R, 1) not in lengths:
        want = " or ".join(f"{R}×{n}" for n in sorted(lengths))
        what = "packed bytes" if is_packed else "codes"
        raise ValueError(f"candidate codes have {cc.size} values (shape {cc.shape}); expected {want} {what} "
                         f"for x of shape {x32.shape} along axis {ax}")
    cc = cc.reshape(R, -1).astype(np.int64)
    if cc.size and (cc.min() < 0 or cc.max() > (0xFF if is_packed else (1 << el.bits) - 1)):
        hint = " (packed 4-bit codes? then do not pass packed=False)" if four and not packed else ""
        raise ValueError(f"candidate codes out of range for {el.name}{hint}")
    swapped = None
    if is_packed:
        b = cc.astype(np.uint8)
        cand = unpack_fp4(b)[:, :C].astype(np.int64)
        swapped = unpack_fp4(((b << 4) | (b >> 4)).astype(np.uint8))[:, :C].astype(np.int64)
    else:
        cand = cc[:, :C]
    n_plain = int(np.count_nonzero(cand != ours))
    packing_swapped = swapped is not None and n_plain > 0 and int(np.count_nonzero(swapped != ours)) < n_plain / 2
    if packing_swapped:
        findings.append("nibble packing order: the candidate puts element 2j in the HIGH nibble "
                        "(fpsim, cvt.*.e2m1x2 and cuBLAS: low nibble)")

    # -- candidate scales: layout (swizzle) hypothesis
    cs = np.asarray(candidate_scales)
    s_dtype = ours_s.dtype
    if kind is Kind.FP32:
        if cs.dtype != np.float32:
            raise ValueError(f"candidate scales of {sch.name} must be float32, got {cs.dtype}")
    elif cs.dtype.kind not in "iu" or (cs.size and (cs.min() < 0 or cs.max() > 0xFF)):
        raise ValueError(f"candidate scales must be raw scale bytes (uint8), got dtype {cs.dtype}")
    cs = cs.reshape(-1).astype(s_dtype)
    n_sw = (128 * -(-R // 128)) * (4 * -(-nb // 4))
    layout_cause = np.zeros((R, nb), bool)
    if swizzled:
        if kind is Kind.FP32:
            raise ValueError("FP32 scales have no swizzled layout")
        if cs.size != n_sw:
            extra = " (that is the plain [rows, blocks] size: drop swizzled)" if cs.size == R * nb else ""
            raise ValueError(f"expected {n_sw} swizzled scale bytes for [{R}, {nb}] scales, got {cs.size}{extra}")
        cand_s = unswizzle_scales(cs, R, nb)
        if n_sw == R * nb:
            plain = cs.reshape(R, nb)
            if np.count_nonzero(plain != ours_s) * 2 < np.count_nonzero(cand_s != ours_s):
                findings.append("swizzled scale layout: the scales are in the plain [rows, blocks] layout, "
                                "not swizzled as declared")
                layout_cause = cand_s != ours_s
    else:
        if cs.size == R * nb:
            cand_s = cs.reshape(R, nb)
            if kind is not Kind.FP32 and n_sw == R * nb:
                un = unswizzle_scales(cs, R, nb)
                if np.count_nonzero(un != ours_s) * 2 < np.count_nonzero(cand_s != ours_s):
                    findings.append("swizzled scale layout: the candidate's scales are fpsim's in the Blackwell "
                                    "swizzled layout (pass swizzled=True / --swizzled)")
                    layout_cause = cand_s != ours_s
        elif kind is not Kind.FP32 and cs.size == n_sw:
            un = unswizzle_scales(cs, R, nb)
            cand_s = np.zeros((R, nb), s_dtype)
            cand_s.reshape(-1)[:] = cs[: R * nb]
            findings.append(f"swizzled scale layout: {cs.size} scale bytes is the swizzled size of [{R}, {nb}] "
                            "(pass swizzled=True / --swizzled)"
                            + ("; unswizzled they equal fpsim's" if np.array_equal(un, ours_s) else ""))
            layout_cause = cand_s != ours_s
        else:
            raise ValueError(f"candidate scales have {cs.size} values; expected {R}×{nb} = {R * nb} "
                             f"(one per block) for x of shape {x32.shape} along axis {ax}")

    # -- amax
    amax_ours = np.asarray(q.amax, np.float32)
    amax_match = None
    amax_cand = None
    if candidate_amax is not None and sch.tensor_scale:
        ca = np.asarray(candidate_amax, np.float32).reshape(amax_ours.shape) if np.size(candidate_amax) == \
            amax_ours.size else None
        if ca is None:
            raise ValueError(f"candidate amax has {np.size(candidate_amax)} values, expected {amax_ours.size}")
        amax_cand = ca
        amax_match = bool(np.all((ca == amax_ours) | (np.isnan(ca) & np.isnan(amax_ours))))
        if not amax_match:
            findings.append(f"tensor amax differs: ours {amax_ours.tolist()}, candidate {ca.tolist()}")

    # -- per block: vmax, our scaling intermediates, and the scale causes
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(R, C)
    vmax = _block_vmax(X, BR, BC, nb)
    nan_block = np.isnan(vmax)
    with np.errstate(all="ignore"):
        if kind is Kind.TWO_LEVEL:
            if sch.tensor_scale:
                am = np.broadcast_to(amax_ours.reshape(-1, 1) if sch.per_row_scale else amax_ours, (R, 1))
                num = F32(el.max) * F32(sch.scale.max)
                s_enc = np.minimum(num / am, FLT_MAX).astype(np.float32)
                s_enc = np.where(np.isnan(am), am, s_enc)
                s_enc = np.where((am == 0) | (s_enc == 0), F32(1.0), s_enc).astype(np.float32)
            else:
                am = np.full((R, 1), np.nan, np.float32)
                s_enc = np.ones((R, 1), np.float32)
            s_dec = (F32(1.0) / s_enc).astype(np.float32)
            nan_block = nan_block | np.isnan(am)
            scale_vals = sch.scale.decode_table()

            def enc_of(sbytes):
                p = (scale_vals[sbytes] * s_dec).astype(np.float32)
                return np.minimum(F32(1.0) / p, FLT_MAX).astype(np.float32)

            ours_enc = enc_of(ours_s)
            cand_enc = enc_of(cand_s.astype(np.int64))
        elif kind is Kind.POW2:
            p2 = np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32), np.float32(np.nan))
            ours_enc, cand_enc = p2[ours_s], p2[cand_s.astype(np.int64)]
        else:
            ours_enc = (F32(1.0) / ours_s).astype(np.float32)
            cand_enc = (F32(1.0) / cand_s).astype(np.float32)

    scale_cause = np.full((R, nb), "", dtype=object)
    scale_detail = np.full((R, nb), "", dtype=object)
    if kind is Kind.FP32:
        s_bad = ours_s.view(np.uint32) != cand_s.view(np.uint32)
    else:
        s_bad = ours_s != cand_s
    if np.any(s_bad):
        alts = {}
        if kind is Kind.TWO_LEVEL:
            with np.errstate(all="ignore"):
                for name, sdb in _scale_orders(sch, vmax, am, s_enc, s_dec).items():
                    sdb = np.where(np.isnan(sdb), sdb, np.minimum(sdb, F32(sch.scale.max))).astype(np.float32)
                    alts[name] = encode(sdb, sch.scale).astype(np.int64)
                if amax_cand is not None and not amax_match:
                    qa = _two_level_scales_with_amax(sch, vmax, np.broadcast_to(amax_cand.reshape(-1, 1)
                                                     if sch.per_row_scale else amax_cand, (R, 1)))
                    alts["__amax__"] = qa
        elif kind is Kind.POW2:
            for rule in ScaleRule:
                if rule is not sch.scale_rule:
                    qr = quantize(x32, sch, axis=axis, scale_rule=rule)
                    alts[rule.value] = np.ascontiguousarray(qr.scales).reshape(R, nb).astype(np.int64)
        cand_vals = sch.scale.decode_table()[cand_s.astype(np.int64)] if kind is not Kind.FP32 else cand_s
        our_vals = sch.scale.decode_table()[ours_s] if kind is not Kind.FP32 else ours_s
        finite = cand_vals[np.isfinite(cand_vals)]
        floor = finite.min() if finite.size else None
        for r, j in zip(*np.nonzero(s_bad)):
            c = int(cand_s[r, j]) if kind is not Kind.FP32 else cand_s[r, j]
            cause, detail = "other", ""
            if layout_cause[r, j]:
                cause = "swizzled scale layout"
            elif nan_block[r, j] or np.isnan(our_vals[r, j]) or np.isnan(cand_vals[r, j]):
                cause = "NaN handling"
            else:
                hit = [n for n, a in alts.items() if a[r, j] == c]
                if "__amax__" in hit:
                    cause = "tensor amax"
                elif hit and kind is Kind.TWO_LEVEL:
                    cause, detail = "scale operation order", "candidate = " + hit[0]
                elif hit and kind is Kind.POW2:
                    cause, detail = "MX scale rule", f"candidate = {hit[0]} rule, fpsim = {sch.scale_rule.value}"
                elif floor is not None and cand_vals[r, j] > our_vals[r, j] and cand_vals[r, j] == floor:
                    cause, detail = "scale clamp", f"candidate floor {float(floor):g}"
                elif kind is not Kind.FP32 and our_vals[r, j] == 0 and cand_vals[r, j] == 0:
                    cause = "±0 sign"
            scale_cause[r, j], scale_detail[r, j] = cause, detail

    # -- per element
    bad = cand != ours
    n_bad = int(np.count_nonzero(bad))
    vals64, _ = _positive_codes(el)
    mids = (vals64[:-1] + vals64[1:]) / 2
    table = el.decode_table()
    code_cause: list[str] = []
    code_detail: list[str] = []
    rows, cols = np.nonzero(bad)
    for r, c in zip(rows, cols):
        j = c // BC
        oc, kc = int(ours[r, c]), int(cand[r, c])
        xv = X[r, c]
        with np.errstate(all="ignore"):
            y = F32(xv * ours_enc[r, j])
        cause, detail = "other", ""
        if packing_swapped and swapped[r, c] == oc:
            cause = "nibble packing order"
        elif s_bad[r, j] and scale_cause[r, j] in ("swizzled scale layout",):
            cause, detail = scale_cause[r, j], "element follows its block scale"
        elif np.isnan(xv) or nan_block[r, j]:
            cause = "NaN handling"
        elif table[oc] == 0 and table[kc] == 0:
            cause = "±0 sign"
        elif s_bad[r, j]:
            with np.errstate(all="ignore"):
                yc = F32(xv * cand_enc[r, j])
            if int(encode(np.array([yc], np.float32), el)[0]) == kc:
                cause, detail = scale_cause[r, j] or "other", "element follows its block scale"
        if (cause == "other" and kind is Kind.TWO_LEVEL and not s_bad[r, j] and xv == 0
                and sch.scale.decode_table()[ours_s[r, j]] == 0 and kc == el.nan_code):
            cause = "zero-scale block"
        if cause == "other" and not s_bad[r, j] and np.isfinite(y):
            if abs(float(y)) in mids:
                cause = "tie rounding"
                rna = int(encode(np.array([y], np.float32), el, "rna")[0])
                detail = "candidate rounds ties away from zero" if rna == kc else "candidate's tie is not to even"
            else:
                for mode in ("rtz", "rup", "rdown"):
                    if int(encode(np.array([y], np.float32), el, mode)[0]) == kc:
                        cause, detail = "rounding mode", f"candidate = {mode}"
                        break
                else:
                    if int(encode(np.array([y], np.float32), el, "rne", saturate=False)[0]) == kc:
                        cause = "saturation"
        code_cause.append(cause)
        code_detail.append(detail)

    causes = Counter(code_cause)
    causes.update(str(v) for v in scale_cause[s_bad])
    code_list = []
    for i in range(min(show, n_bad)):
        r, c = int(rows[i]), int(cols[i])
        j = c // BC
        with np.errstate(all="ignore"):
            y = F32(X[r, c] * ours_enc[r, j])
        code_list.append({
            "index": _orig_index(r, c, moved, ax),
            "row": r, "col": c, "block": [r, j],
            "x": float(X[r, c]), "x_hex": _hex32(X[r, c]), "scaled": float(y), "scaled_hex": _hex32(y),
            "ours": int(ours[r, c]), "ours_hex": f"0x{int(ours[r, c]):X}",
            "candidate": int(cand[r, c]), "candidate_hex": f"0x{int(cand[r, c]):X}",
            "ours_value": float(table[int(ours[r, c])]), "candidate_value": float(table[int(cand[r, c])]),
            "cause": code_cause[i], "detail": code_detail[i],
        })
    scale_list = []
    srows, scols = np.nonzero(s_bad)
    for i in range(min(show, srows.size)):
        r, j = int(srows[i]), int(scols[i])
        o, k = ours_s[r, j], cand_s[r, j]
        hx = (lambda v: f"0x{int(v):02X}") if kind is not Kind.FP32 else _hex32
        scale_list.append({
            "block": [r, j], "vmax": float(vmax[r, j]), "vmax_hex": _hex32(vmax[r, j]),
            "ours": o.item(), "ours_hex": hx(o), "candidate": k.item(), "candidate_hex": hx(k),
            "cause": str(scale_cause[r, j]), "detail": str(scale_detail[r, j]),
        })
    return DiffReport(
        scheme=sch.name,
        n_elements=R * C,
        n_code_mismatches=n_bad,
        n_blocks=R * nb,
        n_scale_mismatches=int(np.count_nonzero(s_bad)),
        amax_ours=amax_ours.tolist() if sch.tensor_scale else None,
        amax_candidate=None if amax_cand is None else amax_cand.tolist(),
        amax_match=amax_match,
        code_mismatches=code_list,
        scale_mismatches=scale_list,
        causes=dict(causes),
        findings=findings,
    )


def _two_level_scales_with_amax(sch: BlockScheme, vmax, am) -> np.ndarray:
    """Block scale bytes in TE order from another tensor amax (``am`` [R, 1])."""
    el, sc = sch.element, sch.scale
    with np.errstate(all="ignore"):
        num = F32(el.max) * F32(sc.max)
        s_enc = np.minimum(num / am, FLT_MAX).astype(np.float32)
        s_enc = np.where((am == 0) | (s_enc == 0), F32(1.0), s_enc).astype(np.float32)
        k = (s_enc * (F32(1.0) / F32(el.max))).astype(np.float32)
        sdb = (vmax * k).astype(np.float32)
        sdb = np.where(np.isnan(sdb), sdb, np.minimum(sdb, F32(sc.max))).astype(np.float32)
    return encode(sdb, sc).astype(np.int64)


# ---------------------------------------------------------------------------
# golden vectors

_NAN, _INF = float("nan"), float("inf")


def _blk(*vals, n):
    return list(vals) + [0.0] * (n - len(vals))


def vector_cases(scheme="nvfp4") -> list[tuple[str, np.ndarray, dict]]:
    """The named edge cases of :func:`write_vectors`: ``(name, x (float32), quantize kwargs)``.

    For NVFP4 these are the inputs of the hand-derived golden cases of the test
    suite (zero, −0, zero block, subnormal and zero E4M3 scales, E2M1 ties,
    E4M3 scale ties, the operation-order tie, inf, NaN propagated and ignored,
    S_enc capped at FLT_MAX, ragged, 2-D tiles, axis=0); other block schemes
    get the same kinds of cases built from their element format, plus a
    seeded random tensor with outliers.
    """
    sch = get_scheme(scheme)
    if sch.kind is Kind.CAST or sch.block is None:
        raise ValueError(f"vectors are defined for block-scaled schemes, not {sch.name}")
    BR, BC = sch.block
    el = sch.element
    M = el.max

    def b(*v):
        return _blk(*v, n=BC)

    two = sch.kind is Kind.TWO_LEVEL and sch.tensor_scale
    A = F32(el.max) * F32(sch.scale.max) if two else F32(M)  # an anchor block amax: S_enc = 1 for NVFP4
    A = float(A)
    Z = float(sch.scale.max) if two else M
    cases: list[tuple[str, list | np.ndarray, dict]] = [
        ("zero tensor", [b()], {}),
        ("negative zero", [[-0.0] * BC], {}),
        ("zero block inside a tensor", [b() + b(A, Z, -Z)], {}),
    ]
    vals = [float(v) for v in el.values()]
    mids = [(a + c) / 2 for a, c in zip(vals[:-1], vals[1:])]
    if two and el.name == "float4_e2m1fn" and sch.scale.name == "float8_e4m3fn":
        cases += [
            ("subnormal E4M3 scale", [b(A) + b(6 * 2.0**-8, 2.0**-8, -3 * 2.0**-8)], {}),
            ("E4M3 scale tie at half the smallest subnormal", [b(A) + b(6 * 2.0**-10) + b(7 * 2.0**-10)], {}),
            ("zero E4M3 scale (block 1e-7 x amax)", [b(A) + b(2.688e-4, -1e-4)], {}),
            ("E2M1 ties after scaling", [b(A) + b(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0)], {}),
            ("E4M3 scale ties and element saturation", [b(A) + b(51.0) + b(57.0)], {}),
            ("E4M3 scale tie decided by the operation order", [b(100.0) + b(0.3487723469734192)], {}),
            ("inf", [b(_INF, 448.0, -_INF) + b(1.0)], {}),
            ("NaN propagates", [b(_NAN, 1.0) + b(2.0)], {}),
            ("NaN ignored", [b(_NAN, A) + b(6.0)], {"nan_amax": "ignore"}),
            ("tiny tensor: S_enc capped at FLT_MAX", [b(2.0**-149)], {}),
            ("ragged 3x20", [[A] + [6.0] * 19, [6.0] * 20, [6.0] * 20], {}),
        ]
        if (BR, BC) == (1, 16):
            t = np.zeros((16, 32), np.float32)
            t[15, 0], t[3, 20], t[0, 17] = A, 6.0, -3.0
            cases.append(("2D 16x16 tiles", t, {"block": (16, 16)}))
            cases.append(("axis=0", np.array([b(A), b(6.0, 0.25)], np.float32).T, {"axis": 0}))
    else:
        row = [M]
        for v in vals[1:] + mids:
            row += [v, -v]
        n = -(-len(row) // BC) * BC
        row += [0.0] * (n - len(row))
        grid = np.array(row, np.float32).reshape(-1, BC)
        grid[:, 0] = M  # every block keeps the amax M: the element grid and its midpoints at scale 1
        cases += [
            ("element grid and midpoints", grid.reshape(1, -1), {}),
            ("small blocks: subnormal, zero and clamped scales",
             [b(A) + b(M * 2.0**-8) + b(M * 2.0**-10) + b(M * 2.0**-20) + b(M * 2.0**-140)], {}),
            ("block amax not on the grid", [b(M * 7 / 6, 1.0) + b(float(np.nextafter(F32(8 * M / 6), F32(0))))], {}),
            ("inf", [b(_INF, M, -_INF) + b(1.0)], {}),
            ("NaN propagates", [b(_NAN, 1.0) + b(2.0)], {}),
            ("NaN ignored", [b(_NAN, A) + b(M)], {"nan_amax": "ignore"}),
            ("huge values", [b(1.5 * 2.0**127, -1.0)], {}),
            ("ragged 3xN", np.full((3, BC + 4), M, np.float32), {}),
        ]
    rng = np.random.default_rng(20240607)
    r = rng.standard_normal((4, 4 * BC)).astype(np.float32)
    r[0, 3], r[2, 5 * BC // 2] = 40.0, -1e3  # outliers
    cases.append(("random normal with outliers", r, {}))
    return [(n, np.asarray(v, np.float32), kw) for n, v, kw in cases]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _atomic_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_VEC_TAG = "fpsim.vectors/1"
_FIELDS = ("input", "codes", "packed", "scales", "scales_swizzled", "amax", "decoded")


def write_vectors(scheme, out_dir) -> dict:
    """Write golden vectors of :func:`vector_cases` for ``scheme`` into ``out_dir``; return the manifest.

    Layout (all written atomically)::

        out_dir/manifest.json           scheme, conventions, per case: name, kwargs, files
        out_dir/vectors.npz             every array, keyed "<case slug>.<field>"
        out_dir/bin/<slug>.<field>.bin  the same arrays as raw little-endian bytes, C order

    The manifest lists for each file its ``dtype`` (numpy name, little-endian),
    ``shape`` and ``sha256``.  Fields: ``input`` (float32, the original shape),
    ``codes`` (uint8, one code per byte, quantized axis last and padded to whole
    blocks: [rows, blocks·block_width]), ``packed`` (4-bit elements: two codes
    per byte, element 2j in the low nibble), ``scales`` (raw scale bytes
    [rows, blocks], or float32 for FP32 scales), ``scales_swizzled`` (E4M3/E8M0
    scales in the Blackwell layout, SPEC §4), ``amax`` (float32 tensor amax; NaN
    where the scheme has none), ``decoded`` (float32, original shape).
    """
    sch = get_scheme(scheme)
    out = Path(out_dir)
    (out / "bin").mkdir(parents=True, exist_ok=True)
    import fpsim

    manifest: dict = {
        "format": _VEC_TAG,
        "fpsim_version": fpsim.__version__,
        "scheme": sch.to_json(),
        "conventions": "SPEC.md: NVIDIA conversions (RNE, satfinite, NaN → positive NaN/max code), Transformer "
        "Engine NVFP4 order sdb = min(fl(vmax·fl(S_enc·fl(1/6))), 448), no lower scale clamp, MX rceil, "
        "element 2j in the low nibble",
        "byteorder": "little",
        "cases": [],
    }
    npz: dict[str, np.ndarray] = {}
    for name, x, kw in vector_cases(sch):
        q = quantize(x, sch, **kw)
        R = math.prod(q.data.shape[:-1])
        arrays = {"input": x}
        if sch.element.bits == 4:
            arrays["codes"] = unpack_fp4(q.data)
            arrays["packed"] = q.data
        else:
            arrays["codes"] = q.data
        arrays["scales"] = q.scales
        if sch.scale.bits == 8:
            arrays["scales_swizzled"] = swizzle_scales(np.ascontiguousarray(q.scales).reshape(R, -1))
        arrays["amax"] = np.asarray(q.amax, np.float32)
        arrays["decoded"] = q.dequantize()
        slug = _slug(name)
        files = {}
        for fld, a in arrays.items():
            a = np.ascontiguousarray(a)
            le = a.astype(a.dtype.newbyteorder("<"), copy=False)
            raw = le.tobytes()
            rel = f"bin/{slug}.{fld}.bin"
            _atomic_bytes(out / rel, raw)
            files[fld] = {"path": rel, "dtype": a.dtype.name, "shape": list(a.shape),
                          "sha256": hashlib.sha256(raw).hexdigest()}
            npz[f"{slug}.{fld}"] = a
        kwj = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
        manifest["cases"].append({"name": name, "slug": slug, "kwargs": kwj, "axis": q.axis, "files": files})

    def write_npz(path):
        fd, tmp = tempfile.mkstemp(dir=out, prefix="vectors", suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **npz)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    write_npz(out / "vectors.npz")
    _atomic_bytes(out / "manifest.json", (json.dumps(manifest, indent=1, allow_nan=False) + "\n").encode())
    return manifest


def read_vectors(vec_dir, source: str = "bin") -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """Read vectors written by :func:`write_vectors`: ``(manifest, {case name: {field: array}})``.

    ``source="bin"`` reads the raw little-endian files through the manifest
    (checking size and sha256, as a C++/Rust reader would); ``"npz"`` reads
    ``vectors.npz`` (never unpickling).
    """
    d = Path(vec_dir)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"{d}: no manifest.json (not a vectors directory)") from None
    if manifest.get("format") != _VEC_TAG:
        raise ValueError(f"{d}: unknown vectors format {manifest.get('format')!r}")
    cases: dict[str, dict[str, np.ndarray]] = {}
    if source == "npz":
        with np.load(d / "vectors.npz", allow_pickle=False) as z:
            for c in manifest["cases"]:
                cases[c["name"]] = {f: z[f"{c['slug']}.{f}"] for f in c["files"]}
        return manifest, cases
    if source != "bin":
        raise ValueError("source must be 'bin' or 'npz'")
    for c in manifest["cases"]:
        arrs = {}
        for fld, info in c["files"].items():
            raw = (d / info["path"]).read_bytes()
            if hashlib.sha256(raw).hexdigest() != info["sha256"]:
                raise ValueError(f"{info['path']}: sha256 does not match the manifest")
            dt = np.dtype(info["dtype"]).newbyteorder("<")
            n = math.prod(info["shape"])
            if len(raw) != n * dt.itemsize:
                raise ValueError(f"{info['path']}: {len(raw)} bytes, expected {n * dt.itemsize}")
            arrs[fld] = np.frombuffer(raw, dt).astype(dt.newbyteorder("=")).reshape(info["shape"])
        cases[c["name"]] = arrs
    return manifest, cases


# ---------------------------------------------------------------------------
# reading user files (CLI)


def load_arrays(path) -> dict[str, np.ndarray]:
    """All arrays of a ``.npz`` (``allow_pickle=False``), ``.npy`` or ``.safetensors`` file; never unpickles.

    Raises ``ValueError`` with a one-line message for a missing, unreadable or pickled file.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".npz", ".npy"):
            loaded = np.load(p, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return {"": loaded}
            with loaded as z:
                return {k: z[k] for k in z.files}
        if suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(p)))
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise ValueError(f"{p}: refusing to load pickled data (allow_pickle=False)") from None
        raise ValueError(f"{p}: cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except Exception as e:  # zipfile.BadZipFile, OSError, SafetensorError …: one line, no traceback
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: cannot read ({type(e).__name__}: {msg})") from None
    raise ValueError(f"{p}: unsupported file type {suffix!r} (use .npz, .npy or .safetensors)")
