"""Numba row kernels of block scaling: the fast paths for RNE elements without four-over-six (docs/spec.md §4–§5).

Same arithmetic as the general kernels of :mod:`fpsim._scaling_kernels` (tested equal), restructured so the
inner loops are straight-line over whole blocks: rows in chunks per parallel
task, block scales by branch-free arithmetic, and blocks of a multiple of 16
through the vector code of :mod:`fpsim._simd` (E2M1, FP8/FP6, amax, decode).
Block and tile amaxes come from ``block_absmax_bits`` where a tensor amax is
measured anyway (one read each pass, two in all).
"""

from __future__ import annotations

import numpy as np

from ._jit import njit, pjit, prange
from ._kernels import bits_f32, f32_bits
from ._scaling_kernels import ABS_MASK, FLT_MAX, INF_BITS, ROWS, fmin_nan, lut_code, mx_scale_byte_fast
from ._simd import absmax16, absmax16_nonan, e2m1_pack16, e2m1_unpack16, elem_rne16, table_decode16


@njit(inline="always")
def _seg_absmax(xr, c0, n, ignore_nan):
    """Bits of max |xr[c0:c0+n]| (NaN-propagating unless ``ignore_nan``)."""
    # Why the casts: Numba widens uint32 & uint32 to uint64 (half the SIMD lanes), and an unsigned index
    # skips the negative-index wraparound select that stops LLVM from seeing consecutive loads.
    m = np.uint32(0)
    if ignore_nan:
        for t in range(n):
            a = np.uint32(xr[np.uint64(c0 + t)] & ABS_MASK)
            m = max(m, a if a <= INF_BITS else np.uint32(0))
    else:
        for t in range(n):
            m = max(m, np.uint32(xr[np.uint64(c0 + t)] & ABS_MASK))
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
def e2m1_code(y):
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
    """The two roundings behind :func:`scale_rne` and :func:`elem_rne`, for |x| with bits ``b`` and value ``f``.

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
def elem_rne(y, mbits, emin_b, qinv, max_code, nan_code, bits):
    """Satfinite RNE code of float32 ``y`` for a signed ≤ 8-bit format with subnormals, branch-free.

    :func:`_rne_parts` on |y| (clamped to inf), then saturation to ``max_code``, the sign, and
    ``nan_code`` for NaN (SPEC §2, NVIDIA's satfinite conversions).  Equal to the codec (tested).
    """
    u = f32_bits(y)
    a = np.uint32(min(np.uint32(u & ABS_MASK), INF_BITS))
    _, cn, _, k = _rne_parts(a, bits_f32(a), mbits, emin_b, qinv)
    mag = min(k if a < np.uint32(emin_b << 23) else cn, np.int32(max_code))
    s = np.int32(np.uint32(u >> np.uint32(31)) << np.uint32((bits - 1) & 31))
    return np.int32(nan_code) if np.uint32(u & ABS_MASK) > INF_BITS else np.int32(mag | s)


@njit(inline="always")
def _seg_encode(xr, c0, n, m, epath, ea, lut, shift, codes):
    """codes[c0 + t] = code of fl(xr[c0 + t] · m) for t < n; ``epath``: 1 E2M1, 2 :func:`elem_rne`, 0 table."""
    if epath == 1:
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = e2m1_code(bits_f32(xr[i]) * m)
    elif epath == 2:
        mb, emin_b, qinv, max_code, nan_code, bits = ea
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = elem_rne(bits_f32(xr[i]) * m, mb, emin_b, qinv, max_code, nan_code, bits)
    else:
        for t in range(n):
            i = np.uint64(c0 + t)
            codes[i] = lut_code(f32_bits(bits_f32(xr[i]) * m), lut, shift)


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
            codes[t] = e2m1_code(bits_f32(xr[np.uint64(c0 + t)]) * m)
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
    """Row r of one-code-per-byte output, :func:`elem_rne` codes of fl(X[r, c] · mul[c // BC]) (FP8/FP6).

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
            orow[i] = np.uint8(elem_rne(bits_f32(xr[i]) * m, mb, emin_b, qinv, max_code, nan_code, bits))
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
def scale_rne(sdb, mbits, emin_b, qinv, q, nan_code):
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
    nan = b > INF_BITS
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
                sb, sv = scale_rne(sdb, smb, semin, sqinv, sq, snan)
                scales[r, j] = np.uint8(sb)
                enc[j] = fmin_nan(np.float32(1.0) / (sv * sd), FLT_MAX)
        else:
            for j in range(nb):
                sdb = fmin_nan(bits_f32(vm[j]) * sek, bound)
                sb = lut_code(f32_bits(sdb), slut, sshift)
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
    for ci in prange(-(-R // ROWS)):
        _two_level_rows(ci * ROWS, min(R, ci * ROWS + ROWS), X, BR, BC, s_enc, s_dec, inv_t, bound, slut, sshift,
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
    nchunk = -(-R // ROWS)
    for ci in prange(nchunk):
        vmax = np.empty(nb, np.uint32)
        mul = np.empty(nb, np.float32)
        codes = np.empty(nb * BC, np.int32)
        for r in range(ci * ROWS, min(R, ci * ROWS + ROWS)):
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
def e2m1_value(c):
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
                orow[i] = (e2m1_value(buf[i]) * sv) * sd
        else:
            for t in range(n):
                i = np.uint64(c0 + t)
                orow[i] = e2m1_value(buf[i]) * sv
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


@njit(inline="always")
def _blocks_e2m1_dec(crow, BC, full, sval, sd, orow):
    for j in range(full):
        sv = sval[j]
        for k in range(j * BC, j * BC + BC, 16):
            e2m1_unpack16(crow, k // 2, sv, sd, orow, k)


@njit
def _decode_e2m1_into(crow, BC, sval, sd, orow):
    """orow[c] = fl(fl(e(code) · sval[c // BC]) · sd) for a row of packed E2M1 codes ``crow`` and blocks of a
    multiple of 16.

    Whole blocks go through the vector decoder of :mod:`fpsim._simd`; the ragged last block takes the
    scalar :func:`e2m1_value`.  Equal to :func:`_unpack_row` + :func:`_row_dec_n` (tested).
    """
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
            orow[c] = (e2m1_value(code) * sv) * sd


@njit(inline="always")
def _blocks_table_dec(crow, BC, full, etable, sval, sd, orow):
    for j in range(full):
        sv = sval[j]
        for k in range(j * BC, j * BC + BC, 16):
            table_decode16(crow, k, etable, sv, sd, orow, k)


@njit
def _decode_bytes_into(crow, BC, etable, sval, sd, orow):
    """orow[c] = fl(fl(e(code) · sval[c // BC]) · sd) for a row of one-code-per-byte ``crow`` (FP8/FP6 elements).

    Whole blocks (a multiple of 16) through the gathering decoder of :mod:`fpsim._simd`; the ragged last
    block through scalar table loads; ``etable`` covers all 256 byte values (:func:`fpsim.scaling.byte_table`).
    Equal to :func:`_unpack_row` + :func:`_row_dec_n` (tested).
    """
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
def decode_row_into(codes, r, BC, sval, e2m1, packed, etable, sd, two, buf, orow):
    """Row r of ``codes`` decoded into the float32 row ``orow``: the vector rows where they apply (packed E2M1 or
    one-byte codes, blocks of a multiple of 16), else unpacking into ``buf`` and the general decoder.  MX passes
    sd = 1 (two = False): fl(fl(e · 2^k) · 1) = fl(e · 2^k), its one rounding.  ``sval``: the row's block scale
    values.  The decoder of :func:`dequantize_blocks_fast` and of the analysis' fused error sums."""
    if BC % 16 == 0 and e2m1 and packed:
        _decode_e2m1_into(codes[r], BC, sval, sd, orow)
    elif BC % 16 == 0 and not packed:
        _decode_bytes_into(codes[r], BC, etable, sval, sd, orow)
    else:
        _unpack_row(codes, r, packed, orow.size, buf)
        _row_dec_n(buf, BC, sval, e2m1, etable, sd, two, orow)


@pjit
def dequantize_blocks_fast(codes, scales, BC, svtable, s_dec, two, etable, packed, out, e2m1):
    """x̂ = fl((e(code) · s_b) · S_dec[r]) with s_b = ``svtable[scale byte]``, row by row: two-level scales
    (E4M3 values, ``two``) or MX (``svtable[b]`` = 2**(b − 127), NaN for 0xFF; S_dec = 1, not ``two``)."""
    R, C = out.shape
    nb = scales.shape[1]
    nchunk = -(-R // ROWS)
    for ci in prange(nchunk):
        buf = np.empty(C, np.int32)
        sval = np.empty(nb, np.float32)
        for r in range(ci * ROWS, min(R, ci * ROWS + ROWS)):
            for j in range(nb):
                sval[j] = svtable[scales[r, j]]
            decode_row_into(codes, r, BC, sval, e2m1, packed, etable, s_dec[r], two, buf, out[r])
