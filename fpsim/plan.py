"""One lowering of every scheme: a :class:`BlockScheme` and its per-call options become a frozen :class:`Plan`.

The plan holds, by name, everything a backend needs to quantize or decode: the element and scale
formats' :class:`~fpsim.formats.Traits`, the two-level constants (``num`` = fl(max_elem · bound), the
bound, fl(1/max_elem)), the E8M0 rule id, the stochastic-rounding counter layout, the NaN policy and
the element-encoder path.  The Numba kernels, the torch ops and the Triton kernels all read these
fields; none of them re-derives a constant from a format name or takes a bare literal.  A new
element format, scale format or scale rule is therefore one change (a :class:`~fpsim.formats.FormatSpec`
or a :class:`~fpsim.schemes.ScaleRule` member) and runs on every backend that claims the plan
(:func:`fpsim.backends.supports`).

>>> p = lower("nvfp4")
>>> float(p.two_level.num), p.element.traits.mbits, p.scale.name
(2688.0, 1, 'float8_e4m3fn')
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._hashing import cached_hash
from .codecs import Rounding
from .conventions import FPSIM, Convention, check_plan_parts, get_convention
from .formats import FormatSpec, get_format
from .random import stream_width
from .schemes import BlockScheme, Kind, ScaleRule, get_scheme
from .validate import block_arg

__all__ = [
    "NanPolicy",
    "FourOverSix",
    "ElemPath",
    "ElemArith",
    "ScaleArith",
    "TwoLevel",
    "PowTwo",
    "SRLayout",
    "Plan",
    "lower",
    "is_e2m1",
]

F32 = np.float32


class NanPolicy(str, enum.Enum):
    """NaN in an amax (docs/spec.md §9): ``PROPAGATE`` (default; the scale becomes NaN) or ``IGNORE``
    (skipped like CUDA's ``fmaxf``; the NaN elements themselves then take the element's NaN code)."""

    PROPAGATE = "propagate"
    IGNORE = "ignore"

    @classmethod
    def parse(cls, value: str | NanPolicy) -> NanPolicy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError("nan_amax must be 'propagate' or 'ignore'") from None


class FourOverSix(enum.IntEnum):
    """The four-over-six variant (§4): off, or per block keep the better of vmax → 6 and vmax → 4 by MAE or MSE."""

    OFF = 0
    MAE = 1
    MSE = 2


class ElemPath(enum.IntEnum):
    """How the RNE row kernels encode elements: a lookup table, E2M1 arithmetic, or the generic RNE arithmetic."""

    TABLE = 0
    E2M1 = 1
    ARITH = 2


class ElemArith(NamedTuple):
    """Constants of the arithmetic RNE element encoder (``ElemPath.ARITH``): q = 2^(emin − mbits) is the
    subnormal step, ``qinv`` its inverse; zeros when the plan uses another path."""

    mbits: int
    emin_b: int
    qinv: np.float32
    max_code: int
    nan_code: int
    bits: int


class ScaleArith(NamedTuple):
    """Constants of the arithmetic E4M3-like scale encoder; ``mbits == 0`` selects the table instead."""

    mbits: int
    emin_b: int
    qinv: np.float32
    q: np.float32
    nan_code: int


@cached_hash
@dataclass(frozen=True)
class TwoLevel:
    """NVFP4-style scaling (§4): S_enc = min(fl(num / amax), FLT_MAX); sdb = min(fl(vmax · fl(S_enc · inv_t)), bound).
    """

    tensor_scale: bool  #: second-level FP32 scale from the amax (else S_enc = S_dec = 1)
    per_row: bool  #: one second-level scale per row of the 2-D view instead of per tensor
    bound: np.float32  #: clamp of the block scale before encoding: the scale format's max (448 for E4M3)
    num: np.float32  #: fl(max_elem · tensor bound): 2688 = 6·448 for NVFP4, 1536 = 6·256 under four-over-six
    inv_t: np.float32  #: fl(1 / max_elem)
    inv_t46: np.float32  #: fl(1 / 4): the four-over-six candidate that maps vmax to 4
    four_over_six: FourOverSix
    scale_arith: ScaleArith


@cached_hash
@dataclass(frozen=True)
class PowTwo:
    """MX scaling (§5): an E8M0 exponent from the block amax's bits under ``rule``."""

    rule: ScaleRule
    rule_id: int
    emax: int  #: unbiased exponent of the element's max
    mbits: int  #: element mantissa bits (the ``even`` rule rounds to them)
    inv_max: np.float32  #: fl(1 / max_elem) (the ``rceil`` rule)


@cached_hash
@dataclass(frozen=True)
class SRLayout:
    """Where each element's random bits come from (§3): Philox4x32-10 keyed by the seed; one call is 128 bits
    = ``per_call`` values of ``width`` bits (``k`` used); the counter of block b is counter0 + b · calls_per_block."""

    k: int
    width: int
    per_call: int
    calls_per_block: int


