"""Measurement hygiene of the campaign (issue 50 item 4, issue 46 item 6): validation windows from every held-out
package, the data passes per plan, the train-vs-validation check of the plans that repeat data, and the A/A
comparison inside the late-switch component, on corpora and run records made here (the committed runs are audited
in tests/test_campaign_audit.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from studies.campaign.data import python_sources

MAIN, SIZE = 265_000_000, 482_000_000
STREAM = 340_469_682  # the committed runs' training stream, in bytes


def _tree(root: Path) -> None:
    """Three packages: alpha (trained on), beta (3 files, ~6 kB) and gamma (1 file, ~2 kB) to hold out."""
    files = {"alpha/a.py": "a = 1\n" * 200, "beta/x.py": "x = 2\n" * 300, "beta/y.py": "y = 3\n" * 400,
             "beta/z.py": "z = 4\n" * 300, "gamma/g.py": "g = 5\n" * 350}
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_validation_windows_draw_an_equal_share_from_every_held_out_package(tmp_path):
    """12 windows of 9 bytes from beta and gamma: 6 each, evenly spaced over each package's bytes (start j·⌊L/6⌋
    within the package), not overlapping, the same every time; the first 12 windows of the stream, the old choice,
    would have come from beta alone.  A package too small for its share is one clear error, and the runner's default
    is 4 Mi predicted bytes."""
    from studies.campaign import run as crun

    _tree(tmp_path)
    c = python_sources([tmp_path], holdout=("beta", "gamma"))
    spans = {name: (a, b) for name, a, b in c.val_spans}
    assert list(spans) == ["beta", "gamma"] and spans["beta"][1] == spans["gamma"][0] == 6003
    assert c.manifest()["val"]["packages"] == {"beta": 6003, "gamma": 2101}
    win, rec = crun.validation_windows(c, 8, 12 * 8)
    again, rec2 = crun.validation_windows(c, 8, 12 * 8)
    assert np.array_equal(win, again) and rec == rec2 and win.shape == (12, 9) and win.dtype == np.int64
    assert rec["packages"] == {"beta": 6, "gamma": 6} and rec["tokens"] == 96 and rec["windows"] == 12
    for name, first in (("beta", 0), ("gamma", 6)):
        a, b = spans[name]
        starts = a + ((b - a) // 6) * np.arange(6)
        want = c.val[starts[:, None] + np.arange(9)[None, :]]
        assert np.array_equal(win[first:first + 6], want)
    old = c.val[: 12 * 8 + 1][np.arange(12)[:, None] * 8 + np.arange(9)[None, :]]
    assert old.max() < 256 and np.arange(12).max() * 8 + 9 <= spans["beta"][1]  # the old windows: beta's bytes only
    with pytest.raises(ValueError, match="held-out package gamma holds 2,101 bytes, fewer than its 400"):
        crun.validation_windows(c, 6, 800 * 6)
    assert crun.VAL_TOKENS == 4 * 2 ** 20 >= 4_000_000
    assert crun.Run.__init__.__kwdefaults__["val_tokens"] == crun.VAL_TOKENS


def test_a_checkpoint_validated_on_other_windows_is_not_resumed(tmp_path):
    """A run checkpointed with one set of validation windows (its record's SHA-256) does not resume under another,
    nor a checkpoint whose record has none (a run from before the windows came from every package)."""
    from studies.campaign import repro
    from studies.campaign import run as crun

    kw = dict(batch=4, corpus=repro.synthetic_corpus(), device="cpu", log_every=1, stop_at=1)
    part = crun.train("bf16", 1, "tiny", 4 * 64 * 4, 3e-3, tmp_path, val_tokens=8 * 64, **kw)
    assert part["status"] == "partial" and part["validation"]["windows"] == 8
    with pytest.raises(ValueError, match="validated on other windows"):
        crun.train("bf16", 1, "tiny", 4 * 64 * 4, 3e-3, tmp_path, val_tokens=16 * 64, **kw)
    js = tmp_path / f"{part['run']}.json"
    js.write_text(json.dumps({k: v for k, v in json.loads(js.read_text()).items() if k != "validation"}))
    with pytest.raises(ValueError, match=r"other windows \(SHA-256 None\)"):
        crun.train("bf16", 1, "tiny", 4 * 64 * 4, 3e-3, tmp_path, val_tokens=8 * 64, **kw)


# ------------------------------------------------------------------------------------------------ report fixtures
def _evals(steps: int) -> list[int]:
    """The row steps (steps done) of a run's 20 evaluations, as the runner places them."""
    return sorted({round(steps * (k + 1) / 20) for k in range(20)})


def _run(d: Path, arm: str, seed: int, *, budget: int = MAIN, size: str = "s10m", val=lambda k, s: 0.7,
         train=lambda step: 0.6, status: str = "done", **extra) -> None:
    """A run's CSV (the current layout: no timing) and record: logs every 50 steps and at the 20 evaluations;
    ``val(k, step)``: the validation loss at evaluation k (1-based); ``train(step)``: the logged train loss."""
    steps = budget // (64 * 512)
    ev = _evals(steps)
    rows = ["step,tokens,lr,train_loss,val_loss"]
    for step in sorted(set(range(50, steps + 1, 50)) | set(ev)):
        v = f"{val(ev.index(step) + 1, step):.6f}" if step in ev else ""
        rows.append(f"{step},{step * 64 * 512},0.001,{train(step):.6f},{v}")
    rid = f"{size}-{arm}-s{seed}-t{budget // 1_000_000}m"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{rid}.csv").write_text("\n".join(rows) + "\n")
    rec = {"run": rid, "arm": arm, "seed": seed, "size": size, "tokens_budget": budget,
           "tokens_done": steps * 64 * 512, "steps": steps, "status": status, "seconds_total": 100.0,
           "corpus": {"holdout": ["sympy", "pandas"], "train": {"bytes": STREAM}}, **extra}
    (d / f"{rid}.json").write_text(json.dumps(rec))


def _render(root: Path) -> str:
    from studies.campaign.report import render
    from studies.common import md_table

    (root / "figs").mkdir(exist_ok=True)
    return "\n\n".join(render(root, root / "figs", md_table)[0])


def _table(text: str, caption: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(caption))
    i = next(j for j in range(at + 1, len(lines)) if lines[j].startswith("|"))
    body = []
    for ln in lines[i:]:
        if not ln.startswith("|"):
            break
        body.append([c.strip() for c in ln.strip().split("|")[1:-1]])
    return [dict(zip(body[0], r)) for r in body[2:]]


def test_the_report_says_which_runs_used_which_validation_and_the_data_passes_per_plan(tmp_path):
    """Records without a ``validation`` entry used the first 1 MiB of the held-out stream (pandas's, in path order);
    records with one are counted by their windows.  Passes: budget / training-stream bytes per plan (265 M: 0.78,
    482 M: 1.42)."""
    for s in range(2):
        _run(tmp_path / "main", "bf16", s)
    text = _render(tmp_path)
    assert ("all 2 of the plans' runs (every committed one) validate on the first 1,048,577 bytes of the held-out "
            "stream") in text and "which in path order are all pandas's: sympy, also held out, is not" in text
    assert "Runs made from now on validate on 4,194,304 predicted bytes (8,192 windows of 513)" in text
    v = {"tokens": 4194304, "windows": 8192, "window_bytes": 513, "packages": {"pandas": 4096, "sympy": 4096}}
    _run(tmp_path / "size", "bf16", 0, budget=SIZE, size="s20m", validation=v)
    text = _render(tmp_path)
    assert ("2 of the plans' runs validate on the first 1,048,577 bytes" in text and "1 validate on 4,194,304 tokens "
            "in 8,192 windows of 513 bytes, 4,096 from pandas, 4,096 from sympy, evenly spaced over each") in text
    assert (f"Data passes per plan, the token budget over the training stream's {STREAM:,} bytes: main (s10m, 265 M "
            f"tokens) {MAIN / STREAM:.2f}; size (s20m, 482 M tokens) {SIZE / STREAM:.2f}.") in text
    assert f"{MAIN / STREAM:.2f}" == "0.78" and f"{SIZE / STREAM:.2f}" == "1.42"


def test_the_train_vs_validation_check_pairs_the_repeated_plan_with_the_main_plan_per_seed(tmp_path):
    """Training loss 0.6 everywhere; validation 0.7 in the main plan, and in the size plan 0.7 until its first pass
    ends (evaluation 14 of 20 at 482 M tokens over a 340 M-byte stream) and then 0.02 + 0.005·seed higher per
    evaluation: val − train widens by 6 × (0.02 + 0.005·s) = 0.12, 0.15, 0.18 (mean 0.15) over the main plan's 0, a
    paired t-interval of 0.15 ± t(0.975, 2) × 0.03 / √3."""
    for s in range(3):
        _run(tmp_path / "main", "bf16", s)
        _run(tmp_path / "size", "bf16", s, budget=SIZE, size="s20m",
             val=lambda k, step, s=s: 0.7 + (0.02 + 0.005 * s) * max(0, k - 14))
    from studies.campaign.report import load_runs, repeat_check

    logs, recs = load_runs(tmp_path)
    (row,) = repeat_check(logs, recs, ("s10m", MAIN))
    assert (row["k"], row["evaluations"]) == (14, 20) and row["tokens"] <= STREAM < _evals(SIZE // 32768)[14] * 32768
    assert math.isclose(row["there"], 0.1, abs_tol=1e-6) and math.isclose(row["end"], 0.25, abs_tol=1e-6)
    half = stats.t.ppf(0.975, 2) * 0.03 / math.sqrt(3)
    ex = row["excess"]
    assert math.isclose(ex.mean, 0.15, abs_tol=1e-6) and math.isclose(ex.hi - ex.mean, half, rel_tol=1e-4)
    table = {r["plan"]: r for r in _table(_render(tmp_path), "Train-vs-validation check")}
    assert set(table) == {"size"}  # the main plan never repeats a byte
    r = table["size"]
    assert r["passes"] == "1.42" and r["first pass ends"] == "evaluation 14 of 20 (337 M)"
    assert r["minus main's widening"] == "+0.1500" and r["95 % CI"] == f"[{0.15 - half:+.4f}, {0.15 + half:+.4f}]"
    assert "size BF16: excess interval above zero, the repeated bytes show in the validation loss" in _render(tmp_path)


def test_the_late_switch_component_states_its_runs_modes_and_the_a_a_comparison_before_the_switch(tmp_path):
    """Recipe and late switch identical but for late − recipe = 0.001·(seed + 1) at every evaluation before the
    switch (step ceil(0.82 · 8087) = 6632; the last evaluation before it is at step 6470, 212 M tokens) and the
    recipe's seed 0 run eager without cuDNN's flag: the section reports the A/A gap there (mean 0.002, the t-interval
    of 0.001, 0.002, 0.003), none of the 39 differences from 15 % of the steps on exactly 0, their standard
    deviation, and the mode of each run.  With pre-switch curves equal bit for bit the gap is exactly 0."""
    from studies.campaign.report import aa_comparison, load_runs

    graph = {"cuda_graph": True, "cudnn_deterministic": True}
    for s in range(3):
        _run(tmp_path / "main", "bf16", s, **graph)
        _run(tmp_path / "main", "nvfp4", s, val=lambda k, step, s=s: 0.7 + 0.001 * s,
             **({"cuda_graph": False} if s == 0 else graph))
        _run(tmp_path / "main", "nvfp4_late_bf16", s, **graph,
             val=lambda k, step, s=s: 0.7 + 0.001 * s + (0.001 * (s + 1) if step <= 6632 else -0.004))
    logs, recs = load_runs(tmp_path)
    aa = aa_comparison(logs.dropna(subset=["val_loss"]), recs, "s10m", MAIN)
    assert (aa["steps"], aa["switch"], aa["step"], aa["tokens"]) == (8087, 6632, 6470, 6470 * 32768)
    d = np.array([0.001, 0.002, 0.003])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert math.isclose(aa["gap"].mean, 0.002, abs_tol=1e-9) and math.isclose(aa["gap"].hi, 0.002 + half, rel_tol=1e-3)
    pre = [step for step in _evals(8087) if 0.15 * 8087 <= step <= 6632]
    assert (aa["evaluations"], aa["n"], aa["zeros"]) == (len(pre), 3 * len(pre), 0) and len(pre) == 13
    assert math.isclose(aa["sd"], np.repeat(d, 13).std(ddof=1), rel_tol=1e-3)
    assert aa["modes"][0] == ("eager, no cuDNN deterministic flag", "CUDA graphs, cuDNN deterministic")
    text = _render(tmp_path)
    assert ("NVFP4 recipe seed 0 ran with eager, no cuDNN deterministic flag, every other run here with CUDA "
            "graphs") in text
    assert (f"late switch − recipe = +0.0020 [{0.002 - half:+.4f}, {0.002 + half:+.4f}] nats/byte" in text
            and "0 of the 39 per-seed differences are 0 at the curves' six decimals" in text)
    from studies.campaign.report import headline

    _, verdict = headline(tmp_path)
    assert "the two ran in different modes on seed 0 (eager, no cuDNN deterministic flag against CUDA graphs" in verdict
    assert "an A/A comparison), yet at 212 M tokens late switch − recipe = +0.0020" in verdict
    for s in range(3):  # the same bits before the switch: the A/A gap is 0 on every seed and every evaluation
        _run(tmp_path / "main", "nvfp4_late_bf16", s, **graph,
             val=lambda k, step, s=s: 0.7 + 0.001 * s + (0.0 if step <= 6632 else -0.004))
    logs, recs = load_runs(tmp_path)
    aa = aa_comparison(logs.dropna(subset=["val_loss"]), recs, "s10m", MAIN)
    assert aa["gap"].mean == aa["gap"].lo == aa["gap"].hi == 0.0 and aa["zeros"] == aa["n"] == 39


def test_four_over_six_is_not_listed_with_a_claim_of_nvidias_paper():
    """NVIDIA's NVFP4 paper does not use or claim four-over-six; the claim that it helps is Four Over Six's (Cook
    et al. 2025).  The component table's "claimed by" column and the headline say so; every other component's claim
    is the NVFP4 paper's."""
    from studies.campaign.arms import CLAIMED_BY, COMPONENTS, NVFP4_PAPER

    assert set(CLAIMED_BY) == {c[0] for c in COMPONENTS}
    assert "Cook et al. 2025" in CLAIMED_BY["four-over-six block scales"]
    assert "not NVIDIA's" in CLAIMED_BY["four-over-six block scales"]
    assert {k for k, v in CLAIMED_BY.items() if v == NVFP4_PAPER} == {c[0] for c in COMPONENTS} - {
        "four-over-six block scales"}
