"""Bit-reproducibility of the campaign's training on the CPU path (issue 50): the same short run in two fresh
processes writes the same curve and final weights byte for byte; the recipe and the late-switch arm are the same
bits until the switch; every op of the training step has a deterministic implementation where torch knows one; and
the runner fixes cuBLAS's workspace before CUDA starts.  The GPU counterparts are in tests/test_campaign.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from studies.campaign import repro  # noqa: E402
from studies.campaign import run as crun  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_two_processes_train_byte_identical_curves_and_weights_on_the_cpu(tmp_path):
    """Three steps of the recipe (SR, RHT, 2-D weights, a BF16 block) at the tiny size, each process logging and
    validating every step: the CSVs, the final weights (every tensor) and the records' weight hashes agree.  The
    curve holds no timing (its tokens/s went to the record), or the CSVs could not agree."""
    dirs = repro.in_processes(tmp_path, 2, arm="nvfp4", steps=3)
    res = repro.compare(dirs)
    assert res["identical"], res
    assert res["csv_identical"] and res["weights_identical"] and res["weights_sha256_identical"]
    csv = next(dirs[0].glob("*.csv")).read_text().splitlines()
    assert csv[0] == "step,tokens,lr,train_loss,val_loss" and len(csv) == 4
    rec = json.loads(next(dirs[0].glob("*.json")).read_text())
    assert [r[0] for r in rec["throughput"]] == [1, 2, 3] and all(r[1] > 0 for r in rec["throughput"])
    assert rec["cublas_workspace_config"] is None and rec["deterministic"] is False  # CPU: nothing switched on


def test_compare_names_the_first_differing_row_and_tensor(tmp_path):
    """The comparison is not vacuous: another seed's run differs, and the report says where."""
    repro.train_short(tmp_path / "a", "bf16", steps=2)
    repro.train_short(tmp_path / "b", "bf16", steps=2, seed=2)
    res = repro.compare([tmp_path / "a", tmp_path / "b"])
    assert not res["identical"] and res["first_differing_csv_row"] == 1  # row 0 is the header
    assert "embed.weight" in res["differing_tensors"] and not res["weights_sha256_identical"]


def test_the_recipe_and_the_late_switch_arm_are_the_same_bits_until_the_switch(tmp_path):
    """Six steps: the late-switch arm runs BF16 from step ceil(0.82 · 6) = 5 (0-based), so the rows of steps 1–5
    and the weights and AdamW state after step 5 equal the recipe's bit for bit, and the row of step 6 differs (the
    switch happened).  This is the A/A comparison study 8 reads on the GPU runs."""
    from studies.campaign.run import Run, weights_sha256

    kw = dict(batch=4, val_tokens=8 * 64, corpus=repro.synthetic_corpus(), device="cpu", log_every=1)
    runs = {arm: Run(arm, 1, "tiny", 4 * 64 * 6, 3e-3, tmp_path / arm, **kw) for arm in ("nvfp4", "nvfp4_late_bf16")}
    states = {}
    for arm, r in runs.items():
        for _ in range(5):
            assert r.advance()
        states[arm] = (weights_sha256(r.model), [
            (k, v.clone()) for g in r.opt.param_groups for p in g["params"] for k, v in r.opt.state[p].items()])
        while r.advance():
            pass
    (ha, oa), (hb, ob) = states.values()
    assert ha == hb and len(oa) == len(ob)
    assert all(ka == kb and torch.equal(va, vb) for (ka, va), (kb, vb) in zip(oa, ob))
    rows = {arm: r.rows for arm, r in runs.items()}
    assert len(rows["nvfp4"]) == 6 and rows["nvfp4"][:5] == rows["nvfp4_late_bf16"][:5]
    assert rows["nvfp4"][5] != rows["nvfp4_late_bf16"][5]
    assert not runs["nvfp4"].switched and runs["nvfp4_late_bf16"].switched


@pytest.mark.parametrize("arm", ["bf16", "nvfp4", "mxfp4", "fp8_blockwise", "nvfp4_46", "nvfp4_late_bf16"])
def test_every_op_of_the_training_step_runs_under_torch_deterministic_algorithms_on_the_cpu(tmp_path, monkeypatch,
                                                                                          arm):
    """With ``torch.use_deterministic_algorithms(True)`` an op that torch knows to be nondeterministic raises
    instead of running: two steps of each arm (the late switch moved to the second step, ceil(0.3 · 3) = 1), their
    validations and a checkpoint run without one, and the record says the switch was on.  The switch is restored
    after (it is process-wide)."""
    import dataclasses

    from studies.campaign.arms import ARMS

    monkeypatch.setitem(ARMS, "nvfp4_late_bf16", dataclasses.replace(ARMS["nvfp4_late_bf16"], switch_at=0.3))
    prev, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        rec = repro.train_short(tmp_path, arm, steps=3, stop_at=2)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=warn)
    assert rec["deterministic"] is True and rec["status"] == "partial" and rec["tokens_done"] == 2 * 4 * 64
    assert (tmp_path / "ckpt" / rec["run"] / "state.safetensors").exists()


def test_importing_the_runner_fixes_the_cublas_workspace_before_cuda_starts():
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it first starts, so the runner sets it on import, before any CUDA
    work (PyTorch's deterministic mode requires :4096:8 or :16:8 on CUDA); a value the user set is kept."""
    code = ("import os, torch; import studies.campaign.run as r; "
            "print(os.environ['CUBLAS_WORKSPACE_CONFIG'], torch.cuda.is_initialized(), r.CUBLAS_WORKSPACE_CONFIG)")
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [":4096:8", "False", ":4096:8"]
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == ":16:8"
    assert crun.CSV_COLUMNS == ("step", "tokens", "lr", "train_loss", "val_loss")
