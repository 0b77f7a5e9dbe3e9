"""Exhaustive sweeps over all 2**32 float32 bit patterns (slow: `make test-slow`, minutes per format).

For E2M1, E4M3, E5M2 and BF16, every float32 input is encoded and compared
(a) with ml_dtypes where SPEC §2 says the conventions agree (RNE, saturate=False, non-NaN),
(b) with NVIDIA's host conversions (satfinite) when the CUDA headers are present,
(c) for the table-driven ≤ 8-bit path, with the generic scalar kernel it was built from.
"""

import numpy as np
import pytest

import fpsim
from fpsim.formats import get_format
from tests.nvref import load

CHUNK = 1 << 24
FORMATS = ["float4_e2m1fn", "float8_e4m3fn", "float8_e5m2", "bfloat16"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_all_float32_bit_patterns(fmt):
    from tests.test_codecs import _scalar_encode, first_mismatch

    s = get_format(fmt)
    nv = load()
    p = s.traits
    for start in range(0, 1 << 32, CHUNK):
        x = np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32)
        xf = x.view(np.float32)
        got = fpsim.encode(xf, s, "rne", saturate=False)
        ok = ~np.isnan(xf)
        with np.errstate(over="ignore"):
            want = xf[ok].astype(s.ml_dtype).view(s.code_dtype)
        assert np.array_equal(got[ok], want), f"ml_dtypes: {first_mismatch(x[ok], got[ok], want)}"
        assert np.all(got[~ok] == s.nan_code)
        sat = fpsim.encode(xf, s, "rne", saturate=True)
        if nv is not None:
            want = nv.encode(x, fmt, "rne", saturate=(s.bits <= 8))
            mine = sat if s.bits <= 8 else got
            assert np.array_equal(mine, want), f"NVIDIA: {first_mismatch(x, mine, want)}"
        if s.bits <= 8:
            ref = np.empty_like(sat)
            _scalar_encode(x, ref, p, 0, True)
            assert np.array_equal(sat, ref), f"scalar kernel: {first_mismatch(x, sat, ref)}"
