"""Numba kernels of :mod:`fpsim.analysis`: one-pass per-row sums (float64) of the metrics of docs/spec.md §10.

Each kernel reads its rows once and computes every statistic of them, so a chunk is read from memory once per
scheme; per-row sums (in element order) are reduced by the caller, in chunks of whole rows."""

from __future__ import annotations

import numpy as np

from ._jit import pjit, prange


@pjit
def scheme_rows(x, xq, codes, blocks, packed, mag_mask, max_code, bc, bound, f, k):
    """Per row of float32 ``x`` and its decoded ``xq``, in one pass (the row stays in cache), with d = x − x̂ exact
    in float64 and every sum taken in element order:

    * f[r, 0:4] = (Σx², Σd², Σd, max|d|) and k[r, 0:4] = (#measured (x and x̂ finite), #measured with x ≠ 0,
      #flushed (measured, x ≠ 0, x̂ = 0), #(x finite, x̂ not finite));
    * f[r, 4:6] = (Σx², Σd²) over the measured elements with |x| ≤ ``bound`` (the bulk of bulk_rel_error);
    * with ``blocks``, k[r, 4] = saturated elements: the code (of ``codes``, two per byte when ``packed``) is the
      largest magnitude, x̂ is finite and non-zero (so the block scale is finite and non-zero) and |x| > |x̂|;
    * with 1 × bc blocks (bc > 0), f[r, 6] = Σ log2(amax / smallest non-zero |x|) over the row's blocks whose amax
      is finite, positive and NaN-free, and k[r, 5] their number (the block dynamic range)."""
    R, C = x.shape
    for r in prange(R):
        sq = 0.0
        esq = 0.0
        es = 0.0
        mx = 0.0
        bsq = 0.0
        besq = 0.0
        n = 0
        nz = 0
        fl = 0
        bad = 0
        # Branch-free: an element outside a sum adds +0.0, which leaves every sum's bits as skipping it would (no
        # sum here is ever −0.0), so the sums are those of the measured elements in element order.
        for c in range(C):
            a = np.float64(x[r, c])
            b = np.float64(xq[r, c])
            fa = abs(a) < np.inf  # False for NaN
            m = fa & (abs(b) < np.inf)
            bad += np.int64(fa) - np.int64(m)  # m implies fa
            n += m
            am = a if m else 0.0
            d = a - b if m else 0.0
            nonzero = m & (a != 0)
            nz += nonzero
            fl += nonzero & (b == 0)
            a2 = am * am
            d2 = d * d
            sq += a2
            esq += d2
            es += d
            mx = abs(d) if abs(d) > mx else mx
            inb = abs(am) <= bound
            bsq += a2 if inb else 0.0
            besq += d2 if inb else 0.0
        f[r, 0] = sq
        f[r, 1] = esq
        f[r, 2] = es
        f[r, 3] = mx
        f[r, 4] = bsq
        f[r, 5] = besq
        k[r, 0] = n
        k[r, 1] = nz
        k[r, 2] = fl
        k[r, 3] = bad
        sat = 0
        if blocks:
            for c in range(C):
                code = (codes[r, c >> 1] >> (4 * (c & 1))) & 0xF if packed else codes[r, c]
                v = abs(xq[r, c])
                sat += ((code & mag_mask) == max_code) & (v > 0) & (v < np.inf) & (abs(x[r, c]) > v)
        k[r, 4] = sat
        dyn = 0.0
        nb = 0
        if bc > 0:
            for c0 in range(0, C, bc):
                amax = np.float32(0.0)
                amin = np.float32(np.inf)
                nan = False
                for c in range(c0, min(c0 + bc, C)):
                    ax = abs(x[r, c])
                    nan |= ax != ax
                    amax = ax if ax > amax else amax
                    amin = ax if (ax > 0) & (ax < amin) else amin
                if not nan and amax > 0 and amax < np.inf and amin < np.inf:
                    dyn += np.log2(np.float64(amax) / np.float64(amin))
                    nb += 1
        f[r, 6] = dyn
        k[r, 5] = nb


@pjit
def abs_hist(bits, parts):
    """parts[t, b >> 16] += 1 for the finite non-zero |x| (bits ``b`` of |x|, float32 viewed as uint32) of the t-th
    of ``len(parts)`` row ranges: bfloat16-wide bins, ordered as the magnitudes are (one table per range, so the
    ranges run in parallel; the caller sums them)."""
    R, C = bits.shape
    T = parts.shape[0]
    for t in prange(T):
        for r in range(t * R // T, (t + 1) * R // T):
            for c in range(C):
                b = bits[r, c] & np.uint32(0x7FFFFFFF)
                if b != 0 and b < np.uint32(0x7F800000):
                    parts[t, b >> np.uint32(16)] += 1


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
