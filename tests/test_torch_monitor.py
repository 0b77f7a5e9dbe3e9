"""fpsim.torch.monitor (fpsim.torch.monitoring): per layer/role statistics of the quantized copies, measured as their labels say."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpsim

torch = pytest.importorskip("torch")
fnn = pytest.importorskip("fpsim.torch.nn")
mon_mod = pytest.importorskip("fpsim.torch.monitoring")


def _q(x, scheme="nvfp4"):
    from fpsim.torch import backend as tb

    return tb.quantize(torch.from_numpy(x), scheme)


def test_stats_against_numpy_on_constructed_flush_and_saturation():
    x = np.zeros((1, 48), np.float32)
    x[0, :16] = np.linspace(-3000, 3000, 16)  # sets the tensor amax
    x[0, 16:32] = 1e-9  # far below the amax: its E4M3 block scale underflows to 0 -> flushed, not saturated
    x[0, 32:48] = np.linspace(0.5, 1.0, 16)
    x[0, 47] = 1.0 + 2 ** -10  # the block max rounds the scale down: its element clips to 6 (saturated)
    q = _q(x)
    row = mon_mod.copy_stats(torch.from_numpy(x), q)
    xh = fpsim.dequantize(q.to_quantized())
    err = (x - xh).astype(np.float64)
    assert math.isclose(row["sqnr_db"], 10 * math.log10((x.astype(np.float64) ** 2).sum() / (err ** 2).sum()),
                        rel_tol=1e-12)
    nz = x != 0
    assert row["flushed_frac"] == ((xh == 0) & nz).sum() / nz.sum() and row["flushed_frac"] >= 16 / 48
    sc = q.scales.numpy().reshape(-1)
    assert sc[1] == 0 and row["zero_scale_block_frac"] == pytest.approx(1 / 3)
    codes = fpsim.unpack_fp4(q.data.numpy())[0]
    sat = ((codes & 7) == 7) & (np.abs(x[0]) > np.abs(xh[0])) & (np.repeat(sc, 16) != 0)
    assert row["saturated_frac"] == sat.sum() / 48
    assert row["flushed_frac"] + row["saturated_frac"] <= 1


def test_exact_copies_say_exact_and_all_zero_says_no_signal():
    x = np.array([[0.4375, 0.875, 1.75, 2.625] * 4], np.float32)  # amax 2688/1024: S_enc = 2**10, e·s_b exact
    row = mon_mod.copy_stats(torch.from_numpy(x), _q(x))
    assert row["sqnr_db"] is None and row["sqnr_note"] == "exact" and row["rel_error"] == 0.0
    z = np.zeros((1, 16), np.float32)
    row = mon_mod.copy_stats(torch.from_numpy(z), _q(z))
    assert row["sqnr_db"] is None and row["sqnr_note"] == "no finite signal" and row["flushed_frac"] is None


def test_monitor_records_every_n_steps_and_the_first_nonfinite(tmp_path):
    import pandas as pd

    layer = fnn.Linear(32, 16, bias=False, recipe="nvfp4_paper", name="L", gemm="fp32")
    path = tmp_path / "m.jsonl"
    with mon_mod.monitor(layer, every=2, path=path) as mon:
        for s in range(3):
            x = torch.randn(16, 32, generator=torch.Generator().manual_seed(s))
            if s == 1:
                x[3, 4] = float("nan")
            layer.step = s
            layer(x.requires_grad_(True)).sum().backward()
    df = pd.read_json(path, lines=True)
    stats = df[df["event"].isna()]
    assert sorted(stats["step"].unique()) == [0, 2]
    assert set(stats["role"]) == {"fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x"}
    assert mon.first_nonfinite == (1, "L", "fprop_x")
    assert (df["event"] == "nonfinite").sum() == 1
    assert fnn.OBSERVERS == []
    mon_mod.plot(path, tmp_path / "sqnr.png")
    assert (tmp_path / "sqnr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
