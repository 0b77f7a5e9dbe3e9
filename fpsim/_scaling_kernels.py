"""Numba kernels of the block-scaled quantizers (SPEC §4–§6).  Private: :mod:`fpsim.scaling` is the API.

All kernels work on a 2-D float32 *bit-pattern* view ``X`` of shape (R, C): the
quantized axis is last, the leading axes are flattened into rows.  A block is a
tile of ``BR`` rows × ``BC`` columns (``BR`` = 1 for 1-D blocks); tiles past the
edge of ``X`` are zero-padded (padding never changes a block amax and encodes to
code 0), so no padded copy of the input is ever made.

Every ``fl(.)`` of SPEC §4 is one float32 operation: the arithmetic below is on
``np.float32`` scalars, and Numba's ``fastmath`` is off (see :mod:`fpsim._jit`),
so LLVM emits exactly one IEEE binary32 operation per ``*`` or ``/``.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit, pjit, prange
from ._kernels import RNE, RUP, bits_f32, encode_one, encode_one_sr, f32_bits, philox4x32_10, split_f32, stream_value
from .schemes import ScaleRule

FLT_MAX = np.float32(np.finfo(np.float32).max)
ABS_MASK = np.uint32(0x7FFFFFFF)
INF_BITS = np.uint32(0x7F800000)
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)

# 2**e as float64 for e in [-160, 160): exact powers of two for MX scales.
_P2 = 160
_POW2 = np.ldexp(1.0, np.arange(-_P2, _P2))

# Rows per parallel work item of the row kernels: their scratch buffers are allocated once per item.
ROWS = 16

# Scale-rule integers (fpsim.scaling.ScaleRule).
FLOOR, CEIL, EVEN, RCEIL = (r.rule_id for r in ScaleRule)


@njit(inline="always")
def fmin_nan(a, b):
    """min(a, b) for float32 that propagates a NaN ``a`` (a comparison with NaN is false)."""
    return b if a > b else a


@njit(inline="always")
def _abs_bits(u, ignore_nan):
    """|x| as bits, or 0 for a NaN when NaNs are ignored.

    Why bits: for non-negative floats the unsigned order of the bit patterns is
    the numeric order, and every NaN pattern is above +inf, so an integer max
    is a NaN-propagating float max (and skipping > 0x7F800000 is ``fmaxf``).
    """
    a = u & ABS_MASK
    if ignore_nan and a > INF_BITS:
        return np.uint32(0)
    return a


@pjit
def row_absmax_bits(X, ignore_nan, out):
    """out[r] = bits of max |X[r, :]| (NaN-propagating unless ``ignore_nan``)."""
    R, C = X.shape
    for r in prange(R):
        m = np.uint32(0)
        for c in range(C):
            a = _abs_bits(X[r, c], ignore_nan)
            if a > m:
                m = a
        out[r] = m


@njit
def encode_scale_factor(amax, num):
    """S_enc = min(fl(num / amax), FLT_MAX); 1 if amax == 0 or S_enc == 0; NaN amax → NaN (SPEC §4, §9)."""
    if amax != amax:
        return amax
    if amax == np.float32(0.0):
        return np.float32(1.0)
    s = fmin_nan(num / amax, FLT_MAX)
    if s == np.float32(0.0):
        return np.float32(1.0)
    return s


@njit
def tensor_scales(amax_rows, num, s_enc, s_dec):
    """Per-row S_enc and S_dec = fl(1 / S_enc) from per-row amax values."""
    for r in range(amax_rows.size):
        s = encode_scale_factor(amax_rows[r], num)
        s_enc[r] = s
        s_dec[r] = np.float32(1.0) / s


@njit
def lut_code(u, lut, shift):
    """RNE element code via the codec lookup table (see ``fpsim._kernels.encode_array_lut``)."""
    low = (np.uint32(1) << np.uint32(shift)) - np.uint32(1)
    key = ((u >> np.uint32(shift)) << np.uint32(1)) | np.uint32((u & low) != 0)
    return lut[key]


@njit(inline="always")
def _elem_code(y, lut, shift, ep, sr, r, k):
    """Element code of the float32 ``y``: RNE satfinite, or SR with random integer ``r``."""
    u = f32_bits(y)
    if sr:
        return np.uint8(encode_one_sr(u, ep, r, k))
    return np.uint8(lut_code(u, lut, shift))


@njit(inline="always")
def _store(out, r, c, code, packed):
    """Write one code; for 4-bit elements two per byte, element 2j in the low nibble."""
    if packed:
        if c & 1:
            out[r, c >> 1] = out[r, c >> 1] | np.uint8(code << 4)
        else:
            out[r, c >> 1] = np.uint8(code)
    else:
        out[r, c] = code


@njit(inline="always")
def _rand(words, t, per_call, width, kmask, rb, r, c, use_rb):
    """The k random bits of element t of a block: given (``rb``) or from this call's Philox words."""
    if use_rb:
        return np.int64(rb[r, c])
    return np.int64(stream_value(words, t % per_call, width) & kmask)


