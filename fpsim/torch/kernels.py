"""Fused Triton kernels for block quantization on CUDA (issue 8): one pass per tensor, bit-identical to Numba.

Imported only by :mod:`fpsim.torch.backend` when Triton is importable.  Every kernel
works on float32 *bit patterns* in int32 registers; the only float operations are
the multiplications of SPEC §4–§5 (``fl(vmax · sek)``, ``fl(x · enc_b)``,
``fl(x · 2^-E)``, ``fl((e · s_b) · S_dec)``), each a single IEEE ``mul.rn.f32``
(where a product feeds an addition it is exact, a sign flip of the random Hadamard
transform, so FMA contraction cannot change a bit).
The divisions of the NVFP4 recipe (S_enc = 2688/amax, S_dec = 1/S_enc and
enc_b = 1/(s_b · S_dec)) use ``tl.math.div_rn`` (PTX ``div.rn.f32``, IEEE): Triton's
``/`` lowers to ``div.full.f32``, up to 2 ulp off (triton-lang/triton#10661).  Each
program derives S_enc and S_dec from the amax itself, so a quantization is one
launch after the amax pass, with no host-side arithmetic between them.

The element encoder :func:`_encode_rne_fast` rounds to nearest even with saturation for
any format with subnormals (an integer carry trick for normals, a float32 magic-number
addition for subnormals; every format is checked against the codec on all float32
exponent classes);
:func:`_e8m0_byte` is the MX scale byte under the four rules of SPEC §5.
Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (the CPU tests).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _e2m1_rne(y):
    """E2M1 code of float32 ``y`` (RNE, satfinite, NaN → 7), the short form of :func:`_encode_rne_fast` for E2M1.

    |y| ≥ 1: round the float32 to one mantissa bit with the integer carry trick (the exponent carries
    into the code); |y| < 1: the code is RNE(2|y|) ∈ {0, 1, 2}, by the float32 magic-number addition.
    """
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    ac = tl.minimum(a, 0x41000000)  # ≥ 8, inf and NaN all saturate to code 7
    hi = tl.minimum(((ac + 0x1FFFFF + ((ac >> 22) & 1)) >> 22) - 252, 7)
    lo = ((a.to(tl.float32, bitcast=True) * 2.0 + 12582912.0).to(tl.int32, bitcast=True)) - 0x4B400000
    s = tl.where(a > 0x7F800000, 0, (u >> 28) & 8)
    return tl.where(a < 0x3F800000, lo, hi) | s


@triton.jit
def _encode_rne_fast(y, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                     SIGN_SHIFT: tl.constexpr):
    """RNE satfinite code of float32 ``y`` for any format with subnormals (fpsim._kernels._encode_branchfree's
    codes in about half the integer operations; the same two-region scheme as :func:`_e2m1_rne`).

    Normal range: round the float32 to MBITS mantissa bits with the integer carry trick, then rebias the
    exponent; subnormal range: code = RNE(|y| · 2^(127 + MBITS − EMIN_B)) by the magic-number addition.
    """
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    SH: tl.constexpr = 23 - MBITS
    ac = tl.minimum(a, 0x7F000000)  # far above every format's max: no int32 overflow; inf saturates
    hi = ((ac + ((1 << (SH - 1)) - 1) + ((ac >> SH) & 1)) >> SH) - ((EMIN_B - 1) << MBITS)
    hi = tl.minimum(hi, MAX_CODE)
    P: tl.constexpr = 2.0 ** (127 + MBITS - EMIN_B)
    lo = ((a.to(tl.float32, bitcast=True) * P + 12582912.0).to(tl.int32, bitcast=True)) - 0x4B400000
    code = tl.where(a < (EMIN_B << 23), lo, hi) | (((u >> 31) & 1) << SIGN_SHIFT)
    return tl.where(a > 0x7F800000, NAN_CODE, code)


@triton.jit
def _e8m0_byte(m, inv_max, RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr):
    """E8M0 scale byte of a block with amax bits ``m`` (fpsim._scaling_kernels.mx_scale_byte).

    RULE 0 floor, 1 ceil, 2 even, 3 rceil (``cvt.rp.satfinite.ue8m0`` of fl(amax · fl(1/max))).
    A subnormal amax gives byte 0 under floor/ceil/even: its exponent is below −127 + emax.
    """
    e = m >> 23
    mant = m & 0x7FFFFF
    if RULE == 3:
        t = (m.to(tl.float32, bitcast=True) * inv_max).to(tl.int32, bitcast=True)
        te = t >> 23
        tm = t & 0x7FFFFF
        b = tl.where(te >= 1, te + (tm != 0).to(tl.int32), (t > 0x400000).to(tl.int32))
        b = tl.minimum(b, 254)
    else:
        fl2 = e - 127
        if RULE == 1:
            fl2 += (mant != 0).to(tl.int32)
        elif RULE == 2:
            fl2 += ((mant | 0x800000) + (1 << (22 - MBITS)) >= 0x1000000).to(tl.int32)
        b = tl.minimum(tl.maximum(fl2 - EMAX, -127), 127) + 127
        b = tl.where(e == 0, 0, b)
    b = tl.where(m == 0x7F800000, 254, b)
    return tl.where(m > 0x7F800000, 255, b)


@triton.jit
def _e2m1_value(c):
    """float32 value of an E2M1 code (0–15): exact, from bits."""
    m = c & 7
    e = m >> 1
    f = m & 1
    bits = tl.where(e == 0, f * 0x3F000000, ((e + 126) << 23) | (f << 22))
    return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_value(sb):
    """float32 value of an E4M3 byte 0–127 (127 = NaN): exact, from bits."""
    sv = tl.where((sb >> 3) == 0, (sb & 7).to(tl.float32) * 0.001953125,
                  ((((sb >> 3) + 120) << 23) | ((sb & 7) << 20)).to(tl.float32, bitcast=True))
    return tl.where(sb == 127, float("nan"), sv)


@triton.jit
def _pack_words(code, BB: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """[BB, N] codes → [BB, N·BITS/32] little-endian int32 words (code i at bit BITS·(i mod 32/BITS)).

    Four-bit codes pack as fpsim.pack_fp4 does (element 2j in the low nibble of byte j); stores of
    whole words are what lets a program write its contiguous output at full bandwidth.
    """
    K: tl.constexpr = 32 // BITS
    c3 = tl.reshape(code, [BB, N // K, K])
    return tl.sum(c3 << (tl.arange(0, K) * BITS)[None, None, :], axis=2)


@triton.jit
def _unpack_words(w, BB: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`_pack_words`: [BB, N·BITS/32] int32 words → [BB, N] codes."""
    K: tl.constexpr = 32 // BITS
    c3 = (w[:, :, None] >> (tl.arange(0, K) * BITS)[None, None, :]) & ((1 << BITS) - 1)
    return tl.reshape(c3, [BB, N])


