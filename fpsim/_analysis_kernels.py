"""Numba kernels of :mod:`fpsim.analysis`: one-pass per-row sums (float64) of the metrics of docs/spec.md §10."""

from __future__ import annotations

import numpy as np

from ._jit import pjit, prange


@pjit
def block_rows(x, xq, codes, packed, mag_mask, max_code, bc, f, k):
    """Per row: k[r, 0] = saturated elements: the code is the largest magnitude, x̂ is finite and non-zero (so
    the block scale is finite and non-zero; a zero-scale block decodes to 0 and counts as flushed) and
    |x| > |x̂|; with 1 × bc blocks (bc > 0), f[r] = Σ log2(amax / smallest nonzero |x|) over the row's blocks
    whose amax is finite, positive and NaN-free, and k[r, 1] their number (the block dynamic range)."""
    R, C = x.shape
    for r in prange(R):
        sat = 0
        for c in range(C):
            code = (codes[r, c >> 1] >> (4 * (c & 1))) & 0xF if packed else codes[r, c]
            v = abs(xq[r, c])
            if (code & mag_mask) == max_code and v > 0 and v < np.inf and abs(x[r, c]) > v:
                sat += 1
        k[r, 0] = sat
        dyn = 0.0
        nb = 0
        if bc > 0:
            for c0 in range(0, C, bc):
                amax = np.float32(0.0)
                amin = np.float32(np.inf)
                nan = False
                for c in range(c0, min(c0 + bc, C)):
                    a = abs(x[r, c])
                    if a != a:
                        nan = True
                    else:
                        amax = max(amax, a)
                        if a > 0:
                            amin = min(amin, a)
                if not nan and amax > 0 and amax < np.inf and amin < np.inf:
                    dyn += np.log2(np.float64(amax) / np.float64(amin))
                    nb += 1
        f[r] = dyn
        k[r, 1] = nb


@pjit
def err_rows(x, xq, f, k):
    """Per row of float32 ``x`` and its decoded ``xq``, over the measured elements (x and x̂ finite), with
    d = x − x̂ exact in float64: f = (Σx², Σd², Σd, max|d|); k = (#measured, #measured with x ≠ 0,
    #flushed (measured, x ≠ 0, x̂ = 0), #(x finite, x̂ not finite)).  One pass, no float64 temporaries."""
    R, C = x.shape
    for r in prange(R):
        sq = 0.0
        esq = 0.0
        es = 0.0
        mx = 0.0
        n = 0
        nz = 0
        fl = 0
        bad = 0
        for c in range(C):
            a = np.float64(x[r, c])
            b = np.float64(xq[r, c])
            if a != a or abs(a) == np.inf:
                continue
            if b != b or abs(b) == np.inf:
                bad += 1
                continue
            n += 1
            nz += a != 0
            fl += a != 0 and b == 0
            d = a - b
            sq += a * a
            esq += d * d
            es += d
            if abs(d) > mx:
                mx = abs(d)
        f[r, 0] = sq
        f[r, 1] = esq
        f[r, 2] = es
        f[r, 3] = mx
        k[r, 0] = n
        k[r, 1] = nz
        k[r, 2] = fl
        k[r, 3] = bad


@pjit
def moment_rows(x, mean, f, k):
    """Per row over the finite values: f = (Σv, Σd², Σd⁴, min v, max v) in float64 with d = v − mean,
    k = (#finite, #NaN, #inf).  min and max give max|v| and tell a constant tensor exactly (its rounded mean
    leaves d ≠ 0)."""
    R, C = x.shape
    for r in prange(R):
        s1 = 0.0
        s2 = 0.0
        s4 = 0.0
        lo = np.inf
        hi = -np.inf
        n = 0
        nan = 0
        inf = 0
        for c in range(C):
            v = np.float64(x[r, c])
            if v != v:
                nan += 1
            elif abs(v) == np.inf:
                inf += 1
            else:
                n += 1
                s1 += v
                lo = min(lo, v)
                hi = max(hi, v)
                dv = v - mean
                d2 = dv * dv
                s2 += d2
                s4 += d2 * d2
        f[r, 0] = s1
        f[r, 1] = s2
        f[r, 2] = s4
        f[r, 3] = lo
        f[r, 4] = hi
        k[r, 0] = n
        k[r, 1] = nan
        k[r, 2] = inf
