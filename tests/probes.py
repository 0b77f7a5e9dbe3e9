"""Structured float32 probe sets: every exponent class, every rounding-relevant mantissa pattern.

A format with ``mbits`` explicit mantissa bits rounds at mantissa bit
``mbits`` (higher in its subnormal range): with ``top`` ≥ mbits + 2 leading
mantissa bits enumerated, every grid point, every midpoint (round bit set, rest
zero) and every ±1-ulp neighbour of a midpoint (low field 1 / all ones below
the previous top pattern) is in the set, for every float32 exponent 0..255
(±0, subnormals, normals, ±inf and NaN payloads) and both signs.  ``sticky``
adds one probe per single low bit, so each sticky position is exercised alone.
"""

from __future__ import annotations

import numpy as np


def float32_probes(top: int, sticky: bool = False, exponents: np.ndarray | None = None) -> np.ndarray:
    """uint32 bit patterns: sign × exponent × ``top`` mantissa bits × low-field patterns."""
    low_bits = 23 - top
    lows = [0, 1, (1 << low_bits) - 1]
    if sticky:
        lows += [1 << j for j in range(1, low_bits)]
    lows = np.unique(np.array(lows, dtype=np.uint32))
    exps = np.arange(256, dtype=np.uint32) if exponents is None else np.asarray(exponents, np.uint32)
    sign = np.array([0, 1], dtype=np.uint32)[:, None, None, None] << np.uint32(31)
    e = exps[None, :, None, None] << np.uint32(23)
    t = np.arange(1 << top, dtype=np.uint32)[None, None, :, None] << np.uint32(low_bits)
    low = lows[None, None, None, :]
    return np.ascontiguousarray((sign | e | t | low).reshape(-1))


def probes_for(spec) -> np.ndarray:
    """The probe set used for ``spec`` in the golden tables and live NVIDIA comparison."""
    if spec.bits <= 8:
        return float32_probes(top=6, sticky=True)
    # 16-bit formats: the exponents where anything but 0 / max / inf can happen.
    lo = max(0, 127 + spec.emin - spec.mbits - 2)
    hi = min(255, 127 + spec.emax + 2)
    exps = np.unique(np.r_[np.arange(lo, hi + 1), [0, 1, 254, 255]])
    return float32_probes(top=spec.mbits + 2, exponents=exps)
