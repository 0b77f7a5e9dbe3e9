"""The quantized-tensor container: packed codes, raw scale bytes, the tensor amax, and how to decode them.

:class:`QuantizedTensor` checks at construction that its arrays have the shapes and dtypes its scheme gives
the original shape and axis (:func:`layout`), so a hand-made or corrupt tensor never reaches a kernel.
Decoding is :func:`fpsim.dequantize`; saving and loading are :func:`fpsim.io.save_quantized` /
:func:`fpsim.io.load_quantized` (the container itself does no I/O: files are the io layer's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .schemes import BlockScheme, Kind

__all__ = ["QuantizedTensor", "layout", "check_layout", "moved_2d", "set_decoder"]

# The decoder sits above the container (the dispatcher of fpsim.backends registers fpsim.dequantize here at
# import), so the method below needs no import of a higher layer.
_DECODER: Callable | None = None


def set_decoder(fn: Callable) -> None:
    """Register the function :meth:`QuantizedTensor.dequantize` calls (done once, by ``import fpsim``)."""
    global _DECODER
    _DECODER = fn


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized tensor: packed codes, raw scale bytes, the tensor amax, and how to decode them.

    Attributes
    ----------
    data
        Codes with the quantized axis last (``np.moveaxis(x, axis, -1)``), padded
        to whole blocks: uint8, two 4-bit codes per byte (element 2j in the low
        nibble), one code per byte for 6/8-bit elements; uint16 for BF16/FP16
        casts (original shape).  Schemes without blocks (a cast, or one FP32
        scale per tensor) keep the original shape, one code per byte, 4-bit
        elements included: packing pairs the elements of a block.
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
    convention
        The producer convention the bytes were written in (:mod:`fpsim.conventions`; ``"fpsim"`` by default):
        :meth:`dequantize` decodes in its order unless told otherwise.
    """

    data: np.ndarray
    scales: np.ndarray
    amax: np.ndarray
    scheme: BlockScheme
    shape: tuple[int, ...]
    dtype: str
    axis: int
    convention: str = "fpsim"

    def __post_init__(self) -> None:
        check_layout(self)

    def dequantize(self, out: np.ndarray | None = None, convention: str | None = None) -> np.ndarray:
        """Decode to float32 in the original shape (§4–§6 decode rules): :func:`fpsim.dequantize` of this tensor;
        ``convention``: decode as that producer does (default: the tensor's own, :attr:`convention`)."""
        if _DECODER is None:
            raise RuntimeError("no decoder registered: import fpsim")
        if convention is None:
            return _DECODER(self, out=out)
        return _DECODER(self, out=out, convention=convention)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of codes + scales + the FP32 second-level amax values (where the scheme has them)."""
        n = self.data.nbytes + self.scales.nbytes
        if self.scheme.tensor_scale or (self.scheme.kind is Kind.FP32 and self.scheme.block is None):
            n += self.amax.nbytes
        return n

    def stored_bytes(self, tensor_scale: bool = True) -> int:
        """Bytes a kernel stores: codes + block scales, and with ``tensor_scale`` one FP32 number for a per-tensor
        second level (NVFP4's amax, or per-tensor FP8's scale: its amax is not stored again) or one per row with
        ``per_row_scale``.  :attr:`nbytes` is what this container holds (per-tensor FP8 keeps scale and amax)."""
        sch = self.scheme
        n = self.data.nbytes + (self.scales.nbytes if sch.block is not None else 0)
        if sch.per_row_scale:
            n += self.amax.nbytes  # one FP32 second-level scale per row
        elif tensor_scale and sch.kind is not Kind.CAST and (sch.tensor_scale or sch.block is None):
            n += 4
        return n

    @property
    def bits_per_element(self) -> float:
        """Storage bits per original element, :meth:`stored_bytes` (NVFP4 on whole blocks: 4.5 plus 32 bits of
        the amax; per-tensor FP8: 8 plus 32 bits of its scale)."""
        return 8.0 * self.stored_bytes() / max(self.size, 1)

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
            and self.convention == other.convention
        )


def moved_2d(shape: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], int, int]:
    moved = shape[:axis] + shape[axis + 1 :] + (shape[axis],)
    return moved, math.prod(moved[:-1]), moved[-1]


def layout(sch: BlockScheme, shape: tuple[int, ...], axis: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The (shape, dtype) of ``data``, ``scales`` and ``amax`` that :func:`quantize` gives this scheme, shape, axis."""
    el = sch.element
    f32, u8 = np.dtype(np.float32), np.dtype(np.uint8)
    if sch.kind is Kind.CAST:
        return {"data": (shape, np.dtype(np.uint16 if el.bits > 8 else np.uint8)), "scales": ((0,), u8),
                "amax": ((), f32)}
    if sch.block is None:
        return {"data": (shape, u8), "scales": ((), f32), "amax": ((), f32)}
    moved, _, C = moved_2d(shape, axis)
    BC = sch.block[1]
    nb = -(-C // BC)
    lead = moved[:-1]
    width = nb * BC // 2 if el.bits == 4 else nb * BC
    per_row = sch.kind is Kind.TWO_LEVEL and sch.per_row_scale
    return {"data": (lead + (width,), u8), "scales": (lead + (nb,), f32 if sch.kind is Kind.FP32 else u8),
            "amax": (lead if per_row else (), f32)}


def check_layout(qt: QuantizedTensor) -> None:
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
    for name, (want_shape, want_dtype) in layout(qt.scheme, shape, qt.axis if shape else 0).items():
        a = getattr(qt, name)
        got = (tuple(a.shape), a.dtype) if isinstance(a, np.ndarray) else (None, type(a).__name__)
        if got != (want_shape, want_dtype):
            raise ValueError(f"QuantizedTensor {name} must be {want_dtype} of shape {want_shape} for "
                             f"{qt.scheme.name} {shape} along axis {qt.axis}, got {got[1]} of shape {got[0]}")
