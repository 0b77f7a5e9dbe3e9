"""Triton device functions shared by the fused kernels, and the small kernels (amax, encode, Philox, RHT).

Imported only when Triton is importable (:func:`fpsim.torch.runtime.triton_available`).  Every
function works on float32 *bit patterns* in int32 registers; the only float operations are the
multiplications of SPEC §4–§5, each a single IEEE ``mul.rn.f32``, and the divisions, which use
``tl.math.div_rn`` (PTX ``div.rn.f32``; Triton's ``/`` lowers to ``div.full.f32``, up to 2 ulp off,
triton-lang/triton#10661).  A format enters a kernel as named constexpr arguments taken from its
:class:`~fpsim.formats.Traits` by :mod:`fpsim.torch.quantize` (never as literals here), so one source
serves every element and scale format of a :class:`~fpsim.plan.Plan`.

The element encoders (RNE and stochastic, generic and E2M1 short forms) are in
:mod:`fpsim.torch.kernels_elem` and re-exported here; :func:`e8m0_byte` is the MX scale byte under the rule ids of
:class:`~fpsim.schemes.ScaleRule`.  Under ``TRITON_INTERPRET=1`` the same source runs on CPU tensors.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels_elem import (  # noqa: F401
    e2m1_rne,
    e2m1_rne_value,
    e2m1_sr,
    e2m1_sr_value,
    encode_elem,
    encode_elem_sr,
    encode_rne,
    encode_sr,
)

FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def e8m0_byte(m, inv_max, RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr):
    """E8M0 scale byte of a block with amax bits ``m`` (fpsim._scaling_kernels.mx_scale_byte).

    RULE is :attr:`ScaleRule.rule_id`: 0 floor, 1 ceil, 2 even, 3 rceil (``cvt.rp.satfinite.ue8m0`` of
    fl(amax · fl(1/max))).  A subnormal amax gives byte 0 under floor/ceil/even: its exponent is below
    −127 + emax.
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
def e2m1_value(c):
    """float32 value of an E2M1 code (0–15): exact, from bits."""
    m = c & 7
    e = m >> 1
    f = m & 1
    bits = tl.where(e == 0, f * 0x3F000000, ((e + 126) << 23) | (f << 22))
    return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def code_value(c, MBITS: tl.constexpr, EMIN_B: tl.constexpr, Q: tl.constexpr, NAN_CODE: tl.constexpr):
    """float32 value of a non-negative code ≤ NAN_CODE of a format with subnormals (a freshly encoded scale):
    exponent field 0 is m · Q (Q = 2^(emin − mbits), exact), else the float32 bits; NAN_CODE is NaN."""
    e = c >> MBITS
    m = c & ((1 << MBITS) - 1)
    v = tl.where(e == 0, m.to(tl.float32) * Q,
                 (((e + (EMIN_B - 1)) << 23) | (m << (23 - MBITS))).to(tl.float32, bitcast=True))
    return tl.where(c == NAN_CODE, float("nan"), v)


