"""Slow, obviously-correct scalar reference of SPEC §4–§6 (block scaling), one block at a time.

Every ``fl(.)`` of SPEC §4 is one ``np.float32`` scalar operation; element and
scale conversions use the exact-rational reference of SPEC §2–§3
(:mod:`tests.reference`).  MX exponents come from ``math.frexp`` (exact) and
``x · 2^-E`` from ``Fraction`` arithmetic.  Random bits for SR are read from the
Philox known-answer function block by block, as SPEC §3 describes them.
Nothing here shares code with ``fpsim._scaling_kernels``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fpsim.formats import FormatSpec, get_format
from fpsim.random import philox4x32, seed_key
from tests.reference import f32_bits, f32_value, ref_decode, ref_encode, ref_sr, round_to_f32

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E4M3 = get_format("e4m3")
E8M0 = get_format("e8m0")


def isnan(v) -> bool:
    return v != v


def fmin(a, b):
    """min with a NaN first argument propagating."""
    return a if isnan(a) or a <= b else b


def absmax(values, ignore_nan: bool):
    """max |v| (float32); NaN if any v is NaN unless ignored; 0 for no values."""
    m = F32(0.0)
    for v in values:
        v = F32(v)
        if isnan(v):
            if ignore_nan:
                continue
            return F32(np.nan)
        m = max(m, F32(abs(v)))
    return m


def code_of(y, spec: FormatSpec, rounding: str, r: int | None, k: int) -> int:
    """Element code of the float32 ``y`` (§2 satfinite, or §3 SR with random integer r)."""
    b = f32_bits(float(F32(y))) if not isnan(y) else 0x7FC00000
    if rounding == "sr":
        return ref_sr(b, spec, r, k)
    return ref_encode(b, spec, rounding, True)


def value_of(code: int, spec: FormatSpec):
    return F32(ref_decode(code, spec))


class Stream:
    """The k-bit random integer of element t of block (r, j), SPEC §3.

    Block index b = r · nb + j; a block takes ⌈BC / (128 / w)⌉ consecutive
    Philox calls starting at counter + b · calls; call output = 16 bytes,
    read as little-endian w-bit integers (w = 8, 16 or 32), low k bits kept.
    """

    def __init__(self, seed: int, k: int, nb: int, bc: int, counter: int = 0):
        self.key = seed_key(seed)
        self.k = k
        self.w = 8 if k <= 8 else 16 if k <= 16 else 32
        self.per_call = 128 // self.w
        self.calls = -(-bc // self.per_call)
        self.nb = nb
        self.counter = counter

    def __call__(self, r: int, j: int, t: int) -> int:
        c = self.counter + (r * self.nb + j) * self.calls + t // self.per_call
        words = philox4x32((c & 0xFFFFFFFF, c >> 32, 0, 0), self.key)
        raw = b"".join(int(w).to_bytes(4, "little") for w in words)
        i = (t % self.per_call) * (self.w // 8)
        return int.from_bytes(raw[i : i + self.w // 8], "little") & ((1 << self.k) - 1)


def _tiles(R: int, C: int, br: int, bc: int):
    nb = -(-C // bc)
    for g in range(-(-R // br)):
        for j in range(nb):
            rows = range(g * br, min(R, g * br + br))
            yield j, rows, [(r, c) for r in rows for c in range(j * bc, min(C, j * bc + bc))]


def _rand_fn(rounding, rbits, seed, k, nb, bc, counter):
    if rounding != "sr":
        return lambda r, j, t, c: None
    if rbits is not None:
        return lambda r, j, t, c: int(rbits[r, c])
    s = Stream(seed, k, nb, bc, counter)
    return lambda r, j, t, c: s(r, j, t)


def _decoded(s_b, code, r, el, sc, s_enc_rows):
    """x̂ = fl((e2m1 · f32(s_b)) · S_dec)."""
    return (value_of(code, el) * value_of(s_b, sc)) * (F32(1.0) / s_enc_rows[r])


def _error(x, s_b, codes, el, sc, s_enc_rows, metric):
    """Σ|x − x̂| or Σ(x − x̂)² in float64, elements in order (four-over-six)."""
    tot = 0.0
    for (r, c), code in codes.items():
        d = float(x[r, c]) - float(_decoded(s_b, code, r, el, sc, s_enc_rows))
        tot += abs(d) if metric == "mae" else d * d
    return tot


def ref_two_level(
    x,
    elem="e2m1",
    scale="e4m3",
    block=(1, 16),
    tensor_scale=True,
    per_row=False,
    four_over_six=False,
    metric="mse",
    rounding="rne",
    rbits=None,
    seed=None,
    k=8,
    counter=0,
    ignore_nan=False,
):
    """NVFP4 (SPEC §4) on a 2-D float32 array: (codes (R, nb·BC), scale bytes (R, nb), amax, decoded (R, C))."""
    el, sc = get_format(elem), get_format(scale)
    x = np.asarray(x, np.float32)
    R, C = x.shape
    br, bc = block
    nb = -(-C // bc)
    codes = np.zeros((R, nb * bc), np.int64)
    scales = np.zeros((R, nb), np.int64)
    dec = np.zeros((R, C), np.float32)
    num = F32(el.max) * F32(256.0 if four_over_six else sc.max)
    with np.errstate(all="ignore"):
        if not tensor_scale:
            amax = F32(np.nan)
            s_enc_rows = [F32(1.0)] * R
        else:
            amax = [absmax(x[r], ignore_nan) for r in range(R)] if per_row else absmax(x.ravel(), ignore_nan)
            s_enc_rows = []
            for r in range(R):
                a = amax[r] if per_row else amax
                s = fmin(num / a, FLT_MAX)
                if a == 0 or s == 0:
                    s = F32(1.0)
                s_enc_rows.append(s)
        rnd = _rand_fn(rounding, rbits, seed, k, nb, bc, counter)
        for j, rows, cells in _tiles(R, C, br, bc):
            vmax = absmax([x[r, c] for r, c in cells], ignore_nan)
            s_enc = s_enc_rows[rows[0]]
            s_dec = F32(1.0) / s_enc

            def candidate(target, vmax=vmax, s_enc=s_enc, s_dec=s_dec, cells=cells, j=j):
                sdb = fmin(vmax * (s_enc * (F32(1.0) / F32(target))), F32(sc.max))
                s_b = code_of(sdb, sc, "rne", None, 0)
                enc = fmin(F32(1.0) / (value_of(s_b, sc) * s_dec), FLT_MAX)
                out = {}
                for r, c in cells:
                    out[r, c] = code_of(x[r, c] * enc, el, rounding, rnd(r, j, c - j * bc, c), k)
                return s_b, out

            s_b, cc = candidate(6.0 if four_over_six else el.max)
            if four_over_six:
                s4, c4 = candidate(4.0)
                err6 = _error(x, s_b, cc, el, sc, s_enc_rows, metric)
                if _error(x, s4, c4, el, sc, s_enc_rows, metric) < err6:
                    s_b, cc = s4, c4
            for r in rows:
                scales[r, j] = s_b
            for (r, c), code in cc.items():
                codes[r, c] = code
                dec[r, c] = _decoded(s_b, code, r, el, sc, s_enc_rows)
    amax = np.array(amax, np.float32)
    return codes, scales, amax, dec


def mx_exponent(amax, rule: str, el: FormatSpec) -> int:
    """E8M0 scale byte from the block amax under a rule (SPEC §5), via exact frexp."""
    if isnan(amax):
        return 0xFF
    if math.isinf(amax):
        return 0xFE
    if rule == "rceil":
        t = F32(amax) * (F32(1.0) / F32(el.max))  # fl(amax · fl(1/max))
        if t == 0:
            return 0
        m, e = math.frexp(float(t))  # t = m · 2^e, m in [0.5, 1)
        ex = e - 1 if m == 0.5 else e  # ceil(log2 t)
    else:
        if amax == 0:
            return 0
        a = float(amax)
        if rule == "even":  # amax rounded to mbits mantissa bits, half away from zero
            m, e = math.frexp(a)
            q = Fraction(1, 2 ** (el.mbits + 1))
            a = float(((Fraction(m) / q + Fraction(1, 2)) // 1) * q * Fraction(2) ** e)
        m, e = math.frexp(a)
        ex = e - 1 - el.emax  # floor(log2 a) − emax
        if rule == "ceil" and m != 0.5:
            ex += 1
    return min(max(ex, -127), 127) + 127


def ref_mx(
    x, elem="e2m1", rule="rceil", block=(1, 32), rounding="rne", rbits=None, seed=None, k=8, counter=0, ignore_nan=False
):
    """MX (SPEC §5) on a 2-D float32 array: (codes (R, nb·BC), scale bytes (R, nb), decoded (R, C))."""
    el = get_format(elem)
    x = np.asarray(x, np.float32)
    R, C = x.shape
    br, bc = block
    nb = -(-C // bc)
    codes = np.zeros((R, nb * bc), np.int64)
    scales = np.zeros((R, nb), np.int64)
    dec = np.zeros((R, C), np.float32)
    rnd = _rand_fn(rounding, rbits, seed, k, nb, bc, counter)
    with np.errstate(all="ignore"):
        for j, rows, cells in _tiles(R, C, br, bc):
            sb = mx_exponent(absmax([x[r, c] for r, c in cells], ignore_nan), rule, el)
            for r in rows:
                scales[r, j] = sb
            for r, c in cells:
                v = x[r, c]
                if sb == 0xFF:
                    code = el.nan_code
                elif isnan(v) or math.isinf(v):
                    code = code_of(v, el, rounding, rnd(r, j, c - j * bc, c), k)
                else:
                    sign = f32_bits(float(v)) >> 31
                    y = round_to_f32(abs(Fraction(float(v))) * Fraction(2) ** (127 - sb))  # exact, then fl32
                    yb = f32_bits(float(y)) | (sign << 31)
                    code = code_of(F32(f32_value(yb)), el, rounding, rnd(r, j, c - j * bc, c), k)
                codes[r, c] = code
                dec[r, c] = F32(np.nan) if sb == 0xFF else F32(float(ref_decode(code, el)) * 2.0 ** (sb - 127))
    return codes, scales, dec


def ref_fp32_blocks(x, elem="e4m3", block=(1, 128), ignore_nan=False):
    """Blockwise FP8 (SPEC §6): d = fl(amax / max), code = e(fl(x / d)); returns (codes, d (R, nb), decoded)."""
    el = get_format(elem)
    x = np.asarray(x, np.float32)
    R, C = x.shape
    br, bc = block
    nb = -(-C // bc)
    codes = np.zeros((R, nb * bc), np.int64)
    scales = np.zeros((R, nb), np.float32)
    dec = np.zeros((R, C), np.float32)
    with np.errstate(all="ignore"):
        for j, rows, cells in _tiles(R, C, br, bc):
            amax = absmax([x[r, c] for r, c in cells], ignore_nan)
            d = amax / F32(el.max)
            if not isnan(d) and (d == 0 or math.isinf(d)):
                d = F32(1.0)
            for r in rows:
                scales[r, j] = d
            for r, c in cells:
                codes[r, c] = code_of(x[r, c] / d, el, "rne", None, 0)
                dec[r, c] = value_of(codes[r, c], el) * d
    return codes, scales, dec
