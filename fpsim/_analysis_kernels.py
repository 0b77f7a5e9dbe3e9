"""Numba kernels of :mod:`fpsim.analysis`: one-pass per-row sums (float64) of the metrics of docs/spec.md §10.

Each kernel reads its rows once and computes every statistic of them, so a chunk is read from memory once per
scheme; per-row sums (the order of each is in its kernel's docstring) are reduced by the caller, in chunks of whole
rows."""

from __future__ import annotations

import numpy as np

from ._jit import njit, pjit, prange
from ._kernels import bits_f32
from ._row_kernels import decode_row_into
from ._simd import (
    F_LANES,
    K_LANES,
    absmax16,
    absmin_nonzero16,
    err_row16,
    err_row16_bytes,
    err_row16_nibbles,
    moment_row16,
)

#: Rows per parallel task of :func:`scheme_rows` and :func:`moment_rows` (each allocates its lanes once).
_ROWS = 16


@njit(inline="always")
def _lane_add(a, b, code_top, bound, facc, kacc, j):
    """Element (x = ``a``, x̂ = ``b``, float32) into lane ``j``: the arithmetic of :mod:`fpsim._simd`, one
    element at a time (the row's tail; tested equal to the vector form).  ``code_top``: the element's code is the
    largest magnitude (False where codes are not counted)."""
    a64 = np.float64(a)
    b64 = np.float64(b)
    fa = abs(a64) < np.inf  # False for NaN
    m = fa & (abs(b64) < np.inf)
    am = a64 if m else 0.0
    d = a64 - b64 if m else 0.0
    nonzero = m & (a64 != 0)
    a2 = am * am
    d2 = d * d
    ad = abs(d)
    inb = abs(am) <= bound
    facc[j] += a2
    facc[16 + j] += d2
    facc[32 + j] += d
    facc[48 + j] = ad if ad > facc[48 + j] else facc[48 + j]
    facc[64 + j] += a2 if inb else 0.0
    facc[80 + j] += d2 if inb else 0.0
    kacc[j] += m
    kacc[16 + j] += nonzero
    kacc[32 + j] += nonzero & (b64 == 0)
    kacc[48 + j] += fa & (not m)
    v = abs(b)
    kacc[64 + j] += code_top & (v > 0) & (v < np.inf) & (abs(a) > v)


@njit(inline="always")
def _lane_total(acc, i):
    """Lanes 16i … 16i + 15 of ``acc`` added in lane order: the last step of every lane sum's order."""
    s = acc[16 * i]
    for j in range(1, 16):
        s += acc[16 * i + j]
    return s


