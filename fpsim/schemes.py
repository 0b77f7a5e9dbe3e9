"""Block-scaled number formats as data: :class:`BlockScheme`, its presets, and the enums of its options.

A block format is a *composition* (STYLE §2): an element format, a scale format (E4M3-like, E8M0,
FP32 or none), a block shape, an optional second-level FP32 tensor scale, a scale rule and the
element rounding.  NVFP4 and MXFP4 differ only in these data.  :func:`fpsim.plan.lower` turns a
scheme and its per-call options into the frozen plan every backend runs (docs/spec.md §4–§6).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._hashing import cached_hash
from .codecs import Rounding
from .formats import FORMATS, FormatSpec, NanStyle, get_format

__all__ = ["ScaleRule", "Kind", "BlockScheme", "SCHEMES", "SCHEME_ALIASES", "get_scheme"]


class ScaleRule(str, enum.Enum):
    """How an E8M0 (power-of-two) block scale exponent follows from the block amax (SPEC §5).

    All rules read the exponent field of the float32 amax (never a float
    ``log2``); the exponent is clamped to [−127, 127]; NaN amax → 0xFF, inf → 0xFE.

    ``FLOOR``: E = floor(log2 amax) − emax_elem (OCP MX v1.0 text; a block max
    with a mantissa above the element's max mantissa saturates).
    ``CEIL``: the floor rule + 1 when amax is not a power of two (never saturates).
    ``EVEN``: the floor rule on amax rounded to the element's mantissa width
    (torchao's ``EVEN``; its half-up rounding and half-even agree here).
    ``RCEIL``: E = ceil(log2(fl(amax · fl(1/max_elem)))), PTX
    ``cvt.rp.satfinite.ue8m0x2.f32``: NVIDIA / Transformer Engine / cuBLAS; the default.
    """

    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"
    RCEIL = "rceil"

    @property
    def rule_id(self) -> int:
        """The rule's integer in every backend's kernels (declaration order: floor 0 … rceil 3)."""
        return _RULE_IDS[self]

    @classmethod
    def parse(cls, value: str | ScaleRule) -> ScaleRule:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown scale rule {value!r}; known: {', '.join(m.value for m in cls)}") from None


_RULE_IDS = {r: i for i, r in enumerate(ScaleRule)}


class Kind(enum.Enum):
    """What a scheme's scale format makes of it (read off the scale format, never off names)."""

    CAST = "cast"  #: no scale: element-wise cast (BF16, FP16)
    TWO_LEVEL = "two_level"  #: E4M3-like block scale, optional FP32 second level: NVFP4 (docs/spec.md §4)
    POW2 = "pow2"  #: E8M0 power-of-two block scale: MX (§5)
    FP32 = "fp32"  #: FP32 scales: FP8 current scaling, blockwise FP8 (§6)


def _spec_to_json(spec: FormatSpec | None):
    if spec is None:
        return None
    if FORMATS.get(spec.name) == spec:
        return spec.name
    d = dataclasses.asdict(spec)
    d["nan"] = spec.nan.value
    return d


def _spec_from_json(obj) -> FormatSpec | None:
    if obj is None:
        return None
    if isinstance(obj, str):
        return get_format(obj)
    d = dict(obj)
    d["nan"] = NanStyle(d["nan"])
    return FormatSpec(**d)


@cached_hash
@dataclass(frozen=True)
class BlockScheme:
    """A block-scaled number format: element format × scale format × block shape × scale rules.

    Parameters
    ----------
    name
        A label (presets: ``"nvfp4"``, ``"mxfp4"``, …; see :data:`SCHEMES`).
    element
        Element format (name, alias or :class:`~fpsim.formats.FormatSpec`).
    scale
        Scale format: an E4M3-like format (two-level NVFP4-style scaling), E8M0
        (MX, power-of-two scales under ``scale_rule``), ``"float32"`` (FP8
        current / blockwise scaling), or ``None`` (a plain cast).
    block
        ``(rows, cols)`` of one block, e.g. (1, 16), (16, 16), (1, 32),
        (1, 128), (128, 128); ``None`` = one scale for the whole tensor.
    tensor_scale
        Second-level FP32 scale from the tensor amax (NVFP4's S_enc, SPEC §4).
        Without it S_enc = S_dec = 1.
    scale_rule
        E8M0 scale rule (:class:`ScaleRule`), default ``rceil``.
    rounding
        Element rounding: ``"rne"`` (default) or ``"sr"`` (stochastic, SPEC §3),
        or any other mode of :class:`~fpsim.codecs.Rounding`.
    sr_bits
        Random bits per element for SR (default: the element's hardware width, 8 for E2M1).
    four_over_six
        NVFP4 variant: per block keep the better of vmax → 6 and vmax → 4
        (scale × 1.5) by ``four_over_six_metric`` (``"mse"`` or ``"mae"``); the
        global bound becomes 256 instead of 448.  E2M1 elements only.
    per_row_scale
        Second-level scale per row (of the quantized 2-D view) instead of per tensor.
    """

    # The fields hold the normalised values; the constructor also takes names (``__post_init__`` resolves them),
    # which the signature below tells a type checker.
    name: str
    element: FormatSpec
    scale: FormatSpec | None
    block: tuple[int, int] | None
    tensor_scale: bool = False
    scale_rule: ScaleRule = ScaleRule.RCEIL
    rounding: Rounding = Rounding.RNE
    sr_bits: int | None = None
    four_over_six: bool = False
    four_over_six_metric: str = "mse"
    per_row_scale: bool = False

    if TYPE_CHECKING:
        def __init__(self, name: str, element: FormatSpec | str, scale: FormatSpec | str | None,
                     block: tuple[int, int] | None, tensor_scale: bool = False,
                     scale_rule: ScaleRule | str = ScaleRule.RCEIL, rounding: Rounding | str = Rounding.RNE,
                     sr_bits: int | None = None, four_over_six: bool = False, four_over_six_metric: str = "mse",
                     per_row_scale: bool = False) -> None: ...

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "element", get_format(self.element))
        set_(self, "scale", None if self.scale is None else get_format(self.scale))
        set_(self, "scale_rule", ScaleRule.parse(self.scale_rule))
        set_(self, "rounding", Rounding.parse(self.rounding))
        if self.block is not None:
            blk = tuple(int(b) for b in self.block)
            if len(blk) != 2 or min(blk) < 1:
                raise ValueError(f"block must be (rows, cols) with positive sizes, got {self.block}")
            set_(self, "block", blk)
        el, sc = self.element, self.scale
        if self.four_over_six_metric not in ("mse", "mae"):
            raise ValueError("four_over_six_metric must be 'mse' or 'mae'")
        if self.sr_bits is not None and not 1 <= int(self.sr_bits) <= 24:
            raise ValueError("sr_bits must be in 1..24")
        kind = self.kind
        if kind is Kind.CAST:
            if self.block is not None or self.tensor_scale:
                raise ValueError("a scheme without a scale format is a plain cast: block=None, tensor_scale=False")
            return
        if el.bits > 8:
            raise ValueError(f"block-scaled elements must be ≤ 8 bits, got {el.name}")
        if kind is Kind.POW2 and self.tensor_scale:
            raise ValueError("E8M0 (MX) scales have no second-level tensor scale")
        if kind is Kind.FP32 and self.tensor_scale:
            raise ValueError("FP32 scales need no second-level tensor scale")
        if kind is Kind.TWO_LEVEL and sc is not None and sc.bits > 8:  # TWO_LEVEL has a scale
            raise ValueError(f"block scale formats must be ≤ 8 bits (or float32), got {sc.name}")
        if self.block is None and kind is not Kind.FP32:
            raise ValueError("per-tensor scaling (block=None) is defined for FP32 scales only")
        if self.block is not None and el.bits == 4 and self.block[1] % 2:
            raise ValueError("4-bit elements are packed two per byte: the block width must be even")
        if self.four_over_six and (kind is not Kind.TWO_LEVEL or el.name != "float4_e2m1fn"):
            raise ValueError("four_over_six applies to E2M1 elements with E4M3-like block scales")
        if self.per_row_scale and (kind is not Kind.TWO_LEVEL or not self.tensor_scale):
            raise ValueError("per_row_scale needs a two-level scheme with tensor_scale=True")
        if self.per_row_scale and self.block is not None and self.block[0] > 1:
            raise ValueError("per_row_scale is undefined for 2-D tiles (a tile spans several rows)")

    @property
    def kind(self) -> Kind:
        sc = self.scale
        if sc is None:
            return Kind.CAST
        if sc.bits == 32:
            return Kind.FP32
        if not sc.subnormals and sc.mbits == 0:
            return Kind.POW2
        return Kind.TWO_LEVEL

    @property
    def k(self) -> int:
        """Random bits per element under stochastic rounding."""
        return int(self.sr_bits) if self.sr_bits is not None else self.element.sr_bits

    def replace(self, **changes) -> BlockScheme:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        """A JSON-ready dict of every field (custom formats spelled out field by field)."""
        return {
            "name": self.name,
            "element": _spec_to_json(self.element),
            "scale": _spec_to_json(self.scale),
            "block": None if self.block is None else list(self.block),
            "tensor_scale": self.tensor_scale,
            "scale_rule": self.scale_rule.value,
            "rounding": self.rounding.value,
            "sr_bits": self.sr_bits,
            "four_over_six": self.four_over_six,
            "four_over_six_metric": self.four_over_six_metric,
            "per_row_scale": self.per_row_scale,
        }

    @classmethod
    def from_json(cls, d: dict) -> BlockScheme:
        d = dict(d)
        d["element"] = _spec_from_json(d["element"])
        d["scale"] = _spec_from_json(d["scale"])
        d["block"] = None if d["block"] is None else tuple(d["block"])
        return cls(**d)


_B = BlockScheme
#: Preset schemes by name (SPEC §4–§6).
SCHEMES: dict[str, BlockScheme] = {
    s.name: s
    for s in (
        _B("nvfp4", "e2m1", "e4m3", (1, 16), tensor_scale=True),
        _B("mxfp4", "e2m1", "e8m0", (1, 32)),
        _B("mxfp6_e2m3", "e2m3", "e8m0", (1, 32)),
        _B("mxfp6_e3m2", "e3m2", "e8m0", (1, 32)),
        _B("mxfp8_e4m3", "e4m3", "e8m0", (1, 32)),
        _B("mxfp8_e5m2", "e5m2", "e8m0", (1, 32)),
        _B("fp8_e4m3", "e4m3", "float32", None),
        _B("fp8_e5m2", "e5m2", "float32", None),
        _B("fp8_block128", "e4m3", "float32", (1, 128)),
        _B("bf16", "bfloat16", None, None),
    )
}


#: The usual spellings of the presets (the schemes' one alias table): MXFP8 and FP8 mean their E4M3 variant, as in
#: the OCP MX recipes and Transformer Engine's default (E5M2 is named: mxfp8_e5m2, fp8_e5m2).
SCHEME_ALIASES: dict[str, str] = {
    **{n: n for n in SCHEMES},
    **dict.fromkeys(("mxfp8", "mx_fp8", "mxfp8e4m3"), "mxfp8_e4m3"),
    **dict.fromkeys(("fp8", "e4m3", "float8_e4m3fn", "fp8e4m3"), "fp8_e4m3"),
    **dict.fromkeys(("e5m2", "float8_e5m2", "fp8e5m2"), "fp8_e5m2"),
    **dict.fromkeys(("nv_fp4",), "nvfp4"),
    **dict.fromkeys(("mx_fp4",), "mxfp4"),
    **dict.fromkeys(("bfloat16",), "bf16"),
}


def get_scheme(scheme: str | BlockScheme) -> BlockScheme:
    """A preset by name or alias (:data:`SCHEME_ALIASES`; case-insensitive), or the scheme itself.

    >>> get_scheme("nvfp4").block
    (1, 16)
    >>> get_scheme("mxfp8").name
    'mxfp8_e4m3'
    """
    if isinstance(scheme, BlockScheme):
        return scheme
    key = str(scheme).strip().lower().replace("-", "_")
    try:
        return SCHEMES[SCHEME_ALIASES[key]]
    except KeyError:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}") from None

