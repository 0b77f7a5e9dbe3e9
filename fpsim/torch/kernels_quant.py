"""Fused Triton kernels of block quantization: one pass per tensor, bit-identical to the Numba reference.

Launched by :mod:`fpsim.torch.quantize` (quantizers) and :mod:`fpsim.torch.container` (decoders), which
pass a :class:`~fpsim.plan.Plan`'s fields as named constexpr arguments:

* the element format: ``E2M1`` (the plan's ``elem_path`` is the E2M1 arithmetic), ``MBITS``, ``EMIN_B``,
  ``MAX_CODE``, ``NAN_CODE``, ``SIGN_SHIFT`` (bits − 1), ``PACK4`` (two codes per byte);
* the two-level constants: ``NUM`` (fl(max_elem · tensor bound), 2688 for NVFP4), ``INV_T`` (fl(1/max_elem)),
  ``BOUND`` (the scale format's max), ``TENSOR_SCALE``, ``PER_ROW``, and the scale format's arithmetic
  encoder ``S_MBITS``, ``S_EMIN_B``, ``S_Q`` (its subnormal quantum), ``S_MAX_CODE``, ``S_NAN_CODE``;
* the MX rule id ``RULE`` and ``EMAX``; the SR layout ``K`` and ``WIDTH``; the block width ``W`` and
  tile height ``TR``.

The float operations are SPEC §4–§5's (``fl(vmax · fl(S_enc · inv_t))``, ``fl(x · enc_b)``, ``fl(x · 2^-E)``,
``fl((e · s_b) · S_dec)``), one IEEE operation each; divisions are ``tl.math.div_rn``.  Each program derives
S_enc and S_dec from the amax itself, so a quantization is one launch after the amax pass.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import (
    FLT_MAX,
    abs_bits,
    block_offsets,
    block_vmax,
    canonical_nan,
    code_value,
    e2m1_rne_value,
    e2m1_sr_value,
    e2m1_value,
    e8m0_byte,
    encode_elem,
    encode_elem_sr,
    encode_rne,
    hadamard_rows,
    pack_words,
    second_level,
    sr_bits,
    sr_key,
    store_f32_or_bf16,
    unpack_words,
)


@triton.jit
def _elem_values(code, dec_ptr, E2M1: tl.constexpr):
    """float32 values of element codes: arithmetic for E2M1, else the element's decode table."""
    if E2M1:
        return e2m1_value(code)
    else:
        return tl.load(dec_ptr + code)