@triton.jit
def pack_words(code, BB: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """[BB, N] codes → [BB, N·BITS/32] little-endian int32 words (code i at bit BITS·(i mod 32/BITS)).

    Four-bit codes pack as fpsim.pack_fp4 does (element 2j in the low nibble of byte j); stores of
    whole words are what lets a program write its contiguous output at full bandwidth.
    """
    K: tl.constexpr = 32 // BITS
    c3 = tl.reshape(code, [BB, N // K, K])
    return tl.sum(c3 << (tl.arange(0, K) * BITS)[None, None, :], axis=2)


@triton.jit
def unpack_words(w, BB: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """Inverse of :func:`pack_words`: [BB, N·BITS/32] int32 words → [BB, N] codes."""
    K: tl.constexpr = 32 // BITS
    c3 = (w[:, :, None] >> (tl.arange(0, K) * BITS)[None, None, :]) & ((1 << BITS) - 1)
    return tl.reshape(c3, [BB, N])


@triton.jit
def canonical_nan(v):
    """NaN results as the reference's canonical 0x7FC00000 (GPU arithmetic makes 0x7FFFFFFF)."""
    return tl.where(v != v, 0x7FC00000, v.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def tensor_scales(amax_ptr, NUM: tl.constexpr):
    """(S_enc, S_dec) from the float32 amax at ``amax_ptr`` (SPEC §4; fpsim._scaling_kernels.encode_scale_factor)."""
    return scales_of(tl.load(amax_ptr), NUM)


@triton.jit
def scales_of(amax, NUM: tl.constexpr):
    """(S_enc, S_dec) of one float32 amax: S_enc = min(fl(NUM / amax), FLT_MAX), 1 where amax or S_enc is 0 (a NaN
    amax stays NaN); S_dec = fl(1 / S_enc)."""
    s = tl.math.div_rn(NUM, amax)
    s = tl.where(s > FLT_MAX, FLT_MAX, s)  # fmin_nan: NaN amax → NaN
    s = tl.where((amax == 0.0) | (s == 0.0), 1.0, s)
    return s, tl.math.div_rn(1.0, s)


@triton.jit
def row_scales(amax, NUM: tl.constexpr, BB: tl.constexpr):
    """:func:`tensor_scales` of [BB] per-row amax values (per-row second-level scales)."""
    s = tl.math.div_rn(tl.full([BB], NUM, tl.float32), amax)
    s = tl.where(s > FLT_MAX, FLT_MAX, s)
    s = tl.where((amax == 0.0) | (s == 0.0), 1.0, s)
    return s, tl.math.div_rn(tl.full([BB], 1.0, tl.float32), s)


@triton.jit
def second_level(amax_ptr, g, gm, NB, NUM: tl.constexpr, BB: tl.constexpr, TENSOR_SCALE: tl.constexpr,
                 PER_ROW: tl.constexpr):
    """(S_enc, S_dec) of blocks ``g``: per tensor (scalars), per row of the 2-D view ([BB]), or 1 without one."""
    if PER_ROW:
        amax = tl.load(amax_ptr + g // NB, mask=gm, other=1.0)
        s_enc, s_dec = row_scales(amax, NUM, BB)
    elif TENSOR_SCALE:
        s_enc, s_dec = tensor_scales(amax_ptr, NUM)
    else:
        s_enc = 1.0
        s_dec = 1.0
    return s_enc, s_dec


@triton.jit
def store_f32_or_bf16(ptr, v, mask, OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr):
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
def block_offsets(pid, NB, C, NBLK, BB: tl.constexpr, W: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr):
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
def abs_bits(x, IGNORE_NAN: tl.constexpr):
    """|x| of the float32 ``x`` as int32 bits, whose order is the values' (NaN bits exceed inf's: NaN propagates
    through a max unless IGNORE_NAN, which makes a NaN 0)."""
    a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if IGNORE_NAN:
        a = tl.where(a > 0x7F800000, 0, a)
    return a


@triton.jit
def block_vmax(x, g, gm, tmax_ptr, NB, TR: tl.constexpr, TILE: tl.constexpr, IGNORE_NAN: tl.constexpr):
    """|x| bits max of each block row of the [BB, W] tile ``x`` (NaN bits exceed inf's: NaN propagates unless
    IGNORE_NAN), or with TILE the precomputed amax of its TR-row tile from ``tmax``."""
    if TILE:
        row = g // NB
        return tl.load(tmax_ptr + (row // TR) * NB + (g - row * NB), mask=gm, other=0)
    return tl.max(abs_bits(x, IGNORE_NAN), axis=1)


@triton.jit
def philox(c0, c1, k0, k1):
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


@triton.jit
def sr_key(k0, k1, key_ptr, KEY_PTR: tl.constexpr):
    """The Philox key (uint32 × 2) of stochastic rounding: the scalar arguments ``k0, k1``, or with KEY_PTR the
    two int32 words at ``key_ptr``, which every replay of a captured CUDA graph reads afresh (a scalar argument
    would be frozen into the graph; :mod:`fpsim.torch.graphs`)."""
    if KEY_PTR:
        u0 = tl.load(key_ptr).to(tl.uint32, bitcast=True)
        u1 = tl.load(key_ptr + 1).to(tl.uint32, bitcast=True)
    else:
        u0 = k0.to(tl.uint32)
        u1 = k1.to(tl.uint32)
    return u0, u1


@triton.jit
def sr_bits(g, counter0, k0, k1, BB: tl.constexpr, W: tl.constexpr, K: tl.constexpr, WIDTH: tl.constexpr):
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
        w0, w1, w2, w3 = philox((c & 0xFFFFFFFF).to(tl.uint32), (c >> 32).to(tl.uint32), k0, k1)
        # each element's word by three selects on [BB, 1] words, then one shift (the SR copies are
        # compute-bound: four selects and four shifts per element cost more than the rounding itself)
        word = tl.where(wi == 0, w0[:, None], tl.where(wi == 1, w1[:, None], tl.where(wi == 2, w2[:, None],
                                                                                      w3[:, None])))
        if CALLS == 1:
            r = word >> sh
        else:
            r = tl.where((tt // PER_CALL) == cc, word >> sh, r)
    return (r & ((1 << K) - 1)).to(tl.int32)


@triton.jit
def bf16_round(x):
    """float32 → the nearest BF16 value as float32 (RNE; NaN → 0x7FC00000; inf kept), as fpsim.transforms."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, r)
    return r.to(tl.float32, bitcast=True)


# ---------------------------------------------------------------------------
# Small kernels


@triton.jit
def absmax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, IGNORE_NAN: tl.constexpr):
    """atomic max of |x| bits into ``out_ptr`` (int32, zeroed): NaN bits exceed inf's, so NaN propagates."""
    base = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        # float32 or BF16 input: a BF16 value widens exactly, so its amax is the float32 copy's
        acc = tl.maximum(acc, abs_bits(tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.float32), IGNORE_NAN))
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
        acc = tl.maximum(acc, abs_bits(tl.load(x_ptr + row.to(tl.int64) * C + col, mask=m, other=0).to(tl.float32),
                                       IGNORE_NAN))
    tl.store(out_ptr + tr * NB + bc, tl.max(acc, axis=1), mask=bc < NB)


@triton.jit
def encode_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, E2M1: tl.constexpr, MBITS: tl.constexpr,
                  EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                  r_ptr=0, SR: tl.constexpr = False, K: tl.constexpr = 8):
    """Element codes (satfinite) of float32 values, one uint8 per code: RNE, or with SR stochastic rounding with
    the K-bit int32 values at ``r_ptr`` (the quantizers' element encoders, exposed for exhaustive tests)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if SR:
        code = encode_elem_sr(x, tl.load(r_ptr + offs, mask=m, other=0), K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                              SIGN_SHIFT)
    else:
        code = encode_elem(x, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    tl.store(out_ptr + offs, code.to(tl.uint8), mask=m)


@triton.jit
def e2m1_values_kernel(x_ptr, r_ptr, out_ptr, n, BLOCK: tl.constexpr, SR: tl.constexpr, K: tl.constexpr):
    """out = the E2M1 value of each float32 x, RNE or stochastically rounded with the K-bit int32 values at
    ``r_ptr`` (a test hook for :func:`e2m1_rne_value` and :func:`e2m1_sr_value`, the fused copies' rounding)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if SR:
        v = e2m1_sr_value(x, tl.load(r_ptr + offs, mask=m, other=0), K)
    else:
        v = e2m1_rne_value(x)
    tl.store(out_ptr + offs, v, mask=m)


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def philox_kernel(out_ptr, n, k0, k1, counter0, BLOCK: tl.constexpr):
    """out[4i + w] = word w of Philox(counter0 + i) (a test hook for the stream)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    c = counter0 + i
    w0, w1, w2, w3 = philox((c & 0xFFFFFFFF).to(tl.uint32), (c >> 32).to(tl.uint32), k0.to(tl.uint32),
                            k1.to(tl.uint32))
    m = i < n
    tl.store(out_ptr + 4 * i, w0, mask=m)
    tl.store(out_ptr + 4 * i + 1, w1, mask=m)
    tl.store(out_ptr + 4 * i + 2, w2, mask=m)
    tl.store(out_ptr + 4 * i + 3, w3, mask=m)


@triton.jit
def hadamard_rows(v, sg, inv_sqrt, BB: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr, BF16_IN: tl.constexpr,
                  BF16_OUT: tl.constexpr, INVERSE: tl.constexpr):
    """fpsim.rht's float32 operations on each row of the float32 [BB, D] tile ``v`` with the signs ``sg`` [1, D]:
    signs (before the butterflies, or after them for the inverse), log2 D butterfly stages that each map the pairs
    (i, i + h) of every 2h-group to (a + b, a − b), h = 1, 2, 4, …, then one multiply by fl(1/√D); BF16 rounding of
    the input and output when asked.  The stages are reshapes of the tile, so the pairs and the order of the
    additions are those of the Numba and eager torch kernels, bit for bit."""
    if BF16_IN:
        v = bf16_round(v)
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
        v = bf16_round(v)
    return v


@triton.jit
def rht_kernel(x_ptr, s_ptr, out_ptr, NT, inv_sqrt, D: tl.constexpr, LOG2D: tl.constexpr, BB: tl.constexpr,
               BF16_IN: tl.constexpr, BF16_OUT: tl.constexpr, INVERSE: tl.constexpr, IDX64: tl.constexpr):
    """Random Hadamard transform of BB contiguous tiles of D values (:func:`hadamard_rows`)."""
    if IDX64:
        t = tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB)
    else:
        t = tl.program_id(0) * BB + tl.arange(0, BB)
    j = tl.arange(0, D)
    offs = t[:, None] * D + j[None, :]
    m = (t < NT)[:, None] & (j[None, :] < D)
    v = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)  # float32 or BF16 input
    v = hadamard_rows(v, tl.load(s_ptr + j)[None, :], inv_sqrt, BB, D, LOG2D, BF16_IN, BF16_OUT, INVERSE)
    tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=m)  # a BF16 output holds the rounded v exactly


@triton.jit
def rht_t_kernel(x_ptr, s_ptr, out_ptr, amax_ptr, R, C, inv_sqrt, D: tl.constexpr, LOG2D: tl.constexpr,
                 BF: tl.constexpr, TILES: tl.constexpr, BF16_IN: tl.constexpr, BF16_OUT: tl.constexpr,
                 AMAX: tl.constexpr, IGNORE_NAN: tl.constexpr, STORE: tl.constexpr = True, plain_ptr=0,
                 PLAIN: tl.constexpr = False, PLAIN_IGNORE_NAN: tl.constexpr = False, WIDE: tl.constexpr = False):
    """:func:`rht_kernel` of Xᵀ without writing Xᵀ: a program takes TILES tiles of D rows × BF columns of the
    row-major X (R × C, R a multiple of D), transforms each column's D values (the rows of Xᵀ) by
    :func:`hadamard_rows`, and stores them into ``out`` (C × R); STORE=False stores nothing (the amax pass of
    :func:`fpsim.torch.kernels_quant.rht_t_two_level_kernel`).  PLAIN: also the amax of X itself, as
    :func:`absmax_kernel` takes it (NaN-propagating unless PLAIN_IGNORE_NAN), one atomic max into ``plain_ptr``
    per program: the Fprop or Dgrad copy of the same tensor then needs no amax pass of its own.
    AMAX: also the max of the stored values' |bits|
    over its tiles, then one atomic max into ``amax_ptr`` (int32, zeroed; TILES tiles per atomic keep the atomics on
    that one address few; NaN propagates unless IGNORE_NAN), read back from the stored dtype as
    :func:`absmax_kernel` would read it.  A NaN amax's payload is not specified: compiled for the H200, the BF16
    store goes through ``cvt.rn.bf16x2.f32`` (NaN → 0x7FFF) and the amax through a rematerialized
    ``cvt.rn.bf16.f32`` that keeps the payload (0x7FC0).

    WIDE: the program's TILES tiles as one [TILES·D, BF] load, transformed as BF·TILES rows of D and stored as
    one [BF, TILES·D] tile (TILES·D contiguous values per row of Xᵀ, where the tile loop stores D at a time).
    The same rows of D in the same order: the same bits."""
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    i = tl.arange(0, D)
    sg = tl.load(s_ptr + i)[None, :]
    if WIDE:
        TD: tl.constexpr = TILES * D
        accp, acc = _rht_t_rows(x_ptr, out_ptr, R, C, f, tl.program_id(0).to(tl.int64) * TD + tl.arange(0, TD), sg,
                                inv_sqrt, TD, D, LOG2D, BF, BF16_IN, BF16_OUT, AMAX, IGNORE_NAN, STORE, PLAIN,
                                PLAIN_IGNORE_NAN)
    else:
        acc = tl.zeros([BF, D], tl.int32)
        accp = tl.zeros([D, BF], tl.int32)
        for t in tl.static_range(TILES):
            row = (tl.program_id(0).to(tl.int64) * TILES + t) * D + i  # past R (tile ≥ NT) the tile is masked out
            ap, a = _rht_t_rows(x_ptr, out_ptr, R, C, f, row, sg, inv_sqrt, D, D, LOG2D, BF, BF16_IN, BF16_OUT, AMAX,
                                IGNORE_NAN, STORE, PLAIN, PLAIN_IGNORE_NAN)
            accp = tl.maximum(accp, ap)
            acc = tl.maximum(acc, a)
    if AMAX:
        tl.atomic_max(amax_ptr, tl.max(tl.max(acc, axis=1), axis=0))
    if PLAIN:
        tl.atomic_max(plain_ptr, tl.max(tl.max(accp, axis=1), axis=0))


@triton.jit
def _rht_t_rows(x_ptr, out_ptr, R, C, f, row, sg, inv_sqrt, N: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr,
                BF: tl.constexpr, BF16_IN: tl.constexpr, BF16_OUT: tl.constexpr, AMAX: tl.constexpr,
                IGNORE_NAN: tl.constexpr, STORE: tl.constexpr, PLAIN: tl.constexpr, PLAIN_IGNORE_NAN: tl.constexpr):
    """The N rows ``row`` (whole groups of D tokens) × columns ``f`` of :func:`rht_t_kernel`: load, transform each
    column's groups of D, store the BF × N tile of Xᵀ; returns the |bits| of the loaded [N, BF] tile (PLAIN; masked
    loads are +0, which no amax exceeds from below) and of the stored [BF, N] tile (AMAX; masked out as 0), zeros
    where not asked."""
    xt = tl.load(x_ptr + row[:, None] * C + f[None, :], mask=(row[:, None] < R) & (f[None, :] < C),
                 other=0.0).to(tl.float32)
    ap = tl.zeros([N, BF], tl.int32)
    if PLAIN:
        ap = abs_bits(xt, PLAIN_IGNORE_NAN)
    v = tl.reshape(tl.trans(xt), [BF * (N // D), D])  # row f's groups of D tokens, in token order
    v = tl.reshape(hadamard_rows(v, sg, inv_sqrt, BF * (N // D), D, LOG2D, BF16_IN, BF16_OUT, False), [BF, N])
    m = (f[:, None] < C) & (row[None, :] < R)
    st = v.to(out_ptr.dtype.element_ty)
    if STORE:
        tl.store(out_ptr + f[:, None].to(tl.int64) * R + row[None, :], st, mask=m)
    a = tl.zeros([BF, N], tl.int32)
    if AMAX:
        a = tl.where(m, abs_bits(st.to(tl.float32), IGNORE_NAN), 0)
    return ap, a


@triton.jit
def _alpha_ok(amax, NUM: tl.constexpr):
    return (tl.abs(amax) < float("inf")) & (amax > 0.0) & (tl.math.div_rn(NUM, amax) < FLT_MAX)


@triton.jit
def _alpha(amax_a_ptr, amax_b_ptr, NUM_A: tl.constexpr, NUM_B: tl.constexpr, NUM_AB: tl.constexpr):
    """SPEC §8's alpha of two scaled copies from their amax values (see :func:`alpha_epilogue_kernel`)."""
    aa = tl.load(amax_a_ptr)
    ab = tl.load(amax_b_ptr)
    alpha = tl.math.div_rn(aa * ab, NUM_AB)
    good = _alpha_ok(aa, NUM_A) & _alpha_ok(ab, NUM_B) & (tl.abs(alpha) < float("inf")) & (alpha > 0.0)
    _, sd_a = scales_of(aa, NUM_A)
    _, sd_b = scales_of(ab, NUM_B)
    return tl.where(good, alpha, sd_a * sd_b)


@triton.jit
def alpha_epilogue_kernel(acc_ptr, out_ptr, amax_a_ptr, amax_b_ptr, n, NUM_A: tl.constexpr, NUM_B: tl.constexpr,
                          NUM_AB: tl.constexpr, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr):
    """out = fl(acc · alpha) (float32, or rounded to BF16) with SPEC §8's alpha = fl(fl(amax_a · amax_b) / NUM_AB),
    NUM_AB = fl(N_a · N_b), or fl(S_dec_a · S_dec_b) where that formula fails (fpsim.torch.gemm.second_level_alpha's
    operations, computed per program from the two amax values: no host work, no extra launch)."""
    alpha = _alpha(amax_a_ptr, amax_b_ptr, NUM_A, NUM_B, NUM_AB)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(acc_ptr + offs, mask=m, other=0.0) * alpha
    store_f32_or_bf16(out_ptr + offs, v, m, OUT_BF16, HW_CVT)


@triton.jit
def alpha_kernel(amax_a_ptr, amax_b_ptr, out_ptr, n, NUM_A: tl.constexpr, NUM_B: tl.constexpr,
                 NUM_AB: tl.constexpr, BLOCK: tl.constexpr):
    """out[:n] = :func:`alpha_epilogue_kernel`'s alpha, for a GEMM that reads alpha from device memory
    (fpsim.torch.cublaslt: one value, or one per output row)."""
    alpha = _alpha(amax_a_ptr, amax_b_ptr, NUM_A, NUM_B, NUM_AB)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32) + alpha, mask=offs < n)


@triton.jit
def scaled_mm_kernel(a_ptr, b_ptr, out_ptr, amax_a_ptr, amax_b_ptr, M, N, K, s_am, s_ak, s_bn, s_bk, s_om,
                     NUM_A: tl.constexpr, NUM_B: tl.constexpr, NUM_AB: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, OUT_BF16: tl.constexpr,
                     HW_CVT: tl.constexpr):
    """out = fl(A·Bᵀ · alpha) in one kernel: the BF16 copies A (M×K) and B (N×K, any strides) on the tensor
    cores with FP32 accumulation, then :func:`alpha_epilogue_kernel`'s alpha and store (float32, or RNE BF16
    into an int16 view) on the accumulator tile, so the FP32 product never goes through memory.  Programs walk
    the output in groups of GROUP_M tile rows (neighbouring programs share B tiles in L2)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gm = tl.minimum(num_m - first_m, GROUP_M)
    pm = first_m + (pid % group) % gm
    pn = (pid % group) // gm
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_rows = a_ptr + rm[:, None].to(tl.int64) * s_am
    b_cols = b_ptr + rn[None, :].to(tl.int64) * s_bn
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_rows + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_cols + kk[:, None] * s_bk, mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        if HW_CVT:
            acc = tl.dot(a, b, acc)  # BF16 tensor cores, FP32 accumulation
        else:  # the interpreter's dot gave wrong products on BF16 tiles (Triton 3.x); widened, the same exact values
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    v = acc * _alpha(amax_a_ptr, amax_b_ptr, NUM_A, NUM_B, NUM_AB)
    offs = rm[:, None].to(tl.int64) * s_om + rn[None, :]
    store_f32_or_bf16(out_ptr + offs, v, (rm[:, None] < M) & (rn[None, :] < N), OUT_BF16, HW_CVT)
