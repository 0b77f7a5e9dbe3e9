"""Counter-based random bits (Philox4x32-10) for stochastic rounding (SPEC §3).

The stream for a seed is a sequence of 16-byte blocks: block ``c`` is
Philox4x32-10 with key ``(seed mod 2**32, seed >> 32)`` and counter
``(c mod 2**32, c >> 32, 0, 0)``, its four 32-bit words laid out little-endian.
Element ``i`` of a stream of ``k``-bit values reads the ``i``-th
little-endian integer of width ``w`` = 8, 16 or 32 (the smallest ≥ k) and keeps
its low ``k`` bits.  For E2M1's k = 8 one block is exactly one NVFP4 block of
16 elements.  No global state: the same (seed, counter) gives the same bits on
every backend.
"""

from __future__ import annotations

import numpy as np

from . import _kernels as K

__all__ = ["random_bits", "philox4x32", "seed_key", "stream_width"]


def seed_key(seed: int) -> tuple[int, int]:
    """Split a seed in [0, 2**64) into Philox's two 32-bit key words."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    s = int(seed)
    if not 0 <= s < 1 << 64:
        raise ValueError(f"seed must be in [0, 2**64), got {s}")
    return s & 0xFFFFFFFF, s >> 32


def stream_width(k: int) -> int:
    """Bits read from the stream per element for ``k`` random bits (8, 16 or 32)."""
    if not 1 <= k <= 32:
        raise ValueError(f"k must be in 1..32, got {k}")
    return 8 if k <= 8 else 16 if k <= 16 else 32


def random_bits(seed: int, n: int, k: int = 8, counter: int = 0) -> np.ndarray:
    """``n`` random ``k``-bit integers (uint32) from the Philox stream of ``seed``.

    ``counter`` is the first block's counter; one block holds 128 // w values.

    >>> random_bits(0, 4, k=8)
    array([213, 232,  39, 102], dtype=uint32)
    """
    k0, k1 = seed_key(seed)
    if n < 0:
        raise ValueError("n must be >= 0")
    if not 0 <= counter < 1 << 64:
        raise ValueError("counter must be in [0, 2**64)")
    out = np.empty(int(n), dtype=np.uint32)
    K.philox_fill(out, k0, k1, int(counter), stream_width(k), int(k))
    return out


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """One Philox4x32-10 block (for known-answer tests and other backends)."""
    w = K.philox4x32_10(*(int(c) for c in counter), *(int(k) for k in key))
    return int(w[0]), int(w[1]), int(w[2]), int(w[3])
