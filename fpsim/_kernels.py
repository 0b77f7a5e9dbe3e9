"""Numba kernels of the element codecs: one generic encoder, driven by a spec's integers.

Everything here works on float32 *bit patterns* (uint32) and integer codes.
The spec arrives as the tuple of :meth:`fpsim.formats.FormatSpec.traits`::

    (bits, mbits, signed, has_inf, has_nan, subnormals, max_code, emin_b, nan_code, inf_code)

``emin_b`` is the float32 *biased* exponent of the format's smallest binade
with full precision (min normal; for E8M0 the binade of code 0).  Values are
handled as ``sig * 2**(E - 150)`` with a 24-bit significand ``sig`` (implicit
bit included) and biased exponent ``E``; rounding to the format keeps the top
``mbits + 1`` bits of ``sig`` (fewer in the format's subnormal range) and
decides on the discarded remainder.

This module is private: :mod:`fpsim.codecs` is the public API.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ._jit import njit, pjit, prange

# Rounding-mode integers shared by all kernels (see fpsim.codecs.Rounding).
RNE, RTZ, RUP, RDOWN, RNA, SR = 0, 1, 2, 3, 4, 5

# 2**e as float64 for e in [-_P2, _P2): exact powers of two without a libm call.
_P2 = 320
_POW2 = np.ldexp(1.0, np.arange(-_P2, _P2))


@intrinsic
def f32_bits(typingctx, x):
    """Bit pattern (uint32) of a float32 scalar: a register bitcast, no memory round trip."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, u):
    """float32 scalar with bit pattern ``u`` (any integer type; its low 32 bits are used)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], context.get_value_type(types.uint32)) if u.bitwidth > 32 else args[0]
        return builder.bitcast(low, context.get_value_type(types.float32))

    return types.float32(u), codegen


@njit
def split_f32(a):
    """|x| bits (finite, non-zero) → (sig, E) with sig in [2**23, 2**24).

    float32 subnormals are normalised, so ``E`` may be ≤ 0 for them; only
    E8M0 has grid points in that range, the other formats just see a sticky bit.
    """
    e = a >> 23
    if e != 0:
        return (a & 0x7FFFFF) | 0x800000, e
    sig = a
    e = 1
    while sig < 0x800000:  # at most 23 steps, subnormal inputs only
        sig <<= 1
        e -= 1
    return sig, e


@njit
def _magnitude(t, e, mbits, subn, emin_b):
    """Code magnitude of significand ``t`` at binade ``max(e, emin_b)``.

    ``t`` counts quanta of the binade and includes the implicit bit, so a
    rounding carry (t == 2**(mbits+1)) spills into the exponent field by
    itself, and in the subnormal range (t < 2**mbits) the code is just ``t``.
    """
    mag = ((max(e, emin_b) - emin_b) << mbits) + t
    if subn == 0:
        mag -= 1 << mbits
    return mag


@njit
def encode_one(u, p, mode, sat):
    """Encode one float32 bit pattern ``u`` with a deterministic rounding mode."""
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    u = np.int64(u)
    a = u & 0x7FFFFFFF
    sign = (u >> 31) & 1 if signed else 0
    sbit = sign << (bits - 1)
    if a > 0x7F800000:  # NaN: positive canonical NaN / positive max (NVIDIA)
        return nan_code
    if a == 0x7F800000:
        if sat or (has_inf == 0 and has_nan == 0):
            return sbit | max_code
        return sbit | (inf_code if has_inf else nan_code)
    if a == 0:
        return sbit
    sig, e = split_f32(a)
    if subn == 0 and e < emin_b:  # below the smallest value of a zero-less format
        return sbit
    sh = 23 - mbits + max(0, emin_b - e)
    sh = min(sh, 25)  # beyond 25 every bit of sig is below half a quantum: sticky only
    t = sig >> sh
    rem = sig & ((np.int64(1) << sh) - 1)
    half = np.int64(1) << (sh - 1)
    if mode == RNE:
        # "even" is the parity of the code (the mantissa's last bit; for
        # mbits = 0, the exponent's), not of the significand t.
        up = rem > half or (rem == half and (_magnitude(t, e, mbits, subn, emin_b) & 1) == 1)
    elif mode == RNA:
        up = rem >= half
    elif mode == RUP:
        up = rem != 0 and sign == 0
    elif mode == RDOWN:
        up = rem != 0 and sign == 1
    else:  # RTZ
        up = False
    mag = _magnitude(t + np.int64(up), e, mbits, subn, emin_b)
    if mag > max_code:
        # IEEE 754 §7.4: modes that round the magnitude up overflow to inf
        # (NaN where the format has no inf); the others give the max finite.
        away = mode == RNE or mode == RNA or (mode == RUP and sign == 0) or (mode == RDOWN and sign == 1)
        if sat or not away or (has_inf == 0 and has_nan == 0):
            mag = max_code
        else:
            mag = inf_code if has_inf else nan_code
    return sbit | mag


@njit
def encode_one_sr(u, p, r, k):
    """Stochastic rounding of one float32 bit pattern with random integer ``r`` (k bits).

    SPEC §3, Transformer Engine's emulation of ``cvt.rs.satfinite``::

        t = fl32(|x| + (r / 2**k) * step);  q = largest grid value <= t, capped at max

    ``|x|`` and ``r * 2**(qexp-k)`` are both float32 values, so their float64
    sum rounded once more to float32 equals the single float32 rounding of the
    exact sum (binary64 has ≥ 2·24+2 bits: double rounding is innocuous).
    Values on the grid never move; NaN and ±inf follow the saturating rules.
    """
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    u = np.int64(u)
    a = u & 0x7FFFFFFF
    sign = (u >> 31) & 1 if signed else 0
    sbit = sign << (bits - 1)
    if a > 0x7F800000:
        return nan_code
    if a >= 0x7F800000:
        return sbit | max_code
    if a == 0:
        return sbit
    sig, e = split_f32(a)
    if subn == 0 and e < emin_b:
        return sbit
    sh = 23 - mbits + max(0, emin_b - e)
    if sh > 25:
        t = np.int64(0)
        rem = sig
    else:
        t = sig >> sh
        rem = sig & ((np.int64(1) << sh) - 1)
    mag = _magnitude(t, e, mbits, subn, emin_b)
    if mag >= max_code:
        return sbit | max_code
    qexp = max(e, emin_b) - 127 - mbits  # exponent of the grid step at |x|
    s = float(sig) * _POW2[e - 150 + _P2] + float(r) * _POW2[qexp - k + _P2]
    t32 = np.float64(np.float32(s))  # the one float32 rounding of the FMA
    # Branch-free on purpose: the outcome is random, a branch would mispredict half the time.
    # rem == 0 (on the grid) never moves; the code is linear in t, so "hi" is mag + 1.
    up = np.int64(t32 >= float(t + 1) * _POW2[qexp + _P2]) & np.int64(rem != 0)
    return sbit | min(mag + up, max_code)


# ---------------------------------------------------------------------------
# Branch-free forms of encode_one for the array kernels.  ``encode_one`` stays
# the readable definition (and builds the lookup tables); these compute the
# same codes with selects instead of branches so LLVM can vectorise the loop.


@njit(inline="always")
def _fields(u, mbits, signed, emin_b):
    """The integer decomposition both branch-free encoders start from (formats with subnormals, emin_b ≥ 1).

    Returns |x| bits, sign, E' = max(E, 1), the 24-bit significand, the shift to the format's quantum,
    the kept quanta ``t``, the discarded remainder, and the code magnitude of ``t`` before rounding.
    """
    u = np.int64(u)
    a = u & 0x7FFFFFFF
    s = (u >> 31) & signed
    e = a >> 23
    ep = max(e, 1)
    sig = (a & 0x7FFFFF) | (min(e, 1) << 23)
    sh = min(23 - mbits + max(emin_b - ep, 0), 25)
    t = sig >> sh
    rem = sig & ((np.int64(1) << sh) - 1)
    return a, s, ep, sig, sh, t, rem, ((max(ep, emin_b) - emin_b) << mbits) + t


@njit(inline="always")
def _encode_branchfree(u, bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, mode, sat):
    """encode_one for formats with subnormals and ``emin_b >= 1`` (all but E8M0).

    float32 subnormals need no normalisation here: with E' = max(E, 1) and no
    implicit bit, ``sig * 2**(E' - 150)`` is still their exact value.
    """
    a, s, ep, sig, sh, t, rem, base = _fields(u, mbits, signed, emin_b)
    half = np.int64(1) << (sh - 1)
    if mode == RNE:
        up = np.int64(rem > half) | (np.int64(rem == half) & base & 1)
        away = np.int64(1)
    elif mode == RNA:
        up = np.int64(rem >= half)
        away = np.int64(1)
    elif mode == RUP:
        up = np.int64(rem != 0) & (1 - s)
        away = 1 - s
    elif mode == RDOWN:
        up = np.int64(rem != 0) & s
        away = s
    else:
        up = np.int64(0)
        away = np.int64(0)
    mag = base + up
    # Overflow: finite values that round past max, and ±inf (a == 0x7F800000).
    special = inf_code if has_inf else nan_code
    if sat or (has_inf | has_nan) == 0:
        special = max_code
    ovf = special if (away | np.int64(a == 0x7F800000)) else max_code
    mag = ovf if mag > max_code else mag
    res = (s << (bits - 1)) | mag
    return nan_code if a > 0x7F800000 else res


@njit(inline="always")
def _encode_sr_branchfree(u, r, k, bits, mbits, signed, max_code, emin_b, nan_code):
    """encode_one_sr for formats with subnormals and ``emin_b >= 1`` (all but E8M0), with selects only."""
    a, s, ep, sig, sh, t, rem, mag = _fields(u, mbits, signed, emin_b)
    qexp = max(ep, emin_b) - 127 - mbits
    x = float(sig) * _POW2[min(ep, 255) - 150 + _P2] + float(r) * _POW2[min(qexp, 200) - k + _P2]
    t32 = np.float64(np.float32(x))
    up = np.int64(t32 >= float(t + 1) * _POW2[min(qexp, 200) + _P2]) & np.int64(rem != 0)
    mag = min(mag + up, max_code)  # |x| ≥ max and ±inf saturate
    res = (s << (bits - 1)) | mag
    return nan_code if a > 0x7F800000 else res


@njit(inline="always")
def _encode_aligned(u, sh, sign_shift, max_code, nan_code, ovf_code, mode):
    """encode_one for formats whose binades coincide with float32's (ebits 8, bias 127: BF16).

    Rounding is then one integer add on the float32 bits: the carry of
    ``a + increment`` walks into the exponent (and to the inf code) by itself,
    and float32 subnormals are the format's subnormals.
    """
    a = u & np.uint32(0x7FFFFFFF)
    s = u >> np.uint32(31)
    ones = (np.uint32(1) << sh) - np.uint32(1)
    if mode == RNE:
        inc = (ones >> np.uint32(1)) + ((a >> sh) & np.uint32(1))
    elif mode == RNA:
        inc = (ones >> np.uint32(1)) + np.uint32(1)
    elif mode == RUP:
        inc = ones * (np.uint32(1) - s)
    elif mode == RDOWN:
        inc = ones * s
    else:
        inc = np.uint32(0)
    mag = (a + inc) >> sh
    mag = ovf_code if mag > max_code else mag  # finite overflow and ±inf alike
    res = (s << sign_shift) | mag
    return nan_code if a > np.uint32(0x7F800000) else res


# ---------------------------------------------------------------------------
# Array kernels.  Inputs are 1-D contiguous views; the public wrappers reshape.
# The rounding mode is a loop invariant: one loop per mode, with the mode a
# literal, lets LLVM fold the mode tests out of the loop body.


@pjit
def encode_array(x, out, p, mode, sat):
    """out[i] = encode_one(x[i]) for a float32-bits array (any rounding but SR)."""
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    if subn == 0 or emin_b < 1:
        for i in prange(x.size):
            out[i] = encode_one(x[i], p, mode, sat)
    elif mode == RNE:
        for i in prange(x.size):
            out[i] = _encode_branchfree(
                x[i], bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, RNE, sat
            )
    elif mode == RTZ:
        for i in prange(x.size):
            out[i] = _encode_branchfree(
                x[i], bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, RTZ, sat
            )
    elif mode == RUP:
        for i in prange(x.size):
            out[i] = _encode_branchfree(
                x[i], bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, RUP, sat
            )
    elif mode == RDOWN:
        for i in prange(x.size):
            out[i] = _encode_branchfree(
                x[i], bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, RDOWN, sat
            )
    else:
        for i in prange(x.size):
            out[i] = _encode_branchfree(
                x[i], bits, mbits, signed, has_inf, has_nan, max_code, emin_b, nan_code, inf_code, RNA, sat
            )


@pjit
def encode_array_aligned(x, out, p, mode, sat):
    """RNE/RNA encode to a signed IEEE-style format with ebits 8 and bias 127 (see ``_encode_aligned``).

    Directed modes overflow depending on the sign (IEEE 754 §7.4): callers
    send them to ``encode_array``.
    """
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    sh = np.uint32(23 - mbits)
    sign_shift = np.uint32(bits - 1)
    mx = np.uint32(max_code)
    nan = np.uint32(nan_code)
    ovf_rne = np.uint32(max_code if sat else inf_code)
    if mode == RNE:
        for i in prange(x.size):
            out[i] = _encode_aligned(x[i], sh, sign_shift, mx, nan, ovf_rne, RNE)
    else:
        for i in prange(x.size):
            out[i] = _encode_aligned(x[i], sh, sign_shift, mx, nan, ovf_rne, RNA)
@pjit
def encode_array_sr(x, rbits, k, out, p):
    """Stochastic rounding with one explicit random integer per element."""
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    if subn == 0 or emin_b < 1:
        for i in prange(x.size):
            out[i] = encode_one_sr(x[i], p, rbits[i], k)
    else:
        for i in prange(x.size):
            out[i] = _encode_sr_branchfree(x[i], rbits[i], k, bits, mbits, signed, max_code, emin_b, nan_code)


@pjit
def encode_array_lut(x, out, lut, shift):
    """Table-driven encode for ≤ 8-bit formats.

    The code of a float32 depends only on its sign, exponent, top
    ``mbits + 2`` mantissa bits and whether any lower bit is set (the sticky
    bit): the round bit sits at most one position below the kept bits, and
    the extra position covers E8M0's grid inside float32's subnormal range.
    The table holds ``encode_one`` of one representative per key, so both
    paths agree by construction (and are tested to).
    """
    low = (np.uint32(1) << np.uint32(shift)) - np.uint32(1)
    for i in prange(x.size):
        u = x[i]
        key = ((u >> np.uint32(shift)) << np.uint32(1)) | np.uint32((u & low) != 0)
        out[i] = lut[key]


@pjit
def encode_array_lut_div(x, d, out, lut, shift):
    """:func:`encode_array_lut` of fl(x[i] / d), the float32 quotient (IEEE division, as numpy's ``x / d`` of a
    float32 array by a float32 scalar) taken in the same pass: FP8 with a per-tensor scale without the quotient's
    array."""
    low = (np.uint32(1) << np.uint32(shift)) - np.uint32(1)
    for i in prange(x.size):
        u = f32_bits(x[i] / d)
        key = ((u >> np.uint32(shift)) << np.uint32(1)) | np.uint32((u & low) != 0)
        out[i] = lut[key]


@njit
def build_lut(p, mode, sat, shift, lut):
    """Fill ``lut`` (size 2**(33 - shift)) with the code of each key's representative."""
    for key in range(lut.size):
        u = ((key >> 1) << shift) | (key & 1)
        lut[key] = encode_one(u, p, mode, sat)


@pjit
def decode_array(codes, table, out):
    """out[i] = table[codes[i]]; returns the number of codes outside the table."""
    bad = 0
    n = table.size
    for i in prange(codes.size):
        c = codes[i]
        if c < n:
            out[i] = table[c]
        else:
            out[i] = table[0]
            bad += 1
    return bad


# ---------------------------------------------------------------------------
# Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of SPEC §3.

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """One Philox4x32-10 block: 128-bit counter, 64-bit key → four uint32 words."""
    c0 = np.uint64(c0)
    c1 = np.uint64(c1)
    c2 = np.uint64(c2)
    c3 = np.uint64(c3)
    k0 = np.uint64(k0)
    k1 = np.uint64(k1)
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            ((p1 >> _S32) ^ c1 ^ k0) & _MASK32,
            p1 & _MASK32,
            ((p0 >> _S32) ^ c3 ^ k1) & _MASK32,
            p0 & _MASK32,
        )
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


