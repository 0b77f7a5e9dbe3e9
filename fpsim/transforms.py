"""Random Hadamard transforms (SPEC §7).

``R = diag(s) · H_d`` with ``H_d`` the Sylvester Hadamard matrix normalised by
``1/sqrt(d)`` and ``s`` a ±1 sign vector.  A row tile ``x`` (1×d) maps to
``y = (x ∘ s) · H_d``; tiles run along one axis (the GEMM's reduction axis).
``R`` is orthogonal, so ``(A·R)(Rᵀ·B) = A·B`` and the inverse of a tile is
``(y · H_d) ∘ s`` (``H_d`` is symmetric and its own inverse).

Arithmetic, tile by tile, all in float32: optional RNE rounding of the input
to BF16 (the recipe default, as Transformer Engine feeds the RHT), sign flips
(exact), the in-place fast Walsh–Hadamard butterflies ``(a, b) → (a + b,
a − b)`` for ``h = 1, 2, 4, …, d/2`` (d·log2 d additions), one multiplication by
``fl32(1/sqrt(d))`` (exact for d = 4**j), optional RNE rounding of the output to
BF16.  The result equals the float64 matrix product to float32 rounding (not
bit for bit: a matrix-multiply kernel sums in another order).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ._arrays import as_float32
from ._jit import njit, pjit, prange
from ._kernels import bits_f32, f32_bits
from ._simd import rht16
from .random import random_bits

__all__ = ["RECIPE_SIGNS", "sign_vector", "derive_seed", "rht", "hadamard_matrix"]

#: The NVFP4 recipe's fixed 16-entry sign vector, shared by all layers and steps (SPEC §7).
RECIPE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float32)
RECIPE_SIGNS.setflags(write=False)


def check_d(d: int) -> int:
    d = int(d)
    if d < 1 or d & (d - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {d}")
    return d


def derive_seed(seed: int, *labels: object) -> int:
    """A 64-bit seed for one layer / call, derived from a run seed and labels (e.g. layer name, step).

    Deterministic across processes and platforms (BLAKE2b of the text, not Python's salted ``hash``).
    """
    text = "\x1f".join([str(int(seed)), *map(str, labels)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def sign_vector(d: int, signs: str | int | np.ndarray | None = "recipe") -> np.ndarray:
    """The ±1 float32 sign vector of length ``d`` for a sign policy.

    ``"recipe"``: :data:`RECIPE_SIGNS` (d = 16 only).  ``None`` or ``"none"``:
    all +1 (a plain Hadamard transform).  An ``int``: random signs from the
    Philox stream of that seed (bit i of the stream → sign i; use
    :func:`derive_seed` for per-layer or per-call vectors).  An array: used as
    given after checking it holds only ±1.
    """
    d = check_d(d)
    if signs is None or (isinstance(signs, str) and signs == "none"):
        return np.ones(d, np.float32)
    if isinstance(signs, str):
        if signs != "recipe":
            raise ValueError(f"unknown sign policy {signs!r}; use 'recipe', 'none', a seed or a ±1 array")
        if d != 16:
            raise ValueError(f"the recipe's fixed sign vector has 16 entries; d = {d} needs a seed or an array")
        return RECIPE_SIGNS.copy()
    if isinstance(signs, (int, np.integer)) and not isinstance(signs, bool):
        bits = random_bits(int(signs), d, k=1)
        return np.where(bits == 1, np.float32(-1), np.float32(1)).astype(np.float32)
    s = np.asarray(signs, dtype=np.float32)
    if s.shape != (d,) or not np.all(np.abs(s) == 1):
        raise ValueError(f"sign vector must be {d} entries of ±1")
    return s


def hadamard_matrix(d: int, signs: str | int | np.ndarray | None = "recipe") -> np.ndarray:
    """The float64 matrix ``R = diag(s) · H_d / sqrt(d)`` (for references and small studies)."""
    from scipy.linalg import hadamard

    d = check_d(d)
    return sign_vector(d, signs).astype(np.float64)[:, None] * hadamard(d).astype(np.float64) / np.sqrt(d)


@njit
def _bf16_round(v):
    """float32 → nearest BF16 value as float32 (RNE; NaN → canonical quiet NaN; inf kept)."""
    bits = f32_bits(v)
    if bits & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000):
        return bits_f32(np.uint32(0x7FC00000))
    r = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return bits_f32(r & np.uint32(0xFFFF0000))


@njit(inline="always")
def _stages(buf, h, d):
    """Butterfly stages h, 2h, … d/2 on the tile ``buf``: lanes j and j + h of every 2h-group → (a + b, a − b)."""
    while h < d:
        for k in range(0, d, 2 * h):
            for j in range(k, k + h):
                a = buf[j]
                b = buf[j + h]
                buf[j] = a + b
                buf[j + h] = a - b
        h *= 2


@njit(inline="always")
def _finish(buf, d, scale, signs, inverse, bf16_out, dr, t0):
    """dr[t0 + j] = the tile's scaled value (the inverse's signs after the scale), BF16-rounded when asked."""
    for j in range(d):
        v = buf[j] * scale
        if inverse:
            v *= signs[j]
        dr[t0 + j] = _bf16_round(v) if bf16_out else v


def _rht_rows(src, dst, signs, d, scale, bf16_in, bf16_out, inverse) -> None:
    """Transform every d-tile of every row of ``src`` (2-D, float32) into ``dst``.

    d = 16 (the recipe's) is one vector tile of :func:`fpsim._simd.rht16`; larger multiples of 16 run its
    first four butterfly stages per 16-lane chunk and the rest as contiguous loops; 2, 4, 8 take the scalar
    loop.  Every path makes the same operations in the same order (tested equal bit for bit).
    """
    if d == 16:
        flags = int(bf16_in) | int(bf16_out) << 1 | (8 if inverse else 4)
        _rht16_rows(src, dst, signs, scale, np.int32(flags))
    elif d % 16 == 0:
        _rht_rows_wide(src, dst, signs, d, scale, bf16_in, bf16_out, inverse)
    else:
        _rht_rows_scalar(src, dst, signs, d, scale, bf16_in, bf16_out, inverse)


@pjit
def _rht16_rows(src, dst, signs, scale, flags):
    rows, n = src.shape
    for i in prange(rows):
        sr, dr = src[i], dst[i]
        for t0 in range(0, n, 16):
            rht16(sr, t0, signs, scale, flags, dr, t0)


@pjit
def _rht_rows_wide(src, dst, signs, d, scale, bf16_in, bf16_out, inverse):
    """d a multiple of 16 above 16: stages h = 1 … 8 in 16-lane chunks (:func:`fpsim._simd.rht16` with scale 1,
    an identity on the sums it multiplies), then h = 16 … d/2, the scale, the inverse's signs, BF16 output."""
    rows, n = src.shape
    first = np.int32(bf16_in) | np.int32(0 if inverse else 4)
    one = np.float32(1.0)
    for i in prange(rows):
        buf = np.empty(d, np.float32)
        sr, dr = src[i], dst[i]
        for t0 in range(0, n, d):
            for k in range(0, d, 16):
                rht16(sr, t0 + k, signs[k:k + 16], one, first, buf, k)
            _stages(buf, 16, d)
            _finish(buf, d, scale, signs, inverse, bf16_out, dr, t0)


@pjit
def _rht_rows_scalar(src, dst, signs, d, scale, bf16_in, bf16_out, inverse):
    """The transform of any power-of-two d.  Each tile goes through a local buffer: the butterflies then touch
    no aliased array, which lets LLVM keep the tile in registers."""
    rows, n = src.shape
    for i in prange(rows):
        buf = np.empty(d, np.float32)
        for t0 in range(0, n, d):
            for j in range(d):
                v = src[i, t0 + j]
                if bf16_in:
                    v = _bf16_round(v)
                buf[j] = v if inverse else v * signs[j]
            _stages(buf, 1, d)
            _finish(buf, d, scale, signs, inverse, bf16_out, dst[i], t0)


def rht(
    x: np.typing.ArrayLike,
    d: int = 16,
    signs: str | int | np.ndarray | None = "recipe",
    axis: int = -1,
    bf16_in: bool = True,
    bf16_out: bool = True,
    inverse: bool = False,
) -> np.ndarray:
    """Random Hadamard transform of ``x`` in tiles of ``d`` along ``axis`` (SPEC §7).

    Parameters
    ----------
    x
        Real array; converted to float32 (RNE).  ``x.shape[axis]`` must be a
        multiple of ``d`` (pad first if it is not: the transform mixes a whole tile).
    d
        Tile size, a power of two (recipe: 16).
    signs
        Sign policy, see :func:`sign_vector` (recipe: the fixed vector).
    bf16_in, bf16_out
        Round the input / output to BF16 (RNE), as the recipe does.  Turn both
        off for the exact float32 transform.
    inverse
        Apply ``Rᵀ`` instead of ``R`` (``rht(rht(x), inverse=True) ≈ x``).

    Returns
    -------
    numpy.ndarray
        float32 array of the shape of ``x``.

    Examples
    --------
    >>> y = rht(np.ones(16, np.float32), signs="none", bf16_in=False, bf16_out=False)
    >>> y[:3]
    array([4., 0., 0.], dtype=float32)
    """
    d = check_d(d)
    s = sign_vector(d, signs)
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("rht needs at least one axis")
    moved = np.moveaxis(x32, axis, -1)
    n = moved.shape[-1]
    if n % d:
        raise ValueError(f"axis length {n} is not a multiple of the Hadamard size {d}")
    src = np.ascontiguousarray(moved).reshape(math.prod(moved.shape[:-1]), n)  # not -1: n may be 0
    dst = np.empty_like(src)
    if src.size:
        scale = np.float32(1.0 / np.sqrt(d))
        _rht_rows(src, dst, s, d, scale, bool(bf16_in), bool(bf16_out), bool(inverse))
    return np.ascontiguousarray(np.moveaxis(dst.reshape(moved.shape), -1, axis))
