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
from ._simd import absmax16, absmax16_nonan, e2m1_pack16, e2m1_unpack16, elem_rne16, table_decode16
from .schemes import ScaleRule

FLT_MAX = np.float32(np.finfo(np.float32).max)
_ABS = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)

# 2**e as float64 for e in [-160, 160): exact powers of two for MX scales.
_P2 = 160
_POW2 = np.ldexp(1.0, np.arange(-_P2, _P2))

# Rows per parallel work item of the row kernels: their scratch buffers are allocated once per item.
_ROWS = 16

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
    a = u & _ABS
    if ignore_nan and a > _INF_BITS:
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
def _lut_code(u, lut, shift):
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
    return np.uint8(_lut_code(u, lut, shift))


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
    if m > _INF_BITS:
        return 0xFF  # NaN amax
    if m == _INF_BITS:
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
    return np.int32(0xFF) if m > _INF_BITS else (np.int32(0xFE) if m == _INF_BITS else byte)


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
def quantize_fp32_scaled(X, BR, BC, emax_f, ep, lut, shift, sr, kbits, seq, rb, use_rb, ignore_nan, out, scales):
    """Blockwise FP8 with FP32 scales (SPEC §6): d = fl(amax / max_elem), code = e(fl(x / d)).

    d = 1 where amax is 0 or inf or d underflows to 0 (mirroring §9's S_enc = 1); NaN amax gives d = NaN.
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
        _encode_tile_rows(X, r0, r1, j, c0, BC, nb, 2, d, 1.0, lut, shift, ep, sr, kbits, seq, rb, use_rb, False,
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
def dequantize_fp32_scaled(codes, scales, BC, etable, out):
    """x̂ = fl(e(code) · d)."""
    R, C = out.shape
    for r in prange(R):
        for c in range(C):
            out[r, c] = etable[codes[r, c]] * scales[r, c // BC]


# ---------------------------------------------------------------------------
# Fast paths for the common case: RNE elements, no four-over-six.  Same
# arithmetic as the general kernels above (tested equal), restructured so the
# inner loops are straight-line over whole blocks: rows in chunks per parallel
# task, block scales by branch-free arithmetic, and blocks of a multiple of 16
# through the vector code of :mod:`fpsim._simd` (E2M1, FP8/FP6, amax, decode).
# Block and tile amaxes come from ``block_absmax_bits`` where a tensor amax is
# measured anyway (one read each pass, two in all).


@njit(inline="always")
def _seg_absmax(xr, c0, n, ignore_nan):
    """Bits of max |xr[c0:c0+n]| (NaN-propagating unless ``ignore_nan``)."""
    # Why the casts: Numba widens uint32 & uint32 to uint64 (half the SIMD lanes), and an unsigned index
    # skips the negative-index wraparound select that stops LLVM from seeing consecutive loads.
    m = np.uint32(0)
    if ignore_nan:
        for t in range(n):
            a = np.uint32(xr[np.uint64(c0 + t)] & _ABS)
            m = max(m, a if a <= _INF_BITS else np.uint32(0))
    else:
        for t in range(n):
            m = max(m, np.uint32(xr[np.uint64(c0 + t)] & _ABS))
    return m


@njit(inline="always")
def _row_absmax_n(xr, n, ignore_nan, vmax):
    C = xr.size
    full = C // n
    rm = np.uint32(0)
    for j in range(full):
        m = _seg_absmax(xr, j * n, n, ignore_nan)
        vmax[j] = m
        rm = max(rm, m)
    if full < vmax.size:
        m = _seg_absmax(xr, full * n, C - full * n, ignore_nan)
        vmax[full] = m
        rm = max(rm, m)
    return rm


@njit
def _blocks_absmax(xr, BC, full, ignore_nan, vmax):
    """vmax[j] = amax bits of xr[j·BC : j·BC + BC] for j < full (BC a multiple of 16); returns their max."""
    rm = np.uint32(0)
    for j in range(full):
        m = np.uint32(0)
        for k in range(j * BC, j * BC + BC, 16):
            m = max(m, absmax16_nonan(xr, k) if ignore_nan else absmax16(xr, k))
        vmax[j] = m
        rm = max(rm, m)
    return rm


@njit
def _row_block_absmax(X, r, BC, ignore_nan, vmax):
    """vmax[j] = amax bits of block j of row r (1 × BC blocks, the last one ragged); returns the row's amax bits.

    Blocks of a multiple of 16 take the vector code of :mod:`fpsim._simd` (an unsigned max over the
    sign-cleared bits, 89 % of a read-only pass on one thread; Numba's own loop of 16 compiles to scalar
    code at 70 %); the ragged last block and other sizes take the scalar loop.
    """
    xr = X[r]
    if BC % 16:
        return _row_absmax_n(xr, BC, ignore_nan, vmax)
    C = xr.size
    full = C // BC
    rm = _blocks_absmax(xr, BC, full, ignore_nan, vmax)  # memory-bound: a literal BC gains nothing (measured)
    if full < vmax.size:
        m = _seg_absmax(xr, full * BC, C - full * BC, ignore_nan)
        vmax[full] = m
        rm = max(rm, m)
    return rm


@pjit
def block_absmax_bits(X, BR, BC, ignore_nan, out, row_out):
    """out[g, j] = amax bits of tile (g, j) of BR × BC; row_out[g] = amax bits of tile row g (a row if BR = 1).

    The tensor amax is ``row_out.max()``: this pass replaces the tensor-amax pass
    and the block amax of the quantize pass, so the input is read twice in all.
    """
    R = X.shape[0]
    ng, nb = out.shape
    for g in prange(ng):
        if BR == 1:
            row_out[g] = _row_block_absmax(X, g, BC, ignore_nan, out[g])
            continue
        vmax = np.empty(nb, np.uint32)
        tm = out[g]
        tm[:] = 0
        rm = np.uint32(0)
        for r in range(g * BR, min(R, g * BR + BR)):
            rm = max(rm, _row_block_absmax(X, r, BC, ignore_nan, vmax))
            for j in range(nb):
                tm[j] = max(tm[j], vmax[j])
        row_out[g] = rm


_MAGIC = np.float32(12582912.0)  # 1.5 · 2**23: adding it rounds a float32 in [0, 2**22) to an integer (RNE)
_MAGIC_BITS = np.int32(0x4B400000)


@njit(inline="always")
def _e2m1_code(y):
    """E2M1 code of float32 ``y`` (RNE, satfinite, NaN → 7), branch-free so that LLVM vectorises the loop.

    The code magnitude is RNE(a·|y| + b) with (a, b) = (2, 0) below 2, (1, 2) on [2, 4) and (½, 4) above:
    consecutive codes are consecutive integers there and a code is even exactly when its mantissa bit is 0,
    so integer RNE is E2M1's RNE.  a·|y| is exact (a power of two) and the one float32 addition of
    b + 1.5·2^23 rounds it to an integer once.  Equal to the codec on every exponent class (tested).
    """
    u = np.int32(f32_bits(y))
    a = abs(y)
    c1 = a >= np.float32(2.0)
    c2 = a >= np.float32(4.0)
    sc = np.float32(0.5) if c2 else (np.float32(1.0) if c1 else np.float32(2.0))
    bm = np.float32(12582916.0) if c2 else (np.float32(12582914.0) if c1 else _MAGIC)
    c = min(np.int32(f32_bits(a * sc + bm)) - _MAGIC_BITS, np.int32(7))  # ≥ 8, ±inf and NaN → 7
    s = (u >> np.int32(28)) & np.int32(8)
    return c | (s if a == a else np.int32(0))


@njit(inline="always")
def _rne_parts(b, f, mbits, emin_b, qinv):
    """The two roundings behind :func:`_scale_rne` and :func:`_elem_rne`, for |x| with bits ``b`` and value ``f``.

    Normal range: the float32 bits rounded to ``mbits`` mantissa bits (the carry walks into the exponent),
    ``rb`` (the bits shifted down) and the code ``cn`` = rb less the exponent offset.  Below the smallest
    normal: ``t`` = f / quantum + 1.5·2^23, whose one float32 addition rounds f / quantum to the integer
    code ``k`` exactly once.  Returns (rb, cn, t, k); the caller selects with ``b < emin_b << 23``.
    """
    # Why the masks and casts: Numba types every integer operation as 64-bit; truncating each result and
    # keeping shift counts provably below 32 lets LLVM narrow the lanes back to 32 bits (8 per AVX2 op).
    sh = np.uint32((23 - mbits) & 31)
    half = np.uint32((np.uint32(1) << np.uint32((22 - mbits) & 31)) - np.uint32(1))
    rb = np.uint32(np.uint32(b + half + np.uint32((b >> sh) & np.uint32(1))) >> sh)
    cn = np.int32(np.int32(rb) - np.int32((emin_b - 1) << mbits))
    t = f * qinv + _MAGIC
    k = np.int32(np.int32(f32_bits(t)) - _MAGIC_BITS)
    return rb, cn, t, k


@njit(inline="always")
def _elem_rne(y, mbits, emin_b, qinv, max_code, nan_code, bits):
    """Satfinite RNE code of float32 ``y`` for a signed ≤ 8-bit format with subnormals, branch-free.

    :func:`_rne_parts` on |y| (clamped to inf), then saturation to ``max_code``, the sign, and
    ``nan_code`` for NaN (SPEC §2, NVIDIA's satfinite conversions).  Equal to the codec (tested).
    """
    u = f32_bits(y)
    a = np.uint32(min(np.uint32(u & _ABS), _INF_BITS))
    _, cn, _, k = _rne_parts(a, bits_f32(a), mbits, emin_b, qinv)
    mag = min(k if a < np.uint32(emin_b << 23) else cn, np.int32(max_code))
    s = np.int32(np.uint32(u >> np.uint32(31)) << np.uint32((bits - 1) & 31))
    return np.int32(nan_code) if np.uint32(u & _ABS) > _INF_BITS else np.int32(mag | s)


@njit(inline="always")
def _seg_encode(xr, c0, n, m, epath, ea, lut, shift, codes):
    """codes[c0 + t] = code of fl(xr[c0 + t] · m) for t < n; ``epath``: 1 E2M1, 2 :func:`_elem_rne`, 0 table."""
    if epath == 1:
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = _e2m1_code(bits_f32(xr[i]) * m)
    elif epath == 2:
        mb, emin_b, qinv, max_code, nan_code, bits = ea
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = _elem_rne(bits_f32(xr[i]) * m, mb, emin_b, qinv, max_code, nan_code, bits)
    else:
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = _lut_code(f32_bits(bits_f32(xr[i]) * m), lut, shift)


@njit(inline="always")
def _row_encode_n(xr, n, mul, epath, ea, lut, shift, codes):
    C = xr.size
    full = C // n
    for j in range(full):
        _seg_encode(xr, j * n, n, mul[j], epath, ea, lut, shift, codes)
    if full < mul.size:
        c0 = full * n
        _seg_encode(xr, c0, C - c0, mul[full], epath, ea, lut, shift, codes)
        codes[C:] = 0


@njit
def _row_codes(X, r, BC, mul, epath, ea, lut, shift, codes):
    """codes[c] = code of fl(X[r, c] · mul[c // BC]), 0 past the last column: the general row encoder.

    The hot cases (E2M1 and FP8/FP6 RNE elements in blocks of a multiple of 16) take the vector rows
    :func:`_row_e2m1` and :func:`_row_elem`; this one serves the rest (other rounding modes through the
    table, ragged block sizes), out of line and over a run-time block length to keep compile time down.
    ``codes`` is int32 scratch, narrowed once in :func:`_emit_row`.
    """
    _row_encode_n(X[r], BC, mul, epath, ea, lut, shift, codes)


@njit
def _emit_row(codes, packed, out, r):
    """Row r of the output: codes packed two per byte (element 2j in the low nibble), or copied."""
    if packed:
        for i in range(codes.size // 2):
            out[r, i] = np.uint8(codes[2 * i] | (codes[2 * i + 1] << np.int32(4)))
    else:
        for i in range(codes.size):
            out[r, i] = np.uint8(codes[i])


@njit(inline="always")
def _blocks_e2m1(xr, BC, full, mul, orow):
    """orow[c // 2] = the packed E2M1 codes of fl(xr[c] · mul[c // BC]) for c < full · BC (BC a multiple of 16)."""
    for j in range(full):
        m = mul[j]
        for k in range(j * BC, j * BC + BC, 16):
            e2m1_pack16(xr, k, m, orow, k // 2)


@njit
def _row_e2m1(X, r, BC, mul, codes, out):
    """Row r of packed E2M1 output, codes of fl(X[r, c] · mul[c // BC]), for blocks of a multiple of 16.

    The same bits as :func:`_row_codes` + :func:`_emit_row` (tested): whole blocks go through the vector
    encoder of :mod:`fpsim._simd`, which packs in registers; the ragged last block takes the scalar
    encoder through the ``codes`` scratch, zero past the last column.
    """
    xr = X[r]
    orow = out[r]
    C = xr.size
    full = C // BC
    if BC == 16:
        _blocks_e2m1(xr, 16, full, mul, orow)
    elif BC == 32:
        _blocks_e2m1(xr, 32, full, mul, orow)
    else:
        _blocks_e2m1(xr, BC, full, mul, orow)
    c0 = full * BC
    if c0 < C:
        n = 2 * orow.size - c0
        m = mul[full]
        for t in range(C - c0):
            codes[t] = _e2m1_code(bits_f32(xr[np.uint64(c0 + t)]) * m)
        codes[C - c0:n] = 0
        for i in range(n // 2):
            orow[c0 // 2 + i] = np.uint8(codes[2 * i] | (codes[2 * i + 1] << np.int32(4)))


@njit(inline="always")
def _blocks_elem(xr, BC, full, mul, ea, orow):
    for j in range(full):
        m = mul[j]
        for k in range(j * BC, j * BC + BC, 16):
            elem_rne16(xr, k, m, ea, orow, k)


@njit
def _row_elem(X, r, BC, mul, ea, out):
    """Row r of one-code-per-byte output, :func:`_elem_rne` codes of fl(X[r, c] · mul[c // BC]) (FP8/FP6).

    As :func:`_row_e2m1`: whole blocks (a multiple of 16) through the vector encoder of :mod:`fpsim._simd`,
    the ragged last block through the scalar one, codes 0 past the last column.
    """
    xr = X[r]
    orow = out[r]
    C = xr.size
    full = C // BC
    if BC == 16:
        _blocks_elem(xr, 16, full, mul, ea, orow)
    elif BC == 32:
        _blocks_elem(xr, 32, full, mul, ea, orow)
    else:
        _blocks_elem(xr, BC, full, mul, ea, orow)
    c0 = full * BC
    if c0 < C:
        mb, emin_b, qinv, max_code, nan_code, bits = ea
        m = mul[full]
        for t in range(C - c0):
            i = np.uint64(c0 + t)
            orow[i] = np.uint8(_elem_rne(bits_f32(xr[i]) * m, mb, emin_b, qinv, max_code, nan_code, bits))
        orow[C:] = 0


@njit
def _encode_row(X, r, BC, mul, epath, ea, lut, shift, packed, codes, out):
    """Row r of the output, codes of fl(X[r, c] · mul[c // BC]): the vector rows where they apply (E2M1
    packed or FP8/FP6 one per byte, blocks of a multiple of 16), else the general encoder and packing."""
    if BC % 16 == 0 and epath == 1 and packed:
        _row_e2m1(X, r, BC, mul, codes, out)
    elif BC % 16 == 0 and epath == 2 and not packed:
        _row_elem(X, r, BC, mul, ea, out)
    else:
        _row_codes(X, r, BC, mul, epath, ea, lut, shift, codes)
        _emit_row(codes, packed, out, r)


@njit(inline="always")
def _scale_rne(sdb, mbits, emin_b, qinv, q, nan_code):
    """(code, value) of the RNE scale of ``sdb`` ≥ 0 or NaN, for a scale format with subnormals, branch-free.

    The caller has clamped ``sdb`` to the format's max; the roundings are :func:`_rne_parts`, the value
    is the rounded bits (normal range) or k · quantum.  Equal to the codec's table on every input (tested).
    """
    # Selects only, 32-bit lanes (see _rne_parts): the loop over a row's blocks vectorises.
    b = f32_bits(sdb)
    rb, cn, t, k = _rne_parts(b, sdb, mbits, emin_b, qinv)
    vn = bits_f32(np.uint32(rb << np.uint32((23 - mbits) & 31)))
    vs = (t - _MAGIC) * q  # k · quantum, exact
    sub = b < np.uint32(emin_b << 23)
    nan = b > _INF_BITS
    code = np.int32(nan_code) if nan else (k if sub else cn)
    val = sdb if nan else (vs if sub else vn)
    return code, val


@njit(inline="always")
def _two_level_rows(r0, r1, X, BR, BC, s_enc, s_dec, inv_t, bound, slut, sshift, stable, lut, shift, ignore_nan,
                    packed, tmax, have_tmax, out, scales, epath, ea, sarith):
    """Rows r0..r1-1 of :func:`quantize_two_level_rne`.

    Inlined into its one caller (out of line it was 40 % slower while the element encoder was scalar code
    inlined here; with the vector rows the two measure the same).
    """
    nb = scales.shape[1]
    smb, semin, sqinv, sq, snan = sarith
    codes = np.empty(nb * BC, np.int32)
    vmax = np.empty(nb, np.uint32)
    enc = np.empty(nb, np.float32)
    for r in range(r0, r1):
        sek = s_enc[r] * inv_t
        sd = s_dec[r]
        vm = tmax[r // BR] if have_tmax else vmax
        if not have_tmax:
            _row_block_absmax(X, r, BC, ignore_nan, vmax)
        if smb > 0:  # arithmetic scale encode: the loop vectorises (no table lookups)
            for j in range(nb):
                sdb = fmin_nan(bits_f32(vm[j]) * sek, bound)
                sb, sv = _scale_rne(sdb, smb, semin, sqinv, sq, snan)
                scales[r, j] = np.uint8(sb)
                enc[j] = fmin_nan(np.float32(1.0) / (sv * sd), FLT_MAX)
        else:
            for j in range(nb):
                sdb = fmin_nan(bits_f32(vm[j]) * sek, bound)
                sb = _lut_code(f32_bits(sdb), slut, sshift)
                scales[r, j] = sb
                enc[j] = fmin_nan(np.float32(1.0) / (stable[sb] * sd), FLT_MAX)
        _encode_row(X, r, BC, enc, epath, ea, lut, shift, packed, codes, out)


@pjit
def quantize_two_level_rne(
    X, BR, BC, s_enc, s_dec, inv_t, bound, slut, sshift, stable, lut, shift, ignore_nan, packed, tmax, have_tmax,
    out, scales, epath, ea, sarith,
):
    """NVFP4-style quantization with RNE elements (SPEC §4), TE's FP32 operation order.

    Row by row, in L1: the block amax (from ``tmax``, the tile amax of
    :func:`block_absmax_bits`, when ``have_tmax``; else measured here), the
    block scales, then the element codes and the packing.
    """
    R = X.shape[0]
    for ci in prange(-(-R // _ROWS)):
        _two_level_rows(ci * _ROWS, min(R, ci * _ROWS + _ROWS), X, BR, BC, s_enc, s_dec, inv_t, bound, slut, sshift,
                        stable, lut, shift, ignore_nan, packed, tmax, have_tmax, out, scales, epath, ea, sarith)


@pjit
def quantize_mx_rne(X, BR, BC, rule, emax, mbits, inv_max, lut, shift, nan_code, ignore_nan, packed, tmax,
                    have_tmax, p2, out, scales, epath, ea):
    """MX quantization with RNE elements (SPEC §5): elements fl32(x · 2^-E), one exact-power multiply.

    ``p2[b]`` = 2**(127 − b) as float32 (exact for every scale byte b ≤ 0xFE),
    so ``x * p2[b]`` is the single rounding of the exact x · 2^-E.  A NaN
    scale (0xFF, NaN in the block) makes the block's elements the NaN code.
    """
    R, C = X.shape
    nb = scales.shape[1]
    nchunk = -(-R // _ROWS)
    for ci in prange(nchunk):
        vmax = np.empty(nb, np.uint32)
        mul = np.empty(nb, np.float32)
        codes = np.empty(nb * BC, np.int32)
        for r in range(ci * _ROWS, min(R, ci * _ROWS + _ROWS)):
            vm = tmax[r // BR] if have_tmax else vmax
            if not have_tmax:
                _row_block_absmax(X, r, BC, ignore_nan, vmax)
            nan_block = False
            for j in range(nb):
                sb = mx_scale_byte_fast(vm[j], rule, emax, mbits, inv_max)
                scales[r, j] = np.uint8(sb)
                mul[j] = p2[sb]
                nan_block |= sb == 0xFF
            if not nan_block:
                _encode_row(X, r, BC, mul, epath, ea, lut, shift, packed, codes, out)
                continue
            _row_codes(X, r, BC, mul, epath, ea, lut, shift, codes)
            if nan_block:
                for j in range(nb):
                    if scales[r, j] == 0xFF:
                        codes[j * BC:min(j * BC + BC, C)] = nan_code
            _emit_row(codes, packed, out, r)


@njit(inline="always")
def _unpack_row(codes, r, packed, C, buf):
    """buf[c] = code of element c of row r (int32 lanes; the inverse of :func:`_emit_row`)."""
    if packed:
        for i in range(C // 2):
            b = np.int32(codes[r, i])
            buf[2 * i] = b & np.int32(0xF)
            buf[2 * i + 1] = b >> np.int32(4)
        if C & 1:
            buf[C - 1] = np.int32(codes[r, C // 2]) & np.int32(0xF)
    else:
        for i in range(C):
            buf[i] = np.int32(codes[r, i])


@njit(inline="always")
def _e2m1_value(c):
    """Value of E2M1 code ``c`` (int32) as float32, from its bits: magnitude m ≥ 2 is (m + 252) << 22."""
    m = c & np.int32(7)
    v = ((m + np.int32(252)) << np.int32(22)) if m >= np.int32(2) else (
        np.int32(0x3F000000) if m == np.int32(1) else np.int32(0))
    return bits_f32(np.uint32(v | ((c & np.int32(8)) << np.int32(28))))


@njit(inline="always")
def _seg_dec(buf, c0, n, e2m1, etable, sv, sd, two, orow):
    """orow[c0 + t] = fl((e(code) · sv) · sd), or fl(e(code) · sv) when not ``two``, for t < n."""
    if e2m1:
        if two:
            for t in range(n):
                i = np.uint64(c0 + t)
                orow[i] = (_e2m1_value(buf[i]) * sv) * sd
        else:
            for t in range(n):
                i = np.uint64(c0 + t)
                orow[i] = _e2m1_value(buf[i]) * sv
    elif two:
        for t in range(n):
            i = np.uint64(c0 + t)
            orow[i] = (etable[buf[i]] * sv) * sd
    else:
        for t in range(n):
            i = np.uint64(c0 + t)
            orow[i] = etable[buf[i]] * sv


@njit(inline="always")
def _row_dec_n(buf, n, sval, e2m1, etable, sd, two, orow):
    C = orow.size
    full = C // n
    for j in range(full):
        _seg_dec(buf, j * n, n, e2m1, etable, sval[j], sd, two, orow)
    if full < sval.size:
        _seg_dec(buf, full * n, C - full * n, e2m1, etable, sval[full], sd, two, orow)


@njit
def _row_decode(buf, BC, sval, e2m1, etable, sd, two, out, r):
    """Row r of the output from its unpacked codes and per-block scale values: the general row decoder,
    for what the vector rows (:func:`_row_decode_e2m1`, :func:`_row_decode_bytes`) do not cover."""
    _row_dec_n(buf, BC, sval, e2m1, etable, sd, two, out[r])


@njit(inline="always")
def _blocks_e2m1_dec(crow, BC, full, sval, sd, orow):
    for j in range(full):
        sv = sval[j]
        for k in range(j * BC, j * BC + BC, 16):
            e2m1_unpack16(crow, k // 2, sv, sd, orow, k)


@njit
def _row_decode_e2m1(codes, r, BC, sval, sd, out):
    """out[r, c] = fl(fl(e(code) · sval[c // BC]) · sd) for packed E2M1 codes and blocks of a multiple of 16.

    Whole blocks go through the vector decoder of :mod:`fpsim._simd`; the ragged last block takes the
    scalar :func:`_e2m1_value`.  Equal to :func:`_unpack_row` + :func:`_row_decode` (tested).
    """
    crow = codes[r]
    orow = out[r]
    C = orow.size
    full = C // BC
    if BC == 16:
        _blocks_e2m1_dec(crow, 16, full, sval, sd, orow)
    elif BC == 32:
        _blocks_e2m1_dec(crow, 32, full, sval, sd, orow)
    else:
        _blocks_e2m1_dec(crow, BC, full, sval, sd, orow)
    if full < sval.size:
        sv = sval[full]
        for c in range(full * BC, C):
            code = (np.int32(crow[c >> 1]) >> np.int32(4 * (c & 1))) & np.int32(0xF)
            orow[c] = (_e2m1_value(code) * sv) * sd


@njit(inline="always")
def _blocks_table_dec(crow, BC, full, etable, sval, sd, orow):
    for j in range(full):
        sv = sval[j]
        for k in range(j * BC, j * BC + BC, 16):
            table_decode16(crow, k, etable, sv, sd, orow, k)


@njit
def _row_decode_bytes(codes, r, BC, etable, sval, sd, out):
    """out[r, c] = fl(fl(e(code) · sval[c // BC]) · sd) for one-code-per-byte rows (FP8/FP6 elements).

    Whole blocks (a multiple of 16) through the gathering decoder of :mod:`fpsim._simd`; the ragged last
    block through scalar table loads; ``etable`` covers all 256 byte values (:func:`fpsim.scaling._byte_table`).
    Equal to :func:`_unpack_row` + :func:`_row_decode` (tested).
    """
    crow = codes[r]
    orow = out[r]
    C = orow.size
    full = C // BC
    if BC == 32:
        _blocks_table_dec(crow, 32, full, etable, sval, sd, orow)
    else:
        _blocks_table_dec(crow, BC, full, etable, sval, sd, orow)
    if full < sval.size:
        sv = sval[full]
        for c in range(full * BC, C):
            orow[c] = (etable[crow[c]] * sv) * sd


@njit
def _decode_row(codes, r, BC, sval, e2m1, packed, etable, sd, two, buf, out):
    """Row r of the output: the vector rows where they apply (packed E2M1 or one-byte codes, blocks of a
    multiple of 16), else unpacking into ``buf`` and the general decoder.  MX passes sd = 1 (two = False):
    fl(fl(e · 2^k) · 1) = fl(e · 2^k), its one rounding."""
    if BC % 16 == 0 and e2m1 and packed:
        _row_decode_e2m1(codes, r, BC, sval, sd, out)
    elif BC % 16 == 0 and not packed:
        _row_decode_bytes(codes, r, BC, etable, sval, sd, out)
    else:
        _unpack_row(codes, r, packed, out.shape[1], buf)
        _row_decode(buf, BC, sval, e2m1, etable, sd, two, out, r)


@pjit
def dequantize_blocks_fast(codes, scales, BC, svtable, s_dec, two, etable, packed, out, e2m1):
    """x̂ = fl((e(code) · s_b) · S_dec[r]) with s_b = ``svtable[scale byte]``, row by row: two-level scales
    (E4M3 values, ``two``) or MX (``svtable[b]`` = 2**(b − 127), NaN for 0xFF; S_dec = 1, not ``two``)."""
    R, C = out.shape
    nb = scales.shape[1]
    nchunk = -(-R // _ROWS)
    for ci in prange(nchunk):
        buf = np.empty(C, np.int32)
        sval = np.empty(nb, np.float32)
        for r in range(ci * _ROWS, min(R, ci * _ROWS + _ROWS)):
            for j in range(nb):
                sval[j] = svtable[scales[r, j]]
            _decode_row(codes, r, BC, sval, e2m1, packed, etable, s_dec[r], two, buf, out)