@triton.jit
def _canonical_nan(v):
    """NaN results as the reference's canonical 0x7FC00000 (GPU arithmetic makes 0x7FFFFFFF)."""
    return tl.where(v != v, 0x7FC00000, v.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def _nvfp4_tensor_scales(amax_ptr, NUM: tl.constexpr):
    """(S_enc, S_dec) from the float32 amax at ``amax_ptr`` (SPEC §4; fpsim._scaling_kernels.encode_scale_factor)."""
    amax = tl.load(amax_ptr)
    s = tl.math.div_rn(NUM, amax)
    s = tl.where(s > 3.4028234663852886e38, 3.4028234663852886e38, s)  # fmin_nan: NaN amax → NaN
    s = tl.where((amax == 0.0) | (s == 0.0), 1.0, s)
    return s, tl.math.div_rn(1.0, s)


@triton.jit
def _store_f32_or_bf16(ptr, v, mask, OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr):
    """Store float32 ``v``, or its RNE BFloat16 bits (NaN → 0x7FC0, as c10's conversion) into an int16 view.

    HW_CVT: the GPU's ``cvt.rn.bf16.f32`` with NaN replaced; otherwise the rounding spelled out in
    integer arithmetic (the interpreter's cast truncates).  Both give the same bits.
    """
    if OUT_BF16:
        if HW_CVT:
            r = v.to(tl.bfloat16).to(tl.int16, bitcast=True)
            r = tl.where(v != v, 0x7FC0, r.to(tl.int32)).to(tl.int16)
        else:
            b = v.to(tl.int32, bitcast=True)
            r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
            r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, r).to(tl.int16)
        tl.store(ptr, r, mask=mask)
    else:
        tl.store(ptr, v, mask=mask)


