"""Issue 17 item 12: quantize's arguments are checked (fpsim.validate) before any work.

These tests FAIL until the lead wires fpsim.validate into fpsim.scaling.quantize (see the io helper's report:
axis_arg, block_arg, counter_arg, amax_arg, and an empty-tensor path); they are not xfail on purpose.
"""

import numpy as np
import pytest

import fpsim

X = np.ones((2, 32), np.float32)


def test_empty_tensor_quantizes_to_an_empty_tensor_or_names_x():
    try:
        q = fpsim.quantize(np.zeros((0, 16), np.float32), "nvfp4")
    except ValueError as e:
        assert "empty" in str(e) and "x" in str(e)
    else:
        assert q.shape == (0, 16) and q.dequantize().shape == (0, 16)


@pytest.mark.parametrize("axis", [0.7, "1", True])
def test_non_integer_axis_is_a_type_error(axis):
    with pytest.raises(TypeError, match="axis"):
        fpsim.quantize(X, "nvfp4", axis=axis)


@pytest.mark.parametrize("counter,exc", [(-1, ValueError), (2**64, ValueError), (1.5, TypeError)])
def test_counter_out_of_range(counter, exc):
    with pytest.raises(exc, match="counter"):
        fpsim.quantize(X, "nvfp4", rounding="sr", seed=0, counter=counter)


def test_negative_tensor_amax():
    with pytest.raises(ValueError, match="tensor_amax"):
        fpsim.quantize(X, "nvfp4", tensor_amax=-1)


def test_huge_block_is_refused_before_allocating():
    with pytest.raises(ValueError, match="block"):
        fpsim.quantize(X, "mxfp8_e4m3", block=(1, 2**30))


def test_load_quantized_of_an_edited_file_names_the_path(tmp_path):
    q = fpsim.quantize(X, "nvfp4")
    p = tmp_path / "q.npz"
    fpsim.save_quantized(q, p)
    p.write_bytes(p.read_bytes()[:-40])
    with pytest.raises(ValueError, match=str(p)):
        fpsim.load_quantized(p)
