"""Bit-for-bit comparison of the tests: arrays and quantized tensors, NaN payloads aside."""

from __future__ import annotations

import numpy as np


def same_bits(got, want) -> bool:
    """Equal shapes, dtypes and bit patterns, NaN positions equal (NaN payloads are not part of the contract:
    SPEC §8, and GPUs canonicalise them)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.kind != "f":
        return np.array_equal(got, want)
    nan = np.isnan(want)
    u = np.dtype(f"u{got.dtype.itemsize}")
    return np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(u), want[~nan].view(u))


def assert_same(q, want, what: str) -> None:
    """Two quantized tensors with the same codes, scales, amax bits, scheme, shape and axis."""
    for field in ("data", "scales", "amax"):
        assert same_bits(getattr(q, field), getattr(want, field)), f"{what}: {field} differs"
    assert q.scheme == want.scheme and tuple(q.shape) == tuple(want.shape) and q.axis == want.axis, what
