"""An independent, slow reference of docs/spec.md §8 — the GEMM accumulator models and the recipe's ``linear`` —
written from the spec text (element tables, TE's NVFP4 order, rceil MX scales, FP32-scaled FP8, RHT16 with the
spec's signs and BF16 rounding), compared with fpsim bit for bit.

Where the spec leaves a choice open, the reference follows the documented choice (§8: the chunk is the gcd of
the operands' block widths, 32 without block scales; a block's dot product is summed exactly and rounded once
where float64 sums are exact; alpha falls back to fl(S_dec_a·S_dec_b) where the amax formula is undefined), and
the SR seeds / per-layer signs use fpsim's own derivation (derive_seed, Philox), which the spec names but does
not define.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)

# ---------------------------------------------------------------- decoders (SPEC §1), written from the table
MINI = {  # name: (exponent bits, mantissa bits, bias, specials)
    "float4_e2m1fn": (2, 1, 1, "none"),
    "float6_e2m3fn": (2, 3, 1, "none"),
    "float6_e3m2fn": (3, 2, 3, "none"),
    "float8_e4m3fn": (4, 3, 7, "fn"),
    "float8_e5m2": (5, 2, 15, "ieee"),
    "bfloat16": (8, 7, 127, "ieee"),
}


def mini_value(code: int, name: str) -> float:
    e, m, bias, sp = MINI[name]
    sign = -1.0 if (code >> (e + m)) & 1 else 1.0
    E, M = (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
    if sp == "ieee" and E == (1 << e) - 1:
        return sign * math.inf if M == 0 else math.nan
    if sp == "fn" and E == (1 << e) - 1 and M == (1 << m) - 1:
        return math.nan
    if E == 0:
        return sign * M * 2.0 ** (1 - bias - m)
    return sign * (1 + M / 2**m) * 2.0 ** (E - bias)


def e8m0_value(b: int) -> float:
    return math.nan if b == 0xFF else 2.0 ** (b - 127)


# ---------------------------------------------------------------- exact float32 rounding of a rational
def round_f32(q: Fraction, trunc_bits: int | None = None) -> float:
    """q rounded to float32: RNE (trunc_bits None) or toward zero to trunc_bits fraction bits."""
    if q == 0:
        return 0.0
    s = -1 if q < 0 else 1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, -126)
    fb = 23 if trunc_bits is None else trunc_bits
    ulp = Fraction(2) ** (e - fb)
    n, r = divmod(a, ulp)
    n = int(n)
    if trunc_bits is None and (r > ulp / 2 or (r == ulp / 2 and n % 2)):
        n += 1
    v = n * ulp
    if trunc_bits is None:
        if v >= Fraction(2) ** 128:
            return s * math.inf
    elif v >= Fraction(2) ** 128:  # cannot happen: truncation keeps the binade
        raise AssertionError
    return s * float(v)


# ---------------------------------------------------------------- an operand as (values, scale-at-k, factor)
class Op:
    """values[r, k]: element values; scale[r, k]: block scale in effect at k; blk: block width (0 = none);
    amax[r] (two-level only), num (N = max_elem · scale bound), two: has a second level."""

    def __init__(self, values, scale, blk, two=False, amax=None, num=1.0):
        self.values, self.scale, self.blk, self.two, self.amax, self.num = values, scale, blk, two, amax, num

    def s_dec(self):
        if not self.two:
            return np.ones(self.values.shape[0], np.float32)
        out = []
        for a in self.amax:
            a = F32(a)
            with np.errstate(all="ignore"):
                se = F32(F32(self.num) / a)
            se = F32(min(se, F32(FLT_MAX))) if not np.isnan(se) else se
            if a == 0 or se == 0:
                se = F32(1)
            with np.errstate(all="ignore"):
                out.append(F32(F32(1) / se))
        return np.array(out, np.float32)


def ref_operand(q) -> Op:
    if isinstance(q, Op):
        return q
    """Decode a QuantizedTensor (reduction axis last) or a plain 2-D array, from the stored bytes."""
    if not hasattr(q, "scheme"):
        x = np.asarray(q, np.float32)
        return Op(x, np.ones_like(x), 0)
    sch = q.scheme
    rows, k = q.shape
    el = sch.element.name
    data = np.asarray(q.data)
    if sch.kind.value == "cast":
        if el == "float32":
            vals = data.view(np.float32).astype(np.float32)
        else:
            vals = np.array([[mini_value(int(c), el) for c in row] for row in data], np.float32)
        return Op(vals, np.ones((rows, k), np.float32), 0)
    if sch.element.bits == 4 and sch.block is not None:  # two codes per byte, element 2j in the low nibble
        codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(rows, -1)
    else:
        codes = data
    vals = np.array([[mini_value(int(codes[r, t]), el) for t in range(k)] for r in range(rows)], np.float32)
    blk = 0 if sch.block is None else sch.block[1]
    if sch.kind.value == "two_level":
        sv = np.array([[mini_value(int(b), sch.scale.name) for b in row] for row in q.scales], np.float32)
    elif sch.kind.value == "pow2":
        sv = np.array([[e8m0_value(int(b)) for b in row] for row in q.scales], np.float32)
    else:
        sv = np.asarray(q.scales, np.float32)
        if blk == 0:
            sv = np.full((rows, 1), sv.reshape(()), np.float32)
    scale = np.empty((rows, k), np.float32)
    for t in range(k):
        scale[:, t] = sv[:, t // blk if blk else 0]
    two = sch.kind.value == "two_level" and sch.tensor_scale
    amax = None
    num = 1.0
    if two:
        a = np.asarray(q.amax, np.float32)
        amax = a.reshape(rows) if a.size == rows and a.ndim else np.full(rows, a.reshape(()), np.float32)
        elem_max = {"float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5, "float6_e3m2fn": 28.0, "float8_e4m3fn": 448.0,
                    "float8_e5m2": 57344.0}[el]
        bound = 256.0 if getattr(sch, "four_over_six", False) else 448.0
        num = elem_max * bound
    return Op(vals, scale, blk, two, amax, num)


def ref_alpha(a: Op, b: Op) -> np.ndarray:
    """SPEC §8 alpha per (i, j), float32; fallback fl(S_dec_a·S_dec_b) where the amax formula is undefined."""
    m, n = a.values.shape[0], b.values.shape[0]
    sa, sb = a.s_dec(), b.s_dec()
    out = np.ones((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            if not (a.two or b.two):
                continue
            with np.errstate(all="ignore"):
                sd = F32(sa[i] * sb[j])
                if not (a.two and b.two):
                    out[i, j] = sd
                    continue
                al = F32(F32(a.amax[i] * b.amax[j]) / F32(F32(a.num) * F32(b.num)))

                def good(amax, num):
                    return np.isfinite(amax) and amax > 0 and F32(F32(num) / amax) < F32(FLT_MAX)

            ok = good(a.amax[i], a.num) and good(b.amax[j], b.num) and np.isfinite(al) and al > 0
            out[i, j] = al if ok else sd
    return out


def _chunk(a: Op, b: Op) -> int:
    bl = [o.blk for o in (a, b) if o.blk]
    return math.gcd(*bl) if bl else 32


def _exact_dot(x, y):
    """Exact Σ x_t·y_t as a Fraction, or a float special (NaN / ±inf) by IEEE rules."""
    fx, fy = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        pr = fx * fy  # exact in float64 for float32 inputs, and the IEEE specials
    if not np.all(np.isfinite(pr)):
        if np.any(np.isnan(pr)) or (np.any(pr == math.inf) and np.any(pr == -math.inf)):
            return math.nan
        return math.inf if np.any(pr == math.inf) else -math.inf
    return sum((Fraction(float(p)) for p in pr), Fraction(0))


def ref_gemm(qa, qb, accumulator="fp32", acc_bits=23, chunk=None):
    a, b = ref_operand(qa), ref_operand(qb)
    assert a.values.shape[1] == b.values.shape[1]
    m, k = a.values.shape
    n = b.values.shape[0]
    ch = chunk or _chunk(a, b)
    nch = -(-k // ch)
    alpha = ref_alpha(a, b)
    if accumulator == "exact":
        sda, sdb = a.s_dec().astype(np.float64), b.s_dec().astype(np.float64)
        out = np.empty((m, n), np.float64)
        for i in range(m):
            for j in range(n):
                tot = Fraction(0)
                special = None
                for t in range(k):
                    with np.errstate(all="ignore"):
                        p = np.float64(a.values[i, t]) * np.float64(b.values[j, t]) * np.float64(a.scale[i, t]) \
                            * np.float64(b.scale[j, t])
                    if not np.isfinite(p):
                        special = p if special is None or special == p else math.nan
                        continue
                    tot += Fraction(float(a.values[i, t])) * Fraction(float(b.values[j, t])) * \
                        Fraction(float(a.scale[i, t])) * Fraction(float(b.scale[j, t]))
                with np.errstate(all="ignore"):
                    f = Fraction(float(sda[i])) * Fraction(float(sdb[j])) if np.isfinite(sda[i] * sdb[j]) else None
                    if special is not None or f is None:
                        out[i, j] = (special if special is not None else float(tot)) * sda[i] * sdb[j]
                    else:
                        out[i, j] = float(tot * f)
        return out
    out = np.empty((m, n), np.float32)
    tb = None if accumulator == "fp32" else acc_bits
    for i in range(m):
        for j in range(n):
            acc = F32(0)
            for c in range(nch):
                s = slice(c * ch, min(k, (c + 1) * ch))
                p = _exact_dot(a.values[i, s], b.values[j, s])
                pf = F32(p if isinstance(p, float) else round_f32(p))
                sa = a.scale[i, c * ch] if k else F32(1)
                sb = b.scale[j, c * ch] if k else F32(1)
                with np.errstate(all="ignore"):
                    term = F32(F32(sa * sb) * pf)
                    if tb is None:
                        acc = F32(acc + term)
                    elif np.isfinite(acc) and np.isfinite(term):
                        acc = F32(round_f32(Fraction(float(acc)) + Fraction(float(term)), tb))
                    else:
                        acc = F32(acc + term)
            with np.errstate(all="ignore"):
                out[i, j] = F32(acc * alpha[i, j])
    return out


# ---------------------------------------------------------------- reference quantizers (SPEC §2–§7)
def grid(name):
    e, m, bias, sp = MINI[name]
    mags = []
    for c in range(1 << (e + m)):
        v = mini_value(c, name)
        if math.isfinite(v):
            mags.append(v)
    return np.array(mags)  # index = code (magnitudes increase with the code)


def _encode(y, name, pick):
    """Codes of float32 y (finite): the grid point below |y| (saturating at the top), moved up by
    ``pick(idx, |y|, lo, g)`` between grid points lo and lo + 1; + the sign bit."""
    g = grid(name)
    sign = 1 << (MINI[name][0] + MINI[name][1])
    out = np.empty(y.shape, np.int64)
    for idx, v in np.ndenumerate(y):
        a = abs(float(v))
        lo = int(np.searchsorted(g, a, "right") - 1)
        c = len(g) - 1 if lo >= len(g) - 1 else pick(idx, a, lo, g)
        out[idx] = c | (sign if np.signbit(v) else 0)
    return out


def enc_rne(y, name):
    """Magnitude codes of float32 y (finite) rounded to nearest, ties to the even code, saturating; + sign."""

    def nearest(idx, a, lo, g):
        dl, dh = a - g[lo], g[lo + 1] - a
        return lo if dl < dh or (dl == dh and lo % 2 == 0) else lo + 1

    return _encode(y, name, nearest)


def enc_sr(y, name, rb, k):
    """Stochastic rounding with the k random bits ``rb``: |y| + rb/2^k of the step, rounded once, then floored."""

    def stochastic(idx, a, lo, g):
        step = g[lo + 1] - g[lo]
        t = float(F32(Fraction(a) + Fraction(int(rb[idx]), 2**k) * Fraction(step)))  # one rounding (exact→f64→f32)
        return min(int(np.searchsorted(g, t, "right") - 1), len(g) - 1)

    return _encode(y, name, stochastic)


def values_of(codes, name):
    return np.vectorize(lambda c: mini_value(int(c), name))(codes).astype(np.float32)


def bf16(x):
    x = np.asarray(x, np.float32)
    return np.array([float(F32(round_f32_bits(float(v), 7))) for v in x.ravel()], np.float32).reshape(x.shape)


def round_f32_bits(v, mbits):
    """RNE of float v to a binary format with mbits fraction bits and float32's exponent range (BF16)."""
    if v == 0 or not math.isfinite(v):
        return v
    q = Fraction(v)
    s = -1 if q < 0 else 1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, -126)
    ulp = Fraction(2) ** (e - mbits)
    n, r = divmod(a, ulp)
    n = int(n)
    if r > ulp / 2 or (r == ulp / 2 and n % 2):
        n += 1
    return s * float(n * ulp)