@pjit
def scheme_rows(x, xq, codes, mode, mag_mask, max_code, bound, f, k):
    """Per row of float32 ``x`` and its decoded ``xq``, in one pass (the row stays in cache), with d = x − x̂ in
    float64 (x and x̂ widened exactly):

    * f[r, 0:4] = (Σx², Σd², Σd, max|d|) and k[r, 0:4] = (#measured (x and x̂ finite), #measured with x ≠ 0,
      #flushed (measured, x ≠ 0, x̂ = 0), #(x finite, x̂ not finite));
    * f[r, 4:6] = (Σx², Σd²) over the measured elements with |x| ≤ ``bound`` (the bulk of bulk_rel_error);
    * with ``mode`` 1 (codes two per byte, element 2j in the low nibble) or 2 (a byte each), k[r, 4] = saturated
      elements: the code's magnitude bits (``mag_mask``) are ``max_code``, x̂ is finite and non-zero (so the block
      scale is finite and non-zero) and |x| > |x̂|; mode 0: no codes, k[r, 4] = 0.

    Sum order (float64, no fast-math): element c of a row adds to lane c mod 16 of its sum, each lane in element
    order (:mod:`fpsim._simd` for the first 16·⌊C/16⌋ elements, :func:`_lane_add` for the rest), and the row's
    sum is its 16 lanes added in lane order.  An element outside a sum adds +0.0, which leaves the sum's bits as
    skipping it would (no sum here is ever −0.0)."""
    R, C = x.shape
    for g in prange(-(-R // _ROWS)):
        facc = np.empty(16 * F_LANES)
        kacc = np.empty(16 * K_LANES, np.int64)
        for r in range(g * _ROWS, min(R, g * _ROWS + _ROWS)):
            _row_sums(x[r], xq[r], codes, r, mode, mag_mask, max_code, bound, facc, kacc, f, k)


@pjit
def scheme_rows_decoded(x, codes, scales, BC, svtable, s_dec, two, etable, packed, e2m1, mode, mag_mask, max_code,
                        bound, f, k):
    """:func:`scheme_rows` with x̂ decoded a row at a time into a buffer that stays in cache (never written out):
    the decoder of :func:`fpsim.scaling.dequantize` (:func:`fpsim._row_kernels.decode_row_into`, the arguments of a
    :class:`fpsim.scaling.RowDecode`), so x̂ has its bits and the sums are those of :func:`scheme_rows`."""
    R, C = x.shape
    nb = scales.shape[1]
    for g in prange(-(-R // _ROWS)):
        facc = np.empty(16 * F_LANES)
        kacc = np.empty(16 * K_LANES, np.int64)
        buf = np.empty(C, np.int32)
        sval = np.empty(nb, np.float32)
        qrow = np.empty(C, np.float32)
        for r in range(g * _ROWS, min(R, g * _ROWS + _ROWS)):
            for j in range(nb):
                sval[j] = svtable[scales[r, j]]
            decode_row_into(codes, r, BC, sval, e2m1, packed, etable, s_dec[r], two, buf, qrow)
            _row_sums(x[r], qrow, codes, r, mode, mag_mask, max_code, bound, facc, kacc, f, k)


@njit(inline="always")
def _row_sums(xr, qr, codes, r, mode, mag_mask, max_code, bound, facc, kacc, f, k):
    """Row r's f[r, 0:6] and k[r, 0:5] of :func:`scheme_rows` from its float32 rows ``xr`` and ``qr`` (x̂)."""
    C = xr.size
    n16 = C // 16
    facc[:] = 0.0
    kacc[:] = 0
    if mode == 1:
        err_row16_nibbles(xr, qr, codes[r], n16, bound, mag_mask, max_code, facc, kacc)
    elif mode == 2:
        err_row16_bytes(xr, qr, codes[r], n16, bound, mag_mask, max_code, facc, kacc)
    else:
        err_row16(xr, qr, codes[0], n16, bound, mag_mask, max_code, facc, kacc)
    for c in range(16 * n16, C):
        top = False
        if mode == 1:
            top = ((codes[r, c >> 1] >> (4 * (c & 1))) & mag_mask) == max_code
        elif mode == 2:
            top = (codes[r, c] & mag_mask) == max_code
        _lane_add(xr[c], qr[c], top, bound, facc, kacc, c - 16 * n16)
    for i in range(F_LANES):
        f[r, i] = facc[48:64].max() if i == 3 else _lane_total(facc, i)  # a max is exact in any order
    for i in range(K_LANES):
        k[r, i] = kacc[16 * i : 16 * i + 16].sum()


@pjit
def block_ratios(bits, bc, q):
    """q[r, b] = amax / (min non-zero |x|) in float64 over block b (1 × ``bc``) of row r (float32 ``bits``) where
    the amax is finite and positive and the block holds no NaN, else NaN: the block dynamic range before its log2.
    Blocks of a multiple of 16 take their max and min bits 16 at a time (:func:`fpsim._simd.absmax16`,
    :func:`fpsim._simd.absmin_nonzero16`: exact, so q is that of a scalar loop)."""
    R, C = bits.shape
    for r in prange(R):
        row = bits[r]
        for b in range(q.shape[1]):
            c0 = b * bc
            hi = np.uint32(0)
            lo = np.uint32(0xFFFFFFFF)
            if bc % 16 == 0 and c0 + bc <= C:
                for c in range(c0, c0 + bc, 16):
                    hi = max(hi, absmax16(row, c))
                    lo = min(lo, absmin_nonzero16(row, c))
            else:
                for c in range(c0, min(c0 + bc, C)):
                    a = row[c] & np.uint32(0x7FFFFFFF)
                    hi = max(hi, a)
                    lo = a if (a != 0) & (a < lo) else lo
            # hi ≤ +inf's bits: no NaN; hi < +inf's: finite amax, so lo is a finite non-zero |x|
            ok = np.uint32(0) < hi and hi < np.uint32(0x7F800000)
            q[r, b] = np.float64(bits_f32(hi)) / np.float64(bits_f32(lo)) if ok else np.nan


@pjit
def row_sums_skipping_nan(v, f, k):
    """f[r] = the non-NaN v[r, :] added in order (float64, from +0.0) and k[r] = their number."""
    R, B = v.shape
    for r in prange(R):
        s = 0.0
        n = 0
        for b in range(B):
            t = v[r, b]
            if t == t:
                s += t
                n += 1
        f[r] = s
        k[r] = n


@pjit
def moment_rows(x, mean, f, k, parts):
    """Per row over the finite values: f = (Σv, Σd², Σd⁴, min v, max v) in float64 with d = v − mean,
    k = (#finite, #NaN, #inf).  min and max give max|v| and tell a constant tensor exactly (its rounded mean
    leaves d ≠ 0).  Sum order as :func:`scheme_rows`: 16 lanes (element c in lane c mod 16, each in element
    order; :func:`fpsim._simd.moment_row16`, then the tail one element at a time), added in lane order.

    With ``parts`` of more than one column, the |x| histogram in the same read: parts[t, b >> 16] += 1 for the
    finite non-zero |x| (bits b) of the t-th of ``len(parts)`` row ranges (bfloat16-wide bins ordered as the
    magnitudes are; one table per range, so the ranges run in parallel; the caller sums them)."""
    R, C = x.shape
    n16 = C // 16
    hist = parts.shape[1] > 1
    T = parts.shape[0] if hist else -(-R // _ROWS)
    for t in prange(T):
        facc = np.empty(16 * 5)
        kacc = np.empty(16 * 3, np.int64)
        for r in range(t * R // T, (t + 1) * R // T):
            if hist:
                bits = x[r].view(np.uint32)
                for c in range(C):
                    bb = bits[c] & np.uint32(0x7FFFFFFF)
                    if bb != 0 and bb < np.uint32(0x7F800000):
                        parts[t, bb >> np.uint32(16)] += 1
            facc[:48] = 0.0
            facc[48:64] = np.inf
            facc[64:] = -np.inf
            kacc[:] = 0
            moment_row16(x[r], n16, mean, facc, kacc)
            for c in range(16 * n16, C):
                j = c - 16 * n16
                v = np.float64(x[r, c])
                if v != v:
                    kacc[16 + j] += 1
                elif abs(v) == np.inf:
                    kacc[32 + j] += 1
                else:
                    kacc[j] += 1
                    facc[j] += v
                    dv = v - mean
                    d2 = dv * dv
                    facc[16 + j] += d2
                    facc[32 + j] += d2 * d2
                    facc[48 + j] = v if v < facc[48 + j] else facc[48 + j]
                    facc[64 + j] = v if v > facc[64 + j] else facc[64 + j]
            for i in range(3):
                f[r, i] = _lane_total(facc, i)
            f[r, 3] = facc[48:64].min()
            f[r, 4] = facc[64:80].max()
            for i in range(3):
                k[r, i] = kacc[16 * i : 16 * i + 16].sum()
