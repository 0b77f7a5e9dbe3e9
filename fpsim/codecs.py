"""Bit-exact element codecs: float32 ⇄ codes of every registered format (SPEC §2–§3).

Conventions (NVIDIA's, see docs/spec.md §2–§3):

* inputs are converted to float32 first (float64/float16/bfloat16 by RNE);
* ``saturate=True`` is ``.satfinite``: finite overflow and ±inf give ±max
  finite; ``saturate=False`` is ``__NV_NOSAT`` / ml_dtypes: E4M3 gives NaN
  beyond 464, E5M2/BF16/FP16 give ±inf; formats without inf/NaN always saturate.
  The default (``saturate=None``, :func:`default_saturate`) is ``.satfinite`` for
  the ≤ 8-bit formats and IEEE for BF16/FP16 (``__float2bfloat16_rn``,
  ``__float2half_rn``, torch and ml_dtypes: overflow and inf give ±inf), SPEC §2.
  Under ``saturate=False`` the directed modes follow IEEE 754 §7.4 (``rtz``
  overflows to max finite, ``rup`` to +inf but -max, ``rdown`` the mirror);
* NaN → the positive all-ones magnitude (E2M1 0x7 = +6, FP6 0x1F, E4M3/E5M2
  0x7F, BF16/FP16 0x7FFF, E8M0 0xFF); −0.0 keeps its sign; float32 subnormals
  are exact inputs (no flush to zero);
* E8M0 (``float8_e8m0fnu``) encodes ``|x|`` like ``cvt.rz|rp.ue8m0x2.f32``:
  0 and values ≤ 2**-127 give 0x00 (the format has no zero), ``saturate``
  caps at 0xFE, otherwise overflow and inf give 0xFF;
* stochastic rounding is ``cvt.rs.satfinite``: SPEC §3's formula with ``k``
  random bits per element, given as ``rbits`` or generated from ``seed`` by
  Philox4x32-10 (:func:`fpsim.random.random_bits`), so bits are
  backend-independent.
"""

from __future__ import annotations

import enum
import functools

import numpy as np

from . import _kernels as K
from ._arrays import as_codes, as_float32
from .formats import FormatSpec, get_format
from .random import seed_key, stream_width

__all__ = ["Rounding", "encode", "encode_quotient", "decode", "default_saturate", "encode_lut", "SR_EXACT_BITS"]


class Rounding(str, enum.Enum):
    """Rounding mode of a float32 → element conversion.

    ``RNE``: to nearest, ties to the even *code* (``cvt.rn``; IEEE default;
    ml_dtypes).  For E8M0, which has no mantissa, that is the even exponent.
    ``RTZ``: toward zero (``cvt.rz``).
    ``RUP``: toward +inf (``cvt.rp``; for E8M0 "round up to the next power of two").
    ``RDOWN``: toward −inf (``cvt.rm``).
    ``RNA``: to nearest, ties away from zero (microxcaling's "nearest").
    ``SR``: stochastic (``cvt.rs.satfinite``), SPEC §3.
    """

    RNE = "rne"
    RTZ = "rtz"
    RUP = "rup"
    RDOWN = "rdown"
    RNA = "rna"
    SR = "sr"

    @property
    def kernel_id(self) -> int:
        return _KERNEL_IDS[self]

    @classmethod
    def parse(cls, value: str | Rounding) -> Rounding:
        """Accept a member or its name, case-insensitively (``"RNE"``, ``"sr"`` …)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown rounding mode {value!r}; known: {known}") from None


_KERNEL_IDS = {
    Rounding.RNE: K.RNE,
    Rounding.RTZ: K.RTZ,
    Rounding.RUP: K.RUP,
    Rounding.RDOWN: K.RDOWN,
    Rounding.RNA: K.RNA,
    Rounding.SR: K.SR,
}

#: Random bits per element of the "exact" stochastic rounding used by studies.
SR_EXACT_BITS = 24


@functools.cache
def encode_lut(spec: FormatSpec, mode: int, saturate: bool) -> np.ndarray:
    """The encode table of a ≤ 8-bit format under one rounding mode (kernel id) and saturation, indexed by the
    float32 bits shifted right by ``21 - mbits`` (every bit that can affect rounding kept); read-only, cached."""
    shift = 21 - spec.mbits
    lut = np.empty(1 << (33 - shift), dtype=spec.code_dtype)
    K.build_lut(spec.traits, mode, saturate, shift, lut)
    lut.setflags(write=False)
    return lut


def _output(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A fresh output array, or the caller's ``out`` after checking it can be written in place."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype:
        got = f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"out must be an array of shape {shape} and dtype {dtype}, got {got}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writeable")
    return out


def _float32_aligned(spec: FormatSpec) -> bool:
    """Binades and subnormals coincide with float32's: rounding is an integer add on the bits."""
    return spec.ebits == 8 and spec.bias == 127 and spec.subnormals and spec.signed and spec.has_inf