@njit(inline="always")
def _words(need, counter, k0, k1):
    """One Philox4x32-10 call (counter = block index · calls per block + call), or zeros when unused."""
    if need:
        c = np.uint64(counter)
        return philox4x32_10(c & _MASK32, c >> _S32, 0, 0, k0, k1)
    z = np.uint64(0)
    return z, z, z, z


@njit
def _tile_vmax(X, r0, r1, c0, c1, ignore_nan):
    R, C = X.shape
    m = np.uint32(0)
    for r in range(r0, min(r1, R)):
        for c in range(c0, min(c1, C)):
            a = _abs_bits(X[r, c], ignore_nan)
            if a > m:
                m = a
    return m


@njit
def _two_level_scale(vmax, s_enc_k, bound, sp, stable):
    """s_b and its value for one block: sdb = min(fl(vmax · fl(S_enc · fl(1/target))), bound)."""
    sdb = fmin_nan(vmax * s_enc_k, bound)
    sb = encode_one(f32_bits(sdb), sp, RNE, True)
    return sb, stable[sb]


@njit
def _tile_error(X, r0, r1, c0, c1, j, enc, sv, sd, etable, lut, shift, ep, sr, kbits, seq, metric, rb, use_rb):
    """Σ|x − x̂| (metric 1) or Σ(x − x̂)² (metric 2), in float64, of one tile for one candidate scale."""
    R, C = X.shape
    err = 0.0
    k0, k1, counter0, width, per_call, calls, nb = seq
    kmask = np.uint64((1 << kbits) - 1)
    for r in range(r0, min(r1, R)):
        bidx = r * nb + j
        for cc in range(calls):
            words = _words(sr and not use_rb, counter0 + bidx * calls + cc, k0, k1)
            for q in range(per_call):
                t = cc * per_call + q
                c = c0 + t
                if c >= min(c1, C):
                    break
                x = bits_f32(X[r, c])
                rr = _rand(words, t, per_call, width, kmask, rb, r, c, use_rb) if sr else np.int64(0)
                code = _elem_code(x * enc, lut, shift, ep, sr, rr, kbits)
                xh = (etable[code] * sv) * sd
                d = np.float64(x) - np.float64(xh)
                err += abs(d) if metric == 1 else d * d
    return err


@njit
def _encode_tile_rows(X, r0, r1, j, c0, BC, nb, op, f32k, f64k, lut, shift, ep, sr, kbits, seq, rb, use_rb, packed,
                      nan_code, nan_block, out):
    """Encode the elements of block column ``j`` for rows r0..r1-1 (the general, SR-capable path).

    The scaled element is ``op`` 0: fl(x · f32k), 1: fl32(x · f64k) (an exact power of two in float64),
    2: fl(x / f32k).  SR bits come from the Philox call of the row's block (SPEC §3) or from ``rb``;
    a NaN block (MX scale 0xFF) gives ``nan_code`` everywhere; columns past the tensor encode to 0.
    """
    C = X.shape[1]
    k0, k1, counter0, width, per_call, calls, _nb = seq
    kmask = np.uint64((1 << kbits) - 1)
    for r in range(r0, r1):
        bidx = r * nb + j
        for cc in range(calls):
            words = _words(sr and not use_rb, counter0 + bidx * calls + cc, k0, k1)
            for q in range(per_call):
                t = cc * per_call + q
                if t >= BC:
                    break
                c = c0 + t
                if c >= C:
                    code = np.uint8(0)
                elif nan_block:
                    code = np.uint8(nan_code)
                else:
                    rr = _rand(words, t, per_call, width, kmask, rb, r, c, use_rb) if sr else np.int64(0)
                    x = bits_f32(X[r, c])
                    if op == 0:
                        y = x * f32k
                    elif op == 1:
                        y = np.float32(np.float64(x) * f64k)
                    else:
                        y = x / f32k
                    code = _elem_code(y, lut, shift, ep, sr, rr, kbits)
                _store(out, r, c, code, packed)