@triton.jit
def absmax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, IGNORE_NAN: tl.constexpr):
    """atomic max of |x| bits into ``out_ptr`` (int32, zeroed): NaN bits exceed inf's, so NaN propagates."""
    base = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        if IGNORE_NAN:
            a = tl.where(a > 0x7F800000, 0, a)
        acc = tl.maximum(acc, a)
    tl.atomic_max(out_ptr, tl.max(acc, axis=0))


@triton.jit
def tile_absmax_kernel(x_ptr, out_ptr, R, C, NB, TR: tl.constexpr, BW: tl.constexpr, BB: tl.constexpr,
                       IGNORE_NAN: tl.constexpr):
    """|x| bits max over BW-wide, TR-tall tiles: out[tile_row, block] (int32)."""
    tr = tl.program_id(0)
    bc = tl.program_id(1) * BB + tl.arange(0, BB)
    j = tl.arange(0, BW)
    col = bc[:, None] * BW + j[None, :]
    acc = tl.zeros([BB, BW], tl.int32)
    for i in tl.static_range(TR):
        row = tr * TR + i
        m = (col < C) & (col * 0 + row < R)
        a = tl.load(x_ptr + row.to(tl.int64) * C + col, mask=m, other=0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        if IGNORE_NAN:
            a = tl.where(a > 0x7F800000, 0, a)
        acc = tl.maximum(acc, a)
    tl.store(out_ptr + tr * NB + bc, tl.max(acc, axis=1), mask=bc < NB)


@triton.jit
def _block_offsets(pid, NB, C, NBLK, BB: tl.constexpr, W: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr):
    """Global block ids ``g`` of a program, the element offsets of its [BB, W] tile, and their masks.

    EVEN (C a multiple of W): the tile is the contiguous run g·W … g·W + W − 1 (no division per block,
    no ragged mask); otherwise rows are located by g // NB and the columns past C are masked.
    """
    if IDX64:
        g = pid.to(tl.int64) * BB + tl.arange(0, BB)
    else:
        g = pid * BB + tl.arange(0, BB)
    gm = g < NBLK
    j = tl.arange(0, W)
    if EVEN:
        offs = g[:, None] * W + j[None, :]
        m = gm[:, None] & (j[None, :] < W)
    else:
        row = g // NB
        col = (g - row * NB)[:, None] * W + j[None, :]
        offs = row[:, None] * C + col
        m = gm[:, None] & (col < C)
    return g, gm, offs, m


@triton.jit
def _block_vmax(x, g, gm, tmax_ptr, NB, TR: tl.constexpr, TILE: tl.constexpr, IGNORE_NAN: tl.constexpr):
    """|x| bits max of each block row of the [BB, W] tile ``x`` (NaN bits exceed inf's: NaN propagates unless
    IGNORE_NAN), or with TILE the precomputed amax of its TR-row tile from ``tmax``."""
    if TILE:
        row = g // NB
        return tl.load(tmax_ptr + (row // TR) * NB + (g - row * NB), mask=gm, other=0)
    a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if IGNORE_NAN:
        a = tl.where(a > 0x7F800000, 0, a)
    return tl.max(a, axis=1)


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def nvfp4_quant_kernel(x_ptr, q_ptr, s_ptr, f_ptr, tmax_ptr, amax_ptr, R, C, NB, NBLK, k0, k1, counter0,
                       BB: tl.constexpr, TILE: tl.constexpr, FAKE: tl.constexpr, IGNORE_NAN: tl.constexpr,
                       EVEN: tl.constexpr, IDX64: tl.constexpr, SR: tl.constexpr = False, K: tl.constexpr = 8,
                       WIDTH: tl.constexpr = 8):
    """NVFP4 (E2M1 elements, E4M3 block scales, TE's operation order, RNE) on BB blocks of 16.

    sdb = min(fl(vmax · fl(S_enc · fl(1/6))), 448); s_b = e4m3(sdb); enc_b = min(fl(1 / fl(f32(s_b) · S_dec)),
    FLT_MAX); code = e2m1(fl(x · enc_b)).  TILE: the block amax comes from ``tmax`` (16×16 tiles).
    FAKE: write the decoded float32 values ``fl((e · s_b) · S_dec)`` to ``f_ptr`` instead of codes and scales.
    SR: stochastic rounding of the elements with K-bit values of the CPU quantizer's Philox stream.
    """
    g, gm, offs, m = _block_offsets(tl.program_id(0), NB, C, NBLK, BB, 16, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    vmax = _block_vmax(x, g, gm, tmax_ptr, NB, 16, TILE, IGNORE_NAN)
    s_enc, s_dec = _nvfp4_tensor_scales(amax_ptr, 2688.0)
    sdb = vmax.to(tl.float32, bitcast=True) * (s_enc * 0.1666666716337204)  # fl(1/6) = 0x3E2AAAAB
    sdb = tl.where(sdb > 448.0, 448.0, sdb)  # fmin_nan: a NaN stays NaN
    sb = _encode_rne_fast(sdb, 3, 121, 126, 127, 7)  # E4M3 byte of sdb ≥ 0 (NaN → 0x7F)
    sv = _e4m3_value(sb)
    enc = tl.math.div_rn(tl.full([BB], 1.0, tl.float32), sv * s_dec)
    enc = tl.where(enc > 3.4028234663852886e38, 3.4028234663852886e38, enc)
    if SR:
        rb = _sr_bits(g, counter0, k0.to(tl.uint32), k1.to(tl.uint32), BB, 16, K, WIDTH)
        code = tl.where(m, _encode_sr(x * enc[:, None], rb, K, 1, 127, 7, 7, 3), 0)
    else:
        code = _e2m1_rne(x * enc[:, None])
        if not EVEN:  # padding past C encodes to 0 (whole blocks have none)
            code = tl.where(m, code, 0)
    if FAKE:
        v = _canonical_nan((_e2m1_value(code) * sv[:, None]) * s_dec)
        tl.store(f_ptr + offs, v, mask=m)
    else:
        tl.store(q_ptr + g[:, None] * 2 + tl.arange(0, 2)[None, :], _pack_words(code, BB, 16, 4), mask=gm[:, None])
        tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def nvfp4_dequant_kernel(q_ptr, s_ptr, amax_ptr, out_ptr, C, NB, NBLK, BB: tl.constexpr,
                         APPLY_SDEC: tl.constexpr, OUT_BF16: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr,
                         HW_CVT: tl.constexpr):
    """x̂ = fl((e · f32(s_b)) · S_dec) (or the exact e · s_b without S_dec), to ``out_ptr``'s dtype."""
    g, gm, offs, m = _block_offsets(tl.program_id(0), NB, C, NBLK, BB, 16, EVEN, IDX64)
    w = tl.load(q_ptr + g[:, None] * 2 + tl.arange(0, 2)[None, :], mask=gm[:, None], other=0)
    sv = _e4m3_value(tl.load(s_ptr + g, mask=gm, other=0).to(tl.int32))[:, None]
    v = _e2m1_value(_unpack_words(w, BB, 16, 4)) * sv
    if APPLY_SDEC:
        _, s_dec = _nvfp4_tensor_scales(amax_ptr, 2688.0)
        v = v * s_dec
    _store_f32_or_bf16(out_ptr + offs, _canonical_nan(v), m, OUT_BF16, HW_CVT)


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def mx_quant_kernel(x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, tmax_ptr, inv_max, R, C, NB, NBLK,
                    BB: tl.constexpr, RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                    EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                    PACK4: tl.constexpr, TILE: tl.constexpr, FAKE: tl.constexpr, IGNORE_NAN: tl.constexpr,
                    EVEN: tl.constexpr, IDX64: tl.constexpr, k0=0, k1=0, counter0=0, SR: tl.constexpr = False,
                    K: tl.constexpr = 8, WIDTH: tl.constexpr = 8):
    """MX (E8M0 scales, blocks of 32): scale byte by RULE, elements fl(x · 2^(127−b)) RNE satfinite
    (SR: stochastically rounded with the CPU quantizer's Philox stream).

    A NaN block (byte 0xFF) takes the element NaN code; padding past C is code 0.
    FAKE: write ``fl(e · 2^(b−127))`` (``dec`` = the element decode table) to ``f_ptr``.
    """
    g, gm, offs, m = _block_offsets(tl.program_id(0), NB, C, NBLK, BB, 32, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    vmax = _block_vmax(x, g, gm, tmax_ptr, NB, 32, TILE, IGNORE_NAN)
    sb = _e8m0_byte(vmax, inv_max, RULE, EMAX, MBITS)
    ex = 127 - sb  # 2^ex, exact float32 (2^-127 is subnormal)
    mul = tl.where(ex >= -126, (ex + 127) << 23, 0x00400000).to(tl.float32, bitcast=True)
    y = x * mul[:, None]
    if SR:
        rb = _sr_bits(g, counter0, k0.to(tl.uint32), k1.to(tl.uint32), BB, 32, K, WIDTH)
        code = _encode_sr(y, rb, K, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    elif MBITS == 1 and MAX_CODE == 7:
        code = _e2m1_rne(y)
    else:
        code = _encode_rne_fast(y, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    code = tl.where((sb == 255)[:, None], NAN_CODE, code)
    code = tl.where(m, code, 0)
    if FAKE:
        back = tl.where(sb >= 1, sb << 23, 0x00400000).to(tl.float32, bitcast=True)
        back = tl.where(sb == 255, float("nan"), back)
        v = _canonical_nan(tl.load(dec_ptr + code) * back[:, None])
        tl.store(f_ptr + offs, v, mask=m)
    else:
        if PACK4:
            tl.store(q_ptr + g[:, None] * 4 + tl.arange(0, 4)[None, :], _pack_words(code, BB, 32, 4),
                     mask=gm[:, None])
        else:
            tl.store(q_ptr + g[:, None] * 8 + tl.arange(0, 8)[None, :], _pack_words(code, BB, 32, 8),
                     mask=gm[:, None])
        tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def mx_dequant_kernel(q_ptr, s_ptr, dec_ptr, out_ptr, C, NB, NBLK, BB: tl.constexpr, PACK4: tl.constexpr,
                      OUT_BF16: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr, HW_CVT: tl.constexpr):
    """x̂ = fl(e · 2^(b − 127)); byte 0xFF decodes to NaN."""
    g, gm, offs, m = _block_offsets(tl.program_id(0), NB, C, NBLK, BB, 32, EVEN, IDX64)
    sb = tl.load(s_ptr + g, mask=gm, other=0).to(tl.int32)
    back = tl.where(sb >= 1, sb << 23, 0x00400000).to(tl.float32, bitcast=True)
    back = tl.where(sb == 255, float("nan"), back)[:, None]
    if PACK4:
        w = tl.load(q_ptr + g[:, None] * 4 + tl.arange(0, 4)[None, :], mask=gm[:, None], other=0)
        code = _unpack_words(w, BB, 32, 4)
    else:
        w = tl.load(q_ptr + g[:, None] * 8 + tl.arange(0, 8)[None, :], mask=gm[:, None], other=0)
        code = _unpack_words(w, BB, 32, 8)
    v = _canonical_nan(tl.load(dec_ptr + code) * back)
    _store_f32_or_bf16(out_ptr + offs, v, m, OUT_BF16, HW_CVT)


@triton.jit
def encode_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr,
                  MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """Element codes (RNE, satfinite) of float32 values, one uint8 per code."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if MBITS == 1 and MAX_CODE == 7:
        code = _e2m1_rne(x)
    else:
        code = _encode_rne_fast(x, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    tl.store(out_ptr + offs, code.to(tl.uint8), mask=m)


@triton.jit
def fp32_scaled_quant_kernel(x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, amax_ptr, emax_f, R, C, NB, NBLK,
                             BB: tl.constexpr, W: tl.constexpr, PER_TENSOR: tl.constexpr, MBITS: tl.constexpr,
                             EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                             SIGN_SHIFT: tl.constexpr, FAKE: tl.constexpr, IGNORE_NAN: tl.constexpr,
                             EVEN: tl.constexpr, IDX64: tl.constexpr):
    """FP8 with FP32 scales (SPEC §6): d = fl(amax / max_elem) (1 where that is 0 or inf; NaN stays NaN),
    codes e(fl(x / d)) RNE satfinite, both divisions IEEE (``div.rn``).  PER_TENSOR: one d from ``amax``
    (stored by program 0); otherwise one d per block of W along the row, stored per block."""
    g, gm, offs, m = _block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if PER_TENSOR:
        amax = tl.load(amax_ptr) + tl.zeros([BB], tl.float32)
    else:
        a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        if IGNORE_NAN:
            a = tl.where(a > 0x7F800000, 0, a)
        amax = tl.max(a, axis=1).to(tl.float32, bitcast=True)
    d = tl.math.div_rn(amax, tl.full([BB], emax_f, tl.float32))
    d = tl.where((d == 0.0) | (d > 3.4028234663852886e38), 1.0, d)
    code = _encode_rne_fast(tl.math.div_rn(x, d[:, None]), MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    code = tl.where(m, code, 0)
    if FAKE:
        tl.store(f_ptr + offs, _canonical_nan(tl.load(dec_ptr + code) * d[:, None]), mask=m)
    else:
        tl.store(q_ptr + g[:, None] * (W // 4) + tl.arange(0, W // 4)[None, :], _pack_words(code, BB, W, 8),
                 mask=gm[:, None])
        if PER_TENSOR:
            tl.store(s_ptr + g * 0, d, mask=(g == 0))
        else:
            tl.store(s_ptr + g, d, mask=gm)


@triton.jit
def _philox(c0, c1, k0, k1):
    """Philox4x32-10 of counter (c0, c1, 0, 0) and key (k0, k1), all uint32: SPEC §3, fpsim._kernels.philox4x32_10."""
    x0 = c0
    x1 = c1
    x2 = tl.zeros_like(c0)
    x3 = tl.zeros_like(c0)
    for _ in tl.static_range(10):
        h0 = tl.umulhi(x0, 0xD2511F53)
        l0 = x0 * 0xD2511F53
        h1 = tl.umulhi(x2, 0xCD9E8D57)
        l1 = x2 * 0xCD9E8D57
        x0, x1, x2, x3 = h1 ^ x1 ^ k0, l1, h0 ^ x3 ^ k1, l0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return x0, x1, x2, x3


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def philox_kernel(out_ptr, n, k0, k1, counter0, BLOCK: tl.constexpr):
    """out[4i + w] = word w of Philox(counter0 + i) (a test hook for the stream)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    c = counter0 + i
    w0, w1, w2, w3 = _philox((c & 0xFFFFFFFF).to(tl.uint32), (c >> 32).to(tl.uint32), k0.to(tl.uint32),
                             k1.to(tl.uint32))
    m = i < n
    tl.store(out_ptr + 4 * i, w0, mask=m)
    tl.store(out_ptr + 4 * i + 1, w1, mask=m)
    tl.store(out_ptr + 4 * i + 2, w2, mask=m)
    tl.store(out_ptr + 4 * i + 3, w3, mask=m)


@triton.jit
def _sr_bits(g, counter0, k0, k1, BB: tl.constexpr, W: tl.constexpr, K: tl.constexpr, WIDTH: tl.constexpr):
    """[BB, W] random K-bit integers of blocks ``g``: the Philox stream of the CPU quantizer (SPEC §3).

    Block g uses calls counter0 + g·CALLS + cc (CALLS = W·WIDTH/128); element t reads value t mod PER_CALL
    of call t // PER_CALL, WIDTH bits at a time from the low end of word 0 upwards (fpsim.random.random_bits).
    """
    PER_CALL: tl.constexpr = 128 // WIDTH
    PER_WORD: tl.constexpr = 32 // WIDTH
    CALLS: tl.constexpr = (W + PER_CALL - 1) // PER_CALL
    tt = tl.arange(0, W)[None, :]
    q = tt % PER_CALL
    wi = q // PER_WORD
    sh = ((q % PER_WORD) * WIDTH).to(tl.uint32)
    r = tl.zeros([BB, W], tl.uint32)
    for cc in tl.static_range(CALLS):
        c = counter0 + g.to(tl.int64) * CALLS + cc
        w0, w1, w2, w3 = _philox((c & 0xFFFFFFFF).to(tl.uint32), (c >> 32).to(tl.uint32), k0, k1)
        mine = (tt // PER_CALL) == cc
        r = tl.where(mine & (wi == 0), w0[:, None] >> sh, r)
        r = tl.where(mine & (wi == 1), w1[:, None] >> sh, r)
        r = tl.where(mine & (wi == 2), w2[:, None] >> sh, r)
        r = tl.where(mine & (wi == 3), w3[:, None] >> sh, r)
    return (r & ((1 << K) - 1)).to(tl.int32)


@triton.jit
def _encode_sr(y, r, K: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr,
               NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """Stochastic rounding (SPEC §3; fpsim._kernels.encode_one_sr): t = fl32(|y| + r·2^(qexp−K)), then truncate.

    Both addends are float32 values and the product r·2^(qexp−K) is exact, so one float32 addition is the
    reference's single rounding (and an FMA would give the same bits).
    """
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    e = a >> 23
    ep = tl.maximum(e, 1)
    sig = (a & 0x7FFFFF) | (tl.minimum(e, 1) << 23)
    sh = tl.minimum(23 - MBITS + tl.maximum(EMIN_B - ep, 0), 25)
    t = sig >> sh
    rem = sig & ((1 << sh) - 1)
    eq = tl.maximum(ep, EMIN_B)
    mag = ((eq - EMIN_B) << MBITS) + t
    qexp = eq - 127 - MBITS
    step = ((qexp - K + 127) << 23).to(tl.float32, bitcast=True)
    val = a.to(tl.float32, bitcast=True) + r.to(tl.float32) * step
    nxt = (t + 1).to(tl.float32) * ((qexp + 127) << 23).to(tl.float32, bitcast=True)
    up = ((val >= nxt) & (rem != 0)).to(tl.int32)
    mag = tl.minimum(mag + up, MAX_CODE)
    return tl.where(a > 0x7F800000, NAN_CODE, (((u >> 31) & 1) << SIGN_SHIFT) | mag)


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def nvfp4_quant_2d_kernel(x_ptr, q_ptr, s_ptr, amax_ptr, R, C, NB, k0, k1, counter0, BT: tl.constexpr,
                          SR: tl.constexpr = False, K: tl.constexpr = 8, WIDTH: tl.constexpr = 8,
                          IGNORE_NAN: tl.constexpr = False):
    """NVFP4 with 16×16 tiles in one pass: a program holds 16 rows × BT tiles, takes each tile's amax
    in registers, and writes every row's codes and the tile's scale on each of its 16 rows (SPEC §4)."""
    tr = tl.program_id(0)
    t0 = tl.program_id(1) * BT
    i = tl.arange(0, 16 * BT)
    rr = i // BT  # row within the tile row
    bt = t0 + i % BT  # tile (block) column
    row = tr * 16 + rr
    j = tl.arange(0, 16)
    col = bt[:, None] * 16 + j[None, :]
    m = (row < R)[:, None] & (col < C) & (bt < NB)[:, None]
    x = tl.load(x_ptr + row.to(tl.int64)[:, None] * C + col, mask=m, other=0.0)
    a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if IGNORE_NAN:
        a = tl.where(a > 0x7F800000, 0, a)
    bmax = tl.max(a, axis=1)  # per (row, tile) block of 16
    tmax = tl.max(tl.reshape(bmax, [16, BT]), axis=0)  # per tile
    vmax = tl.reshape(tl.broadcast_to(tmax[None, :], [16, BT]), [16 * BT])
    s_enc, s_dec = _nvfp4_tensor_scales(amax_ptr, 2688.0)
    sdb = vmax.to(tl.float32, bitcast=True) * (s_enc * 0.1666666716337204)
    sdb = tl.where(sdb > 448.0, 448.0, sdb)
    sb = _encode_rne_fast(sdb, 3, 121, 126, 127, 7)  # E4M3 byte of sdb ≥ 0 (NaN → 0x7F)
    enc = tl.math.div_rn(tl.full([16 * BT], 1.0, tl.float32), _e4m3_value(sb) * s_dec)
    enc = tl.where(enc > 3.4028234663852886e38, 3.4028234663852886e38, enc)
    g = row.to(tl.int64) * NB + bt  # the block index of the CPU quantizer (row-major blocks)
    if SR:
        rb = _sr_bits(g, counter0, k0.to(tl.uint32), k1.to(tl.uint32), 16 * BT, 16, K, WIDTH)
        code = tl.where(m, _encode_sr(x * enc[:, None], rb, K, 1, 127, 7, 7, 3), 0)
    else:
        code = tl.where(m, _e2m1_rne(x * enc[:, None]), 0)
    gm = (row < R) & (bt < NB)
    tl.store(q_ptr + g[:, None] * 2 + tl.arange(0, 2)[None, :], _pack_words(code, 16 * BT, 16, 4), mask=gm[:, None])
    tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def _bf16_round(x):
    """float32 → the nearest BF16 value as float32 (RNE; NaN → 0x7FC00000; inf kept), as fpsim.transforms."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, r)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def rht_kernel(x_ptr, s_ptr, out_ptr, NT, inv_sqrt, D: tl.constexpr, LOG2D: tl.constexpr, BB: tl.constexpr,
               BF16_IN: tl.constexpr, BF16_OUT: tl.constexpr, INVERSE: tl.constexpr, IDX64: tl.constexpr):
    """Random Hadamard transform of BB contiguous tiles of D values: fpsim.rht's float32 operations in its order.

    Signs (before the butterflies, or after them for the inverse), log2 D butterfly stages that each map the
    pairs (i, i + h) of every 2h-group to (a + b, a − b), h = 1, 2, 4, …, then one multiply by fl(1/√D); BF16
    rounding of the input and output when asked.  The stages are reshapes of the [BB, D] tile, so the pairs
    and the order of the additions are those of the Numba and eager torch kernels, bit for bit.
    """
    if IDX64:
        t = tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB)
    else:
        t = tl.program_id(0) * BB + tl.arange(0, BB)
    j = tl.arange(0, D)
    offs = t[:, None] * D + j[None, :]
    m = (t < NT)[:, None] & (j[None, :] < D)
    v = tl.load(x_ptr + offs, mask=m, other=0.0)
    sg = tl.load(s_ptr + j)[None, :]
    if BF16_IN:
        v = _bf16_round(v)
    if not INVERSE:
        v = v * sg
    for k in tl.static_range(LOG2D):  # h = 2^k (a constexpr cannot be reassigned in compiled Triton)
        w = tl.permute(tl.reshape(v, [BB, D // (2 << k), 2, 1 << k]), [0, 1, 3, 2])  # [BB, groups, h, 2]
        a, b = tl.split(w)
        v = tl.reshape(tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2]), [BB, D])
    v = v * inv_sqrt
    if INVERSE:
        v = v * sg
    if BF16_OUT:
        v = _bf16_round(v)
    tl.store(out_ptr + offs, v, mask=m)
