"""The per-row kernels of fpsim.analysis against NumPy references of their documented order, bit for bit.

scheme_rows and moment_rows (fpsim/_analysis_kernels.py): element c of a row adds to lane c mod 16 of each float64
sum, each lane in element order, the 16 lanes then added in lane order; max|d| and the counts are exact in any
order.  The reference below builds each lane with np.add.accumulate (strictly sequential), so it is independent of
the vector code of fpsim/_simd.py and of the kernels' scalar tails.  The block dynamic range: one
log2(amax / min non-zero |x|) per block (numpy's log2), added in block order, against a plain loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fpsim._analysis_kernels import block_ratios, moment_rows, row_sums_skipping_nan, scheme_rows
from fpsim._analysis_sums import NO_CODES, BlockRanges
from fpsim.dispatch import quantize


def _data(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Student-t values with zeros, subnormals, huge values, ±inf and NaN scattered in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, (rows, cols)).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.permutation(flat.size)
    k = max(1, flat.size // 50)
    flat[idx[:k]] = 0.0
    flat[idx[k : 2 * k]] = np.float32(3e-41) * np.sign(flat[idx[k : 2 * k]] + 0.5)
    flat[idx[2 * k : 2 * k + 3]] = [np.inf, -np.inf, np.nan][: min(3, flat.size - 2 * k)]
    flat[idx[2 * k + 3 : 3 * k]] *= np.float32(1e4)
    return x


def _seq(v: np.ndarray) -> float:
    """v[0] + v[1] + … in order, starting from +0.0 (as each lane starts)."""
    return float(np.add.accumulate(np.concatenate([[0.0], v]))[-1]) if v.size else 0.0


def _codes(q, mode: int, rows: int, cols: int) -> np.ndarray:
    c = np.ascontiguousarray(q.data).reshape(rows, -1).astype(np.int64)
    if mode == 1:
        c = np.stack([c & 0xF, c >> 4], axis=-1).reshape(rows, -1)
    return c[:, :cols]  # MX pads each row to whole blocks


def _reference(x, xq, codes, mode, mag, top, bound):
    a, b = x.astype(np.float64), xq.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.abs(a) < np.inf
        m = fin & (np.abs(b) < np.inf)
        am = np.where(m, a, 0.0)
        d = np.where(m, a - b, 0.0)
    nonzero = m & (a != 0)
    inb = np.abs(am) <= bound
    terms = [am * am, d * d, d, None, np.where(inb, am * am, 0.0), np.where(inb, d * d, 0.0)]
    R = x.shape[0]
    f = np.zeros((R, 6))
    for r in range(R):
        for i, t in enumerate(terms):
            if t is None:
                f[r, i] = float(np.abs(d[r]).max(initial=0.0))
            else:
                f[r, i] = _seq(np.array([_seq(t[r, j::16]) for j in range(16)]))
    with np.errstate(invalid="ignore"):
        v = np.abs(xq)
        sat = (v > 0) & (v < np.inf) & (np.abs(x) > v)
    sat = sat & ((codes & mag) == top) if mode else np.zeros_like(sat)
    k = np.stack([m.sum(1), nonzero.sum(1), (nonzero & (b == 0)).sum(1), (fin & ~m).sum(1), sat.sum(1)], axis=1)
    return f, k


@pytest.mark.parametrize("cols", [1, 15, 16, 32, 40, 258, 1000])
@pytest.mark.parametrize("scheme,mode", [("nvfp4", 1), ("mxfp8_e4m3", 2), ("fp8_e4m3", 2), ("bf16", 0)])
def test_scheme_rows_equals_the_lane_order_reference_bit_for_bit(cols, scheme, mode):
    if scheme == "nvfp4" and cols % 2:
        cols += 1  # 4-bit codes pack two per byte: the block width must be even
    x = _data(7, cols, seed=cols)
    q = quantize(x, scheme, tensor_amax=float(np.nanmax(np.abs(x[np.isfinite(x)])))) \
        if scheme in ("nvfp4", "fp8_e4m3") else quantize(x, scheme)
    xq = q.dequantize()
    el = q.scheme.element
    codes = np.ascontiguousarray(q.data).reshape(x.shape[0], -1) if mode else NO_CODES
    for bound in (-1.0, 2.0, math.inf):
        f = np.zeros((x.shape[0], 6))
        k = np.zeros((x.shape[0], 5), np.int64)
        scheme_rows(x, xq, codes, mode, el.magnitude_mask, el.max_code, np.float64(bound), f, k)
        rf, rk = _reference(x, xq, _codes(q, mode, *x.shape) if mode else None, mode, el.magnitude_mask,
                            el.max_code, bound)
        np.testing.assert_array_equal(k, rk)
        assert f.tobytes() == rf.tobytes(), np.argwhere(f != rf)[:5]


def _dyn_reference(x: np.ndarray, bc: int):
    f, k = np.zeros(x.shape[0]), np.zeros(x.shape[0], np.int64)
    for r in range(x.shape[0]):
        for c0 in range(0, x.shape[1], bc):
            blk = np.abs(x[r, c0 : c0 + bc])
            if np.isnan(blk).any():
                continue
            amax = blk.max()
            nz = blk[blk > 0]
            if 0 < amax < np.inf:
                f[r] += np.log2(np.float64(amax) / np.float64(nz.min()))  # numpy's log2, as BlockRanges takes
                k[r] += 1
    return f, k


@pytest.mark.parametrize("bc", [8, 16, 32])
@pytest.mark.parametrize("cols", [16, 40, 96, 100])
def test_block_ranges_equal_a_plain_loop_bit_for_bit(bc, cols):
    x = _data(9, cols, seed=bc + cols)
    x[1, :] = 0.0  # blocks of zeros only: left out
    x[2, : min(bc, cols)] = np.float32(2.0 ** -140)  # a block of equal subnormals: log2 = 0, counted
    f, k = np.full(x.shape[0], np.nan), np.zeros(x.shape[0], np.int64)
    q = np.empty((x.shape[0], -(-cols // bc)))
    block_ratios(x.view(np.uint32), bc, q)
    np.log2(q, out=q)
    row_sums_skipping_nan(q, f, k)
    rf, rk = _dyn_reference(x, bc)
    np.testing.assert_array_equal(k, rk)
    assert f.tobytes() == rf.tobytes()
    assert BlockRanges(x)(bc) == (float(rf.sum()), int(rk.sum()))


@pytest.mark.parametrize("cols", [1, 15, 16, 33, 256, 1000])
@pytest.mark.parametrize("mean", [0.0, 0.37])
def test_moment_rows_equals_the_lane_order_reference_bit_for_bit(cols, mean):
    x = _data(6, cols, seed=cols + 1)
    x[3] = np.nan  # a row with no finite value: min > max
    f, k = np.zeros((x.shape[0], 5)), np.zeros((x.shape[0], 3), np.int64)
    parts = np.zeros((2, 0x7F80), np.int64)
    moment_rows(x, np.float64(mean), f, k, parts)
    a = np.abs(x[np.isfinite(x) & (x != 0)]).view(np.uint32) >> 16
    np.testing.assert_array_equal(parts.sum(0), np.bincount(a, minlength=0x7F80))
    f2, k2 = np.zeros_like(f), np.zeros_like(k)
    moment_rows(x, np.float64(mean), f2, k2, np.zeros((1, 1), np.int64))  # no histogram: the same sums
    assert f2.tobytes() == f.tobytes() and (k2 == k).all()
    v = x.astype(np.float64)
    fin = np.isfinite(v)
    with np.errstate(invalid="ignore"):
        d2 = np.where(fin, (v - mean) ** 2, 0.0)
    terms = [np.where(fin, v, 0.0), d2, d2 * d2]
    for r in range(x.shape[0]):
        want = [_seq(np.array([_seq(t[r, j::16]) for j in range(16)])) for t in terms]
        assert f[r, :3].tobytes() == np.array(want).tobytes(), r
        assert (f[r, 3], f[r, 4]) == ((v[r, fin[r]].min(), v[r, fin[r]].max()) if fin[r].any() else (np.inf, -np.inf))
        assert list(k[r]) == [fin[r].sum(), np.isnan(v[r]).sum(), np.isinf(v[r]).sum()]


def _decodable_schemes():
    from fpsim.schemes import SCHEMES

    return sorted(SCHEMES)


@pytest.mark.parametrize("cols", [16, 40, 96])
@pytest.mark.parametrize("scheme", _decodable_schemes())
def test_the_fused_decode_gives_the_sums_of_dequantize(scheme, cols):
    """scheme_rows_decoded (x̂ decoded a row at a time in the kernel) against scheme_rows over q.dequantize(): the
    same bits, for every preset that fpsim.scaling.row_decoder covers (and None exactly for the others)."""
    from fpsim._analysis_kernels import scheme_rows_decoded
    from fpsim.scaling import row_decoder
    from fpsim.schemes import Kind, get_scheme

    sch = get_scheme(scheme)
    x = _data(5, cols, seed=cols)
    if sch.kind is not Kind.POW2:  # a NaN amax would make every element NaN; MX keeps its NaN and ±inf blocks
        x[~np.isfinite(x)] = 1e3
    if sch.block is not None and sch.block[0] > 1:
        x = np.concatenate([x] * 4)[:16]  # whole 16-row tiles
    q = quantize(x, scheme)
    rd = row_decoder(q)
    covered = sch.kind in (Kind.TWO_LEVEL, Kind.POW2) or (sch.kind is not Kind.CAST and sch.block is None
                                                          and sch.element.bits <= 8)
    assert (rd is not None) == covered
    if rd is None:
        return
    el = sch.element
    mode = 1 if el.bits == 4 else 2
    codes = np.ascontiguousarray(q.data).reshape(x.shape[0], -1)
    f0, k0 = np.zeros((x.shape[0], 6)), np.zeros((x.shape[0], 5), np.int64)
    f1, k1 = f0.copy(), k0.copy()
    scheme_rows(x, q.dequantize(), codes, mode, el.magnitude_mask, el.max_code, np.float64(3.0), f0, k0)
    scheme_rows_decoded(x, rd.codes, rd.scales, rd.BC, rd.svtable, rd.s_dec, rd.two, rd.etable, rd.packed, rd.e2m1,
                        mode, el.magnitude_mask, el.max_code, np.float64(3.0), f1, k1)
    np.testing.assert_array_equal(k1, k0)
    assert f1.tobytes() == f0.tobytes()
