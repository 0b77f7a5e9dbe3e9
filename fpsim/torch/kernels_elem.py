"""Triton element encoders: float32 → element code, round-to-nearest-even or stochastic (SPEC §2–§3).

:func:`encode_rne` rounds to nearest even with saturation for any ≤ 8-bit format with subnormals (an integer
carry trick for normals, a float32 magic-number addition for subnormals); :func:`encode_sr` is SPEC §3's
stochastic rounding for the same formats; :func:`e2m1_rne` and :func:`e2m1_sr` are their short forms for E2M1
(chosen by the plan's E2M1 constexpr).  Each is checked against the CPU codec on every float32 exponent class
(``tests/test_triton.py``).  Re-exported by :mod:`fpsim.torch.kernels`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_rne(y):
    """E2M1 code of float32 ``y`` (RNE, satfinite, NaN → 7), the short form of :func:`encode_rne` for E2M1.

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
def encode_rne(y, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
               SIGN_SHIFT: tl.constexpr):
    """RNE satfinite code of float32 ``y`` for any format with subnormals (fpsim._kernels._encode_branchfree's
    codes in about half the integer operations; the same two-region scheme as :func:`e2m1_rne`).

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
def encode_elem(y, E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr,
                NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """RNE satfinite element code: :func:`e2m1_rne` on the plan's E2M1 path, else :func:`encode_rne`."""
    if E2M1:
        return e2m1_rne(y)
    else:
        return encode_rne(y, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)


@triton.jit
def encode_sr(y, r, K: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr, MAX_CODE: tl.constexpr,
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


@triton.jit
def _e2m1_sr_sum(a, r, K: tl.constexpr):
    """The bits that E2M1's SR truncates, for |y| with bits ``a`` and the K-bit values ``r``: t = fl32(|y| +
    r·2^-K·step) with step = 2^(max(e, 0) − 1) for |y| in [2^e, 2^(e+1)) (r·step is exact: one rounding, as an
    FMA; inf and NaN get a finite step, and their sum stays inf or NaN), or where K > 22 and |y| is on the grid,
    |y| itself.

    SPEC §3 keeps grid values: for a grid value g the sum g + u·step is exact below g + step, and rounds up onto
    g + step only when the gap, ≥ step·2^-K ≥ (g + step)·2^-(K+2) (E2M1's spacing is at least a quarter of the
    next grid value), is below half its ulp, ≤ (g + step)·2^-24: only for K > 22.  So only then is the test paid.
    """
    e = tl.minimum(a >> 23, 254)
    step = ((tl.maximum(e, 127) - 1 - K) << 23).to(tl.float32, bitcast=True)
    t = a.to(tl.float32, bitcast=True) + r.to(tl.float32) * step
    if K > 22:
        on_grid = ((a & 0x3FFFFF) == 0) & ((a >= 0x3F800000) | (a == 0) | (a == 0x3F000000))
        return tl.where(on_grid, a, t.to(tl.int32, bitcast=True))
    else:
        return t.to(tl.int32, bitcast=True)


@triton.jit
def e2m1_sr(y, r, K: tl.constexpr):
    """E2M1 code of float32 ``y`` by stochastic rounding with the K-bit values ``r`` (SPEC §3), the short form of
    :func:`encode_sr` for E2M1: the sum t of :func:`_e2m1_sr_sum` (step is the grid's spacing at |y|: 0.5 below 2,
    then 1, then 2), and the code is t truncated onto the grid: floor(2t)
    below 1, else the float32's exponent and first mantissa bit (the carry-free form of :func:`e2m1_rne`), capped
    at 7 (satfinite; inf and NaN give 7, NaN without its sign, as :func:`e2m1_rne`); grid values stay put
    (:func:`_e2m1_sr_sum`)."""
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    tb = _e2m1_sr_sum(a, r, K)
    hi = tl.minimum((tl.minimum(tb, 0x41000000) >> 22) - 252, 7)
    lo = (tb.to(tl.float32, bitcast=True) * 2.0).to(tl.int32)  # below 1: floor(2t) ∈ {0, 1}
    s = tl.where(a > 0x7F800000, 0, (u >> 28) & 8)
    return tl.where(tb < 0x3F800000, lo, hi) | s


@triton.jit
def encode_elem_sr(y, r, K: tl.constexpr, E2M1: tl.constexpr, MBITS: tl.constexpr, EMIN_B: tl.constexpr,
                   MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr):
    """Stochastically rounded element code: :func:`e2m1_sr` on the plan's E2M1 path, else :func:`encode_sr`."""
    if E2M1:
        return e2m1_sr(y, r, K)
    else:
        return encode_sr(y, r, K, MBITS, EMIN_B, MAX_CODE, NAN_CODE, SIGN_SHIFT)


@triton.jit
def e2m1_rne_value(y):
    """float32 value of :func:`e2m1_rne`'s code of ``y`` (the decoded code, −0 and NaN → +6 included), rounded in
    place without a code: |y| ≥ 1 rounds the float32 to one mantissa bit with the integer carry trick and saturates
    at 6; |y| < 1 rounds to a multiple of 0.5 by the float32 magic-number addition (3·2^21, whose ulp is 0.5).  The
    training path's copies hold these values times the block scale, so the code round trip is skipped."""
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    ac = tl.minimum(a, 0x41000000)  # ≥ 8, inf and NaN all saturate to 6
    hi = tl.minimum((ac + 0x1FFFFF + ((ac >> 22) & 1)) & 0x7FC00000, 0x40C00000)
    lo = ((a.to(tl.float32, bitcast=True) + 6291456.0) - 6291456.0).to(tl.int32, bitcast=True)
    s = tl.where(a > 0x7F800000, 0, u & -0x80000000)
    return (tl.where(a < 0x3F800000, lo, hi) | s).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_sr_value(y, r, K: tl.constexpr):
    """float32 value of :func:`e2m1_sr`'s code of ``y`` with the K-bit values ``r`` (the same sum t, truncated onto
    the grid in place: one mantissa bit kept at t ≥ 1, saturated at 6; floor(2t)/2 below 1)."""
    u = y.to(tl.int32, bitcast=True)
    a = u & 0x7FFFFFFF
    tb = _e2m1_sr_sum(a, r, K)
    hi = tl.minimum(tl.minimum(tb, 0x41000000) & 0x7FC00000, 0x40C00000)
    lo = ((tb.to(tl.float32, bitcast=True) * 2.0).to(tl.int32).to(tl.float32) * 0.5).to(tl.int32, bitcast=True)
    s = tl.where(a > 0x7F800000, 0, u & -0x80000000)
    return (tl.where(tb < 0x3F800000, lo, hi) | s).to(tl.float32, bitcast=True)
