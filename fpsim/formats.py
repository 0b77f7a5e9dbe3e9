"""Element formats: one frozen spec type, the registry, and the alias table (SPEC §1).

Every minifloat fpsim knows is a :class:`FormatSpec` — exponent bits, mantissa
bits, bias, signedness, and the inf/NaN policy.  Everything else (max finite,
min normal, min subnormal, the NaN code, the value of every code) is derived
from those fields, and a single generic encoder/decoder in :mod:`fpsim.codecs`
is driven by them.  There is no per-format code.

Canonical names are the ml_dtypes / LLVM spellings (``float4_e2m1fn``,
``float8_e4m3fn``, ``float8_e8m0fnu`` …); user spellings (``e2m1``, ``fp4``,
``e4m3``, ``bf16`` …) go through :data:`ALIASES`, the one alias table.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ._hashing import cached_hash

__all__ = [
    "NanStyle",
    "Traits",
    "FormatSpec",
    "FORMATS",
    "ALIASES",
    "get_format",
    "format_names",
]


class NanStyle(str, enum.Enum):
    """How a format spends its top codes on specials.

    ``IEEE``: the all-ones exponent is reserved: mantissa 0 is ±inf, any other
    mantissa is NaN (E5M2, BF16, FP16, FP32).
    ``ALL_ONES``: only the all-ones magnitude is NaN, every other code is finite
    and there is no infinity (the ``fn`` formats: E4M3, E8M0).
    ``NONE``: every code is finite (E2M1, E2M3, E3M2).
    """

    IEEE = "ieee"
    ALL_ONES = "all_ones"
    NONE = "none"


class Traits(NamedTuple):
    """The integers a codec kernel needs of one format, by name (:attr:`FormatSpec.traits`).

    Every backend (the Numba kernels, the torch ops, the Triton kernels) reads a format through these
    fields, so a new format is one :class:`FormatSpec` and runs everywhere.  Numba receives the tuple
    itself (a named tuple of ints is one kernel argument); Python code reads the fields by name.
    """

    bits: int  #: total width
    mbits: int  #: explicit mantissa bits
    signed: int  #: 1 when the top bit is a sign bit
    has_inf: int  #: 1 for IEEE-style infinities
    has_nan: int  #: 1 when some code is NaN
    subnormals: int  #: 1 when exponent field 0 holds zero and subnormals
    max_code: int  #: code of the largest finite magnitude
    emin_b: int  #: float32 biased exponent of the smallest full-precision binade (127 + emin)
    nan_code: int  #: the NaN code fpsim writes (the positive all-ones magnitude where there is one)
    inf_code: int  #: +inf's code, or -1


@cached_hash
@dataclass(frozen=True)
class FormatSpec:
    """A binary floating-point element format.

    Parameters
    ----------
    name
        Canonical (ml_dtypes) name.
    ebits, mbits
        Exponent and explicit mantissa field widths.
    bias
        Exponent bias: a normal code with exponent field ``e`` has value
        ``(1 + m / 2**mbits) * 2**(e - bias)``.
    signed
        Whether the top bit is a sign bit.  Unsigned formats (E8M0) encode
        ``|x|``, as PTX ``cvt.*.ue8m0x2.f32`` does.
    nan
        The inf/NaN policy, see :class:`NanStyle`.
    subnormals
        ``True``: exponent field 0 holds zero and the subnormals
        ``m * 2**(1 - bias - mbits)``.  ``False``: exponent field 0 is an
        ordinary binade and the format has no zero (E8M0: code 0 is 2**-127).
    sr_bits
        Default number of random bits per element for stochastic rounding,
        as NVIDIA's ``cvt.rs`` forms consume them (SPEC §3).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    nan: NanStyle = NanStyle.IEEE
    subnormals: bool = True
    sr_bits: int = 16

    def __post_init__(self) -> None:
        if not (1 <= self.ebits <= 8 and 0 <= self.mbits <= 23):
            raise ValueError(f"{self.name}: need 1 <= ebits <= 8 and 0 <= mbits <= 23")
        if self.bits > 32:
            raise ValueError(f"{self.name}: at most 32 bits")
        if not self.subnormals and self.mbits != 0:
            # Only power-of-two scale formats lack subnormals; the encoder's
            # underflow rule (clamp to code 0) is defined for that case alone.
            raise ValueError(f"{self.name}: formats without subnormals must have mbits == 0")
        if not 1 <= self.sr_bits <= 24:
            raise ValueError(f"{self.name}: sr_bits must be in 1..24")

    # -- widths and masks ---------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width in bits."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def is_passthrough(self) -> bool:
        """True for float32 itself: encode/decode are bit-preserving views."""
        return self.bits == 32

    @property
    def code_dtype(self) -> np.dtype:
        """Smallest unsigned dtype that holds one code (uint8/uint16/uint32)."""
        return np.dtype(np.uint8 if self.bits <= 8 else np.uint16 if self.bits <= 16 else np.uint32)

    @property
    def magnitude_mask(self) -> int:
        """Mask of the exponent and mantissa fields."""
        return (1 << (self.ebits + self.mbits)) - 1

    @property
    def sign_mask(self) -> int:
        """Mask of the sign bit (0 for unsigned formats)."""
        return (1 << (self.bits - 1)) if self.signed else 0

    # -- special codes --------------------------------------------------------
    @property
    def has_inf(self) -> bool:
        """Whether the format encodes ±infinity."""
        return self.nan is NanStyle.IEEE

    @property
    def has_nan(self) -> bool:
        """Whether the format encodes NaN."""
        return self.nan is not NanStyle.NONE

    @property
    def max_code(self) -> int:
        """Code (positive) of the largest finite magnitude."""
        if self.nan is NanStyle.IEEE:
            return (((1 << self.ebits) - 2) << self.mbits) | ((1 << self.mbits) - 1)
        if self.nan is NanStyle.ALL_ONES:
            return self.magnitude_mask - 1
        return self.magnitude_mask

    @property
    def inf_code(self) -> int | None:
        """Code of +inf, or None."""
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None

    @property
    def nan_code(self) -> int:
        """Code NVIDIA's conversions produce for a NaN input (SPEC §2).

        Always the positive all-ones magnitude: the canonical NaN where the
        format has one (E4M3 0x7F, E5M2 0x7F, BF16 0x7FFF, E8M0 0xFF), and the
        positive maximum where it has none (E2M1 0x7, E2M3/E3M2 0x1F).
        """
        return self.magnitude_mask

    # -- derived values -------------------------------------------------------
    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        e, m = self.max_code >> self.mbits, self.max_code & ((1 << self.mbits) - 1)
        return float((1.0 + m / 2.0**self.mbits) * 2.0 ** (e - self.bias))

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (for E8M0, the smallest value)."""
        return float(2.0**self.emin)

    @property
    def min_subnormal(self) -> float | None:
        """Smallest positive subnormal value, or None if the format has none."""
        return float(2.0 ** (self.emin - self.mbits)) if self.subnormals else None

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite value."""
        return int(np.frexp(self.max)[1]) - 1

    @property
    def traits(self) -> Traits:
        """The format's integers for the kernels of every backend, by name (see :class:`Traits`)."""
        return Traits(
            bits=self.bits,
            mbits=self.mbits,
            signed=int(self.signed),
            has_inf=int(self.has_inf),
            has_nan=int(self.has_nan),
            subnormals=int(self.subnormals),
            max_code=self.max_code,
            emin_b=127 + self.emin,
            nan_code=self.nan_code,
            inf_code=self.inf_code if self.inf_code is not None and self.has_inf else -1,
        )

    @functools.cache  # noqa: B019 - specs are immutable singletons
    def decode_table(self) -> np.ndarray:
        """float32 value of every code, indexed by code (formats of ≤ 16 bits).

        Built with exact float64 arithmetic from the fields, then rounded to
        float32 (exact: every value of every ≤ 16-bit format is a float32).
        NaN codes decode to the positive canonical float32 NaN (0x7FC00000).
        """
        if self.bits > 16:
            raise ValueError(f"{self.name}: no decode table for {self.bits}-bit formats")
        codes = np.arange(1 << self.bits, dtype=np.int64)
        mag = codes & self.magnitude_mask
        e = mag >> self.mbits
        m = (mag & ((1 << self.mbits) - 1)).astype(np.float64)
        scale = 2.0 ** self.mbits
        if self.subnormals:
            val = np.where(e == 0, m / scale * 2.0 ** (1 - self.bias), (1.0 + m / scale) * np.exp2(e - self.bias))
        else:
            val = (1.0 + m / scale) * np.exp2((e - self.bias).astype(np.float64))
        top = (1 << self.ebits) - 1
        if self.nan is NanStyle.IEEE:
            val = np.where((e == top) & (m == 0), np.inf, val)
            val = np.where((e == top) & (m != 0), np.nan, val)
        elif self.nan is NanStyle.ALL_ONES:
            val = np.where(mag == self.magnitude_mask, np.nan, val)
        if self.signed:
            val = np.where(codes & self.sign_mask, -val, val)
        out = val.astype(np.float32)
        bits = out.view(np.uint32)
        bits[np.isnan(out)] = 0x7FC00000
        out.setflags(write=False)
        return out

    def values(self) -> np.ndarray:
        """All distinct finite non-negative values, ascending (float32)."""
        t = self.decode_table()
        return np.unique(np.abs(t[np.isfinite(t)])).astype(np.float32)

    @property
    def ml_dtype(self) -> np.dtype:
        """The matching numpy / ml_dtypes dtype (element storage of the same bits)."""
        import ml_dtypes

        if self.name in ("float16", "float32"):
            return np.dtype(self.name)
        return np.dtype(getattr(ml_dtypes, self.name))

    def __str__(self) -> str:
        return self.name


