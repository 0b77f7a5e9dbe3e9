"""analyze_tensor reads a tensor at most twice (the moments' two passes; every plain scheme row shares the second),
and what it shares does not change a row: each scheme's row equals the row of that scheme analysed alone, and
bulk_rel_error equals an exact float64 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fpsim.analysis import BULK_MEDIANS, DEFAULT_SCHEMES, analyze_tensor
from fpsim.dispatch import fake_quantize


class CountingRows:
    """A 2-D float32 tensor read in row slices (as fpsim.io.RowSource is), counting the elements read."""

    def __init__(self, a: np.ndarray):
        self.a, self.read = a, 0
        self.dtype, self.shape, self.size, self.ndim = a.dtype, a.shape, a.size, a.ndim
        self.axis, self.orig_shape = a.ndim - 1, a.shape

    def as_2d(self):
        return self

    def stored_2d(self):
        return self

    def __getitem__(self, sl: slice) -> np.ndarray:
        out = self.a[sl].copy()
        self.read += out.size
        return out


def _tensor(rows: int = 96, cols: int = 64) -> np.ndarray:
    x = np.random.default_rng(3).standard_t(3, (rows, cols)).astype(np.float32)
    x[5, 7] = 300.0  # an outlier beyond the bulk
    return x


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("keep_bytes", [0, 300 * 64 * 4])
@pytest.mark.parametrize("chunk_rows", [384, 128])  # chunks are multiples of 128 rows
def test_the_five_default_schemes_read_the_tensor_twice_at_most(chunk_rows, keep_bytes):
    x = _tensor(300)
    src = CountingRows(x)
    analyze_tensor("t", src, chunk_bytes=chunk_rows * 64 * 4, keep_bytes=keep_bytes)
    # one chunk, or a tensor within keep_bytes: read once and kept; else the moments' first pass, then one pass
    # for everything else
    once = chunk_rows >= x.shape[0] or x.nbytes <= keep_bytes
    assert src.read == (x.size if once else 2 * x.size)


def test_a_kept_tensor_gives_the_rows_of_a_tensor_read_twice():
    x = _tensor(300)
    kw = {"chunk_bytes": 128 * 64 * 4, "role": "gradient", "seeds": 2}
    once, twice = analyze_tensor("t", x, keep_bytes=x.nbytes, **kw), analyze_tensor("t", x, keep_bytes=0, **kw)
    assert len(once) == len(twice) == 5
    for a, b in zip(once, twice):
        assert a.keys() == b.keys() and all(_same(a[c], b[c]) for c in a), a["scheme"]


def test_each_scheme_row_equals_that_scheme_analysed_alone():
    x = _tensor(300)
    x[9, 3] = np.nan  # a NaN tensor amax: every per-tensor-scaled element decodes to NaN
    together = analyze_tensor("t", x, chunk_bytes=128 * 64 * 4, role="gradient", seeds=2)
    for row in together:
        alone = analyze_tensor("t", x, schemes=(row["scheme"],), chunk_bytes=128 * 64 * 4, role="gradient", seeds=2)
        assert len(alone) == 1
        bad = [c for c in row if not _same(row[c], alone[0][c])]
        assert not bad, (row["scheme"], bad)


@pytest.mark.parametrize("scheme", DEFAULT_SCHEMES)
def test_bulk_rel_error_equals_an_exact_float64_reference(scheme):
    x = _tensor()
    row = next(r for r in analyze_tensor("t", x, schemes=(scheme,)))
    a = np.abs(x[(x != 0) & np.isfinite(x)]).view(np.uint32)
    med = np.sort(a)[(a.size + 1) // 2 - 1]  # the median's bfloat16-wide bin, rounded up: its upper edge
    bound = BULK_MEDIANS * float(np.array([((med >> 16) + 1) << 16], np.uint32).view(np.float32)[0])
    xq = fake_quantize(x, scheme, tensor_amax=float(np.abs(x).max())) if scheme in ("nvfp4", "fp8_e4m3") \
        else fake_quantize(x, scheme)
    m = (np.abs(x) <= bound) & np.isfinite(xq)
    xb, d = x[m].astype(np.float64), x[m].astype(np.float64) - xq[m]
    want = math.sqrt(math.fsum(d * d) / math.fsum(xb * xb))
    assert row["bulk_rel_error"] == pytest.approx(want, rel=1e-13)
