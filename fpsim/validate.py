"""Argument checks of the public API: one place decides what an axis, a counter, an amax or a block may be.

Every function returns the normalised value or raises ``TypeError`` (wrong kind of value) or
``ValueError`` (right kind, out of range) with one line that names the argument, so a caller never
sees numpy's "cannot reshape" or an ``OverflowError`` from deep inside a kernel, and a float axis or a
string is never silently truncated.  This module imports nothing from fpsim (any layer may use it).

>>> axis_arg(-1, 2)
1
>>> block_arg((1, 16))
(1, 16)
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["axis_arg", "counter_arg", "amax_arg", "block_arg", "seed_arg", "MAX_BLOCK", "COUNTER_LIMIT"]

#: Largest block side accepted (hardware blocks are 16 … 128; a block is padded whole, so a huge one
#: would allocate its full size for a handful of values).
MAX_BLOCK = 1 << 16
#: Philox counters are carried as int64 by the kernels: counter + blocks · calls must stay below this.
COUNTER_LIMIT = 1 << 63


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def axis_arg(axis, ndim: int, name: str = "axis") -> int:
    """``axis`` as a non-negative int below ``ndim``; ``TypeError`` for a non-integer (0.7, "1", True)."""
    if not _is_int(axis):
        raise TypeError(f"{name} must be an integer, got {type(axis).__name__} {axis!r}")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ValueError(f"{name}={a} is out of range for a {ndim}-d array")
    return a % ndim if ndim else 0


def counter_arg(counter, span: int = 0, name: str = "counter") -> int:
    """A Philox counter: an int with ``0 <= counter`` and ``counter + span < 2**63`` (``span``: counters used)."""
    if not _is_int(counter):
        raise TypeError(f"{name} must be an integer, got {type(counter).__name__} {counter!r}")
    c = int(counter)
    if c < 0:
        raise ValueError(f"{name}={c} must be non-negative")
    if c + int(span) >= COUNTER_LIMIT:
        raise ValueError(f"{name}={c} (+ {int(span)} counters this call uses) must stay below 2**63")
    return c


def seed_arg(seed, name: str = "seed") -> int | None:
    """None or an int in [0, 2**64) (the Philox key)."""
    if seed is None:
        return None
    if not _is_int(seed):
        raise TypeError(f"{name} must be an integer or None, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < 1 << 64:
        raise ValueError(f"{name}={int(seed)} must be in [0, 2**64)")
    return int(seed)


def amax_arg(amax, name: str = "tensor_amax") -> float | None:
    """None or a real amax ≥ 0 (NaN and +inf allowed: they propagate as SPEC §9 says); negative raises."""
    if amax is None:
        return None
    if isinstance(amax, (bool, np.bool_)) or not isinstance(amax, (numbers.Real, np.floating, np.integer)):
        if isinstance(amax, np.ndarray) and amax.ndim == 0 and amax.dtype.kind in "fiu":
            amax = amax.item()
        else:
            raise TypeError(f"{name} must be a real number or None, got {type(amax).__name__}")
    v = float(amax)
    if v < 0 or (math.isinf(v) and v < 0):
        raise ValueError(f"{name}={v} must be non-negative (it is a max of |x|)")
    return v


def block_arg(block, name: str = "block") -> tuple[int, int] | None:
    """None or ``(rows, cols)`` of positive ints, each at most :data:`MAX_BLOCK`."""
    if block is None:
        return None
    if isinstance(block, (str, bytes)) or not hasattr(block, "__len__") or len(block) != 2:
        raise TypeError(f"{name} must be a pair (rows, cols) of integers, got {block!r}")
    if not all(_is_int(b) for b in block):
        raise TypeError(f"{name} must be a pair (rows, cols) of integers, got {block!r}")
    r, c = (int(b) for b in block)
    if not (1 <= r <= MAX_BLOCK and 1 <= c <= MAX_BLOCK):
        raise ValueError(f"{name}={(r, c)}: each side must be in [1, {MAX_BLOCK}]")
    return r, c