@njit
def stream_value(words, j, width):
    """Element ``j`` of one 16-byte Philox block (tuple of 4 words) as a ``width``-bit integer."""
    lg = 2 if width == 8 else (1 if width == 16 else 0)  # log2(values per word), no division
    w = _word(words[0], words[1], words[2], words[3], j >> lg)
    shift = np.uint64((j & ((1 << lg) - 1)) * width)
    return (w >> shift) & np.uint64((1 << width) - 1)


@njit
def _word(w0, w1, w2, w3, i):
    return w0 if i == 0 else (w1 if i == 1 else (w2 if i == 2 else w3))


@pjit
def philox_fill(out, k0, k1, counter0, width, kbits):
    """out[i] = low ``kbits`` of stream element i; 16 bytes per counter value.

    Block ``b`` (counter ``counter0 + b``) holds ``128 // width`` elements:
    word ``wi`` of the block, bits ``[sub*width, (sub+1)*width)`` is element
    ``b * 128 // width + wi * (32 // width) + sub`` (little-endian bytes).
    """
    per_word = 32 // width
    per_block = 4 * per_word
    nblocks = (out.size + per_block - 1) // per_block
    mask = np.uint64((1 << kbits) - 1)
    for b in prange(nblocks):
        c = np.uint64(counter0) + np.uint64(b)
        w0, w1, w2, w3 = philox4x32_10(c & _MASK32, c >> _S32, 0, 0, k0, k1)
        base = b * per_block
        for wi in range(4):
            w = _word(w0, w1, w2, w3, wi)
            for sub in range(per_word):
                i = base + wi * per_word + sub
                if i < out.size:
                    out[i] = (w >> np.uint64(sub * width)) & mask


@pjit
def encode_array_sr_seeded(x, k0, k1, counter0, width, kbits, out, p):
    """Stochastic rounding with Philox bits generated in place (same bits as ``philox_fill``)."""
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = p
    per_word = 32 // width
    lg = 2 if width == 8 else (1 if width == 16 else 0)
    per_block = 4 * per_word
    nblocks = (x.size + per_block - 1) // per_block
    mask = np.uint64((1 << kbits) - 1)
    fast = subn == 1 and emin_b >= 1
    for b in prange(nblocks):
        c = np.uint64(counter0) + np.uint64(b)
        w0, w1, w2, w3 = philox4x32_10(c & _MASK32, c >> _S32, 0, 0, k0, k1)
        base = b * per_block
        for j in range(min(per_block, x.size - base)):
            w = _word(w0, w1, w2, w3, j >> lg)
            r = np.int64((w >> np.uint64((j & (per_word - 1)) * width)) & mask)
            if fast:
                out[base + j] = _encode_sr_branchfree(
                    x[base + j], r, kbits, bits, mbits, signed, max_code, emin_b, nan_code
                )
            else:
                out[base + j] = encode_one_sr(x[base + j], p, r, kbits)
