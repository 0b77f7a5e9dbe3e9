"""Block-scaled tensors: NVFP4, MX, FP8 per-tensor and blockwise, BF16 casts (SPEC §4–§6, §9).

A block format is a *composition* (:class:`BlockScheme`): an element format, a
scale format (E4M3, E8M0, FP32 or none), a block shape, an optional second-level
FP32 tensor scale, and a scale rule.  NVFP4 and MXFP4 differ only in these data.
:func:`quantize` turns a float tensor into a :class:`QuantizedTensor` (packed
codes + raw scale bytes + tensor amax), :func:`dequantize` back to float32.

Conventions (NVIDIA's, SPEC.md):

* NVFP4 follows Transformer Engine's FP32 operation order exactly (SPEC §4);
  block scales are *not* clamped from below, so blocks far below the tensor
  amax get subnormal or zero E4M3 scales (a zero-scale block decodes to zeros);
* MX scales come from the block amax's exponent bits under a :class:`ScaleRule`
  (``rceil`` = ``cvt.rp.satfinite.ue8m0`` by default), elements are
  ``x · 2^-E`` encoded with saturation (SPEC §5);
* FP8 with FP32 scales stores ``d = fl(amax / max_elem)`` and encodes
  ``fl(x / d)`` (SPEC §6);
* inputs are converted to float32 first (float64/float16/bfloat16 by RNE);
  blocks run along the last axis unless ``axis`` says otherwise; ragged shapes
  are zero-padded for the computation and restored on decode;
* NaN (SPEC §9): by default the amax propagates NaN (an NVFP4 tensor with a NaN
  decodes to NaN everywhere; an MX block with a NaN gets scale 0xFF and decodes
  to NaN); ``nan_amax="ignore"`` skips NaNs in every amax like CUDA's
  ``fmaxf``, and the NaN elements themselves then take the element format's NaN
  code (for E2M1 that is +6, a finite value: the price of ignoring NaN).

The blocks of a 2-D tile mode (16×16, 128×128) store the tile's one scale on
each of its rows, so quantizing ``W.T`` gives exactly the transposed codes and
scales of quantizing ``W``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _scaling_kernels as SK
from . import backends
from ._arrays import as_float32
from .codecs import Rounding, _encode_lut, decode, encode
from .formats import FORMATS, FormatSpec, NanStyle, get_format
from .random import seed_key, stream_width

__all__ = [
    "ScaleRule",
    "BlockScheme",
    "SCHEMES",
    "get_scheme",
    "QuantizedTensor",
    "quantize",
    "dequantize",
    "fake_quantize",
    "swizzle_scales",
    "unswizzle_scales",
    "save_quantized",
    "load_quantized",
]


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
    def kernel_id(self) -> int:
        return {"floor": SK.FLOOR, "ceil": SK.CEIL, "even": SK.EVEN, "rceil": SK.RCEIL}[self.value]

    @classmethod
    def parse(cls, value: str | ScaleRule) -> ScaleRule:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown scale rule {value!r}; known: {', '.join(m.value for m in cls)}") from None


class _Kind(enum.Enum):
    CAST = "cast"  # no scale: element-wise cast (BF16, FP16)
    TWO_LEVEL = "two_level"  # E4M3-like block scale (+ optional FP32 tensor scale): NVFP4
    POW2 = "pow2"  # E8M0 block scale: MX
    FP32 = "fp32"  # FP32 scales: FP8 current scaling, blockwise FP8


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

    name: str
    element: FormatSpec | str
    scale: FormatSpec | str | None
    block: tuple[int, int] | None
    tensor_scale: bool = False
    scale_rule: ScaleRule | str = ScaleRule.RCEIL
    rounding: Rounding | str = Rounding.RNE
    sr_bits: int | None = None
    four_over_six: bool = False
    four_over_six_metric: str = "mse"
    per_row_scale: bool = False

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
        if kind is _Kind.CAST:
            if self.block is not None or self.tensor_scale:
                raise ValueError("a scheme without a scale format is a plain cast: block=None, tensor_scale=False")
            return
        if el.bits > 8:
            raise ValueError(f"block-scaled elements must be ≤ 8 bits, got {el.name}")
        if kind is _Kind.POW2 and self.tensor_scale:
            raise ValueError("E8M0 (MX) scales have no second-level tensor scale")
        if kind is _Kind.FP32 and self.tensor_scale:
            raise ValueError("FP32 scales need no second-level tensor scale")
        if kind is _Kind.TWO_LEVEL and sc.bits > 8:
            raise ValueError(f"block scale formats must be ≤ 8 bits (or float32), got {sc.name}")
        if self.block is None and kind is not _Kind.FP32:
            raise ValueError("per-tensor scaling (block=None) is defined for FP32 scales only")
        if self.block is not None and el.bits == 4 and self.block[1] % 2:
            raise ValueError("4-bit elements are packed two per byte: the block width must be even")
        if self.four_over_six and (kind is not _Kind.TWO_LEVEL or el.name != "float4_e2m1fn"):
            raise ValueError("four_over_six applies to E2M1 elements with E4M3-like block scales")
        if self.per_row_scale and (kind is not _Kind.TWO_LEVEL or not self.tensor_scale):
            raise ValueError("per_row_scale needs a two-level scheme with tensor_scale=True")
        if self.per_row_scale and self.block is not None and self.block[0] > 1:
            raise ValueError("per_row_scale is undefined for 2-D tiles (a tile spans several rows)")

    @property
    def kind(self) -> _Kind:
        sc = self.scale
        if sc is None:
            return _Kind.CAST
        if sc.bits == 32:
            return _Kind.FP32
        if not sc.subnormals and sc.mbits == 0:
            return _Kind.POW2
        return _Kind.TWO_LEVEL

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


def get_scheme(scheme: str | BlockScheme) -> BlockScheme:
    """A preset by name (case-insensitive), or the scheme itself.

    >>> get_scheme("nvfp4").block
    (1, 16)
    """
    if isinstance(scheme, BlockScheme):
        return scheme
    key = str(scheme).strip().lower().replace("-", "_")
    try:
        return SCHEMES[key]
    except KeyError:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}") from None


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized tensor: packed codes, raw scale bytes, the tensor amax, and how to decode them.

    Attributes
    ----------
    data
        Codes with the quantized axis last (``np.moveaxis(x, axis, -1)``), padded
        to whole blocks: uint8, two 4-bit codes per byte (element 2j in the low
        nibble), one code per byte for 6/8-bit elements; uint16 for BF16/FP16
        casts (original shape).
    scales
        One scale per block, shape = data's leading shape × blocks along the
        axis: uint8 raw E4M3/E8M0 bytes, or float32 for FP32-scaled FP8
        (0-d for per-tensor scaling; empty for casts).  2-D tiles repeat their
        scale on each of their rows.
    amax
        float32 tensor amax (per row, shaped like the leading axes, with
        ``per_row_scale``); NaN where the scheme has no second level.
    scheme, shape, dtype, axis
        The scheme, the original shape, the original dtype's name, the quantized axis.
    """

    data: np.ndarray
    scales: np.ndarray
    amax: np.ndarray
    scheme: BlockScheme
    shape: tuple[int, ...]
    dtype: str
    axis: int

    def __post_init__(self) -> None:
        _check_layout(self)

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """Decode to float32 in the original shape (SPEC §4–§6 decode rules); ``out``: see :func:`dequantize`."""
        return dequantize(self, out=out)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of codes + scales + the FP32 second-level amax values (where the scheme has them)."""
        n = self.data.nbytes + self.scales.nbytes
        if self.scheme.tensor_scale or (self.scheme.kind is _Kind.FP32 and self.scheme.block is None):
            n += self.amax.nbytes
        return n

    @property
    def bits_per_element(self) -> float:
        """Storage bits per original element (NVFP4 on whole blocks: 4.5 plus the amax)."""
        return 8.0 * self.nbytes / max(self.size, 1)

    def save(self, path: str | os.PathLike) -> None:
        """Save losslessly to ``.npz`` or ``.safetensors`` (by extension); see :func:`save_quantized`."""
        save_quantized(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> QuantizedTensor:
        """Load a file written by :meth:`save`; never unpickles (see :func:`load_quantized`)."""
        return load_quantized(path)

    def equals(self, other: QuantizedTensor) -> bool:
        """Bit-identical data, scales, amax and metadata."""

        def same(a, b):
            return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

        return (
            same(self.data, other.data)
            and same(self.scales, other.scales)
            and same(np.asarray(self.amax), np.asarray(other.amax))
            and self.scheme == other.scheme
            and tuple(self.shape) == tuple(other.shape)
            and self.dtype == other.dtype
            and self.axis == other.axis
        )


def _dtype_name(x) -> str:
    return getattr(x, "dtype", np.asarray(x).dtype).name


def _moved_2d(shape: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], int, int]:
    moved = shape[:axis] + shape[axis + 1 :] + (shape[axis],)
    return moved, math.prod(moved[:-1]), moved[-1]


def _layout(sch: BlockScheme, shape: tuple[int, ...], axis: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The (shape, dtype) of ``data``, ``scales`` and ``amax`` that :func:`quantize` gives this scheme, shape, axis."""
    el = sch.element
    f32, u8 = np.dtype(np.float32), np.dtype(np.uint8)
    if sch.kind is _Kind.CAST:
        return {"data": (shape, np.dtype(np.uint16 if el.bits > 8 else np.uint8)), "scales": ((0,), u8),
                "amax": ((), f32)}
    if sch.block is None:
        return {"data": (shape, u8), "scales": ((), f32), "amax": ((), f32)}
    moved, _, C = _moved_2d(shape, axis)
    BC = sch.block[1]
    nb = -(-C // BC)
    lead = moved[:-1]
    width = nb * BC // 2 if el.bits == 4 else nb * BC
    per_row = sch.kind is _Kind.TWO_LEVEL and sch.per_row_scale
    return {"data": (lead + (width,), u8), "scales": (lead + (nb,), f32 if sch.kind is _Kind.FP32 else u8),
            "amax": (lead if per_row else (), f32)}


def _check_layout(qt: QuantizedTensor) -> None:
    """ValueError, one line, unless data/scales/amax have the shapes and dtypes that the scheme gives the
    original shape and axis: the kernels read them with raw (vector) loads, so a hand-made or corrupt
    tensor must not reach them."""
    shape = tuple(qt.shape)
    if not isinstance(qt.scheme, BlockScheme):
        raise ValueError(f"QuantizedTensor scheme must be a BlockScheme, got {type(qt.scheme).__name__}")
    if any(not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise ValueError(f"QuantizedTensor shape must be non-negative integers, got {qt.shape!r}")
    if shape and not 0 <= qt.axis < len(shape):
        raise ValueError(f"QuantizedTensor axis {qt.axis} out of range for shape {shape}")
    for name, (want_shape, want_dtype) in _layout(qt.scheme, shape, qt.axis if shape else 0).items():
        a = getattr(qt, name)
        got = (tuple(a.shape), a.dtype) if isinstance(a, np.ndarray) else (None, type(a).__name__)
        if got != (want_shape, want_dtype):
            raise ValueError(f"QuantizedTensor {name} must be {want_dtype} of shape {want_shape} for "
                             f"{qt.scheme.name} {shape} along axis {qt.axis}, got {got[1]} of shape {got[0]}")


def _rbits_2d(rbits, x_shape, axis, k) -> np.ndarray:
    r = np.asarray(rbits)
    if r.shape != tuple(x_shape):
        raise ValueError(f"rbits must have the shape of x {tuple(x_shape)}, got {r.shape}")
    if not np.issubdtype(r.dtype, np.integer):
        raise TypeError(f"rbits must be integers, got {r.dtype}")
    if r.size and (int(r.min()) < 0 or int(r.max()) >= (1 << k)):
        raise ValueError(f"rbits must lie in [0, 2**{k})")
    r = np.moveaxis(r, axis, -1)
    return np.ascontiguousarray(r, dtype=np.int64).reshape(-1, r.shape[-1] if r.ndim else 1)


def _tensor_amax_bits(row_bits: np.ndarray) -> np.uint32:
    return np.uint32(row_bits.max()) if row_bits.size else np.uint32(0)


def _as_f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _two_level_num(scheme: BlockScheme) -> np.float32:
    """fl(max_elem · bound): 2688 = 6·448 for NVFP4, 1536 = 6·256 for four-over-six."""
    bound = 256.0 if scheme.four_over_six else scheme.scale.max
    return np.float32(scheme.element.max) * np.float32(bound)


def _s_enc_dec(scheme: BlockScheme, amax_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = amax_rows.size
    if not scheme.tensor_scale:
        one = np.ones(n, np.float32)
        return one, one.copy()
    s_enc = np.empty(n, np.float32)
    s_dec = np.empty(n, np.float32)
    SK.tensor_scales(np.ascontiguousarray(amax_rows, dtype=np.float32), _two_level_num(scheme), s_enc, s_dec)
    return s_enc, s_dec


# E8M0 byte b → 2**(127 − b) (element multiplier) and 2**(b − 127) (decode), exact float32; NaN for 0xFF.
_POW2_NEG = np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32), np.float32(np.nan))
_POW2_POS = np.append(np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32), np.float32(np.nan))