@pjit
def quantize_two_level(
    X,
    BR,
    BC,
    s_enc,
    s_dec,
    inv_t,
    inv_t46,
    bound,
    sp,
    stable,
    ep,
    etable,
    lut,
    shift,
    sr,
    kbits,
    seq,
    rb,
    use_rb,
    fos_metric,
    ignore_nan,
    packed,
    out,
    scales,
):
    """NVFP4-style two-level quantization (SPEC §4), one fused pass per tile.

    Per tile: block amax, E4M3 (or other) scale in Transformer Engine's FP32
    order, encode every element (RNE via the codec LUT, or SR with Philox bits
    keyed by block index), pack, and store the scale on each of the tile's rows.
    ``fos_metric`` > 0 enables four-over-six (1 = MAE, 2 = MSE): candidate
    targets 6 and 4, the lower error wins, ties keep 6.
    """
    R, C = X.shape
    nb = scales.shape[1]
    ng = (R + BR - 1) // BR
    for tile in prange(ng * nb):
        g = tile // nb
        j = tile % nb
        r0 = g * BR
        r1 = min(r0 + BR, R)
        c0 = j * BC
        c1 = c0 + BC
        vmax = bits_f32(_tile_vmax(X, r0, r1, c0, c1, ignore_nan))
        se = s_enc[r0]
        sd = s_dec[r0]
        sb, sv = _two_level_scale(vmax, se * inv_t, bound, sp, stable)
        enc = fmin_nan(np.float32(1.0) / (sv * sd), FLT_MAX)
        if fos_metric > 0:
            sb4, sv4 = _two_level_scale(vmax, se * inv_t46, bound, sp, stable)
            enc4 = fmin_nan(np.float32(1.0) / (sv4 * sd), FLT_MAX)
            e6 = _tile_error(
                X, r0, r1, c0, c1, j, enc, sv, sd, etable, lut, shift, ep, sr, kbits, seq, fos_metric, rb, use_rb
            )
            e4 = _tile_error(
                X, r0, r1, c0, c1, j, enc4, sv4, sd, etable, lut, shift, ep, sr, kbits, seq, fos_metric, rb, use_rb
            )
            if e4 < e6:
                sb, sv, enc = sb4, sv4, enc4
        for r in range(r0, r1):
            scales[r, j] = sb
        _encode_tile_rows(X, r0, r1, j, c0, BC, nb, 0, enc, 1.0, lut, shift, ep, sr, kbits, seq, rb, use_rb, packed,
                          0, False, out)


@njit
def mx_scale_byte(m, rule, emax, mbits, inv_max, e8p):
    """E8M0 scale byte of a block with amax bits ``m`` under a scale rule (SPEC §5).

    Exponents come from the float32 fields (``split_f32`` normalises subnormal
    amax), never from a float log2, which is off by one just below a power of two.
    """
    if m > INF_BITS:
        return 0xFF  # NaN amax
    if m == INF_BITS:
        return 0xFE  # satfinite
    if rule == RCEIL:
        # cvt.rp.satfinite.ue8m0x2.f32 of fl(amax · fl(1/max_elem))
        t = bits_f32(m) * inv_max
        return encode_one(f32_bits(t), e8p, RUP, True)
    if m == 0:
        return 0  # log2(0) = -inf, clamped to -127
    sig, e = split_f32(np.int64(m))
    fl2 = e - 127  # floor(log2 amax)
    if rule == CEIL:
        if sig != 0x800000:  # not a power of two
            fl2 += 1
    elif rule == EVEN:
        # Round amax to the element's mantissa width (half up); only the carry
        # into the exponent matters, and at an exact half the kept bits are all
        # ones (odd), so half-up and half-even agree.
        if sig + (np.int64(1) << (22 - mbits)) >= 0x1000000:
            fl2 += 1
    ex = min(max(fl2 - emax, -127), 127)
    return ex + 127


@njit(inline="always")
def mx_scale_byte_fast(m, rule, emax, mbits, inv_max):
    """:func:`mx_scale_byte` without branches or table lookups, so that a loop over blocks vectorises.

    From the float32 fields of the amax: exponent E ≥ 1 gives floor(log2 amax) = E − 127, plus one for
    ceil (fraction ≠ 0) or even (the fraction's carry when rounded to the element's width); a subnormal
    amax is below 2^-126, so with emax ≥ 1 every rule clamps it to byte 0.  rceil: the byte is
    ceil(log2 t) + 127 of t = fl(amax · fl(1/max)), read off t's fields the same way (a subnormal t
    rounds up to 2^-127 or 2^-126).  NaN → 0xFF, inf → 0xFE.  Equal to :func:`mx_scale_byte` (tested).
    """
    m = np.uint32(m)
    if rule == RCEIL:
        m = f32_bits(bits_f32(m) * inv_max)
    e = np.int32(m >> np.uint32(23))
    frac = np.int32(m & np.uint32(0x7FFFFF))
    if rule == RCEIL:
        byte = e + np.int32(frac != 0) if e > 0 else np.int32(frac > 0x400000)
        byte = min(byte, np.int32(254))
    else:
        if rule == CEIL:
            inc = np.int32(frac != 0)
        elif rule == EVEN:
            inc = np.int32(frac + np.int32((1 << (22 - mbits)) & 0x7FFFFF) >= 0x800000)
        else:
            inc = np.int32(0)
        ex = min(max(e - np.int32(127) + inc - np.int32(emax), np.int32(-127)), np.int32(127))
        byte = ex + np.int32(127) if e > 0 else np.int32(0)
    return np.int32(0xFF) if m > INF_BITS else (np.int32(0xFE) if m == INF_BITS else byte)