@triton.jit
def _store_codes(q_ptr, g, gm, code, BB: tl.constexpr, W: tl.constexpr, PACK4: tl.constexpr):
    """Store [BB, W] codes as whole int32 words: 4-bit codes two per byte, others one per byte."""
    if PACK4:
        tl.store(q_ptr + g[:, None] * (W // 8) + tl.arange(0, W // 8)[None, :], pack_words(code, BB, W, 4),
                 mask=gm[:, None])
    else:
        tl.store(q_ptr + g[:, None] * (W // 4) + tl.arange(0, W // 4)[None, :], pack_words(code, BB, W, 8),
                 mask=gm[:, None])


@triton.jit
def _load_codes(q_ptr, g, gm, BB: tl.constexpr, W: tl.constexpr, PACK4: tl.constexpr):
    """Inverse of :func:`_store_codes`."""
    if PACK4:
        w = tl.load(q_ptr + g[:, None] * (W // 8) + tl.arange(0, W // 8)[None, :], mask=gm[:, None], other=0)
        return unpack_words(w, BB, W, 4)
    else:
        w = tl.load(q_ptr + g[:, None] * (W // 4) + tl.arange(0, W // 4)[None, :], mask=gm[:, None], other=0)
        return unpack_words(w, BB, W, 8)


@triton.jit
def _block_scale(vmax, s_enc, s_dec, BB: tl.constexpr, INV_T: tl.constexpr, BOUND: tl.constexpr,
                 S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr, S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr,
                 S_NAN_CODE: tl.constexpr):
    """(scale code, its value, enc_b) of blocks with amax bits ``vmax`` in Transformer Engine's order:
    sdb = min(fl(vmax · fl(S_enc · INV_T)), BOUND); s_b = RNE(sdb); enc_b = min(fl(1 / fl(s_b · S_dec)), FLT_MAX)."""
    sdb = vmax.to(tl.float32, bitcast=True) * (s_enc * INV_T)
    sdb = tl.where(sdb > BOUND, BOUND, sdb)  # fmin_nan: a NaN stays NaN
    sb = encode_rne(sdb, S_MBITS, S_EMIN_B, S_MAX_CODE, S_NAN_CODE, 7)  # sdb ≥ 0 or NaN: no sign bit
    sv = code_value(sb, S_MBITS, S_EMIN_B, S_Q, S_NAN_CODE)
    enc = tl.math.div_rn(tl.full([BB], 1.0, tl.float32), sv * s_dec)
    enc = tl.where(enc > FLT_MAX, FLT_MAX, enc)
    return sb, sv, enc


@triton.jit
def _encode_scaled(y, rb, SR: tl.constexpr, K: tl.constexpr, E2M1: tl.constexpr, MBITS: tl.constexpr,
                   EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """Element codes of the scaled values ``y``: stochastically rounded with the random bits ``rb`` (SR), else RNE."""
    if SR:
        return encode_elem_sr(y, rb, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    else:
        return encode_elem(y, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)


@triton.jit
def _e2m1_values(y, rb, SR: tl.constexpr, K: tl.constexpr):
    """E2M1 values (float32) of the scaled values ``y``, stochastically rounded with ``rb`` (SR) or RNE: the decoded
    codes of :func:`_encode_scaled` without the codes (the fake-quantized copies need only the values)."""
    if SR:
        return e2m1_sr_value(y, rb, K)
    else:
        return e2m1_rne_value(y)


@triton.jit
def _fos_candidate(x, rb, m, vmax, s_enc, s_dec, N: tl.constexpr, INV_T46: tl.constexpr, BOUND: tl.constexpr,
                   S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr, S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr,
                   S_NAN_CODE: tl.constexpr, SR: tl.constexpr, K: tl.constexpr, E2M1: tl.constexpr,
                   MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
                   SIGN_SHIFT: tl.constexpr):
    """Four-over-six's second candidate for N blocks (vmax → 4 with INV_T46): (scale code, its value, element
    codes, 0 past the tensor), with the first candidate's random bits."""
    sb4, sv4, enc4 = _block_scale(vmax, s_enc, s_dec, N, INV_T46, BOUND, S_MBITS, S_EMIN_B, S_Q, S_MAX_CODE,
                                  S_NAN_CODE)
    code4 = _encode_scaled(x * enc4[:, None], rb, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    return sb4, sv4, tl.where(m, code4, 0)


@triton.jit
def _fos_error(x, code, sv, s_dec, m, dec_ptr, E2M1: tl.constexpr, PER_ROW: tl.constexpr, FOS: tl.constexpr,
               BB: tl.constexpr, W: tl.constexpr):
    """Four-over-six's block error of one candidate: Σ|x − x̂| (FOS 1) or Σ(x − x̂)² (FOS 2) in float64, summed
    element by element in the reference's order (a tree sum could round differently and pick the other scale).
    Column c is taken out of the tile by a masked sum, which is exact: every other term is +0."""
    xh = _elem_values(code, dec_ptr, E2M1) * sv[:, None]
    if PER_ROW:
        xh = xh * s_dec[:, None]
    else:
        xh = xh * s_dec
    d = x.to(tl.float64) - xh.to(tl.float64)
    if FOS == 1:
        t = tl.abs(d)
    else:
        t = d * d
    t = tl.where(m, t, 0.0)
    j = tl.arange(0, W)[None, :]
    acc = tl.zeros([BB], tl.float64)
    for c in tl.static_range(W):
        acc = acc + tl.sum(tl.where(j == c, t, 0.0), axis=1)
    return acc


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def two_level_quant_kernel(
    x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, tmax_ptr, amax_ptr, R, C, NB, NBLK, k0, k1, counter0,
    BB: tl.constexpr, W: tl.constexpr, TR: tl.constexpr, TILE: tl.constexpr, FAKE: tl.constexpr,
    IGNORE_NAN: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr,
    NUM: tl.constexpr, INV_T: tl.constexpr, BOUND: tl.constexpr, TENSOR_SCALE: tl.constexpr, PER_ROW: tl.constexpr,
    S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr, S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr,
    S_NAN_CODE: tl.constexpr,
    E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, PACK4: tl.constexpr,
    SR: tl.constexpr = False, K: tl.constexpr = 8, WIDTH: tl.constexpr = 8, FOS: tl.constexpr = 0,
    INV_T46: tl.constexpr = 0.25, APPLY_SDEC: tl.constexpr = True, OUT_BF16: tl.constexpr = False,
    HW_CVT: tl.constexpr = True, key_ptr=0, KEY_PTR: tl.constexpr = False,
):
    """Two-level (NVFP4-style) quantization of BB blocks of W (SPEC §4): block scale by :func:`_block_scale`,
    code = e(fl(x · enc_b)).  TILE: the block amax comes from ``tmax`` (TR-row tiles).  FAKE: write the decoded
    float32 values ``fl((e · s_b) · S_dec)`` to ``f_ptr`` instead of codes and scales.  SR: stochastic rounding
    with K-bit values of the CPU quantizer's Philox stream.  FOS (four-over-six, 1-row blocks): also the
    candidate INV_T46 (vmax → 4), kept where its :func:`_fos_error` is lower (ties keep vmax → 6).
    ``x`` may be BF16 (widened exactly).  FAKE with APPLY_SDEC=False writes the exact e · s_b instead, and
    OUT_BF16 writes the values as BF16 bits into an int16 view (exact for e · s_b of E2M1 × E4M3).  FAKE on the
    E2M1 path rounds straight to the values (:func:`_e2m1_values`: no codes; the copies are issue-bound, and the
    code round trip was a third of the RNE copy's instructions, ``studies/bench/kernel_ptx.py``)."""
    g, gm, offs, m = block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    vmax = block_vmax(x, g, gm, tmax_ptr, NB, TR, TILE, IGNORE_NAN)
    s_enc, s_dec = second_level(amax_ptr, g, gm, NB, NUM, BB, TENSOR_SCALE, PER_ROW)
    sb, sv, enc = _block_scale(vmax, s_enc, s_dec, BB, INV_T, BOUND, S_MBITS, S_EMIN_B, S_Q, S_MAX_CODE, S_NAN_CODE)
    if SR:
        u0, u1 = sr_key(k0, k1, key_ptr, KEY_PTR)
        rb = sr_bits(g, counter0, u0, u1, BB, W, K, WIDTH)
    else:
        rb = 0
    VALUES: tl.constexpr = FAKE and E2M1 and FOS == 0  # the training path's copies: E2M1 values, no codes
    if VALUES:
        ev = _e2m1_values(x * enc[:, None], rb, SR, K)
    else:
        code = _encode_scaled(x * enc[:, None], rb, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
        if SR or not EVEN:  # padding past C encodes to 0 (whole blocks have none)
            code = tl.where(m, code, 0)
    if FOS > 0:
        sb4, sv4, code4 = _fos_candidate(x, rb, m, vmax, s_enc, s_dec, BB, INV_T46, BOUND, S_MBITS, S_EMIN_B, S_Q,
                                         S_MAX_CODE, S_NAN_CODE, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                                         SIGN_SHIFT)
        four = (_fos_error(x, code4, sv4, s_dec, m, dec_ptr, E2M1, PER_ROW, FOS, BB, W)
                < _fos_error(x, code, sv, s_dec, m, dec_ptr, E2M1, PER_ROW, FOS, BB, W))
        sb = tl.where(four, sb4, sb)
        sv = tl.where(four, sv4, sv)
        code = tl.where(four[:, None], code4, code)
    if FAKE:
        if not VALUES:
            ev = _elem_values(code, dec_ptr, E2M1)
        v = ev * sv[:, None]
        if APPLY_SDEC:
            if PER_ROW:
                v = v * s_dec[:, None]
            else:
                v = v * s_dec
        store_f32_or_bf16(f_ptr + offs, canonical_nan(v), m, OUT_BF16, HW_CVT)
    else:
        _store_codes(q_ptr, g, gm, code, BB, W, PACK4)
        tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def _tile_fos_error(x, code, sv, s_dec, m, dec_ptr, E2M1: tl.constexpr, FOS: tl.constexpr, BT: tl.constexpr,
                    W: tl.constexpr):
    """Four-over-six's error of one candidate for each of the BT W×W tiles of a [W·BT, W] program (row i holds row
    i // BT of tile i % BT): Σ|x − x̂| (FOS 1) or Σ(x − x̂)² (FOS 2) in float64, summed over the tile's rows and then
    its columns one element at a time, the reference's order.  Each row and element is taken out by a masked sum,
    which is exact: every other term is +0."""
    xh = (_elem_values(code, dec_ptr, E2M1) * sv[:, None]) * s_dec
    d = x.to(tl.float64) - xh.to(tl.float64)
    if FOS == 1:
        t = tl.abs(d)
    else:
        t = d * d
    t3 = tl.reshape(tl.where(m, t, 0.0), [W, BT, W])
    r_idx = tl.arange(0, W)[:, None, None]
    j = tl.arange(0, W)[None, :]
    acc = tl.zeros([BT], tl.float64)
    for r in tl.static_range(W):
        row = tl.sum(tl.where(r_idx == r, t3, 0.0), axis=0)  # [BT, W]: row r of every tile
        for c in tl.static_range(W):
            acc = acc + tl.sum(tl.where(j == c, row, 0.0), axis=1)
    return acc


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def two_level_quant_2d_kernel(
    x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, amax_ptr, R, C, NB, k0, k1, counter0,
    BT: tl.constexpr, W: tl.constexpr, IGNORE_NAN: tl.constexpr,
    NUM: tl.constexpr, INV_T: tl.constexpr, BOUND: tl.constexpr, TENSOR_SCALE: tl.constexpr,
    S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr, S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr,
    S_NAN_CODE: tl.constexpr,
    E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, PACK4: tl.constexpr,
    SR: tl.constexpr = False, K: tl.constexpr = 8, WIDTH: tl.constexpr = 8, FAKE: tl.constexpr = False,
    APPLY_SDEC: tl.constexpr = True, OUT_BF16: tl.constexpr = False, HW_CVT: tl.constexpr = True,
    FOS: tl.constexpr = 0, INV_T46: tl.constexpr = 0.25, key_ptr=0, KEY_PTR: tl.constexpr = False,
):
    """Two-level quantization with W×W tiles in one pass: a program holds W rows × BT tiles, takes each tile's
    amax in registers, and writes every row's codes and the tile's scale on each of its W rows (SPEC §4).
    FAKE / APPLY_SDEC / OUT_BF16 as in :func:`two_level_quant_kernel` (decoded values to ``f_ptr``).  FOS: also the
    four-over-six candidate INV_T46, kept for a tile where its :func:`_tile_fos_error` is lower (ties keep 6)."""
    tr = tl.program_id(0)
    t0 = tl.program_id(1) * BT
    i = tl.arange(0, W * BT)
    rr = i // BT  # row within the tile row
    bt = t0 + i % BT  # tile (block) column
    row = tr * W + rr
    j = tl.arange(0, W)
    col = bt[:, None] * W + j[None, :]
    m = (row < R)[:, None] & (col < C) & (bt < NB)[:, None]
    offs = row.to(tl.int64)[:, None] * C + col
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    bmax = tl.max(abs_bits(x, IGNORE_NAN), axis=1)  # per (row, tile) block of W
    tmax = tl.max(tl.reshape(bmax, [W, BT]), axis=0)  # per tile
    vmax = tl.reshape(tl.broadcast_to(tmax[None, :], [W, BT]), [W * BT])
    g = row.to(tl.int64) * NB + bt  # the block index of the CPU quantizer (row-major blocks)
    gm = (row < R) & (bt < NB)
    s_enc, s_dec = second_level(amax_ptr, g, gm, NB, NUM, W * BT, TENSOR_SCALE, False)
    sb, sv, enc = _block_scale(vmax, s_enc, s_dec, W * BT, INV_T, BOUND, S_MBITS, S_EMIN_B, S_Q, S_MAX_CODE,
                               S_NAN_CODE)
    if SR:
        u0, u1 = sr_key(k0, k1, key_ptr, KEY_PTR)
        rb = sr_bits(g, counter0, u0, u1, W * BT, W, K, WIDTH)
    else:
        rb = 0
    VALUES: tl.constexpr = FAKE and E2M1 and FOS == 0  # W's copies in training: E2M1 values, no codes
    if VALUES:
        ev = _e2m1_values(x * enc[:, None], rb, SR, K)
    else:
        code = tl.where(m, _encode_scaled(x * enc[:, None], rb, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                                          SIGN_SHIFT), 0)
    if FOS > 0:
        sb4, sv4, code4 = _fos_candidate(x, rb, m, vmax, s_enc, s_dec, W * BT, INV_T46, BOUND, S_MBITS, S_EMIN_B,
                                         S_Q, S_MAX_CODE, S_NAN_CODE, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                                         SIGN_SHIFT)
        four_t = (_tile_fos_error(x, code4, sv4, s_dec, m, dec_ptr, E2M1, FOS, BT, W)
                  < _tile_fos_error(x, code, sv, s_dec, m, dec_ptr, E2M1, FOS, BT, W))
        four = tl.reshape(tl.broadcast_to(four_t[None, :], [W, BT]), [W * BT])
        sb = tl.where(four, sb4, sb)
        sv = tl.where(four, sv4, sv)
        code = tl.where(four[:, None], code4, code)
    if FAKE:
        if not VALUES:
            ev = _elem_values(code, dec_ptr, E2M1)
        v = ev * sv[:, None]
        if APPLY_SDEC:
            v = v * s_dec
        store_f32_or_bf16(f_ptr + offs, canonical_nan(v), m, OUT_BF16, HW_CVT)
    else:
        _store_codes(q_ptr, g, gm, code, W * BT, W, PACK4)
        tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def _scaled_values(x, m, g, gm, s_enc, s_dec, rb, dec_ptr, NB, BB: tl.constexpr, IGNORE_NAN: tl.constexpr,
                   INV_T: tl.constexpr, BOUND: tl.constexpr, S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr,
                   S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr, S_NAN_CODE: tl.constexpr, SR: tl.constexpr,
                   K: tl.constexpr, E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr,
                   MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """The exact e · s_b of the [BB, W] two-level blocks ``x`` (ids ``g``, element mask ``m``; random bits ``rb``
    under SR): :func:`two_level_quant_kernel`'s FAKE, APPLY_SDEC=False values, canonical NaN."""
    vmax = block_vmax(x, g, gm, 0, NB, 1, False, IGNORE_NAN)
    sb, sv, enc = _block_scale(vmax, s_enc, s_dec, BB, INV_T, BOUND, S_MBITS, S_EMIN_B, S_Q, S_MAX_CODE, S_NAN_CODE)
    code = tl.where(m, _encode_scaled(x * enc[:, None], rb, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                                      SIGN_SHIFT), 0)
    return canonical_nan(_elem_values(code, dec_ptr, E2M1) * sv[:, None])


@triton.jit(do_not_specialize=["k0", "k1", "counter0", "k0p", "k1p"])
def rht_t_two_level_kernel(
    x_ptr, s_ptr, f_ptr, dec_ptr, amax_ptr, R, C, NB, inv_sqrt, k0, k1, counter0,
    D: tl.constexpr, LOG2D: tl.constexpr, BF: tl.constexpr, TILES: tl.constexpr, IGNORE_NAN: tl.constexpr,
    NUM: tl.constexpr, INV_T: tl.constexpr, BOUND: tl.constexpr, TENSOR_SCALE: tl.constexpr,
    S_MBITS: tl.constexpr, S_EMIN_B: tl.constexpr, S_Q: tl.constexpr, S_MAX_CODE: tl.constexpr,
    S_NAN_CODE: tl.constexpr,
    E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, SR: tl.constexpr = False, K: tl.constexpr = 8, WIDTH: tl.constexpr = 8,
    HW_CVT: tl.constexpr = True, key_ptr=0, KEY_PTR: tl.constexpr = False,
    fp_ptr=0, amax_p_ptr=0, NBP=0, k0p=0, k1p=0, key_p_ptr=0, PLAIN: tl.constexpr = False, W: tl.constexpr = 16,
):
    """Wgrad's scaled copy of Xᵀ in one pass over the row-major X (R × C, R a multiple of D): the tiles of
    :func:`fpsim.torch.kernels.rht_t_kernel` (TILES tiles of D rows × BF columns per program; each column's D
    values, a row of Xᵀ, through :func:`hadamard_rows` with BF16 rounding in and out), and each transformed row
    of D values quantized as one two-level block of Xᵀ, as :func:`two_level_quant_kernel` quantizes the stored
    Xᵀ (FAKE, APPLY_SDEC=False, OUT_BF16): block g = row of Xᵀ · NB + tile (NB = R / D), the same Philox counters,
    the exact e · s_b written as BF16 bits into the int16 view ``f_ptr`` (C × R).  The tensor amax at
    ``amax_ptr`` is the transformed copy's, from the STORE=False amax pass of ``rht_t_kernel``.  The values
    quantized are those the two-pass path reads back from BF16 (the rounded float32 ``v``), so the codes and
    scales are its bits; a NaN input's payload can differ, and NaN encodes by the NaN policy either way.

    PLAIN: from the same tiles also the scaled copy of X itself (the same plan, 1 × W blocks along its rows,
    block id row · NBP + column block, its own tensor amax at ``amax_p_ptr`` and SR key ``k0p, k1p`` or
    ``key_p_ptr``; counters from ``counter0``) into the int16 view ``fp_ptr`` (R × C): Fprop's X or Dgrad's dY
    copy beside Wgrad's, from one read."""
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    i = tl.arange(0, D)
    sg = tl.load(s_ptr + i)[None, :]
    s_enc, s_dec = second_level(amax_ptr, f, f < C, NB, NUM, BF, TENSOR_SCALE, False)
    if SR:
        u0, u1 = sr_key(k0, k1, key_ptr, KEY_PTR)
    if PLAIN:
        NQ: tl.constexpr = BF // W  # plain blocks per tile row
        sp_enc, sp_dec = second_level(amax_p_ptr, f, f < C, NB, NUM, BF, TENSOR_SCALE, False)
        fb = tl.reshape(tl.broadcast_to((tl.program_id(1) * NQ + tl.arange(0, NQ))[None, :], [D, NQ]), [D * NQ])
        colp = fb[:, None] * W + tl.arange(0, W)[None, :]
        if SR:
            p0, p1 = sr_key(k0p, k1p, key_p_ptr, KEY_PTR)
    for t in tl.static_range(TILES):
        b = tl.program_id(0).to(tl.int64) * TILES + t
        row = b * D + i  # rows of X in tile b (columns of Xᵀ); past R (b ≥ NB) the tile is masked out
        xt = tl.load(x_ptr + row[:, None] * C + f[None, :], mask=(row[:, None] < R) & (f[None, :] < C),
                     other=0.0).to(tl.float32)
        v = hadamard_rows(tl.trans(xt), sg, inv_sqrt, BF, D, LOG2D, True, True, False)  # [BF, D]: block (f, b)
        m = (f[:, None] < C) & (row[None, :] < R)
        g = f.to(tl.int64) * NB + b
        gm = (f < C) & (b < NB)
        if SR:
            rb = sr_bits(g, counter0, u0, u1, BF, D, K, WIDTH)
        else:
            rb = 0
        out = _scaled_values(v, m, g, gm, s_enc, s_dec, rb, dec_ptr, NB, BF, IGNORE_NAN, INV_T, BOUND, S_MBITS,
                             S_EMIN_B, S_Q, S_MAX_CODE, S_NAN_CODE, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE,
                             SIGN_SHIFT)
        store_f32_or_bf16(f_ptr + f[:, None].to(tl.int64) * R + row[None, :], out, m, True, HW_CVT)
        if PLAIN:  # row-major reshape: block q of the tile is row q // NQ, column block q % NQ
            xp = tl.reshape(xt, [D * NQ, W])
            rp = tl.reshape(tl.broadcast_to(row[:, None], [D, NQ]), [D * NQ])
            gp = rp * NBP + fb
            gpm = (rp < R) & (fb < NBP)
            mp = gpm[:, None] & (colp < C)
            if SR:
                rbp = sr_bits(gp, counter0, p0, p1, D * NQ, W, K, WIDTH)
            else:
                rbp = 0
            outp = _scaled_values(xp, mp, gp, gpm, sp_enc, sp_dec, rbp, dec_ptr, NBP, D * NQ, IGNORE_NAN, INV_T,
                                  BOUND, S_MBITS, S_EMIN_B, S_Q, S_MAX_CODE, S_NAN_CODE, SR, K, E2M1, MBITS, EMIN_B,
                                  MAX_CODE, NAN_CODE, SIGN_SHIFT)
            store_f32_or_bf16(fp_ptr + rp[:, None] * C + colp, outp, mp, True, HW_CVT)


@triton.jit
def two_level_dequant_kernel(
    q_ptr, s_ptr, stab_ptr, dec_ptr, amax_ptr, out_ptr, C, NB, NBLK,
    BB: tl.constexpr, W: tl.constexpr, APPLY_SDEC: tl.constexpr, NUM: tl.constexpr, TENSOR_SCALE: tl.constexpr,
    PER_ROW: tl.constexpr, E2M1: tl.constexpr, PACK4: tl.constexpr, OUT_BF16: tl.constexpr, EVEN: tl.constexpr,
    IDX64: tl.constexpr, HW_CVT: tl.constexpr,
):
    """x̂ = fl((e · s_b) · S_dec) (or the exact e · s_b without S_dec), to ``out_ptr``'s dtype; s_b from the scale
    format's 256-entry table ``stab`` (every stored byte decodes as the reference decodes it; on the H200 one
    table load per block measured faster than decoding the byte arithmetically with its sign, inf and NaN codes:
    0.341 against 0.386 ms for 1.07 GB)."""
    g, gm, offs, m = block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    code = _load_codes(q_ptr, g, gm, BB, W, PACK4)
    sv = tl.load(stab_ptr + tl.load(s_ptr + g, mask=gm, other=0).to(tl.int32))[:, None]
    v = _elem_values(code, dec_ptr, E2M1) * sv
    if APPLY_SDEC:
        s_enc, s_dec = second_level(amax_ptr, g, gm, NB, NUM, BB, TENSOR_SCALE, PER_ROW)
        if PER_ROW:
            v = v * s_dec[:, None]
        else:
            v = v * s_dec
    store_f32_or_bf16(out_ptr + offs, canonical_nan(v), m, OUT_BF16, HW_CVT)


@triton.jit(do_not_specialize=["k0", "k1", "counter0"])
def mx_quant_kernel(
    x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, tmax_ptr, inv_max, R, C, NB, NBLK,
    BB: tl.constexpr, W: tl.constexpr, TR: tl.constexpr, RULE: tl.constexpr, EMAX: tl.constexpr,
    E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr, PACK4: tl.constexpr, TILE: tl.constexpr, FAKE: tl.constexpr, IGNORE_NAN: tl.constexpr,
    EVEN: tl.constexpr, IDX64: tl.constexpr, k0=0, k1=0, counter0=0, SR: tl.constexpr = False,
    K: tl.constexpr = 8, WIDTH: tl.constexpr = 8, OUT_BF16: tl.constexpr = False, HW_CVT: tl.constexpr = True,
    key_ptr=0, KEY_PTR: tl.constexpr = False,
):
    """MX (E8M0 scales, blocks of W): scale byte by RULE, elements fl(x · 2^(127−b)) RNE satfinite
    (SR: stochastically rounded with the CPU quantizer's Philox stream).

    A NaN block (byte 0xFF) takes the element NaN code; padding past C is code 0.
    FAKE: write ``fl(e · 2^(b−127))`` (``dec`` = the element decode table) to ``f_ptr`` (as BF16 bits into an
    int16 view with OUT_BF16).  ``x`` may be BF16.
    """
    g, gm, offs, m = block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    vmax = block_vmax(x, g, gm, tmax_ptr, NB, TR, TILE, IGNORE_NAN)
    sb = e8m0_byte(vmax, inv_max, RULE, EMAX, MBITS)
    ex = 127 - sb  # 2^ex, exact float32 (2^-127 is subnormal)
    mul = tl.where(ex >= -126, (ex + 127) << 23, 0x00400000).to(tl.float32, bitcast=True)
    y = x * mul[:, None]
    if SR:
        u0, u1 = sr_key(k0, k1, key_ptr, KEY_PTR)
        rb = sr_bits(g, counter0, u0, u1, BB, W, K, WIDTH)
    else:
        rb = 0
    code = _encode_scaled(y, rb, SR, K, E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    code = tl.where((sb == 255)[:, None], NAN_CODE, code)
    code = tl.where(m, code, 0)
    if FAKE:
        back = tl.where(sb >= 1, sb << 23, 0x00400000).to(tl.float32, bitcast=True)
        back = tl.where(sb == 255, float("nan"), back)
        v = canonical_nan(tl.load(dec_ptr + code) * back[:, None])
        store_f32_or_bf16(f_ptr + offs, v, m, OUT_BF16, HW_CVT)
    else:
        _store_codes(q_ptr, g, gm, code, BB, W, PACK4)
        tl.store(s_ptr + g, sb.to(tl.uint8), mask=gm)


@triton.jit
def mx_dequant_kernel(q_ptr, s_ptr, dec_ptr, out_ptr, C, NB, NBLK, BB: tl.constexpr, W: tl.constexpr,
                      PACK4: tl.constexpr, OUT_BF16: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr,
                      HW_CVT: tl.constexpr):
    """x̂ = fl(e · 2^(b − 127)); byte 0xFF decodes to NaN."""
    g, gm, offs, m = block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    sb = tl.load(s_ptr + g, mask=gm, other=0).to(tl.int32)
    back = tl.where(sb >= 1, sb << 23, 0x00400000).to(tl.float32, bitcast=True)
    back = tl.where(sb == 255, float("nan"), back)[:, None]
    code = _load_codes(q_ptr, g, gm, BB, W, PACK4)
    v = canonical_nan(tl.load(dec_ptr + code) * back)
    store_f32_or_bf16(out_ptr + offs, v, m, OUT_BF16, HW_CVT)


@triton.jit
def fp32_scaled_quant_kernel(
    x_ptr, q_ptr, s_ptr, f_ptr, dec_ptr, amax_ptr, emax_f, R, C, NB, NBLK,
    BB: tl.constexpr, W: tl.constexpr, PER_TENSOR: tl.constexpr, E2M1: tl.constexpr, MBITS: tl.constexpr,
    EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr,
    FAKE: tl.constexpr, IGNORE_NAN: tl.constexpr, EVEN: tl.constexpr, IDX64: tl.constexpr,
):
    """FP8 with FP32 scales (SPEC §6): d = fl(amax / max_elem) (1 where that is 0 or inf; NaN stays NaN),
    codes e(fl(x / d)) RNE satfinite, both divisions IEEE (``div.rn``).  PER_TENSOR: one d from ``amax``
    (stored by program 0); otherwise one d per block of W along the row, stored per block."""
    g, gm, offs, m = block_offsets(tl.program_id(0), NB, C, NBLK, BB, W, EVEN, IDX64)
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if PER_TENSOR:
        amax = tl.load(amax_ptr) + tl.zeros([BB], tl.float32)
    else:
        amax = tl.max(abs_bits(x, IGNORE_NAN), axis=1).to(tl.float32, bitcast=True)
    d = tl.math.div_rn(amax, tl.full([BB], emax_f, tl.float32))
    d = tl.where((d == 0.0) | (d > FLT_MAX), 1.0, d)
    code = encode_elem(tl.math.div_rn(x, d[:, None]), E2M1, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)
    code = tl.where(m, code, 0)
    if FAKE:
        tl.store(f_ptr + offs, canonical_nan(tl.load(dec_ptr + code) * d[:, None]), mask=m)
    else:
        _store_codes(q_ptr, g, gm, code, BB, W, False)
        if PER_TENSOR:
            tl.store(s_ptr + g * 0, d, mask=(g == 0))
        else:
            tl.store(s_ptr + g, d, mask=gm)