def _block_amax(X: np.ndarray, BR: int, BC: int, nb: int, ignore_nan: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tile amax bits (ceil(R / BR), nb) and the amax bits of each tile row (a row when BR = 1): one read of X."""
    ng = -(-X.shape[0] // BR)
    tmax = np.empty((ng, nb), np.uint32)
    row_bits = np.empty(ng, np.uint32)
    SK.block_absmax_bits(X, BR, BC, ignore_nan, tmax, row_bits)
    return tmax, row_bits


_NO_TMAX = np.zeros((1, 1), np.uint32)


def _scale_arith(spec: FormatSpec) -> tuple:
    """Parameters of the row kernel's arithmetic scale encoder (``_scale_rne``), or mbits 0 for the table.

    It covers ≤ 8-bit scale formats with subnormals and at least one mantissa bit (E4M3, E5M2, …).
    """
    if not (spec.subnormals and spec.bits <= 8 and spec.mbits >= 1 and spec.has_nan):
        return (0, 0, np.float32(0.0), np.float32(0.0), 0)
    q = np.ldexp(np.float32(1.0), spec.emin - spec.mbits)
    return (spec.mbits, 127 + spec.emin, np.float32(1.0) / q, q, spec.nan_code)


_NO_ELEM = (0, 0, np.float32(0.0), 0, 0, 0)


def _elem_path(spec: FormatSpec, mode: Rounding) -> tuple[int, tuple]:
    """How the RNE row kernels encode elements: 1 E2M1 (float arithmetic), 2 ``_elem_rne``, 0 the table."""
    if mode is not Rounding.RNE:
        return 0, _NO_ELEM
    if _is_e2m1(spec):
        return 1, _NO_ELEM
    if spec.subnormals and spec.signed and spec.bits <= 8 and spec.mbits >= 1 and spec.ebits <= 6:
        q = np.ldexp(np.float32(1.0), spec.emin - spec.mbits)
        return 2, (spec.mbits, 127 + spec.emin, np.float32(1.0) / q, spec.max_code, spec.nan_code, spec.bits)
    return 0, _NO_ELEM


def _byte_table(spec: FormatSpec) -> np.ndarray:
    """The element decode table over all 256 byte values: a byte that is no code of a < 8-bit format (a corrupt
    or hand-made ``.data``) decodes to NaN instead of reading past the table."""
    t = spec.decode_table()
    if t.size >= 256:
        return t
    return np.concatenate([t, np.full(256 - t.size, np.nan, np.float32)])


def _is_e2m1(spec: FormatSpec) -> bool:
    """E2M1 under any name: the row kernels then encode and decode it arithmetically instead of by table."""
    return spec.kernel_params() == get_format("float4_e2m1fn").kernel_params()


def quantize(
    x: np.typing.ArrayLike,
    scheme: str | BlockScheme = "nvfp4",
    axis: int = -1,
    block: tuple[int, int] | None = None,
    rounding: str | Rounding | None = None,
    scale_rule: str | ScaleRule | None = None,
    seed: int | None = None,
    rbits: np.typing.ArrayLike | None = None,
    k: int | None = None,
    counter: int = 0,
    nan_amax: str = "propagate",
    tensor_amax: float | None = None,
    backend: str | None = None,
) -> QuantizedTensor:
    """Quantize a tensor with a block-scaled scheme (SPEC §4–§6).

    Parameters
    ----------
    x
        Values; converted to float32 first (RNE).
    scheme
        A preset name (:data:`SCHEMES`) or a :class:`BlockScheme`.
    axis
        The axis the blocks run along (default: last).  The "columnwise" copy
        of a GEMM operand is ``axis=0`` of a 2-D tensor.
    block, rounding, scale_rule, k
        Override the scheme's block shape, element rounding, E8M0 scale rule, SR bits.
    seed, rbits, counter
        Stochastic rounding only (exactly one of seed/rbits): Philox4x32-10 keyed
        by ``seed``, counter = ``counter`` + block index × calls per block, where
        block index = row × blocks per row of the quantized 2-D view; one call is
        16 bytes = one NVFP4 block of 8-bit values.  ``rbits``: integers of the
        shape of ``x``.  Per-tensor FP8 and casts use :func:`fpsim.encode`'s flat stream.
    nan_amax
        ``"propagate"`` (default) or ``"ignore"`` NaNs in every amax (SPEC §9).
    tensor_amax
        Use this FP32 tensor amax instead of measuring it (schemes with a
        per-tensor second level or per-tensor FP8 scale): quantizing a large
        tensor chunk by chunk with its global amax gives the bits of quantizing it whole.

    Examples
    --------
    >>> q = quantize(np.arange(16, dtype=np.float32), "nvfp4")
    >>> q.scales, float(q.amax), q.dequantize()[[1, 15]]
    (array([126], dtype=uint8), 15.0, array([ 1.25, 15.  ], dtype=float32))
    """
    name = backends.pick(backend, x)
    if name is not None:
        from . import torch_backend as tb

        kw = {k: v for k, v in dict(block=block, rounding=rounding, scale_rule=scale_rule, seed=seed, rbits=rbits,
                                    k=k, tensor_amax=tensor_amax).items() if v is not None}
        if counter:
            kw["counter"] = counter
        if nan_amax != "propagate":
            kw["nan_amax"] = nan_amax
        x32 = as_float32(x)
        return tb.quantize(backends.to_torch(x32, name), scheme, axis, **kw).to_quantized(_dtype_name(x))
    sch = get_scheme(scheme)
    changes = {}
    if block is not None:
        changes["block"] = tuple(block)
    if rounding is not None:
        changes["rounding"] = rounding
    if scale_rule is not None:
        changes["scale_rule"] = scale_rule
    if k is not None:
        changes["sr_bits"] = int(k)
    if changes:
        sch = dataclasses.replace(sch, **changes)
    if nan_amax not in ("propagate", "ignore"):
        raise ValueError("nan_amax must be 'propagate' or 'ignore'")
    ignore_nan = nan_amax == "ignore"
    sr = sch.rounding is Rounding.SR
    if sr and (seed is None) == (rbits is None):
        raise ValueError("rounding='sr' needs exactly one of seed= or rbits=")
    if not sr and (seed is not None or rbits is not None):
        raise ValueError("seed/rbits apply only to rounding='sr'")
    dtype = _dtype_name(x)
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("quantize needs at least one axis")
    shape = tuple(x32.shape)
    ax = int(axis)
    if not -x32.ndim <= ax < x32.ndim:
        raise ValueError(f"axis {axis} out of range for a {x32.ndim}-d tensor")
    ax %= x32.ndim
    kind = sch.kind
    nan32 = np.float32(np.nan)
    sr_kw = {"seed": seed, "rbits": rbits, "k": sch.k, "counter": counter} if sr else {}

    if kind is _Kind.CAST:
        codes = encode(x32, sch.element, sch.rounding, **sr_kw)
        return QuantizedTensor(codes, np.zeros(0, np.uint8), np.array(nan32), sch, shape, dtype, ax)

    moved, R, C = _moved_2d(shape, ax)
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(R, C).view(np.uint32)
    row_bits = np.empty(R, np.uint32)

    if tensor_amax is not None and not (sch.block is None or (sch.tensor_scale and not sch.per_row_scale)):
        raise ValueError(f"tensor_amax applies to schemes with a per-tensor scale, not {sch.name}")

    def measured_amax():
        if tensor_amax is not None:
            return np.array(np.float32(tensor_amax))
        SK.row_absmax_bits(X, ignore_nan, row_bits)
        return _as_f32(_tensor_amax_bits(row_bits))

    if sch.block is None:  # per-tensor FP32 scale (FP8 current scaling)
        amax = measured_amax()
        d = SK.fp32_block_scale(np.float32(amax), np.float32(sch.element.max))
        with np.errstate(all="ignore"):
            y = x32 / d
        codes = encode(y, sch.element, sch.rounding, **sr_kw)
        return QuantizedTensor(codes, np.array(d, np.float32), np.array(amax), sch, shape, dtype, ax)

    BR, BC = sch.block
    if BR > 1 and len(moved) != 2:
        raise ValueError(f"2-D blocks {sch.block} need a 2-D tensor, got shape {shape}")
    nb = -(-C // BC)
    el = sch.element
    packed = el.bits == 4
    ep = el.kernel_params()
    mode = Rounding.RNE if sr else sch.rounding
    lut = _encode_lut(el, mode.kernel_id, True)
    shift = 21 - el.mbits
    kbits = sch.k
    width = stream_width(kbits)
    per_call = 128 // width
    k0, k1 = seed_key(seed) if seed is not None else (0, 0)
    seq = (
        np.int64(k0),
        np.int64(k1),
        np.int64(counter),
        np.int64(width),
        np.int64(per_call),
        np.int64(-(-BC // per_call)),
        np.int64(nb),
    )
    use_rb = rbits is not None
    rb = _rbits_2d(rbits, shape, ax, kbits) if use_rb else np.zeros((1, 1), np.int64)
    out = np.empty((R, nb * BC // 2 if packed else nb * BC), np.uint8)

    if kind is _Kind.TWO_LEVEL:
        sc = sch.scale
        scales = np.empty((R, nb), np.uint8)
        fast = not sr and not sch.four_over_six
        # The fast kernel takes its block amax from a tile-amax pass when one is needed anyway (2-D tiles, or
        # a tensor amax to measure): that pass also gives the tensor amax, so the input is read twice in all.
        tmax = None
        if fast and (BR > 1 or (sch.tensor_scale and tensor_amax is None)):
            tmax, tile_rows = _block_amax(X, BR, BC, nb, ignore_nan)
        if sch.tensor_scale:
            if sch.per_row_scale:
                if tmax is not None and BR == 1:
                    row_bits = tile_rows
                else:
                    SK.row_absmax_bits(X, ignore_nan, row_bits)
                amax = _as_f32(row_bits).copy()
            elif tmax is not None and tensor_amax is None:
                amax = _as_f32(_tensor_amax_bits(tile_rows))
            else:
                amax = measured_amax()
            amax_rows = np.broadcast_to(amax, (R,))
        else:
            amax = np.array(nan32)
            amax_rows = np.ones(R, np.float32)
        s_enc, s_dec = _s_enc_dec(sch, amax_rows)
        one = np.float32(1.0)
        inv_t = one / np.float32(el.max)
        inv_t46 = one / np.float32(4.0)
        fos = 0 if not sch.four_over_six else (2 if sch.four_over_six_metric == "mse" else 1)
        if fast:
            SK.quantize_two_level_rne(
                X, BR, BC, s_enc, s_dec, inv_t, np.float32(sc.max), _encode_lut(sc, Rounding.RNE.kernel_id, True),
                21 - sc.mbits, sc.decode_table(), lut, shift, ignore_nan, packed,
                _NO_TMAX if tmax is None else tmax, tmax is not None, out, scales, *_elem_path(el, mode),
                _scale_arith(sc),
            )
            amax = amax.reshape(moved[:-1]) if sch.per_row_scale else np.array(amax)
            data = out.reshape(moved[:-1] + (out.shape[1],))
            return QuantizedTensor(data, scales.reshape(moved[:-1] + (nb,)), amax, sch, shape, dtype, ax)
        SK.quantize_two_level(
            X,
            BR,
            BC,
            s_enc,
            s_dec,
            inv_t,
            inv_t46,
            np.float32(sc.max),
            sc.kernel_params(),
            sc.decode_table(),
            ep,
            el.decode_table(),
            lut,
            shift,
            sr,
            kbits,
            seq,
            rb,
            use_rb,
            fos,
            ignore_nan,
            packed,
            out,
            scales,
        )
        amax = amax.reshape(moved[:-1]) if sch.per_row_scale else np.array(amax)
    elif kind is _Kind.POW2:
        scales = np.empty((R, nb), np.uint8)
        if not sr:
            SK.quantize_mx_rne(
                X, BR, BC, sch.scale_rule.kernel_id, el.emax, el.mbits, np.float32(1.0) / np.float32(el.max),
                lut, shift, el.nan_code, ignore_nan, packed,
                *((_block_amax(X, BR, BC, nb, ignore_nan)[0], True) if BR > 1 else (_NO_TMAX, False)), _POW2_NEG, out,
                scales, *_elem_path(el, mode),
            )
            data = out.reshape(moved[:-1] + (out.shape[1],))
            return QuantizedTensor(data, scales.reshape(moved[:-1] + (nb,)), np.array(nan32), sch, shape, dtype, ax)
        SK.quantize_mx(
            X,
            BR,
            BC,
            sch.scale_rule.kernel_id,
            el.emax,
            el.mbits,
            np.float32(1.0) / np.float32(el.max),
            sch.scale.kernel_params(),
            ep,
            lut,
            shift,
            el.nan_code,
            sr,
            kbits,
            seq,
            rb,
            use_rb,
            ignore_nan,
            packed,
            out,
            scales,
        )
        amax = np.array(nan32)
    else:
        scales = np.empty((R, nb), np.float32)
        SK.quantize_fp32_scaled(
            X, BR, BC, np.float32(el.max), ep, lut, shift, sr, kbits, seq, rb, use_rb, ignore_nan, out, scales
        )
        amax = np.array(nan32)
    data = out.reshape(moved[:-1] + (out.shape[1],))
    return QuantizedTensor(data, scales.reshape(moved[:-1] + (nb,)), amax, sch, shape, dtype, ax)


def _into(out: np.ndarray | None, res: np.ndarray) -> np.ndarray:
    if out is None:
        return res
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == res.shape and out.flags.writeable):
        raise ValueError(f"out must be a writeable float32 array of shape {res.shape}")
    out[...] = res
    return out


def dequantize(qt: QuantizedTensor, backend: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a :class:`QuantizedTensor` to float32 in its original shape.

    NVFP4: ``fl((e2m1 · f32(s_b)) · S_dec)`` with S_dec recomputed from the
    stored amax; MX: ``fl(e · 2^(b−127))``, scale byte 0xFF → NaN; FP32 scales: ``fl(e · d)``.
    ``backend``: as for :func:`quantize` (same bits on every backend).
    ``out``: a C-contiguous, writeable float32 array of the original shape to decode into (block
    schemes quantized along the last axis, Numba backend): reusing it saves the allocation and the
    page faults of a fresh output, which cost about as much as the decoding itself on large tensors.
    """
    name = backends.pick(backend, qt)
    if name is not None:
        from . import torch_backend as tb

        res = tb.TorchQuantized.from_quantized(qt, backends.torch_device(name)).dequantize().cpu().numpy()
        return _into(out, res)
    sch = qt.scheme
    kind = sch.kind
    el = sch.element
    if kind is _Kind.CAST:
        return _into(out, decode(qt.data, el).reshape(qt.shape))
    if sch.block is None:
        with np.errstate(all="ignore"):
            return _into(out, (decode(qt.data, el) * np.float32(qt.scales)).astype(np.float32).reshape(qt.shape))
    moved, R, C = _moved_2d(tuple(qt.shape), qt.axis)
    BC = sch.block[1]
    codes = np.ascontiguousarray(qt.data).reshape(R, -1)
    scales = np.ascontiguousarray(qt.scales).reshape(R, -1)
    user_out = out
    if out is None:
        out = np.empty((R, C), np.float32)
    else:
        if qt.axis != len(qt.shape) - 1:
            raise ValueError("out= needs a tensor quantized along its last axis")
        if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == tuple(qt.shape)
                and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"out must be a C-contiguous writeable float32 array of shape {tuple(qt.shape)}")
        out = out.reshape(R, C)
    packed = el.bits == 4
    etable = el.decode_table() if packed else _byte_table(el)
    if kind is _Kind.TWO_LEVEL:
        amax = np.asarray(qt.amax, np.float32)
        amax_rows = amax.reshape(R) if sch.per_row_scale else np.broadcast_to(amax.reshape(()), (R,))
        _, s_dec = _s_enc_dec(sch, amax_rows)
        SK.dequantize_blocks_fast(codes, scales, BC, sch.scale.decode_table(), s_dec, True, etable, packed, out,
                                  _is_e2m1(el))
    elif kind is _Kind.POW2:
        SK.dequantize_blocks_fast(codes, scales, BC, _POW2_POS, np.ones(R, np.float32), False, etable, packed, out,
                                  _is_e2m1(el))
    else:
        SK.dequantize_fp32_scaled(codes, scales, BC, etable, out)
    if user_out is not None:
        return user_out
    return np.moveaxis(out.reshape(moved), -1, qt.axis)