def _pad(x, br, bc):
    r, c = x.shape
    p = np.zeros((-(-r // br) * br, -(-c // bc) * bc), np.float32)
    p[:r, :c] = x
    return p


def _rbits(seed, rows, nb, bw, k=8):
    from fpsim.random import random_bits
    return random_bits(seed, rows * nb * bw, k=k).reshape(rows, nb * bw)


def ref_nvfp4(x, tile=(1, 16), sr_seed=None):
    x = np.asarray(x, np.float32)
    R, C = x.shape
    br, bc = tile
    xp = _pad(x, br, bc)
    amax = F32(np.max(np.abs(x))) if x.size else F32(0)
    with np.errstate(all="ignore"):
        se = F32(min(F32(F32(2688) / amax), F32(FLT_MAX)))
    if amax == 0 or se == 0:
        se = F32(1)
    sdec = F32(F32(1) / se)
    nb = xp.shape[1] // bc
    scale = np.zeros(xp.shape, np.float32)
    enc = np.zeros(xp.shape, np.float32)
    f = F32(se * F32(F32(1) / F32(6)))
    for r0 in range(0, xp.shape[0], br):
        for c0 in range(0, xp.shape[1], bc):
            t = xp[r0:r0 + br, c0:c0 + bc]
            sdb = F32(min(F32(F32(np.max(np.abs(t))) * f), F32(448)))
            sb = values_of(enc_rne(np.array([sdb]), "float8_e4m3fn"), "float8_e4m3fn")[0]
            with np.errstate(all="ignore"):
                eb = F32(min(F32(F32(1) / F32(sb * sdec)), F32(FLT_MAX)))
            scale[r0:r0 + br, c0:c0 + bc] = sb
            enc[r0:r0 + br, c0:c0 + bc] = eb
    y = (xp * enc).astype(np.float32)
    if sr_seed is None:
        codes = enc_rne(y, "float4_e2m1fn")
    else:
        codes = enc_sr(y, "float4_e2m1fn", _rbits(sr_seed, xp.shape[0], nb, bc), 8)
    vals = values_of(codes, "float4_e2m1fn")[:R, :C]
    return Op(vals, scale[:R, :C], bc, True, np.full(R, amax, np.float32), 2688.0)


def ref_mx(x, sr_seed=None, el="float4_e2m1fn", emax=6.0, bc=32):
    x = np.asarray(x, np.float32)
    R, C = x.shape
    xp = _pad(x, 1, bc)
    nb = xp.shape[1] // bc
    scale = np.zeros(xp.shape, np.float32)
    y = np.zeros(xp.shape, np.float32)
    inv = F32(F32(1) / F32(emax))
    for r in range(xp.shape[0]):
        for b in range(nb):
            t = xp[r, b * bc:(b + 1) * bc]
            v = F32(F32(np.max(np.abs(t))) * inv)
            if v == 0:
                e = -127
            else:
                fr, E = math.frexp(float(v))
                e = E - 1 if fr == 0.5 else E
            e = max(-127, min(127, e))
            scale[r, b * bc:(b + 1) * bc] = F32(2.0 ** e)
            y[r, b * bc:(b + 1) * bc] = [F32(Fraction(float(u)) * Fraction(2) ** (-e)) for u in t]
    if sr_seed is None:
        codes = enc_rne(y, el)
    else:
        codes = enc_sr(y, el, _rbits(sr_seed, xp.shape[0], nb, bc), 8)
    return Op(values_of(codes, el)[:R, :C], scale[:R, :C], bc)


def ref_fp8(x, tile=None, el="float8_e4m3fn"):
    x = np.asarray(x, np.float32)
    R, C = x.shape
    emax = F32(448.0 if el == "float8_e4m3fn" else 57344.0)
    br, bc = tile if tile else (max(R, 1), max(C, 1))
    xp = _pad(x, br, bc)
    scale = np.ones(xp.shape, np.float32)
    y = np.zeros(xp.shape, np.float32)
    for r0 in range(0, xp.shape[0], br):
        for c0 in range(0, xp.shape[1], bc):
            t = xp[r0:r0 + br, c0:c0 + bc]
            d = F32(F32(np.max(np.abs(t))) / emax)
            if d == 0 or not np.isfinite(d):
                d = F32(1)
            scale[r0:r0 + br, c0:c0 + bc] = d
            y[r0:r0 + br, c0:c0 + bc] = (t / d).astype(np.float32)
    codes = enc_rne(y, el)
    return Op(values_of(codes, el)[:R, :C], scale[:R, :C], bc if tile else 0)


def hadamard(d):
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def ref_rht(x, d, signs):
    """Tiles of d along the last axis: y = bf16(fl32(((bf16(x) ∘ s) · H_d) · fl32(1/√d)))."""
    x = bf16(x)
    R, C = x.shape
    h = hadamard(d)
    y = np.empty_like(x)
    sc = F32(1 / math.sqrt(d))
    for r in range(R):
        for c0 in range(0, C, d):
            tile = x[r, c0:c0 + d].astype(np.float64) * signs
            s = tile @ h  # ±sums of ≤ 32 BF16 values within one tile: exact in float64 here
            y[r, c0:c0 + d] = (s.astype(np.float32) * sc).astype(np.float32)
    return bf16(y)


def op_dequant(op: Op):
    sd = op.s_dec()
    return ((op.values * op.scale).astype(np.float32) * sd[:, None]).astype(np.float32)


SPEC_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)


def ref_copy(t, pol, seed, layer, step, role):
    """One operand copy (reduction axis last) under an OperandPolicy, from SPEC §4–§8."""
    from fpsim.transforms import derive_seed, sign_vector
    x = np.ascontiguousarray(t, np.float32)
    if pol.rht:
        s = pol.rht_signs
        if s == "recipe":
            sv = SPEC_SIGNS
        else:
            sd = {"per_layer": derive_seed(seed, "rht", layer), "per_call": derive_seed(seed, "rht", layer, step)}
            sv = sign_vector(pol.rht, sd.get(s, s)).astype(np.float64)
        x = ref_rht(x, pol.rht, sv)
    if pol.scheme is None:
        return Op(x, np.ones_like(x), 0)
    name = pol.scheme if isinstance(pol.scheme, str) else pol.scheme.name
    sr = derive_seed(seed, "sr", layer, step, role) if pol.rounding == "sr" else None
    if name == "nvfp4":
        return ref_nvfp4(x, pol.block or (1, 16), sr)
    if name == "mxfp4":
        assert pol.block in (None, (1, 32))
        return ref_mx(x, sr)
    assert sr is None
    if name in ("fp8_e4m3", "fp8_e5m2"):
        return ref_fp8(x, None, "float8_e4m3fn" if name == "fp8_e4m3" else "float8_e5m2")
    if name == "fp8_block128":
        return ref_fp8(x, pol.block or (1, 128))
    if name == "bf16":
        return Op(bf16(x), np.ones_like(x), 0)
    raise NotImplementedError(name)


def ref_linear(x, w, dy, rec, seed=0, layer="", step=0):
    copies = {"fprop_x": x, "fprop_w": w, "dgrad_dy": dy, "dgrad_w": w.T, "wgrad_dy": dy.T, "wgrad_x": x.T}
    ops = {}
    for role, src in copies.items():
        if role == "dgrad_w" and rec.dgrad_w_from_fprop:
            src = op_dequant(ops["fprop_w"]).T
        ops[role] = ref_copy(src, getattr(rec, role), seed, layer, step, role)
    acc = rec.accumulator
    return (ref_gemm(ops["fprop_x"], ops["fprop_w"], acc), ref_gemm(ops["dgrad_dy"], ops["dgrad_w"], acc),
            ref_gemm(ops["wgrad_dy"], ops["wgrad_x"], acc), ops)


# ================================================================ tests
import dataclasses  # noqa: E402
import itertools  # noqa: E402

import pytest  # noqa: E402

import fpsim  # noqa: E402
from fpsim.recipe import RECIPES, linear  # noqa: E402
from fpsim.schemes import BlockScheme, get_scheme  # noqa: E402
from tests.bitcompare import same_bits  # noqa: E402

CAST_E4M3 = BlockScheme("cast_e4m3", "e4m3", None, None)
CAST_E5M2 = BlockScheme("cast_e5m2", "e5m2", None, None)
KINDS = {
    "nvfp4": "nvfp4", "nvfp4_2d": ("nvfp4", (16, 16)), "nvfp4_row": get_scheme("nvfp4").replace(per_row_scale=True),
    "mxfp4": "mxfp4", "mxfp6": "mxfp6_e3m2", "mxfp8_e5m2": "mxfp8_e5m2", "fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
    "fp8_block": "fp8_block128", "bf16": "bf16", "cast_e4m3": CAST_E4M3, "cast_e5m2": CAST_E5M2, "plain": None,
}


def _q(x, kind):
    s = KINDS[kind]
    if s is None:
        return x
    return fpsim.quantize(x, s[0], block=s[1]) if isinstance(s, tuple) else fpsim.quantize(x, s)


def _data(rng, shape, spread=8):
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)).astype(np.float32)


