"""Tensor statistics of `fpsim analyze`: a constant tensor has no kurtosis, and a small spread about a large mean
keeps its variance (the one-pass Σv²/n − mean² gave kurtosis 0.0 and max|x|/std 7.2e6 for a constant 1/3)."""

import math

import numpy as np
import pytest

from fpsim.analysis import _moments, analyze_tensor


@pytest.mark.parametrize("value", [1 / 3, 0.7, 123.456, 0.1, -7.1, 3e-30])
def test_a_constant_tensor_has_zero_variance_and_no_kurtosis(value):
    x = np.full((64, 1000), value, np.float32)
    m = _moments(x, 7)
    assert m["std"] == 0.0 and math.isnan(m["kurtosis"])
    row = analyze_tensor("w", x, schemes=("bf16",))[0]
    assert row["kurtosis"] is None or math.isnan(row["kurtosis"])
    assert row["amax_over_std"] is None or math.isnan(row["amax_over_std"])
    assert "constant tensor" in row["notes"]["kurtosis"]


def test_a_small_spread_about_a_large_mean_keeps_its_moments():
    rng = np.random.default_rng(0)
    x = (1000.0 + rng.standard_normal((64, 1000)) * 1e-3).astype(np.float32)  # spread ~16 float32 ulps of 1000
    ref = x.astype(np.float64).reshape(-1)
    d = ref - ref.mean()
    m = _moments(x, 5)
    assert math.isclose(m["std"], float(np.sqrt(np.mean(d * d))), rel_tol=1e-9)
    assert math.isclose(m["kurtosis"], float(np.mean(d**4) / np.mean(d * d) ** 2), rel_tol=1e-9)


def test_an_axis_out_of_range_names_the_tensor_and_a_non_float_tensor_is_skipped_first(tmp_path):
    from tests.cliutil import run

    p = tmp_path / "t.npz"
    np.savez(p, ints=np.arange(12).reshape(3, 4), one=np.ones(8, np.float32), two=np.ones((4, 16), np.float32))
    r = run(p, "--axis", "1", "--formats", "bf16")
    lines = r.output.splitlines()
    assert "note: skipped t.npz:ints: not a floating-point tensor (dtype int64)" in lines  # not an axis error
    assert "error: t.npz:one: axis 1 is out of range for a 1-d tensor [8]" in lines  # names file and tensor
    assert r.exit_code == 1  # one tensor in error, the rest reported
    r = run(p, "--axis", "0", "--formats", "bf16", "--select", "ints")
    assert r.exit_code == 3 and "note: skipped" in r.output and "axis" not in r.output  # nothing analysed


@pytest.mark.parametrize("kind", ["safetensors", "npz", "float16"])
def test_the_tensor_statistics_are_the_same_bits_along_every_axis(tmp_path, kind):
    """kurtosis, max|x|/std and the NaN/inf counts are properties of the tensor, not of the axis its blocks run
    along: a file's tensor analysed with its blocks along each axis, in several chunks, gives the same bits (the
    last digits of the kurtosis differed: float64 sums taken in the axis-moved rows' order)."""
    from safetensors.numpy import save_file

    from fpsim.io import open_tensors

    rng = np.random.default_rng(5)
    x = (rng.standard_t(4, (96, 80, 72)) * 3 + 0.5).astype(np.float16 if kind == "float16" else np.float32)
    x[3, 4, 5], x[50, 7, 1] = np.nan, -np.inf
    p = tmp_path / ("w.npz" if kind == "npz" else "w.safetensors")
    np.savez(p, w=x) if kind == "npz" else save_file({"w": x}, str(p))
    (ref,) = open_tensors([str(p)])
    got = {}
    for axis in (-1, 0, 1):
        r = analyze_tensor("w", ref.row_source(axis), schemes=("nvfp4",), chunk_bytes=1 << 16)[0]
        got[axis] = [np.float64(r["kurtosis"]).tobytes(), np.float64(r["amax_over_std"]).tobytes(), r["nan_count"],
                     r["inf_count"]]
        assert r["shape"] == list(np.moveaxis(x, axis, -1).shape) and r["nan_count"] == 1 and r["inf_count"] == 1
    assert got[0] == got[-1] and got[1] == got[-1]