def fake_quantize(x: np.typing.ArrayLike, scheme: str | BlockScheme = "nvfp4", backend: str | None = None,
                  **kwargs) -> np.ndarray:
    """``quantize(x, scheme, **kwargs).dequantize()``: the float32 values the scheme can represent."""
    return dequantize(quantize(x, scheme, backend=backend, **kwargs), backend=backend)


# ---------------------------------------------------------------------------
# Blackwell scale layout (SPEC §4)


def _swizzle_offsets(R: int, C: int) -> tuple[np.ndarray, int, int]:
    Rp = 128 * -(-R // 128)
    C4 = -(-C // 4)
    r = np.arange(Rp, dtype=np.int64)[:, None]
    c = np.arange(4 * C4, dtype=np.int64)[None, :]
    off = ((r // 128) * C4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)
    return off, Rp, 4 * C4


def swizzle_scales(scales: np.ndarray) -> np.ndarray:
    """[R, C] scale bytes → the 1-D Blackwell tensor-core layout (SPEC §4).

    The matrix is zero-padded to [128·⌈R/128⌉, 4·⌈C/4⌉]; byte (r, c) goes to
    ((r//128)·⌈C/4⌉ + c//4)·512 + (r%32)·16 + ((r%128)//32)·4 + (c%4).

    >>> swizzle_scales(np.arange(8, dtype=np.uint8).reshape(2, 4))[[0, 3, 16, 19]]
    array([0, 3, 4, 7], dtype=uint8)
    """
    s = np.asarray(scales)
    if s.ndim != 2:
        raise ValueError(f"swizzle_scales needs a 2-D [rows, blocks] matrix, got shape {s.shape}")
    R, C = s.shape
    off, Rp, Cp = _swizzle_offsets(R, C)
    pad = np.zeros((Rp, Cp), s.dtype)
    pad[:R, :C] = s
    out = np.empty(Rp * Cp, s.dtype)
    out[off.reshape(-1)] = pad.reshape(-1)
    return out


def unswizzle_scales(buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of :func:`swizzle_scales`: the [rows, cols] matrix back from the swizzled bytes."""
    b = np.asarray(buf).reshape(-1)
    off, Rp, Cp = _swizzle_offsets(int(rows), int(cols))
    if b.size != Rp * Cp:
        raise ValueError(f"expected {Rp * Cp} swizzled bytes for [{rows}, {cols}], got {b.size}")
    return b[off][:rows, :cols].copy()


# ---------------------------------------------------------------------------
# Save / load (no pickle anywhere)

_FORMAT_TAG = "fpsim.QuantizedTensor/1"
_ST_DTYPES = {"uint8": "U8", "uint16": "U16", "uint32": "U32", "float32": "F32"}


def _meta(qt: QuantizedTensor) -> dict:
    return {
        "format": _FORMAT_TAG,
        "scheme": qt.scheme.to_json(),
        "shape": list(qt.shape),
        "dtype": qt.dtype,
        "axis": qt.axis,
    }


def _from_parts(meta: dict, arrays: dict, path) -> QuantizedTensor:
    if meta.get("format") != _FORMAT_TAG:
        raise ValueError(f"{path}: not an fpsim QuantizedTensor file (format tag {meta.get('format')!r})")
    try:
        return QuantizedTensor(
            np.asarray(arrays["data"]),
            np.asarray(arrays["scales"]),
            np.asarray(arrays["amax"], np.float32),
            BlockScheme.from_json(meta["scheme"]),
            tuple(int(s) for s in meta["shape"]),
            str(meta["dtype"]),
            int(meta["axis"]),
        )
    except KeyError as e:
        raise ValueError(f"{path}: missing field {e}") from None
    except ValueError as e:  # arrays that do not fit the scheme (a corrupt or hand-edited file)
        raise ValueError(f"{path}: {e}") from None


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_quantized(qt: QuantizedTensor, path: str | os.PathLike) -> None:
    """Write ``qt`` to ``.npz`` (metadata as a JSON byte array) or ``.safetensors`` (metadata in the header).

    Both are bit-exact and pickle-free; the write is atomic.
    """
    p = Path(path)
    arrays = {"data": qt.data, "scales": qt.scales, "amax": np.asarray(qt.amax, np.float32)}
    meta = json.dumps(_meta(qt), allow_nan=False)
    if p.suffix == ".npz":
        meta_arr = np.frombuffer(meta.encode(), np.uint8)
        _atomic_write(p, lambda f: np.savez(f, meta=meta_arr, **arrays))
    elif p.suffix == ".safetensors":
        header: dict = {"__metadata__": {"fpsim": meta}}
        blobs, pos = [], 0
        for name, a in arrays.items():
            a = np.asarray(a, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            header[name] = {
                "dtype": _ST_DTYPES[a.dtype.name],
                "shape": list(a.shape),
                "data_offsets": [pos, pos + len(raw)],
            }
            blobs.append(raw)
            pos += len(raw)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)

        def write(f):
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for b in blobs:
                f.write(b)

        _atomic_write(p, write)
    else:
        raise ValueError(f"{path}: use a .npz or .safetensors extension")


_PICKLE_REFUSED = "refusing to load pickled content (fpsim never unpickles; this file was not written by fpsim)"


def load_quantized(path: str | os.PathLike) -> QuantizedTensor:
    """Read a file written by :func:`save_quantized`.

    Never unpickles: ``.npz`` is read with ``allow_pickle=False`` and a file
    holding pickled (object) data raises ``ValueError``; ``.safetensors`` is
    parsed by hand (8-byte header length, JSON header, raw little-endian bytes).
    """
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        try:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except ValueError as e:
            if "pickle" in str(e).lower():
                raise ValueError(f"{path}: {_PICKLE_REFUSED}") from None
            raise
        if "meta" not in arrays or arrays["meta"].dtype != np.uint8:
            raise ValueError(f"{path}: not an fpsim QuantizedTensor file (no metadata)")
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        return _from_parts(meta, arrays, path)
    return _load_safetensors(p)


def _load_safetensors(p: Path) -> QuantizedTensor:
    raw = p.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{p}: too short for a safetensors file")
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8 and raw[0] == 0x80 and 2 <= raw[1] <= 5:  # pickle protocol 2-5 opcode PROTO
        raise ValueError(f"{p}: {_PICKLE_REFUSED}")
    if n > len(raw) - 8:
        raise ValueError(f"{p}: not a safetensors file (header length {n} beyond the file)")
    try:
        header = json.loads(raw[8 : 8 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{p}: not a safetensors file (header is not JSON)") from None
    body = memoryview(raw)[8 + n :]
    inv = {v: k for k, v in _ST_DTYPES.items()}
    meta_s = header.pop("__metadata__", {}).get("fpsim")
    if meta_s is None:
        raise ValueError(f"{p}: not an fpsim QuantizedTensor file (no 'fpsim' metadata)")
    arrays = {}
    for name, info in header.items():
        if info.get("dtype") not in inv:
            raise ValueError(f"{p}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        a, b = info["data_offsets"]
        dt = np.dtype(inv[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(body[a:b], dt).astype(dt.newbyteorder("="))
        arrays[name] = arr.reshape(info["shape"])
    return _from_parts(json.loads(meta_s), arrays, p)
