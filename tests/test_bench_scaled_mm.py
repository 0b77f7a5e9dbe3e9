"""studies.bench.scaled_mm's smoke mode: every GEMM of a block at small sizes, the table's rows and per-step total,
and scaled_mm under explicit tilings equal to the exact products × alpha up to FP32 summation order (under the
interpreter without a GPU, compiled on the device machine)."""

from __future__ import annotations

import re

import numpy as np

from fpsim.torch import fastpath as fp
from tests.tritonenv import DEV, INTERPRETER_WARNINGS, torch  # sets TRITON_INTERPRET first

pytestmark = INTERPRETER_WARNINGS


def test_the_sweep_times_every_gemm_of_a_block_and_totals_them(tmp_path, monkeypatch):
    from studies.bench import scaled_mm as b

    monkeypatch.setattr(fp, "IMPL", "triton")
    shapes = b.step_shapes(16, 32, 32)
    assert [s[0] for s in shapes] == [f"{n} {r}" for n in ("qkv", "proj", "fc1", "fc2")
                                      for r in ("fprop", "dgrad", "wgrad")]
    assert shapes[0][1:] == (32, 48, 16, "bf16") and shapes[-1][1:] == (16, 32, 32, "fp32")  # qkv Y; fc2 dW
    b.main(["--tiny", "--out", str(tmp_path / "t.md"), "--best", str(tmp_path / "best")])
    assert (tmp_path / "best").read_text() == "16,16,16,1,1,1\n"
    text = (tmp_path / "t.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ("×" in ln or "per step" in ln)
            and "GEMM" not in ln]
    assert len(rows) == 13  # 12 GEMMs and the per-step total
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    for c in cells[:-1]:
        assert all(float(v) > 0 for v in c[3:]), c
    total = sum(float(c[5]) for c in cells[:-1])
    assert abs(float(cells[-1][5]) - total) <= 1e-3 * 12 + 1e-9 * total  # the tiling's column sums to its total
    assert re.search(r"Fastest tiling over the step: \(16, 16, 16, 1, 1, 1\)", text)


def test_an_explicit_tiling_gives_the_products_of_the_default_path():
    from fpsim.plan import lower

    rng = np.random.default_rng(3)
    x, w = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)).to(DEV) for s in ((40, 48), (24, 48)))
    old = fp.IMPL
    fp.IMPL = "triton"
    try:
        a, bb = fp.make_copy(x, lower("nvfp4")), fp.make_copy(w, lower("nvfp4"))
        A, B = a.values.double(), bb.values.double()
        want = fp.alpha_epilogue((A @ B.T).float(), a, bb, torch.float32)
        # the exact products summed in FP32 in some order: within K ulps of Σ|a·b| (× alpha) of the exact sum
        bound = 48 * 2.0**-23 * fp.alpha_epilogue((A.abs() @ B.abs().T).float(), a, bb, torch.float32)
        for t in (fp.MMTiles(16, 16, 16, 1, 1, 1), fp.MMTiles(32, 16, 32, 2, 1, 1)):
            got = fp.scaled_mm(a, bb, torch.float32, t)
            assert bool(((got - want).abs() <= bound).all()) and not torch.equal(bound, torch.zeros_like(bound))
    finally:
        fp.IMPL = old
