"""Slow, obviously-correct scalar reference of SPEC §1–§3, in exact rational arithmetic.

Nothing here looks at bits beyond reading the float32 input: a format is its
sorted list of representable values (built by enumerating codes from the
definition in SPEC §1), and each rounding mode is a choice between the two grid
neighbours of the exact input.  The kernels in ``fpsim`` are checked against it.
"""

from __future__ import annotations

import functools
import math
import struct
from bisect import bisect_left, bisect_right
from fractions import Fraction

from fpsim.formats import FormatSpec, NanStyle


def f32_value(bits: int) -> float:
    """The float32 with these bits, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def code_value(spec: FormatSpec, code: int) -> Fraction | str:
    """Exact value of a code from SPEC §1's field definitions: a Fraction, 'nan', '+inf' or '-inf'."""
    sign = (code >> (spec.bits - 1)) & 1 if spec.signed else 0
    mag = code & ((1 << (spec.ebits + spec.mbits)) - 1)
    e, m = mag >> spec.mbits, mag & ((1 << spec.mbits) - 1)
    top = (1 << spec.ebits) - 1
    if spec.nan is NanStyle.IEEE and e == top:
        return "nan" if m else ("-inf" if sign else "+inf")
    if spec.nan is NanStyle.ALL_ONES and mag == (1 << (spec.ebits + spec.mbits)) - 1:
        return "nan"
    if spec.subnormals and e == 0:
        v = Fraction(m, 1 << spec.mbits) * Fraction(2) ** (1 - spec.bias)
    else:
        v = (1 + Fraction(m, 1 << spec.mbits)) * Fraction(2) ** (e - spec.bias)
    return -v if sign else v


@functools.cache
def grid(spec: FormatSpec) -> tuple[list[Fraction], list[int]]:
    """Non-negative finite values (ascending) and their codes."""
    pairs = []
    for code in range(1 << (spec.ebits + spec.mbits)):  # sign bit clear
        v = code_value(spec, code)
        if isinstance(v, Fraction):
            pairs.append((v, code))
    pairs.sort()
    return [p[0] for p in pairs], [p[1] for p in pairs]


def top_step(spec: FormatSpec) -> Fraction:
    """Quantum of the top binade, 2**(emax - mbits): max + top_step is where the next value would lie."""
    mx = grid(spec)[0][-1]
    e = 0
    while Fraction(2) ** (e + 1) <= mx:
        e += 1
    while Fraction(2) ** e > mx:
        e -= 1
    return Fraction(2) ** (e - spec.mbits)


@functools.cache
def _extended(spec: FormatSpec) -> list[Fraction]:
    """The grid plus a virtual point one top-binade quantum above max (where overflow starts)."""
    vals = grid(spec)[0]
    return vals + [vals[-1] + top_step(spec)]


def round_to_f32(v: Fraction) -> Fraction:
    """Exact value of fl32(v): round-to-nearest-even to binary32 (v ≥ 0, no overflow)."""
    if v == 0:
        return v
    e = math.floor(math.log2(v))
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    q = Fraction(2) ** (max(e, -126) - 23)  # float32 quantum at v
    n, r = divmod(v, q)
    if r > q / 2 or (r == q / 2 and n % 2 == 1):
        n += 1
    return n * q


def ref_encode(bits: int, spec: FormatSpec, rounding: str = "rne", saturate: bool = True) -> int:
    """Code of the float32 with bits ``bits`` under SPEC §2."""
    x = f32_value(bits)
    sign = (bits >> 31) & 1 if spec.signed else 0
    sbit = sign << (spec.bits - 1)
    if math.isnan(x):
        return spec.nan_code
    vals, codes = grid(spec)
    no_specials = not spec.has_inf and not spec.has_nan
    if math.isinf(x):
        if saturate or no_specials:
            return sbit | codes[-1]
        return sbit | (spec.inf_code if spec.has_inf else spec.nan_code)
    a = abs(Fraction(x))
    if not spec.subnormals and a < vals[0]:
        return sbit | codes[0]  # no zero: everything below the smallest value gives code 0
    ext = _extended(spec)
    i = bisect_right(ext, a) - 1
    lo = ext[i]
    if a > ext[-1]:
        choice = len(codes)  # beyond the first point past max: an overflow in every mode
    elif lo == a:
        choice = i
    else:
        hi_i = i + 1
        hi = ext[hi_i]
        toward_up = {"rtz": False, "rup": sign == 0, "rdown": sign == 1}
        if rounding in toward_up:
            choice = hi_i if toward_up[rounding] else i
        else:
            d_lo, d_hi = a - lo, hi - a
            if d_lo != d_hi:
                choice = i if d_lo < d_hi else hi_i
            elif rounding == "rna":
                choice = hi_i
            else:  # rne: the neighbour whose code is even; the virtual point continues the code sequence
                lo_code = codes[i] if i < len(codes) else codes[-1] + 1
                choice = i if lo_code % 2 == 0 else hi_i
    if choice < len(codes):
        return sbit | codes[choice]
    # overflow (IEEE 754 §7.4 for the directed modes)
    away = rounding in ("rne", "rna") or (rounding == "rup" and sign == 0) or (rounding == "rdown" and sign == 1)
    if saturate or no_specials or not away:
        return sbit | codes[-1]
    return sbit | (spec.inf_code if spec.has_inf else spec.nan_code)


def ref_sr(bits: int, spec: FormatSpec, r: int, k: int) -> int:
    """Stochastic rounding of SPEC §3 with random integer ``r`` of ``k`` bits."""
    x = f32_value(bits)
    sign = (bits >> 31) & 1 if spec.signed else 0
    sbit = sign << (spec.bits - 1)
    if math.isnan(x):
        return spec.nan_code
    vals, codes = grid(spec)
    if math.isinf(x) or abs(Fraction(x)) >= vals[-1]:
        return sbit | codes[-1]
    a = abs(Fraction(x))
    if not spec.subnormals and a < vals[0]:
        return sbit | codes[0]
    i = bisect_right(vals, a) - 1
    if vals[i] == a:
        return sbit | codes[i]
    step = vals[i + 1] - vals[i]
    t = round_to_f32(a + Fraction(r, 1 << k) * step)
    j = min(bisect_right(vals, t) - 1, len(vals) - 1)
    return sbit | codes[j]


def ref_decode(code: int, spec: FormatSpec) -> float:
    """float value of a code (NaN as float('nan'))."""
    v = code_value(spec, code)
    if v == "nan":
        return math.nan
    if v in ("+inf", "-inf"):
        return math.inf if v == "+inf" else -math.inf
    if v == 0 and (code >> (spec.bits - 1)) & 1 and spec.signed:
        return -0.0
    return float(v)


def neighbours(spec: FormatSpec, value: float) -> tuple[Fraction, Fraction]:
    """Grid neighbours lo ≤ |value| ≤ hi (for tests that build midpoints)."""
    vals, _ = grid(spec)
    a = abs(Fraction(value))
    return vals[max(bisect_right(vals, a) - 1, 0)], vals[min(bisect_left(vals, a), len(vals) - 1)]