_F = FormatSpec
#: Registry of element formats, keyed by canonical name.
FORMATS: dict[str, FormatSpec] = {
    f.name: f
    for f in (
        _F("float4_e2m1fn", 2, 1, 1, nan=NanStyle.NONE, sr_bits=8),
        _F("float6_e2m3fn", 2, 3, 1, nan=NanStyle.NONE),
        _F("float6_e3m2fn", 3, 2, 3, nan=NanStyle.NONE),
        _F("float8_e4m3fn", 4, 3, 7, nan=NanStyle.ALL_ONES),
        _F("float8_e5m2", 5, 2, 15, nan=NanStyle.IEEE),
        _F("float8_e8m0fnu", 8, 0, 127, signed=False, nan=NanStyle.ALL_ONES, subnormals=False),
        _F("bfloat16", 8, 7, 127, nan=NanStyle.IEEE),
        _F("float16", 5, 10, 15, nan=NanStyle.IEEE, sr_bits=13),
        _F("float32", 8, 23, 127, nan=NanStyle.IEEE, sr_bits=24),
    )
}

#: The one table of user spellings → canonical element-format names.
ALIASES: dict[str, str] = {
    **{n: n for n in FORMATS},
    **dict.fromkeys(("e2m1", "fp4", "fp4_e2m1", "float4_e2m1", "e2m1fn"), "float4_e2m1fn"),
    **dict.fromkeys(("e2m3", "fp6_e2m3", "float6_e2m3", "e2m3fn"), "float6_e2m3fn"),
    **dict.fromkeys(("e3m2", "fp6_e3m2", "float6_e3m2", "e3m2fn"), "float6_e3m2fn"),
    **dict.fromkeys(("e4m3", "fp8_e4m3", "e4m3fn", "float8_e4m3"), "float8_e4m3fn"),
    **dict.fromkeys(("e5m2", "fp8_e5m2", "float8_e5m2"), "float8_e5m2"),
    **dict.fromkeys(("e8m0", "ue8m0", "e8m0fnu", "float8_e8m0"), "float8_e8m0fnu"),
    **dict.fromkeys(("bf16", "bfloat16"), "bfloat16"),
    **dict.fromkeys(("fp16", "f16", "half", "float16"), "float16"),
    **dict.fromkeys(("fp32", "f32", "float", "float32"), "float32"),
}


def get_format(fmt: str | FormatSpec) -> FormatSpec:
    """Look up an element format by canonical name or alias (case-insensitive).

    >>> get_format("e2m1").name
    'float4_e2m1fn'
    >>> get_format("e4m3").max
    448.0
    """
    if isinstance(fmt, FormatSpec):
        return fmt
    key = str(fmt).strip().lower().replace("-", "_")
    try:
        return FORMATS[ALIASES[key]]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"unknown element format {fmt!r}; known: {known} (or an alias)") from None


def format_names() -> list[str]:
    """Canonical names of all registered element formats."""
    return list(FORMATS)