def default_saturate(fmt: str | FormatSpec) -> bool:
    """The overflow convention of ``encode(..., saturate=None)`` for ``fmt`` (SPEC §2).

    ``True`` (``.satfinite``) for the ≤ 8-bit formats (FP4, FP6, FP8, E8M0), ``False`` (IEEE: overflow and
    inf give ±inf, like ``__float2bfloat16_rn``, torch and ml_dtypes) for the 16-bit BF16 and FP16.

    >>> default_saturate("e4m3"), default_saturate("bf16")
    (True, False)
    """
    return get_format(fmt).bits <= 8


def encode(
    x: np.typing.ArrayLike,
    fmt: str | FormatSpec,
    rounding: str | Rounding = "rne",
    saturate: bool | None = None,
    rbits: np.typing.ArrayLike | None = None,
    seed: int | None = None,
    k: int | None = None,
    counter: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Encode values to the codes of element format ``fmt`` (SPEC §2–§3).

    Parameters
    ----------
    x
        Values of any shape; converted to float32 first (RNE).
    fmt
        Element format name, alias or :class:`~fpsim.formats.FormatSpec`.
    rounding
        ``"rne"`` (default), ``"rtz"``, ``"rup"``, ``"rdown"``, ``"rna"`` or ``"sr"``.
    saturate
        ``True``: ``.satfinite``.  ``False``: ``__NV_NOSAT`` / IEEE / ml_dtypes.  ``None`` (default):
        :func:`default_saturate` — satfinite for ≤ 8-bit formats, IEEE for BF16/FP16.
        Stochastic rounding is satfinite only, like ``cvt.rs.satfinite`` (``None`` means ``True`` there).
    rbits, seed
        Stochastic rounding only, exactly one of them: the random integers
        (one per element, shape of ``x``, each < 2**k), or a seed for
        Philox4x32-10 (bits of element ``i`` = element ``i`` of
        ``random_bits(seed, x.size, k, counter)``).
    k
        Random bits per element (default: the format's hardware width, 8 for
        E2M1, 16 for FP8/FP6/BF16, 13 for FP16; 24 = "exact" SR).
    counter
        First Philox counter (one counter value per 16 bytes of random bits).
    out
        Optional C-contiguous array of the shape of ``x`` and dtype
        ``spec.code_dtype`` to write the codes into (saves the allocation and
        its page faults on large arrays).

    Returns
    -------
    numpy.ndarray
        Codes of the shape of ``x``, dtype uint8 (≤ 8 bits), uint16 or uint32.

    Examples
    --------
    >>> encode([1.25, 1.75, -0.0, float("nan")], "e2m1")
    array([ 2,  4,  8,  7], dtype=uint8)
    >>> encode([500.0], "e4m3"), encode([500.0], "e4m3", saturate=False)
    (array([126], dtype=uint8), array([127], dtype=uint8))
    >>> hex(int(encode(float("inf"), "bf16"))), hex(int(encode(float("inf"), "bf16", saturate=True)))
    ('0x7f80', '0x7f7f')
    """
    spec = get_format(fmt)
    mode = Rounding.parse(rounding)
    if saturate is None:
        saturate = True if mode is Rounding.SR else default_saturate(spec)
    x32 = as_float32(x)
    if mode is not Rounding.SR:
        if rbits is not None or seed is not None:
            raise ValueError("rbits/seed apply only to rounding='sr'")
        if spec.is_passthrough:
            return x32.view(np.uint32).copy()
        bits = x32.reshape(-1).view(np.uint32)
        out = _output(out, x32.shape, spec.code_dtype)
        flat = out.reshape(-1)
        if spec.bits <= 8:
            K.encode_array_lut(bits, flat, encode_lut(spec, mode.kernel_id, bool(saturate)), 21 - spec.mbits)
        elif _float32_aligned(spec) and mode in (Rounding.RNE, Rounding.RNA):
            K.encode_array_aligned(bits, flat, spec.traits, mode.kernel_id, bool(saturate))
        else:
            K.encode_array(bits, flat, spec.traits, mode.kernel_id, bool(saturate))
        return out

    if not saturate:
        raise ValueError("stochastic rounding is satfinite only (cvt.rs.satfinite); use saturate=True")
    kbits = spec.sr_bits if k is None else int(k)
    if not 1 <= kbits <= SR_EXACT_BITS:
        raise ValueError(f"k must be in 1..{SR_EXACT_BITS}, got {kbits}")
    if (rbits is None) == (seed is None):
        raise ValueError("rounding='sr' needs exactly one of rbits= or seed=")
    if spec.is_passthrough:
        return x32.view(np.uint32).copy()
    bits = x32.reshape(-1).view(np.uint32)
    out = _output(out, x32.shape, spec.code_dtype)
    flat = out.reshape(-1)
    if seed is not None:
        k0, k1 = seed_key(seed)
        K.encode_array_sr_seeded(bits, k0, k1, int(counter), stream_width(kbits), kbits, flat, spec.traits)
    else:
        r = np.asarray(rbits)
        if r.shape != x32.shape:
            raise ValueError(f"rbits must have the shape of x {x32.shape}, got {r.shape}")
        if not np.issubdtype(r.dtype, np.integer):
            raise TypeError(f"rbits must be integers, got {r.dtype}")
        r = np.ascontiguousarray(r, dtype=np.int64).reshape(-1)
        if r.size and (r.min() < 0 or r.max() >= (1 << kbits)):
            raise ValueError(f"rbits must lie in [0, 2**{kbits})")
        K.encode_array_sr(bits, r, kbits, flat, spec.traits)
    return out


def encode_quotient(x32: np.ndarray, d: np.float32, fmt: str | FormatSpec, rounding: str | Rounding = "rne",
                    **sr_kw) -> np.ndarray:
    """``encode(x32 / d, fmt, rounding, **sr_kw)`` for a float32 array and a float32 scalar ``d`` (numpy's IEEE
    quotient): on the table path of :func:`encode` (≤ 8-bit formats, not SR) the division is taken in the encode pass,
    with no quotient array (:func:`fpsim._kernels.encode_array_lut_div`); otherwise the quotient, then
    :func:`encode`."""
    spec = get_format(fmt)
    mode = Rounding.parse(rounding)
    if mode is not Rounding.SR and spec.bits <= 8:
        xc = np.ascontiguousarray(x32, np.float32)
        out = np.empty(xc.shape, spec.code_dtype)
        K.encode_array_lut_div(xc.reshape(-1), np.float32(d), out.reshape(-1),
                               encode_lut(spec, mode.kernel_id, default_saturate(spec)), 21 - spec.mbits)
        return out
    with np.errstate(all="ignore"):
        y = x32 / d
    return encode(y, spec, mode, **sr_kw)


def decode(codes: np.typing.ArrayLike, fmt: str | FormatSpec, out: np.ndarray | None = None) -> np.ndarray:
    """Decode codes of element format ``fmt`` to float32 (exact).

    NaN codes give the positive canonical float32 NaN (0x7FC00000); E8M0 code
    ``b`` gives 2**(b − 127) (code 0 is 2**-127, a float32 subnormal).  Codes
    may be any integer array, or an ml_dtypes array of the format's dtype
    (read as its bits).  Codes outside ``[0, 2**bits)`` raise ``ValueError``.
    ``out``: optional C-contiguous float32 array of the codes' shape to fill.

    >>> decode([0x2, 0x4, 0xF], "e2m1")
    array([ 1. ,  2. , -6. ], dtype=float32)
    """
    spec = get_format(fmt)
    c = as_codes(codes, spec)
    if spec.is_passthrough:
        return c.view(np.float32).copy()
    out = _output(out, c.shape, np.dtype(np.float32))
    bad = K.decode_array(c.reshape(-1), spec.decode_table(), out.reshape(-1))
    if bad:
        raise ValueError(f"{bad} code(s) outside the {spec.bits}-bit range of {spec.name}")
    return out