@pjit
def quantize_mx(
    X,
    BR,
    BC,
    rule,
    emax,
    mbits,
    inv_max,
    e8p,
    ep,
    lut,
    shift,
    nan_code,
    sr,
    kbits,
    seq,
    rb,
    use_rb,
    ignore_nan,
    packed,
    out,
    scales,
):
    """MX quantization (SPEC §5): E8M0 scale from the block amax, elements fl32(x · 2^-E) then §2 satfinite.

    ``x · 2^-E`` is computed exactly in float64 (a power of two from a table)
    and rounded once to float32, which is exact unless the result is below
    float32's normal range, far under half the element's smallest subnormal.
    A NaN scale (NaN in the block amax) makes every element the NaN code.
    """
    R, C = X.shape
    nb = scales.shape[1]
    ng = (R + BR - 1) // BR
    for tile in prange(ng * nb):
        g = tile // nb
        j = tile % nb
        r0 = g * BR
        r1 = min(r0 + BR, R)
        c0 = j * BC
        m = _tile_vmax(X, r0, r1, c0, c0 + BC, ignore_nan)
        sb = mx_scale_byte(m, rule, emax, mbits, inv_max, e8p)
        p = _POW2[127 - sb + _P2]  # 2**(-E), E = sb - 127
        for r in range(r0, r1):
            scales[r, j] = sb
        _encode_tile_rows(X, r0, r1, j, c0, BC, nb, 1, np.float32(1.0), p, lut, shift, ep, sr, kbits, seq, rb, use_rb,
                          packed, nan_code, sb == 0xFF, out)


@pjit
def quantize_fp32_scaled(X, BR, BC, emax_f, ep, lut, shift, sr, kbits, seq, rb, use_rb, ignore_nan, packed, out,
                         scales):
    """Blockwise FP8 with FP32 scales (SPEC §6): d = fl(amax / max_elem), code = e(fl(x / d)).

    d = 1 where amax is 0 or inf or d underflows to 0 (mirroring §9's S_enc = 1); NaN amax gives d = NaN.
    ``packed``: 4-bit elements, two codes per byte (SPEC §4), as ``out`` is allocated for them.
    """
    R, C = X.shape
    nb = scales.shape[1]
    ng = (R + BR - 1) // BR
    for tile in prange(ng * nb):
        g = tile // nb
        j = tile % nb
        r0 = g * BR
        r1 = min(r0 + BR, R)
        c0 = j * BC
        amax = bits_f32(_tile_vmax(X, r0, r1, c0, c0 + BC, ignore_nan))
        d = fp32_block_scale(amax, emax_f)
        for r in range(r0, r1):
            scales[r, j] = d
        _encode_tile_rows(X, r0, r1, j, c0, BC, nb, 2, d, 1.0, lut, shift, ep, sr, kbits, seq, rb, use_rb, packed,
                          0, False, out)


@njit
def fp32_block_scale(amax, emax_f):
    """FP32 dequantization scale d = fl(amax / max_elem), with d = 1 for amax 0 / inf / underflow."""
    if amax != amax:
        return amax
    d = amax / emax_f
    if d == np.float32(0.0) or d > FLT_MAX:
        return np.float32(1.0)
    return d


# ---------------------------------------------------------------------------
# Decoders: one rounding per element, as SPEC §4 writes it.


@pjit
def dequantize_fp32_scaled(codes, scales, BC, etable, packed, out):
    """x̂ = fl(e(code) · d); ``packed``: 4-bit codes two per byte, element 2j in the low nibble."""
    R, C = out.shape
    for r in prange(R):
        for c in range(C):
            code = (codes[r, c >> 1] >> ((c & 1) * 4)) & 0xF if packed else codes[r, c]
            out[r, c] = etable[code] * scales[r, c // BC]
