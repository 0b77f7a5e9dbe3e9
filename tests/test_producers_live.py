"""The producer conventions against the installed libraries themselves (issue 47 item 1).

Runs torchao, compressed-tensors and nvidia-modelopt (``pip install 'fpsim[producers]'``) through the same entry
points as tests/data/producers/generate.py, on its edge tensors and on seeded random tensors spanning many
binades, and requires fpsim's conventions to give their bytes and decoded values bit for bit (NaN compared as NaN).
A library that is not installed skips its cases, saying which one; CI's ``dev`` install checks the committed golden
files instead (tests/test_producers.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim import conventions as C

_GEN = Path(__file__).resolve().parent / "data" / "producers" / "generate.py"
_spec = importlib.util.spec_from_file_location("fpsim_producers_generate", _GEN)
gen = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gen
_spec.loader.exec_module(gen)

MODULES = {"torchao": "torchao", "compressed-tensors": "compressed_tensors", "modelopt": "modelopt"}

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def _need(producer: str) -> None:
    pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[producers]')")
    try:
        ok = importlib.util.find_spec(MODULES[producer]) is not None
    except (ImportError, ValueError):
        ok = False
    if not ok:
        pytest.skip(f"{producer} not installed (pip install 'fpsim[producers]')")
    try:
        gen.produce(producer, np.zeros((1, 16), np.float32), "float32")
    except ImportError as e:  # installed without a dependency its NVFP4 path imports
        pytest.skip(f"{producer} cannot run here: {e}")


def _random_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4747)
    out = {}
    for i in range(6):
        x = (rng.standard_t(3, (6, 64)) * np.exp2(rng.integers(-30, 30, (6, 1)))).astype(np.float32)
        x[i % 6, (7 * i) % 64] *= 1e3  # an outlier
        x[(i + 1) % 6, 16:32] = 0.0  # a zero block
        out[f"random_{i}"] = x
    return out


def _same(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    na, nb = np.isnan(a), np.isnan(b)
    return a.shape == b.shape and bool((na == nb).all()) and a[~na].tobytes() == b[~nb].tobytes()


@pytest.mark.parametrize("producer", list(MODULES))
def test_conventions_equal_the_installed_libraries(producer):
    _need(producer)
    tensors = {**gen.edge_tensors(), **_random_tensors()}
    checked = 0
    for name, x in tensors.items():
        for dtype in ("float32", "bfloat16"):
            codes, scales, g, dec = gen.produce(producer, x, dtype)
            xin = x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
            q = fpsim.quantize(xin, "nvfp4", convention=producer)
            where = f"{producer} {name} {dtype}"
            assert fpsim.unpack_fp4(q.data).tobytes() == codes.tobytes(), where
            assert q.scales.tobytes() == scales.reshape(q.scales.shape).tobytes(), where
            assert C.stored_global(q).tobytes() == np.asarray(g, np.float32).reshape(()).tobytes(), where
            assert _same(q.dequantize(), dec), where
            checked += 1
    assert checked == 2 * len(tensors)


def test_the_golden_files_are_what_the_installed_libraries_write(tmp_path):
    for producer in MODULES:
        _need(producer)
    if gen.versions() != {"torch": "2.13.0+cpu", "torchao": "0.18.0", "compressed-tensors": "0.20.1",
                          "nvidia-modelopt": "0.47.0"}:
        pytest.skip(f"the golden files were written with other versions than these: {gen.versions()}")
    gen.main(tmp_path)
    for producer in MODULES:
        with np.load(tmp_path / f"{producer}.npz") as new, np.load(gen.HERE / f"{producer}.npz") as old:
            assert sorted(new.files) == sorted(old.files)
            for k in new.files:
                assert new[k].tobytes() == old[k].tobytes(), (producer, k)


def test_a_fused_groups_shared_global_scale_is_tensor_amax_of_the_group():
    """q/k/v (or gate/up) share one compressed-tensors global scale: llmcompressor 0.14's Observer.get_global_scale
    passes the group's absmax to generate_gparam.  fpsim: tensor_amax= the largest of the layers' amaxes."""
    _need("compressed-tensors")
    rng = np.random.default_rng(11)
    layers = [(rng.standard_normal((4, 32)) * s).astype(np.float32) for s in (0.02, 0.7, 0.013)]
    for dtype in ("float32", "bfloat16"):
        xs = [x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x for x in layers]
        m = max(float(np.max(np.abs(np.asarray(x, np.float32)))) for x in xs)
        for x in xs:
            codes, scales, g, dec = gen.produce("compressed-tensors", np.asarray(x, np.float32), dtype, absmax=m)
            q = fpsim.quantize(x, "nvfp4", convention="compressed-tensors", tensor_amax=m)
            assert fpsim.unpack_fp4(q.data).tobytes() == codes.tobytes() and q.scales.tobytes() == scales.tobytes()
            assert C.stored_global(q).tobytes() == np.asarray(g, np.float32).reshape(()).tobytes()
            assert _same(q.dequantize(), dec)
