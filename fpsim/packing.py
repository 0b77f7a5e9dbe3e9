"""FP4 nibble packing and ml_dtypes interop (SPEC §4 "Packing").

Two 4-bit codes per byte along the last axis: element ``2j`` in the **low**
nibble, element ``2j + 1`` in the high nibble (the layout of
``cvt.rn.satfinite.e2m1x2.f32`` and of Transformer Engine / cuBLAS FP4 data).
"""

from __future__ import annotations

import numpy as np

from .formats import FormatSpec, get_format

__all__ = ["pack_fp4", "unpack_fp4", "to_ml_dtypes", "from_ml_dtypes"]


def pack_fp4(codes: np.typing.ArrayLike) -> np.ndarray:
    """Pack 4-bit codes (uint8, values < 16) two per byte along the last axis.

    An odd last dimension is padded with a zero nibble; pass the original
    length to :func:`unpack_fp4` to drop it.

    >>> pack_fp4(np.array([0x1, 0x2, 0xF], dtype=np.uint8))
    array([33, 15], dtype=uint8)
    """
    c = np.asarray(codes)
    if c.dtype.kind not in "iu":
        raise TypeError(f"expected integer 4-bit codes, got dtype {c.dtype}")
    if c.ndim == 0:
        raise ValueError("pack_fp4 needs at least one axis")
    if c.size and (c.min() < 0 or c.max() > 0xF):
        raise ValueError("4-bit codes must lie in [0, 15]")
    c = c.astype(np.uint8, copy=False)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (1,), np.uint8)], axis=-1)
    return c[..., 0::2] | (c[..., 1::2] << np.uint8(4))


def unpack_fp4(packed: np.typing.ArrayLike, n: int | None = None) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: bytes → 4-bit codes along the last axis.

    ``n`` (default ``2 * packed.shape[-1]``) is the number of codes to keep.
    """
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise TypeError(f"expected packed uint8 bytes, got dtype {p.dtype}")
    if p.ndim == 0:
        raise ValueError("unpack_fp4 needs at least one axis")
    full = 2 * p.shape[-1]
    n = full if n is None else int(n)
    if not full - 1 <= n <= full:
        raise ValueError(f"n={n} does not fit {p.shape[-1]} packed bytes")
    out = np.empty(p.shape[:-1] + (full,), np.uint8)
    out[..., 0::2] = p & np.uint8(0xF)
    out[..., 1::2] = p >> np.uint8(4)
    return out[..., :n]


def to_ml_dtypes(codes: np.typing.ArrayLike, fmt: str | FormatSpec) -> np.ndarray:
    """View codes as the format's ml_dtypes (or numpy) array without copying values.

    ml_dtypes stores 4- and 6-bit formats one code per byte, so unpacked
    fpsim codes view directly.
    """
    spec = get_format(fmt)
    c = np.ascontiguousarray(codes, dtype=spec.code_dtype)
    if c.size and int(c.max()) >> spec.bits:
        raise ValueError(f"code(s) outside the {spec.bits}-bit range of {spec.name}")
    return c.view(spec.ml_dtype)


def from_ml_dtypes(arr: np.ndarray) -> tuple[np.ndarray, FormatSpec]:
    """Codes and format of an ml_dtypes / float16 / float32 array (a bit view, no conversion)."""
    a = np.asarray(arr)
    from .formats import FORMATS

    for spec in FORMATS.values():
        if a.dtype == spec.ml_dtype:
            return np.ascontiguousarray(a).view(spec.code_dtype), spec
    raise TypeError(f"dtype {a.dtype} is not an fpsim element format")