@cached_hash
@dataclass(frozen=True)
class Plan:
    """A scheme lowered with its options: what every backend runs (fields by name, no positional tuples)."""

    scheme: BlockScheme  #: the scheme with the call's overrides applied (block, rounding, scale rule, SR bits)
    kind: Kind
    element: FormatSpec
    scale: FormatSpec | None
    block: tuple[int, int] | None
    rounding: Rounding
    nan: NanPolicy
    packed: bool  #: two 4-bit codes per byte, element 2j in the low nibble
    elem_path: ElemPath
    elem_arith: ElemArith
    sr: SRLayout | None
    two_level: TwoLevel | None
    pow2: PowTwo | None
    #: the producer whose arithmetic the two-level scales, elements and decode follow (:mod:`fpsim.conventions`)
    convention: Convention = FPSIM

    @property
    def ignore_nan(self) -> bool:
        return self.nan is NanPolicy.IGNORE

    @property
    def is_sr(self) -> bool:
        return self.rounding is Rounding.SR

    @property
    def encode_mode(self) -> Rounding:
        """The mode of the element table path: RNE under SR (the SR kernels add their own bits first)."""
        return Rounding.RNE if self.is_sr else self.rounding

    def blocks_per_row(self, cols: int) -> int:
        return -(-cols // self.block[1]) if self.block is not None else 1


def is_e2m1(spec: FormatSpec) -> bool:
    """E2M1 under any name: kernels then encode and decode it arithmetically instead of by table."""
    return spec.traits == get_format("float4_e2m1fn").traits


def elem_path(spec: FormatSpec, mode: Rounding) -> tuple[ElemPath, ElemArith]:
    none = ElemArith(0, 0, F32(0.0), 0, 0, 0)
    if mode is not Rounding.RNE:
        return ElemPath.TABLE, none
    if is_e2m1(spec):
        return ElemPath.E2M1, none
    if spec.subnormals and spec.signed and spec.bits <= 8 and spec.mbits >= 1 and spec.ebits <= 6:
        q = np.ldexp(F32(1.0), spec.emin - spec.mbits)
        return ElemPath.ARITH, ElemArith(spec.mbits, 127 + spec.emin, F32(1.0) / q, spec.max_code, spec.nan_code,
                                         spec.bits)
    return ElemPath.TABLE, none


def scale_arith(spec: FormatSpec) -> ScaleArith:
    """The arithmetic scale encoder covers ≤ 8-bit scale formats with subnormals, a mantissa and a NaN (E4M3, …)."""
    if not (spec.subnormals and spec.bits <= 8 and spec.mbits >= 1 and spec.has_nan):
        return ScaleArith(0, 0, F32(0.0), F32(0.0), 0)
    q = np.ldexp(F32(1.0), spec.emin - spec.mbits)
    return ScaleArith(spec.mbits, 127 + spec.emin, F32(1.0) / q, q, spec.nan_code)


@functools.lru_cache(maxsize=512)
def _lower(sch: BlockScheme, nan: NanPolicy, conv: Convention = FPSIM) -> Plan:
    kind = sch.kind
    el = sch.element
    mode = Rounding.RNE if sch.rounding is Rounding.SR else sch.rounding
    path, arith = elem_path(el, mode)
    sr = None
    if sch.rounding is Rounding.SR:
        width = stream_width(sch.k)
        per_call = 128 // width
        bc = sch.block[1] if sch.block is not None else 1
        sr = SRLayout(sch.k, width, per_call, -(-bc // per_call))
    two = pow2 = None
    if kind is Kind.TWO_LEVEL:
        assert sch.scale is not None
        # Four-over-six maps the tensor amax to 6·256, so that a block's ×1.5 candidate (vmax → 4) still fits
        # under E4M3's 448; the block scale itself is clamped at the scale format's max either way.
        tensor_bound = F32(256.0) if sch.four_over_six else F32(sch.scale.max)
        fos = FourOverSix.OFF if not sch.four_over_six else FourOverSix[sch.four_over_six_metric.upper()]
        two = TwoLevel(sch.tensor_scale, sch.per_row_scale, F32(sch.scale.max), F32(el.max) * tensor_bound,
                       F32(1.0) / F32(el.max),
                       F32(1.0) / F32(4.0), fos, scale_arith(sch.scale))
    elif kind is Kind.POW2:
        pow2 = PowTwo(sch.scale_rule, sch.scale_rule.rule_id, el.emax, el.mbits, F32(1.0) / F32(el.max))
    if conv is not FPSIM:
        check_plan_parts(conv, sch)
        if nan is not NanPolicy.PROPAGATE:
            raise ValueError(f"convention {conv.name!r} takes NaN into every amax (nan_amax='propagate')")
    return Plan(sch, kind, el, sch.scale, sch.block, sch.rounding, nan, el.bits == 4, path, arith, sr, two, pow2,
                conv)


def lower(scheme: str | BlockScheme | Plan, *, block: tuple[int, int] | None = None,
          rounding: str | Rounding | None = None, scale_rule: str | ScaleRule | None = None, k: int | None = None,
          nan_amax: str | NanPolicy = "propagate", convention: str | Convention | None = None) -> Plan:
    """The plan of ``scheme`` with the call's overrides (cached: equal arguments give the same object).

    ``block``, ``rounding``, ``scale_rule``, ``k`` override the scheme's block shape, element rounding,
    E8M0 rule and SR bits (the scheme's own checks apply to the result); ``nan_amax`` is the NaN policy;
    ``convention`` a producer's arithmetic (:mod:`fpsim.conventions`; NVFP4 only, default fpsim's own).
    """
    if isinstance(scheme, Plan):
        if convention is not None and get_convention(convention) is not scheme.convention:
            return _lower(scheme.scheme, scheme.nan, get_convention(convention))
        return scheme
    sch = get_scheme(scheme)
    changes: dict[str, Any] = {}
    block = block_arg(block)
    if block is not None:
        changes["block"] = block
    if rounding is not None:
        changes["rounding"] = rounding
    if scale_rule is not None:
        changes["scale_rule"] = scale_rule
    if k is not None:
        changes["sr_bits"] = int(k)
    if changes:
        sch = dataclasses.replace(sch, **changes)
    return _lower(sch, NanPolicy.parse(nan_amax), get_convention(convention))
