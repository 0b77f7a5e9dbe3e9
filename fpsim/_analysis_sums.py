"""Running sums of :mod:`fpsim.analysis` over the chunks of a tensor: quantization errors and element/block counts
(:class:`ErrorSums`) and the moments of the tensor (:class:`MomentSums`).  One kernel pass per chunk gives each
row's sums (:mod:`fpsim._analysis_kernels`); the rows of a chunk are summed here (numpy's pairwise sum), so
results do not depend on how the kernels split the work."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._analysis_kernels import (
    block_ratios,
    moment_rows,
    row_sums_skipping_nan,
    scheme_rows,
    scheme_rows_decoded,
)
from ._jit import get_num_threads
from .scaling import row_decoder
from .schemes import Kind
from .tensor import QuantizedTensor

__all__ = ["BlockRanges", "ErrorSums", "MomentSums", "NO_CODES"]


@dataclass
class ErrorSums:
    """Running sums over chunks (float64): errors over the measured elements, element and block counts."""

    measured: int = 0
    nonfinite_out: int = 0
    sq: float = 0.0
    err_sq: float = 0.0
    max_abs_err: float = 0.0
    err_sum: float = 0.0
    n: int = 0
    nonzero: int = 0
    flushed: int = 0
    saturated: int = 0
    blocks: int = 0
    small_scale: int = 0
    dyn_sum: float = 0.0
    dyn_n: int = 0
    bound: float | None = None  # the bulk's |x| bound (bulk_rel_error), or None: not measured
    bulk_sq: float = 0.0
    bulk_err_sq: float = 0.0

    def add(self, x: np.ndarray, xq: np.ndarray | None, q: QuantizedTensor | None, errors: bool = True,
            elements: bool = True, ranges: BlockRanges | None = None) -> None:
        """Add a chunk: ``errors`` (MSE … bias sums), ``elements`` (flushed/saturated counts and, with ``q``,
        block statistics).  RHT recipe rows take errors in one basis and elements in the other.  One kernel pass
        (:func:`scheme_rows`) gives every per-row sum; the sums of the chunk's rows are added here.  ``xq`` None:
        x̂ is ``q`` (quantized from ``x`` along its last axis) decoded row by row inside the kernel where
        :func:`fpsim.scaling.row_decoder` covers it (:func:`scheme_rows_decoded`), else by ``q.dequantize()``.
        ``ranges``: the chunk's :class:`BlockRanges`, shared by the schemes of one block width (made here when
        None)."""
        x2 = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1] if x.ndim else 1)
        rd = row_decoder(q) if xq is None and q is not None and elements else None
        if xq is None and rd is None:
            assert q is not None, "xq or q"
            xq = q.dequantize()
        q2 = None if rd is not None else np.ascontiguousarray(xq, np.float32).reshape(x2.shape)
        f = np.zeros((x2.shape[0], 6), np.float64)
        k = np.zeros((x2.shape[0], 5), np.int64)
        blocks = elements and q is not None
        sch = q.scheme if blocks else None
        el = sch.element if blocks else None
        codes = np.ascontiguousarray(q.data).reshape(x2.shape[0], -1) if blocks else NO_CODES
        bc = sch.block[1] if blocks and sch.block is not None and sch.block[0] == 1 else 0
        bound = self.bound if errors and self.bound is not None else -1.0  # -1: no element is in a bulk
        if x2.size:
            mode = (1 if el.bits == 4 else 2) if blocks else 0  # codes two per byte, one per byte, none
            top = (el.magnitude_mask, el.max_code) if blocks else (0, 0)
            if rd is not None:
                scheme_rows_decoded(x2, rd.codes, rd.scales, rd.BC, rd.svtable, rd.s_dec, rd.two, rd.etable,
                                    rd.packed, rd.e2m1, mode, *top, np.float64(bound), f, k)
            else:
                scheme_rows(x2, q2, codes, mode, *top, np.float64(bound), f, k)
        if errors:
            self.measured += int(k[:, 0].sum())
            self.nonfinite_out += int(k[:, 3].sum())
            self.sq += float(f[:, 0].sum())
            self.err_sq += float(f[:, 1].sum())
            self.err_sum += float(f[:, 2].sum())
            self.max_abs_err = max(self.max_abs_err, float(f[:, 3].max()) if x2.size else 0.0)
            if self.bound is not None:
                self.bulk_sq += float(f[:, 4].sum())
                self.bulk_err_sq += float(f[:, 5].sum())
        if elements:
            self.n += x2.size
            self.nonzero += int(k[:, 1].sum())
            self.flushed += int(k[:, 2].sum())
        if blocks:
            self.saturated += int(k[:, 4].sum())
            if sch.kind is Kind.TWO_LEVEL:
                sc = q.scales.reshape(-1)
                exp_field = sch.scale.magnitude_mask & ~((1 << sch.scale.mbits) - 1)
                self.small_scale += int(((sc & exp_field) == 0).sum())  # subnormal or zero scale
                self.blocks += sc.size
            if bc:
                dyn, n = (ranges if ranges is not None else BlockRanges(x2))(bc)
                self.dyn_sum += dyn
                self.dyn_n += n


NO_CODES = np.zeros((1, 1), np.uint8)


class BlockRanges:
    """The block dynamic range of a float32 chunk (rows × last axis), per block width: (Σ over its rows of the row's
    sum of log2(amax / min non-zero |x|) over its counted blocks, in block order (:func:`block_ratios`, numpy's
    log2, :func:`row_sums_skipping_nan`), the rows by numpy's pairwise sum; the number of blocks counted), each
    width computed once however many schemes ask (NVFP4's 16, MXFP4's and MXFP8's 32)."""

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1] if x.ndim else 1)
        self.memo: dict[int, tuple[float, int]] = {}

    def __call__(self, bc: int) -> tuple[float, int]:
        if bc not in self.memo:
            R, C = self.x.shape
            f = np.zeros(R)
            k = np.zeros(R, np.int64)
            if self.x.size:
                q = np.empty((R, -(-C // bc)))
                block_ratios(self.x.view(np.uint32), bc, q)
                # numpy's log2 (its vector code: ten times libm's, one call per block), NaN kept for the blocks
                # left out
                np.log2(q, out=q)
                row_sums_skipping_nan(q, f, k)
            self.memo[bc] = float(f.sum()), int(k.sum())
        return self.memo[bc]


class MomentSums:
    """Running sums of :func:`moment_rows` over float32 2-D chunks: (Σv, Σd², Σd⁴) with d = v − ``mean``, counts
    (finite, NaN, inf), min and max of the finite values; with ``hist``, the finite non-zero |x| counted by their
    top 16 bits (in the same kernel)."""

    def __init__(self, mean: float, hist: np.ndarray | None = None):
        self.mean, self.hist = mean, hist
        self.tf, self.tk = np.zeros(3), np.zeros(3, np.int64)
        self.lo, self.hi = math.inf, -math.inf

    def add(self, c: np.ndarray) -> None:
        if not c.size:
            return
        c = np.ascontiguousarray(c).reshape(-1, c.shape[-1])
        f = np.empty((c.shape[0], 5), order="F")  # column-major: numpy sums each column pairwise over the rows
        k = np.empty((c.shape[0], 3), np.int64)
        parts = np.zeros((min(get_num_threads(), c.shape[0]), self.hist.size) if self.hist is not None else (1, 1),
                         np.int64)
        moment_rows(c, np.float64(self.mean), f, k, parts)
        if self.hist is not None:
            self.hist += parts.sum(axis=0)
        self.tf += f[:, :3].sum(axis=0)
        self.tk += k.sum(axis=0)
        self.lo, self.hi = min(self.lo, float(f[:, 3].min())), max(self.hi, float(f[:, 4].max()))

    def result(self):
        """(Σv, Σd², Σd⁴), counts, amax, min, max (amax 0 and min > max when no value is finite)."""
        return self.tf, self.tk, max(-self.lo, self.hi, 0.0), self.lo, self.hi
