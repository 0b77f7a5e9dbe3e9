"""FP4 nibble packing and ml_dtypes views."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fpsim


def test_element_2j_is_the_low_nibble():
    assert fpsim.pack_fp4(np.array([0x1, 0x2], np.uint8)).tolist() == [0x21]
    assert fpsim.pack_fp4(np.array([[0xF, 0x0, 0x7]], np.uint8)).tolist() == [[0x0F, 0x07]]
    assert fpsim.unpack_fp4(np.array([0x21, 0x07], np.uint8), 3).tolist() == [0x1, 0x2, 0x7]


@given(hnp.arrays(np.uint8, hnp.array_shapes(min_dims=1, max_dims=3, max_side=9), elements=st.integers(0, 15)))
def test_pack_unpack_round_trip(codes):
    """unpack(pack(c), n) == c for every shape, odd last axes included."""
    p = fpsim.pack_fp4(codes)
    assert p.shape[-1] == (codes.shape[-1] + 1) // 2
    assert np.array_equal(fpsim.unpack_fp4(p, codes.shape[-1]), codes)


def test_pack_validation():
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        fpsim.pack_fp4(np.array([16]))
    with pytest.raises(TypeError):
        fpsim.pack_fp4(np.array([1.0]))
    with pytest.raises(ValueError, match="does not fit"):
        fpsim.unpack_fp4(np.array([1, 2], np.uint8), 7)


@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e8m0", "bf16", "fp16"])
def test_ml_dtypes_views_round_trip(fmt):
    spec = fpsim.get_format(fmt)
    x = np.linspace(-3, 3, 41, dtype=np.float32)
    codes = fpsim.encode(x, spec, "rtz" if spec.name == "float8_e8m0fnu" else "rne")
    view = fpsim.to_ml_dtypes(codes, spec)
    assert view.dtype == spec.ml_dtype
    assert np.array_equal(view.astype(np.float32), fpsim.decode(codes, spec))
    back, s2 = fpsim.from_ml_dtypes(view)
    assert s2 is spec and np.array_equal(back, codes)


def test_from_ml_dtypes_rejects_other_dtypes():
    with pytest.raises(TypeError, match="not an fpsim element format"):
        fpsim.from_ml_dtypes(np.zeros(2, np.int32))
    assert fpsim.from_ml_dtypes(np.zeros(2, ml_dtypes.float8_e4m3fn))[1].name == "float8_e4m3fn"