def _check(qa, qb, torch_too=True):
    for acc, bits in (("fp32", 23), ("truncated", 23), ("truncated", 9), ("exact", 23)):
        got, exp = fpsim.gemm(qa, qb, acc, bits), ref_gemm(qa, qb, acc, bits)
        if acc == "exact":  # float64 throughout: the spec fixes no order; allow a few float64 roundings
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=0)
        else:
            assert same_bits(got, exp), (acc, bits, got, exp)
    if torch_too and all(isinstance(q, fpsim.QuantizedTensor) for q in (qa, qb)):
        assert same_bits(fpsim.gemm(qa, qb, "fp32", backend="torch-cpu"), ref_gemm(qa, qb)), "torch-cpu"


@pytest.mark.parametrize("ka", ["nvfp4", "nvfp4_2d", "nvfp4_row", "mxfp4", "fp8", "fp8_block", "bf16", "plain"])
def test_gemm_every_operand_kind(ka):
    """Every operand kind against every other, K not a multiple of any block, M or N = 1, K = 0 and K > 128."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(hash(ka) % 2**32)
    for kb in KINDS:
        for m, n, k in ((2, 2, 40), (1, 1, 17), (2, 1, 0), (1, 1, 136)):
            _check(_q(_data(rng, (m, k)), ka), _q(_data(rng, (n, k)), kb))


def test_gemm_specials_and_extreme_scales():
    """NaN / inf inputs, all-zero tensors, subnormal and zero block scales, tiny amax (S_enc capped), huge amax."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    xs = {"wide": _data(rng, (2, 48), 40), "zero": np.zeros((2, 48), np.float32),
          "tiny": (rng.standard_normal((2, 48)) * 1e-37).astype(np.float32),
          "huge": (rng.standard_normal((2, 48)) * 1e37).astype(np.float32)}
    xs["inf"] = xs["wide"].copy()
    xs["inf"][0, 3] = np.inf
    xs["nan"] = xs["wide"].copy()
    xs["nan"][1, 5] = np.nan
    pairs = [("nvfp4", "nvfp4"), ("nvfp4_2d", "nvfp4_row"), ("nvfp4", "mxfp4"), ("mxfp4", "mxfp4"), ("fp8", "nvfp4"),
             ("fp8_block", "fp8"), ("bf16", "nvfp4")]
    with np.errstate(all="ignore"):
        for (xa, xb), (ka, kb) in itertools.product(itertools.product(xs.values(), repeat=2), pairs):
            _check(_q(xa, ka), _q(xb, kb))


