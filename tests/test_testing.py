"""fpsim.testing (issue 47 item 5): assertion helpers whose failure message is ``fpsim diff``'s diagnosis; the pytest
example of docs/testing.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.testing import assert_dequantized_equal, assert_quantized_equal

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
DATA = Path(__file__).resolve().parent / "data" / "producers"


pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def test_the_documented_pytest_example_runs_as_written():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    example = next(b for b in blocks if "def test_" in b)
    ns: dict = {}
    exec(compile(example, str(DOC), "exec"), ns)  # noqa: S102 - the documented example itself
    tests = [f for name, f in ns.items() if name.startswith("test_")]
    assert len(tests) == 3
    for t in tests:
        t()


def _golden(producer: str, case: str) -> dict:
    with np.load(DATA / f"{producer}.npz") as z:
        return {f: z[f"{case}.{f}"] for f in ("input", "codes", "scales", "global", "decoded")}


@pytest.mark.parametrize("producer", ["torchao", "compressed-tensors", "modelopt"])
def test_the_libraries_own_bytes_pass_under_their_convention(producer):
    for case in ("outliers.float32", "zero_blocks.bfloat16", "small_scales.float32"):
        g = _golden(producer, case)
        x = g["input"].astype(ml_dtypes.bfloat16) if case.endswith("bfloat16") else g["input"]
        assert_quantized_equal(g["codes"], g["scales"], x, convention=producer, global_scale=g["global"],
                               values=g["decoded"])
        assert_dequantized_equal(g["decoded"], x, convention=producer)


def test_a_failure_names_the_cause_of_each_byte():
    g = _golden("torchao", "small_scales.float32")
    with pytest.raises(AssertionError) as e:
        assert_quantized_equal(g["codes"], g["scales"], g["input"], global_scale=g["global"])
    msg = str(e.value)
    assert msg.startswith("nvfp4 under convention 'fpsim': codes: 6 of 64 differ; scales: 3 of 4 differ")
    assert "first differing blocks (codes in hex):" in msg and "block (0, 1): scale ours 0x" in msg
    assert "scales differing by cause: block scales clamped to ≥ 0.015625 (torchao) ×3" in msg
    # amax = 2688: the encode scale G and the decode scale amax/2688 are both 1, so which one is stored is not told
    assert "global scale: 1.0 (expected 2688.0" in msg and "global differing by cause: not explained ×1" in msg


def test_torch_tensors_packed_codes_and_float8_scales():
    torch = pytest.importorskip("torch", reason="torch is optional")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    q = fpsim.quantize(x, "nvfp4", convention="te-cuda-fastmath")
    scales = torch.from_numpy(np.asarray(q.scales).copy()).view(torch.float8_e4m3fn)
    assert_quantized_equal(torch.from_numpy(np.asarray(q.data)), scales, x, convention="te-cuda-fastmath")
    bad = np.asarray(q.data).copy()
    bad[0, 0] ^= 0x01
    with pytest.raises(AssertionError, match=r"codes: 1 of 256 differ"):
        assert_quantized_equal(bad, scales, x, convention="te-cuda-fastmath")


def test_other_block_formats_get_diffs_diagnosis():
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    q = fpsim.quantize(x, "mxfp8_e4m3")
    assert_quantized_equal(q.data, q.scales, x, "mxfp8_e4m3")
    s = np.asarray(q.scales).copy()
    s[1, 0] += 1
    with pytest.raises(AssertionError, match=r"(?s)scales: 1 of 4 differ.*diagnosis \(fpsim.oracle.diff\)"):
        assert_quantized_equal(q.data, s, x, "mxfp8_e4m3")


def test_shapes_that_do_not_fit_are_one_assertion():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_quantized_equal(np.zeros((2, 8), np.uint8), np.zeros((2, 2), np.uint8), x)