def test_zero_times_inf_or_nan_is_nan():
    """SPEC §9 (no silent finite garbage): 0 · inf and 0 · NaN reach the sum.  The Numba kernel used to skip
    zero elements of A, so [0, 1]·[inf, 1] gave 1 under "fp32", "truncated" and "exact" (torch-cpu gave NaN)."""
    a = np.array([[0.0, 1.0]], np.float32)
    for special in (np.inf, np.nan):
        b = np.array([[special, 1.0]], np.float32)
        for acc in ("fp32", "truncated", "exact", "blas"):
            assert np.isnan(fpsim.gemm(a, b, acc)[0, 0]), (special, acc)
    qa = fpsim.quantize(a, CAST_E4M3)
    qb = fpsim.quantize(np.ones((1, 2), np.float32), CAST_E4M3)
    qb.data[0, 0] = 0x7F  # the E4M3 NaN code
    assert np.isnan(fpsim.gemm(qa, qb)[0, 0]) and np.isnan(ref_gemm(qa, qb)[0, 0])


def test_truncated_accumulator_far_apart_exponents():
    """The truncated model truncates the *exact* acc + term toward zero: 1 − 2^-60 → 1 − 2^-(bits+1).  The kernel
    used to round the sum to float64 first (exact only within 29 exponents), which gives 1 and truncates nothing."""
    a = np.zeros((1, 64), np.float32)
    b = np.zeros((1, 64), np.float32)
    a[0, 0] = b[0, 0] = 1.0
    a[0, 32], b[0, 32] = 2.0**-30, -(2.0**-30)  # second 32-chunk: term = −2^-60
    for bits in (23, 10, 1):
        got = fpsim.gemm(a, b, "truncated", bits)[0, 0]
        assert got == np.float32(1 - 2.0 ** -(bits + 1)) == ref_gemm(a, b, "truncated", bits)[0, 0], bits
    b[0, 32] = 2.0**-30  # same signs: truncation keeps 1
    assert fpsim.gemm(a, b, "truncated", 23)[0, 0] == 1.0


def test_torch_fp32_model_inexact_float64_sums():
    """BF16 / E5M2 chunk sums are not always exact in float64: the torch-cpu "fp32" model used one float64 matmul
    (BLAS order) and differed from the reference's ascending sum, e.g. 2^60 + 1 − 2^60 in one chunk."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    for s in ("bf16", CAST_E5M2, "fp8_e5m2"):
        for _ in range(20):
            a = np.zeros((1, 40), np.float32)
            i, j, k = rng.permutation(32)[:3]
            a[0, i], a[0, j], a[0, k] = 2.0**60, 1.0, -(2.0**60)
            qa, qb = fpsim.quantize(a, s), fpsim.quantize(np.ones((2, 40), np.float32), s)
            assert same_bits(fpsim.gemm(qa, qb, backend="torch-cpu"), fpsim.gemm(qa, qb)), (s, i, j, k)


def test_mismatched_blocks_are_handled_and_errors_are_one_line():
    """Different block widths are accepted (chunk = gcd, §8); invalid calls fail with one clear line."""
    rng = np.random.default_rng(4)
    _check(_q(_data(rng, (2, 100)), "nvfp4"), _q(_data(rng, (3, 100)), "fp8_block"), torch_too=False)
    w24 = BlockScheme("fp8_b24", "e4m3", "float32", (1, 24))
    _check(fpsim.quantize(_data(rng, (2, 50)), w24), _q(_data(rng, (2, 50)), "nvfp4"), torch_too=False)
    a, b = fpsim.quantize(np.ones((2, 32), np.float32)), fpsim.quantize(np.ones((2, 48), np.float32))
    col = fpsim.quantize(np.ones((32, 2), np.float32), axis=0)
    for args in ((a, b), (a, col), (a, a, "bogus"), (a, a, "truncated", 0), (np.ones((2, 2, 2)), a)):
        with pytest.raises(ValueError) as e:
            fpsim.gemm(*args)
        assert "\n" not in str(e.value) and str(e.value)


def _recipes():
    for r in RECIPES.values():
        yield r
        for comp in ("rht", "2d", "sr", "bf16_layers"):
            yield r.without(comp)
        yield r.only("forward")
        yield r.only("backward")
        yield dataclasses.replace(r, dgrad_w_from_fprop=True, name=r.name + "-dgrad-w-from-fprop")


@pytest.mark.parametrize("rec", list(_recipes()), ids=lambda r: r.name)
def test_linear_against_reference(rec):
    """y, dX, dW of every preset and ablation equal the reference's six copies multiplied by ref_gemm."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((32, 40)).astype(np.float32)
    x[3, 5] = 40.0  # an outlier: RHT and the per-block scales matter
    w = (rng.standard_normal((24, 40)) * 0.1).astype(np.float32)
    dy = (rng.standard_normal((32, 24)) * 1e-3).astype(np.float32)
    res = linear(x, w, dy, rec, seed=7, layer="blocks.3.fc1", step=11)
    y, dx, dw, _ = ref_linear(x, w, dy, rec, seed=7, layer="blocks.3.fc1", step=11)
    assert same_bits(res.y, y) and same_bits(res.dx, dx) and same_bits(res.dw, dw)


def test_linear_reference_is_sensitive():
    """Negative control: another step (other SR bits) changes the reference's gradients of the paper's recipe."""
    rng = np.random.default_rng(6)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in ((32, 32), (16, 32), (32, 16)))
    rec = RECIPES["nvfp4_paper"]
    res = linear(x, w, dy, rec, seed=7, layer="l", step=1)
    _, dx, dw, _ = ref_linear(x, w, dy, rec, seed=7, layer="l", step=2)
    assert not same_bits(res.dx, dx) and not same_bits(res.dw, dw)
