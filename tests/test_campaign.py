"""The campaign's data stream and paired statistics (issue 20), on data made here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from studies.campaign.data import python_sources
from studies.campaign.stats import paired_gap, verdict


def _tree(root):
    for rel, text in {"alpha/__init__.py": "a = 1\n", "alpha/z.py": "z = 2\n", "beta/m.py": "m = 3\n",
                      "gamma/sub/k.py": "k = 4\n", "gamma/readme.txt": "not python\n"}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_corpus_is_sorted_whole_packages_held_out_and_recorded(tmp_path):
    _tree(tmp_path)
    c = python_sources([tmp_path], holdout=("beta",))
    assert c.train.tobytes() == b"a = 1\n\nz = 2\n\nk = 4\n\n"  # alpha/__init__, alpha/z, gamma/sub/k: path order
    assert c.val.tobytes() == b"m = 3\n\n"
    m = c.manifest()
    assert (m["train"]["files"], m["val"]["files"], m["train"]["bytes"]) == (3, 1, c.train.size)
    again = python_sources([tmp_path], holdout=("beta",)).manifest()
    assert again == m  # same tree, same stream, same SHA-256
    (tmp_path / "alpha" / "z.py").write_text("z = 5\n")
    assert python_sources([tmp_path], holdout=("beta",)).manifest()["train"]["sha256"] != m["train"]["sha256"]


def test_paired_gap_is_the_t_interval_of_the_differences():
    base = {0: 3.0, 1: 3.1, 2: 2.9, 3: 3.05}
    arm = {0: 3.02, 1: 3.13, 2: 2.91, 3: 3.08, 9: 1.0}  # seed 9 has no baseline: not paired, not used
    g = paired_gap(arm, base)
    d = np.array([0.02, 0.03, 0.01, 0.03])
    lo, hi = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    assert g.seeds == (0, 1, 2, 3)
    assert math.isclose(g.mean, d.mean(), rel_tol=1e-12) and math.isclose(g.lo, lo, rel_tol=1e-9)
    assert math.isclose(g.hi, hi, rel_tol=1e-9)
    assert verdict(g, "helps") == "resolved" and verdict(g, "harmless") == "contradicted"


def test_seeds_for_power_is_the_80_percent_power_sample_size_of_a_paired_t_test():
    """The "N seeds" planning figure is the fewest seeds at which a two-sided paired t-test at α has 80 % power for
    a true gap equal to the observed mean at the observed spread: G*Power's one-sample figures (d = 0.5: 34, d = 0.8:
    15, d = 1: 10 at α = 0.05), a Monte Carlo of t-tests at that n and n − 1, and 28 seeds for study 8's SR gap
    (the old count, the fewest seeds whose interval would exclude zero at the same mean and spread, said 16)."""
    from studies.campaign.stats import power, seeds_for_power

    def gap_of(d):
        return paired_gap({i: 1.0 + x for i, x in enumerate(d)}, {i: 1.0 for i in range(len(d))})

    for d, n in ((0.5, 34), (0.8, 15), (1.0, 10)):
        g = gap_of([d - 1.0, d, d + 1.0])  # mean d, sd exactly 1
        assert math.isclose(g.sd, 1.0) and seeds_for_power(g) == n
    rng = np.random.default_rng(7)

    def simulated(n, effect=0.8, reps=20_000):
        x = rng.normal(effect, 1.0, (reps, n))
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        return float(np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1)))

    assert power(0.8, 1.0, 15) >= 0.8 > power(0.8, 1.0, 14)  # 15 seeds reach 80 %, 14 do not
    for n in (14, 15):
        assert abs(simulated(n) - power(0.8, 1.0, n)) < 0.01  # the noncentral-t formula is the tests' rate
    sr = gap_of([0.0042, -0.0002, 0.0001])  # the shape of study 8's SR gap
    assert seeds_for_power(sr) == 28 and seeds_for_power(sr, 0.05 / 6) == 43
    assert power(sr.mean, sr.sd, 28) >= 0.8 > power(sr.mean, sr.sd, 27)
    word = verdict(sr, "helps")
    assert "80 % power" in word and "needs 28 seeds in a paired t-test at α = 0.05" in word
    assert "would exclude 0)" not in word  # not the interval-at-the-observed-mean count any more
    assert seeds_for_power(gap_of([0.0, 2.125]), most=10) == "> 10"
    assert seeds_for_power(paired_gap({0: 1.5, 1: 0.5}, {0: 1.0, 1: 1.0})) is None  # exactly 0 in binary
    with pytest.raises(ValueError, match="two seeds"):
        seeds_for_power(paired_gap({0: 1.0}, {0: 0.9}))


def test_detectable_gap_p_value_and_holm_correction():
    """detectable(): the true gap a paired t-test at α finds with 80 % power at the observed n and spread (power
    there is 0.8, and a Monte Carlo agrees); p_value(): scipy's one-sample t-test of the differences; holm(): the
    step-down adjustment of a textbook example, with NaN for tests without a p-value."""
    from studies.campaign.stats import detectable, holm, p_value, power

    d = np.array([0.0042, -0.0002, 0.0001, 0.003, 0.0011])
    g = paired_gap({i: 1.0 + x for i, x in enumerate(d)}, {i: 1.0 for i in range(d.size)})
    mde = detectable(g)
    assert math.isclose(power(mde, g.sd, g.n), 0.8, abs_tol=1e-9)
    assert detectable(g, 0.05 / 6) > mde > float(stats.t.ppf(0.975, 4)) * g.sd / math.sqrt(5)  # > the CI's half
    x = np.random.default_rng(3).normal(mde, d.std(ddof=1), (40_000, 5))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(5))
    assert abs(float(np.mean(np.abs(t) > stats.t.ppf(0.975, 4))) - 0.8) < 0.01
    assert math.isclose(p_value(g), stats.ttest_1samp(d, 0.0).pvalue, rel_tol=1e-9)
    assert math.isnan(p_value(paired_gap({0: 1.0}, {0: 0.9}))) and math.isnan(detectable(paired_gap({0: 1.0},
                                                                                                      {0: 0.9})))
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, math.nan, 0.01]) == pytest.approx([0.2, math.nan, 0.02], nan_ok=True)
    late = paired_gap({0: 1.0048, 1: 1.0032, 2: 1.0057}, {0: 1.0, 1: 1.0, 2: 1.0})  # study 8's late switch
    assert p_value(late) < 0.05 and verdict(late, "helps") == "resolved"  # on its own
    word = verdict(late, "helps", p_adjusted=6 * p_value(late), family=6)  # Holm's first step over 6
    assert word.startswith("not resolved at this scale (p 0.025 alone, 0.15 after the Holm correction over 6")


def test_identical_differences_give_an_exactly_zero_width_interval_and_verdicts():
    g = paired_gap({0: 1.1, 1: 2.1, 2: 3.1}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert g.lo == g.mean == g.hi or (g.hi - g.lo) < 1e-15
    noisy = paired_gap({0: 1.0, 1: 1.2, 2: 0.9}, {0: 1.05, 1: 1.1, 2: 0.95})
    assert verdict(noisy, "helps").startswith("not resolved at this scale (")
    assert verdict(noisy, "harmless") == "consistent"
    worse = paired_gap({0: 0.9, 1: 0.91, 2: 0.92}, {0: 1.0, 1: 1.0, 2: 1.01})
    assert verdict(worse, "helps") == "contradicted"
    one = paired_gap({0: 1.0}, {0: 0.9})
    assert math.isnan(one.lo) and verdict(one, "helps").startswith("not resolved")
    with pytest.raises(ValueError, match="diverged"):
        paired_gap({0: float("nan")}, {0: 1.0})
    with pytest.raises(ValueError, match="no seed in common"):
        paired_gap({0: 1.0}, {1: 1.0})


# ---------------------------------------------------------------------------
# The runner: data order, schedule, determinism, resume (tiny model on CPU)

torch = pytest.importorskip("torch")

from studies.campaign import run as crun  # noqa: E402
from studies.campaign.arms import ARMS, COMPONENTS, bf16_tail  # noqa: E402
from studies.campaign.data import Corpus  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_deterministic_mode():
    """A run on CUDA switches torch's deterministic algorithms (and cuDNN's flag) on for its whole process; each
    test here gives the next test, of any file in this process, the modes it found."""
    prev, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic
    yield
    torch.use_deterministic_algorithms(prev, warn_only=warn)
    torch.backends.cudnn.deterministic = cudnn


def _corpus(n_train=40_000, n_val=9_000):
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"def f(x):\n    return x * 2 + 1\n" * 2000, np.uint8)
    train = text[:n_train].copy()
    train[rng.integers(0, train.size, 500)] = rng.integers(32, 127, 500)
    return Corpus(train, text[:n_val].copy(), 1, 1, ("held",), ("synthetic",))


def test_batches_are_seeded_permutations_of_whole_windows_and_resume_where_they_stopped():
    stream = np.arange(1000)  # positions as values (the corpus is uint8; any integer stream works)
    gen = crun.batches(stream, 9, 4, seed=3)
    first = [next(gen)[1] for _ in range(30)]
    per_epoch = ((1000 - 1) // 9) // 4
    starts = {int(b[0]) for bt in first[:per_epoch] for b in bt}  # window starts within one epoch never repeat
    assert len(starts) == 4 * per_epoch and all(s % 9 == 0 for s in starts)
    assert all(bt.shape == (4, 10) for bt in first)
    again = crun.batches(stream, 9, 4, seed=3, start_step=17)
    assert np.array_equal(next(again)[1], first[17])  # a resumed run continues the same order
    assert not np.array_equal(next(crun.batches(stream, 9, 4, seed=4))[1], first[0])


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [crun.lr_at(s, 1000, 1e-3) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-3 / 20) and lrs[19] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4, rel=1e-3) and all(a >= b for a, b in zip(lrs[20:], lrs[21:]))


def test_arms_cover_the_protocol_and_components_compare_existing_arms():
    for name in ("bf16", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_no_2d", "nvfp4_all", "nvfp4_fwd",
                 "nvfp4_bwd", "mxfp4", "fp8_blockwise", "nvfp4_46", "nvfp4_late_bf16"):
        assert ARMS[name].build() is not None
    assert all(a in ARMS and b in ARMS and c in ("helps", "harmless") for _, a, b, c in COMPONENTS)
    assert (bf16_tail(6), bf16_tail(10), bf16_tail(62)) == (1, 2, 9)
    assert ARMS["nvfp4_no_sr"].build().dgrad_dy.rounding == "rne"


def _train(tmp_path, arm, steps=8, **kw):
    args = dict(batch=4, val_tokens=64 * 64, corpus=_corpus(), device="cpu", log_every=2)
    args.update(kw)
    return crun.train(arm, 1, "tiny", 4 * 64 * steps, 3e-3, tmp_path, **args)


def test_a_run_writes_its_curve_and_record_and_is_deterministic(tmp_path):
    rec = _train(tmp_path / "a", "nvfp4")
    import pandas as pd

    df = pd.read_csv(tmp_path / "a" / f"{rec['run']}.csv")
    assert list(df.columns) == list(crun.CSV_COLUMNS) and df["step"].iloc[-1] == 8
    assert df["val_loss"].notna().sum() >= 4 and np.isfinite(df["train_loss"]).all()
    assert rec["status"] == "done" and rec["tokens_done"] == 8 * 4 * 64 and rec["corpus"]["train"]["sha256"]
    assert rec["gemm_path"] == crun.GEMM_PATH == "cublas"  # pinned for every arm (the fast path's default may move)
    assert any(r[1] == "bf16" for r in rec["layers"]) and any(r[1] == "nvfp4_paper" for r in rec["layers"])
    again = _train(tmp_path / "b", "nvfp4")
    a, b = (pd.read_csv(tmp_path / d / f"{rec['run']}.csv") for d in ("a", "b"))
    assert a[["train_loss", "val_loss"]].equals(b[["train_loss", "val_loss"]])  # same seed, same bits
    del again


@pytest.mark.parametrize("switch_at", [0.82, 0.0], ids=["cut-before-switch", "cut-after-switch"])
def test_a_partial_run_resumes_to_the_uninterrupted_runs_curve_and_weights(tmp_path, monkeypatch, switch_at):
    """Stopped at a checkpoint and resumed, a run writes the uninterrupted run's curve byte for byte (the curve holds
    no timing) and ends with its weights (the records' SHA-256 of the state dict); the tokens/s of the rows before
    the stop are kept in the record."""
    import dataclasses

    import pandas as pd

    monkeypatch.setitem(ARMS, "nvfp4_late_bf16", dataclasses.replace(ARMS["nvfp4_late_bf16"], switch_at=switch_at))
    full = _train(tmp_path / "full", "nvfp4_late_bf16")
    part = _train(tmp_path / "cut", "nvfp4_late_bf16", max_seconds=0.0)
    assert part["status"] == "partial" and part["tokens_done"] < full["tokens_done"]
    assert (tmp_path / "cut" / "ckpt" / part["run"] / "state.safetensors").exists()
    done = _train(tmp_path / "cut", "nvfp4_late_bf16")
    assert done["status"] == "done"
    a, b = (pd.read_csv(tmp_path / d / f"{full['run']}.csv") for d in ("full", "cut"))
    assert a[["step", "train_loss", "val_loss"]].equals(b[["step", "train_loss", "val_loss"]])
    csv = [(tmp_path / d / f"{full['run']}.csv").read_bytes() for d in ("full", "cut")]
    assert csv[0] == csv[1]
    assert done["weights_sha256"] == full["weights_sha256"] != part["weights_sha256"]
    assert [r[0] for r in done["throughput"]] == [r[0] for r in full["throughput"]] == list(range(1, 9))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (the device machine)")
@pytest.mark.parametrize("arm", ["nvfp4", "nvfp4_late_bf16"])
def test_a_cuda_graph_run_gives_the_eager_runs_bits(tmp_path, arm):
    """The campaign may run its steps as CUDA graphs (``--cuda-graph``) only if that changes nothing but speed:
    weights and AdamW state at a checkpoint past the capture, and the whole curve after resuming (a second capture;
    with the late BF16 switch a recapture too), equal the eager run's bit for bit."""
    from safetensors.numpy import load_file

    # 16 steps: 3 eager warm-ups, a capture and replays to the cut at 6; after resuming 3 warm-ups again, a
    # capture at 9, replays; the late switch (step 14) drops the graph and the last steps run eagerly
    kw = dict(device="cuda", log_every=1, steps=16)
    runs = {}
    for mode in (False, True):
        d = tmp_path / ("graph" if mode else "eager")
        part = _train(d, arm, cuda_graph=mode, stop_at=6, **kw)
        assert part["status"] == "partial" and part["tokens_done"] == 6 * 4 * 64
        assert part["cuda_graph"] is mode and part["cuda_graph_failure"] is None
        state = load_file(str(d / "ckpt" / part["run"] / "state.safetensors"))
        done = _train(d, arm, cuda_graph=mode, **kw)
        assert done["status"] == "done"
        runs[mode] = (state, (d / f"{done['run']}.csv").read_text())
    (se, ce), (sg, cg) = runs[False], runs[True]
    # byte strings, not views: AdamW's step counter is a 0-d array, which numpy cannot view as bytes (the first
    # GPU run of this test failed there, on the test's own comparison)
    assert se.keys() == sg.keys()
    assert all(se[k].dtype == sg[k].dtype and se[k].shape == sg[k].shape and se[k].tobytes() == sg[k].tobytes()
               for k in se), [k for k in se if se[k].tobytes() != sg[k].tobytes()]
    strip = [",".join(r.split(",")[:5]) for r in ce.splitlines()], [",".join(r.split(",")[:5]) for r in cg.splitlines()]
    assert strip[0] == strip[1]  # every column but the throughput


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the device machine)")
@pytest.mark.parametrize("mode", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("arm", ["bf16", "nvfp4"])
def test_two_processes_train_the_same_bits_on_cuda(tmp_path, arm, mode):
    """The campaign's deterministic mode (issue 50): the same short run of the campaign's model (s10m, 20 steps of
    4 × 512 bytes, eager or as CUDA graphs) trained in two fresh processes writes byte-identical curves and final
    weights, and each record says the run was deterministic with the fixed cuBLAS workspace.  On 2026-12-06, before
    that mode, 30 such steps in two processes differed from step 1 in BF16 eager."""
    from studies.campaign import repro

    dirs = repro.in_processes(tmp_path, 2, arm=arm, size="s10m", steps=20, device="cuda", cuda_graph=mode)
    res = repro.compare(dirs)
    assert res["identical"], res
    rec = json.loads(next(dirs[0].glob("*.json")).read_text())
    assert rec["deterministic"] is True and rec["cudnn_deterministic"] is True
    assert rec["cublas_workspace_config"] in (":4096:8", ":16:8") and rec["cuda_graph"] is mode


def test_the_sizes_parameter_counts_and_budgets_are_the_models():
    """The budgets are 25 tokens per non-embedding parameter of the model actually built (100 for the horizon),
    and the second size is 1.5–3× the main one (two sizes between ~10 M and ~50 M, issue 20)."""
    from studies.campaign import batch
    from studies.campaign.model import SIZES, Llama, non_embedding_params

    for size, n in batch.PARAMS.items():
        assert non_embedding_params(Llama(SIZES[size])) == n
        assert abs(batch.TOKENS[size] - 25 * n) < 0.005 * 25 * n
        assert 10e6 <= n <= 50e6
    assert abs(batch.HORIZON - 100 * batch.PARAMS["s10m"]) < 0.005 * 100 * batch.PARAMS["s10m"]
    assert 1.5 <= batch.PARAMS["s20m"] / batch.PARAMS["s10m"] <= 3
    assert {r["size"] for r in batch.plan_runs("size", lr=1e-3)} == {"s20m"}


def test_a_profiled_run_reports_both_arms_and_leaves_no_scratch(tmp_path):
    """``--profile``: a few profiled steps of BF16 and of the arm (tables by kind that add up), the record's
    profiled time, and nothing left in the output folder but the report."""
    import contextlib
    import re

    text = crun.profile_run("nvfp4", "tiny", 4 * 64 * 16, 3e-3, tmp_path / "out", tmp_path / "p.md", batch=4,
                            corpus=_corpus(), device="cpu", steps=2, val_tokens=64 * 64)
    assert (tmp_path / "p.md").read_text() == text and list((tmp_path / "out").iterdir()) == []
    total = re.search(r"^\| \*\*all\*\* \| \*\*([\d.]+)\*\* \| \*\*([\d.]+)\*\* \|", text, re.M)
    assert total and float(total.group(2)) > float(total.group(1)) > 0
    assert "| bf16 |" in text and "| nvfp4 |" in text and "not measured (no GPU" in text
    rec = crun.train("nvfp4", 1, "tiny", 4 * 64 * 16, 3e-3, tmp_path / "r", batch=4, corpus=_corpus(), device="cpu",
                     log_every=1, stop_at=5, prof=contextlib.nullcontext(), val_tokens=64 * 64)
    assert rec["profiled_steps"] == 2 and rec["profiled_s"] > 0 and rec["status"] == "partial"
    assert any((tmp_path / "r" / "ckpt").iterdir())  # a partial run checkpoints by default ...
    rec = crun.train("nvfp4", 1, "tiny", 4 * 64 * 16, 3e-3, tmp_path / "q", batch=4, corpus=_corpus(), device="cpu",
                     log_every=1, stop_at=3, checkpoint=False, val_tokens=64 * 64)
    assert rec["status"] == "partial" and not (tmp_path / "q" / "ckpt").exists()  # ... a profile does not


def test_too_small_a_validation_stream_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="held-out packages held hold"):
        _train(tmp_path, "bf16", corpus=_corpus(n_val=500))


def _fake_run(d, arm, seed, final, status="done", size="s10m", budget=265_000_000, **extra):
    """A run's CSV and JSON as the runner writes them (synthetic losses: the renderer's input, not a result)."""
    from fpsim.io import dumps

    rid = crun.run_id(arm, seed, size, budget)
    rows = [",".join(crun.CSV_COLUMNS)]
    for k, frac in enumerate((0.4, 0.8, 1.0)):
        rows.append(f"{k + 1},{int(frac * budget)},0.001,1.0,{final + 0.1 * (2 - k):.6f}")
    (d / f"{rid}.csv").write_text("\n".join(rows) + "\n")
    (d / f"{rid}.json").write_text(dumps({"run": rid, "arm": arm, "seed": seed, "size": size,
                                          "tokens_budget": budget, "status": status, "seconds_total": 600,
                                          "throughput": [[k + 1, 250000.0] for k in range(3)], **extra}))


def test_campaign_section_reports_paired_gaps_and_verdicts(tmp_path):
    from studies.campaign.report import render
    from studies.common import md_table

    blocks, figs = render(tmp_path / "none", tmp_path, md_table)
    assert not figs and "protocol" in blocks[0] and "No main-campaign run has finished yet" in blocks[-1]
    d = tmp_path / "main"
    d.mkdir()
    for s, (b, n, nsr) in enumerate(((1.00, 1.010, 1.030), (1.02, 1.031, 1.049), (0.99, 1.001, 1.022))):
        _fake_run(d, "bf16", s, b, **({"side_by_side": 3, "cuda_graph": True} if s else {}))
        _fake_run(d, "nvfp4", s, n)
        _fake_run(d, "nvfp4_no_sr", s, nsr)
    _fake_run(d, "mxfp4", 0, 2.0, status="partial")
    _fake_run(d, "nvfp4_no_rht", 0, 1.012)
    blocks, figs = render(tmp_path, tmp_path, md_table)
    text = "\n".join(blocks)
    assert "| NVFP4 recipe | 3 | +0.0107 |" in text  # mean of 0.010, 0.011, 0.011
    assert "stochastic rounding of gradients | helps | NVIDIA's NVFP4 paper | +0.0197 |" in text
    assert "| resolved |" in text
    assert "| random Hadamard transform (Wgrad) | helps | NVIDIA's NVFP4 paper | +0.0020 |" in text  # one seed
    assert "1 − 0.95^" not in text  # one component with an interval: no multiple-comparison note
    assert "Not finished: s10m-mxfp4-s0-t265m" in text and figs == ["campaign_s10m_265m.png"]
    # throughput is grouped by how the batch shared the GPU, never pooled across batch shapes
    assert "| BF16 | s10m | separate processes (see the ledger), eager steps | 1 | 250000 |" in text
    assert "| BF16 | s10m | 3 on streams, graph steps | 2 | 250000 |" in text


def test_a_budget_without_a_pair_says_so_in_the_gap_panel(tmp_path, monkeypatch):
    """A budget with BF16 alone (the first horizon run) draws its loss curve, and the gap panel says why it is
    empty instead of showing blank axes."""
    from studies.campaign import report as rep
    from studies.common import md_table

    figs = {}
    monkeypatch.setattr(rep, "save_fig", lambda fig, path: figs.__setitem__(Path(path).name, fig))
    d = tmp_path / "horizon"
    d.mkdir()
    _fake_run(d, "bf16", 0, 1.0, budget=1_062_000_000)
    _fake_run(d, "nvfp4", 1, 1.01, budget=1_062_000_000)  # another arm, but on no seed BF16 has
    rep.render(tmp_path, tmp_path, md_table)
    loss, gap = figs["campaign_s10m_1062m.png"].axes[:2]
    assert len(loss.lines) == 2 and not gap.lines[:-1]  # the two curves; only the zero line in the gap panel
    assert any("no paired gap yet" in t.get_text() for t in gap.texts)


def test_headline_states_paired_gaps_relative_to_bf16_and_the_components_verdicts(tmp_path):
    """Study 8's measured/verdict lines come from the campaign once BF16 and the recipe have runs: the recipe's
    gap here is 0.010, 0.011, 0.011 over BF16 losses 1.00, 1.02, 0.99 (mean 1.0033), so +1.1 % of BF16's loss with
    an interval above zero; removing SR adds 0.020, 0.018, 0.021 (resolved)."""
    from studies.campaign.report import headline

    assert headline(tmp_path) is None  # no campaign data: the study falls back to the earlier runs
    d = tmp_path / "main"
    d.mkdir()
    _fake_run(d, "bf16", 0, 1.0)
    assert headline(tmp_path) is None  # no recipe run yet
    for s, (b, n, nsr) in enumerate(((1.00, 1.010, 1.030), (1.02, 1.031, 1.049), (0.99, 1.001, 1.022))):
        if s:
            _fake_run(d, "bf16", s, b)
        _fake_run(d, "nvfp4", s, n)
        _fake_run(d, "nvfp4_no_sr", s, nsr)
    _fake_run(d, "mxfp4", 0, 2.0, status="partial")  # not done: left out of every number
    _fake_run(d, "nvfp4_no_rht", 0, 1.012)  # one seed: a component without an interval, not "includes zero"
    measured, verdict = headline(tmp_path)
    assert "10 of the 36 main runs" in measured and "BF16's final validation loss: 1.0033 nats/byte" in measured
    assert "NVFP4 recipe +0.0107 [" in measured and "(+1.1 %, 3 seeds; detectable" in measured
    assert "MXFP4" not in measured
    assert verdict.startswith("The recipe stays behind BF16 by +0.0107 nats/byte (+1.1 %), its interval above zero")
    assert ("Of the 1 recipe component with an interval (p below 0.05), resolved in the claimed direction: "
            "stochastic rounding of gradients; one seed so far, no interval: random Hadamard transform "
            "(Wgrad).") in verdict
    assert "interval includes zero" not in verdict
    assert "1 − 0.95" not in verdict and "at least one would exclude zero" not in verdict  # one interval only
    assert "fewer than three seeds so far: NVFP4 − RHT" in verdict and "MXFP4 recipe" in verdict


def test_verdict_splits_the_gap_by_pass_and_compares_the_other_formats():
    """Forward only +0.008 on three seeds (interval above zero) and backward only ±0.004 (across zero): their paired
    difference forward − backward, +0.0077 [-0.0041, +0.0194], includes zero, so the text does not say which pass
    carries the gap (it used to credit the forward pass from the two intervals alone); with backward-only gaps of
    0.001, 0.002, 0.0015 the difference's interval lies above zero and it does.  MXFP4 − NVFP4 of 0.010, 0.012,
    0.011 is resolved in the paper's direction (two seeds of it would not be: t = 12.7 makes their interval
    ±0.013), with the MXFP4 arm's changes besides the format named; one-seed arms say nothing yet."""
    from studies.campaign import report as rep

    bf = {0: 1.0, 1: 1.1, 2: 0.9}
    fin = {"bf16": bf, "nvfp4": {0: 1.006, 1: 1.105, 2: 0.907},
           "nvfp4_fwd": {0: 1.008, 1: 1.109, 2: 0.907}, "nvfp4_bwd": {0: 1.004, 1: 1.096, 2: 0.901},
           "mxfp4": {0: 1.016, 1: 1.117, 2: 0.918}, "fp8_blockwise": {0: 0.999}}
    gaps = {a: paired_gap(v, bf) for a, v in fin.items() if a != "bf16"}
    text = rep._split_text(gaps, fin)
    assert "forward pass alone costs +0.0080 (interval above zero)" in text
    assert "backward pass alone +0.0003 (interval across zero)" in text and "carries" not in text
    assert ("forward − backward, paired per seed: +0.0077 [-0.0041, +0.0194] (p 0.11, detectable at 80 % power: "
            "0.0154), an interval that includes zero, so these runs do not tell which pass costs more.") in text
    other = {**fin, "nvfp4_bwd": {0: 1.001, 1: 1.102, 2: 0.9015}}
    assert rep._split_text({a: paired_gap(v, bf) for a, v in other.items() if a != "bf16"}, other).endswith(
        "+0.0065 [+0.0043, +0.0087] (p 0.0059, detectable at 80 % power: 0.0028): the forward pass's quantization "
        "costs more than the other's.")
    assert rep._split_text({"nvfp4_fwd": gaps["nvfp4_fwd"]}) == ""
    fmt = rep._format_text(fin, gaps)
    two = rep._format_text({**fin, "mxfp4": {0: 1.016, 1: 1.117}}, gaps)
    assert ("+0.0110 [-0.0017, +0.0237] (interval across zero, detectable at 80 % power: 0.0163; the paper's 'MXFP4 "
            "widens the gap': not resolved") in two
    assert fmt.startswith("MXFP4's recipe − NVFP4's: +0.0110 [+0.0085, +0.0135] (interval above zero, detectable at "
                          "80 % power: 0.0033; the paper's 'MXFP4 widens the gap': resolved). The MXFP4 arm changes "
                          "the format (blocks of 32 with power-of-two E8M0 scales and no FP32 tensor scale")
    assert "1×32 blocks instead of 16×16 tiles" in fmt and "32-point RHT with per-layer seeded signs" in fmt
    fin["fp8_blockwise"] = {0: 0.999, 1: 1.102, 2: 0.9}
    gaps["fp8_blockwise"] = paired_gap(fin["fp8_blockwise"], bf)
    assert rep._format_text(fin, gaps).endswith(
        " FP8 blockwise − BF16: +0.0003 [-0.0035, +0.0041] (interval across zero, detectable at 80 % power: 0.0050).")


def test_gap_against_tokens_pairs_each_budget_with_the_main_one_per_seed(tmp_path):
    """With the main budget alone the section says what the figure needs; with the horizon's runs it tabulates the
    gap at 25 and 100 tokens per parameter and the paired change: recipe gaps 0.010, 0.011, 0.012 at 265 M and
    0.015, 0.017, 0.016 at 1,062 M move by +0.005, +0.006, +0.004 (mean +0.0050)."""
    from studies.campaign.report import render
    from studies.common import md_table

    main, hor = tmp_path / "main", tmp_path / "horizon"
    main.mkdir()
    hor.mkdir()
    for s, b in enumerate((1.00, 1.02, 0.99)):
        for arm, g in (("bf16", 0.0), ("nvfp4", 0.010 + 0.001 * s), ("nvfp4_no_sr", 0.020 + 0.001 * s)):
            _fake_run(main, arm, s, b + g)
    text = "\n".join(render(tmp_path, tmp_path, md_table)[0])
    assert "Gap against the token budget and the model size: needs a second budget" in text
    for s, b in enumerate((0.90, 0.93, 0.88)):
        for arm, g in (("bf16", 0.0), ("nvfp4", (0.015, 0.017, 0.016)[s]), ("nvfp4_no_sr", 0.030)):
            _fake_run(hor, arm, s, b + g, budget=1_062_000_000)
    blocks, figs = render(tmp_path, tmp_path, md_table)
    text = "\n".join(blocks)
    assert "campaign_gap_vs_tokens.png" in figs and (tmp_path / "campaign_gap_vs_tokens.png").exists()
    assert "| s10m | 265 M | 25 | NVFP4 recipe | 3 | +0.0110 |" in text
    assert "| s10m | 1,062 M | 100 | NVFP4 recipe | 3 | +0.0160 |" in text
    assert "| s10m | 1,062 M | 100 | SR's component (without − with) | 3 | +0.0140 |" in text  # 0.030 − 0.016
    assert "| NVFP4 recipe | s10m, 265 M | s10m, 1,062 M | 3 | +0.0050 |" in text


def test_arms_without_a_seed_in_common_with_bf16_are_reported_as_such_not_a_crash(tmp_path):
    """Part-way through a plan an arm can have finished a seed BF16 has not (it used to raise "no seed in common"
    and stop `make reports`): its row says so, its component has no verdict, and the headline waits."""
    from studies.campaign.report import headline, render
    from studies.common import md_table

    d = tmp_path / "main"
    d.mkdir()
    _fake_run(d, "bf16", 0, 1.0)
    _fake_run(d, "nvfp4", 1, 1.01)
    _fake_run(d, "nvfp4_no_sr", 1, 1.02)
    text = "\n".join(render(tmp_path, tmp_path, md_table)[0])
    assert "| NVFP4 recipe | 0 |  | — (no seed in common yet) |  |" in text
    assert "| no verdict (no seed in common yet) |" not in text  # no_sr and nvfp4 share seed 1: a one-seed verdict
    assert ("stochastic rounding of gradients | helps | NVIDIA's NVFP4 paper | +0.0100 | — (1 seed: no interval) "
            "|") in text
    assert headline(tmp_path) is None
    hor = tmp_path / "horizon"
    hor.mkdir()
    _fake_run(hor, "bf16", 0, 1.0, budget=1_062_000_000)
    _fake_run(hor, "nvfp4", 1, 1.0, budget=1_062_000_000)
    assert "needs a second budget" in "\n".join(render(tmp_path, tmp_path, md_table)[0])


def test_a_ledger_command_lost_with_its_machine_is_counted_apart_not_as_zero(tmp_path):
    """A command whose machine was taken back has wall_s null: the device-time sum covers the known commands and
    names the others (it used to stop the whole study with a TypeError)."""
    from studies.campaign.report import render
    from studies.common import md_table

    (tmp_path / "sessions.json").write_text(json.dumps([
        {"date": "d", "command": "a --work /tmp/campaign", "wall_s": 1800.0, "result": {"main/r1": "done",
                                                                                         "main/r2": "partial"}},
        {"date": "d", "command": "b", "wall_s": None, "result": "lost | nothing came back"},
        {"date": "d", "command": "c --work /tmp/w2 --out /root/out/a --parallel 2", "wall_s": 32.0, "result": "x"}]))
    text = "\n".join(render(tmp_path, tmp_path, md_table)[0])
    assert "0.51 h over 2 commands, plus 1 command(s) whose machine was taken back" in text
    # the table lists both commands; the unknown wall time is an empty cell, and a '|' stays inside its cell
    assert "| d |  | `a` | 1800 | done: r1; partial: r2 |" in text
    assert "| d |  | `b` |  | lost \\| nothing came back |" in text
    assert "| d |  | `c --parallel 2` | 32 | x |" in text  # a path under --out is the shell's too, not '/a'


def _unswept(plan_runs):
    from studies.campaign import batch

    old, batch.LR = batch.LR, None
    try:
        plan_runs("main")
    finally:
        batch.LR = old


def test_the_learning_rate_is_the_committed_sweeps_best_and_the_section_shows_the_sweep_and_probes(tmp_path):
    """LR (used by every arm) is the learning rate of the lowest final validation loss among the committed sweep
    runs; the study shows the sweep, the throughput probes and the first look at the probe runs."""
    import pandas as pd

    from studies.campaign import batch
    from studies.campaign.report import render
    from studies.common import md_table

    final = {}
    for js in (batch.DATA / "lr_sweep").rglob("*.json"):
        rec = json.loads(js.read_text())
        final[rec["lr"]] = float(pd.read_csv(js.with_suffix(".csv")).val_loss.dropna().iloc[-1])
    assert len(final) == 4 and batch.LR == min(final, key=final.get)
    blocks, _ = render(batch.DATA, tmp_path, md_table)
    text = "\n".join(blocks)
    assert f"| {batch.LR:g} | 39,976,960 | {final[batch.LR]:.4f} |" in text
    assert "| NVFP4 recipe | 1 |" in text and "| BF16 | 6 |" in text and "A first look, not a campaign result" in text
    # the committed main runs, counted from their records rather than restated here
    recs = [json.loads(js.read_text()) for js in (batch.DATA / "main").glob("*.json")]
    done = sum(r["status"] == "done" for r in recs)
    assert "Paired gaps to BF16, s10m, 265 M tokens" in text
    assert (f"main {done} of 36 runs done" if done < 36 else "main: all 36 runs done") in text and "nan" not in text
    from studies.campaign.report import headline

    assert headline(batch.DATA)[0].startswith(f"{done} of the 36 main runs" if done < 36 else "All 36 main runs")


def test_plans_need_the_swept_learning_rate_and_the_manifest_records_runs(tmp_path):
    from studies.campaign.batch import plan_runs, update_manifest

    assert len(plan_runs("lr_sweep")) == 4
    with pytest.raises(ValueError, match="lr_sweep plan first"):
        _unswept(plan_runs)
    main = plan_runs("main", lr=2e-3)
    assert len(main) == 36 and len({(r["arm"], r["seed"]) for r in main}) == 36
    assert {r["arm"] for r in main} == set(ARMS)
    # the SR comparison (BF16, the recipe, without SR) has all three seeds within the first nine runs
    assert {(r["arm"], r["seed"]) for r in main[:9]} == {(a, s) for a in ("bf16", "nvfp4", "nvfp4_no_sr")
                                                          for s in range(3)}
    d = tmp_path / "main"
    d.mkdir()
    _fake_run(d, "bf16", 0, 1.0)
    _fake_run(d, "nvfp4", 0, 1.0, status="partial")
    rec = json.loads((d / "s10m-bf16-s0-t265m.json").read_text())
    rec.update(tokens_done=265_000_000, lr=2e-3, device="NVIDIA H200")
    (d / "s10m-bf16-s0-t265m.json").write_text(json.dumps(rec))
    for p in d.glob("*nvfp4*.json"):
        r = json.loads(p.read_text())
        r.update(tokens_done=1, lr=2e-3, device="x")
        p.write_text(json.dumps(r))
    man = update_manifest(tmp_path, tmp_path / "manifest.json")
    assert man["main/s10m-bf16-s0-t265m"]["status"] == "done"
    assert man["main/s10m-nvfp4-s0-t265m"]["status"] == "partial"
    assert json.loads((tmp_path / "manifest.json").read_text()) == man


def test_the_batch_driver_keeps_its_parallel_runs_going_and_collects_their_results(tmp_path, monkeypatch):
    """Runs start as earlier ones end (not in lock step), each with the plan's arguments; results are copied."""
    from studies.campaign import batch

    started, live = [], []

    class FakeRun:
        def __init__(self, cmd):
            args = dict(zip(cmd[3::2], cmd[4::2]))
            started.append(args)
            self.ticks = 1 if len(started) % 2 else 3  # uneven lengths
            live.append(self)
            rid = crun.run_id(args["--arm"], int(args["--seed"]), args["--size"], float(args["--tokens"]))
            out = Path(args["--out"])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{rid}.json").write_text("{}")
            (out / f"{rid}.csv").write_text("step\n")
            self.returncode = None

        def poll(self):
            assert sum(r.returncode is None for r in live) <= 2  # never more than --parallel at once
            self.ticks -= 1
            if self.ticks <= 0:
                self.returncode = 0
            return self.returncode

    monkeypatch.setattr(batch.subprocess, "Popen", FakeRun)
    monkeypatch.setattr(batch, "POLL_S", 0.0)
    batch.main(["--plan", "lr_sweep", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                "--parallel", "2", "--manifest", str(tmp_path / "none.json")])
    assert [s["--lr"] for s in started] == ["0.001", "0.002", "0.004", "0.008"]
    # each run gets what is left of the command's 540 s (here almost all: the fakes take no time)
    assert all(s["--batch"] == str(batch.BATCH) and 539 < float(s["--max-seconds"]) <= 540 for s in started)
    import tarfile

    # one archive (the device returns at most 8 files), folder names without '.' (the device drops those)
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["lr_sweep.tar"]
    with tarfile.open(tmp_path / "o" / "lr_sweep.tar") as tf:
        names = tf.getnames()
    assert len(names) == 9 and all("." not in n.rsplit("/", 1)[0] for n in names), names
    assert sorted({n.split("/")[1] for n in names} - {"ledger.json"}) == ["lr1e-03", "lr2e-03", "lr4e-03", "lr8e-03"]
    # the command's device-time entry travels in the archive and merges into the ledger
    with tarfile.open(tmp_path / "o" / "lr_sweep.tar") as tf:
        tf.extractall(tmp_path / "x", filter="data")
    entry = json.loads((tmp_path / "x" / "lr_sweep" / "ledger.json").read_text())
    assert entry["command"].startswith("batch --plan lr_sweep") and entry["wall_s"] >= 0
    assert sorted(entry["result"]) == [f"lr_sweep/lr{v}/s10m-bf16-s0-t40m" for v in ("1e-03", "2e-03", "4e-03",
                                                                                     "8e-03")]
    led = batch.add_ledger(tmp_path / "x" / "lr_sweep" / "ledger.json", tmp_path / "sessions.json", gpu="NVIDIA H200")
    assert led[-1]["gpu"] == "NVIDIA H200" and json.loads((tmp_path / "sessions.json").read_text()) == led


def test_runs_side_by_side_in_one_process_give_their_alone_curves(tmp_path):
    """train_many interleaves the runs' steps (here two at a time over three runs, so the third starts when the
    first stops) and each run's curve is the one it has alone; a run that cannot start is an error record and
    the others go on."""
    import pandas as pd

    args = dict(batch=4, val_tokens=64 * 64, corpus=_corpus(), device="cpu", log_every=2)
    specs = [dict(arm=arm, seed=1, size="tiny", tokens=4 * 64 * n, lr=3e-3, out=tmp_path / "many")
             for arm, n in (("nvfp4", 4), ("bf16", 8), ("nvfp4_no_sr", 6))]
    bad = dict(arm="nvfp4", seed=1, size="no-such-size", tokens=4 * 64 * 4, lr=3e-3, out=tmp_path / "many")
    seen = []
    recs = crun.train_many([specs[0], bad, *specs[1:]], parallel=2, on_done=lambda s, r: seen.append(r["run"]),
                           **args)
    assert [r["status"] for r in recs] == ["done", "error: KeyError: 'no-such-size'", "done", "done"]
    assert recs[0]["side_by_side"] == 2 and len(seen) == 4
    for s, rec in zip(specs, (recs[0], *recs[2:])):
        alone = crun.train(s["arm"], 1, "tiny", s["tokens"], 3e-3, tmp_path / "alone", **args)
        assert "side_by_side" not in alone
        a, b = (pd.read_csv(tmp_path / d / f"{rec['run']}.csv") for d in ("many", "alone"))
        assert a[["step", "train_loss", "val_loss"]].equals(b[["step", "train_loss", "val_loss"]])


def test_max_seconds_is_the_calls_time_so_a_queued_run_gets_what_is_left_or_does_not_start(monkeypatch, tmp_path):
    """One at a time under max_seconds 500 (a fake clock: each step takes 100 s): the first run takes 300 s, the
    second starts with 200 s left, the third with 100 s, and the fourth, with 0 s left (under MIN_START_S), is
    not started: a status, no files.  Before, every queued run got the whole 500 s, so a batch could run past its
    ten-minute command and be killed before its checkpoints and archive were written."""
    clock, made = [0.0], []

    class FakeRun:
        def __init__(self, arm, seed, size, tokens, lr, out, *, max_seconds, **kw):
            self.n, self.rid = int(tokens), crun.run_id(arm, seed, size, tokens)
            made.append((self.rid, max_seconds))

        def advance(self):
            clock[0] += 100.0
            self.n -= 1
            return self.n > 0

        def finish(self):
            return {"run": self.rid, "status": "done"}

    monkeypatch.setattr(crun, "Run", FakeRun)
    monkeypatch.setattr(crun.time, "perf_counter", lambda: clock[0])
    specs = [dict(arm="bf16", seed=k, size="tiny", tokens=n, lr=1e-3, out=tmp_path) for k, n in enumerate((3, 1, 1, 1))]
    seen = []
    recs = crun.train_many(specs, parallel=1, on_done=lambda s, r: seen.append(r["status"]), max_seconds=500.0,
                           device="cpu")
    assert [m for _, m in made] == [500.0, 200.0, 100.0] and len(seen) == 4
    assert [r["status"] for r in recs[:3]] == ["done"] * 3
    assert recs[3]["status"] == f"{crun.NOT_STARTED}: 0 s of max_seconds left" and not list(tmp_path.iterdir())


def test_separate_process_runs_get_what_is_left_of_the_commands_time(tmp_path, monkeypatch):
    """The same deadline for ``batch`` without --streams: with --max-seconds 250 and each process taking 100 s
    (a fake clock), the lr sweep's runs one at a time get 250 and 150 s; the third and the fourth, with 50 s left
    (under MIN_START_S), are not started, and the ledger says so."""
    from studies.campaign import batch

    clock, started = [0.0], []

    class FakeProc:
        def __init__(self, cmd):
            started.append(float(cmd[cmd.index("--max-seconds") + 1]))
            self.returncode = None

        def poll(self):
            clock[0] += 100.0
            self.returncode = 0
            return 0

    monkeypatch.setattr(batch.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(batch, "POLL_S", 0.0)
    monkeypatch.setattr(batch.time, "perf_counter", lambda: clock[0])
    batch.main(["--plan", "lr_sweep", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--parallel",
                "1", "--max-seconds", "250", "--loose", "--manifest", str(tmp_path / "none.json")])
    assert started == [250.0, 150.0]
    result = json.loads((tmp_path / "o" / "lr_sweep" / "ledger.json").read_text())["result"]
    assert [result[f"lr_sweep/lr{v}/s10m-bf16-s0-t40m"] for v in ("1e-03", "2e-03", "4e-03", "8e-03")] == [
        "exit 0, no record", "exit 0, no record", f"{crun.NOT_STARTED}: 50 s of max_seconds left",
        f"{crun.NOT_STARTED}: 50 s of max_seconds left"]


def test_the_batch_driver_skips_done_runs_and_records_runs_it_could_not_start(tmp_path, monkeypatch):
    """A run the committed manifest lists as done, or whose record under --work says done (an earlier command of
    the session), is skipped rather than trained again from zero; --redo runs it.  A run train_many did not start
    goes into the ledger entry with its status and nothing is collected for it."""
    from studies.campaign import batch, data

    calls = []

    def fake_many(specs, *, parallel, on_done, **kw):
        calls.append([s["arm"] for s in specs])
        for s in specs:
            on_done(s, {"run": crun.run_id(s["arm"], s["seed"], s["size"], s["tokens"]),
                        "status": f"{crun.NOT_STARTED}: 12 s of max_seconds left"})

    monkeypatch.setattr(crun, "train_many", fake_many)
    monkeypatch.setattr(data, "python_sources", lambda holdout=None: "corpus")
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"main/s10m-bf16-s1-t265m": {"status": "done"},
                               "main/s10m-nvfp4_no_sr-s1-t265m": {"status": "partial"}}))
    (tmp_path / "w" / "main").mkdir(parents=True)
    (tmp_path / "w" / "main" / "s10m-nvfp4-s1-t265m.json").write_text(json.dumps(
        {"run": "s10m-nvfp4-s1-t265m", "status": "done"}))
    argv = ["--plan", "main", "--runs", "3:6", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
            "--streams", "--loose", "--manifest", str(man)]
    batch.main(argv)
    assert calls == [["nvfp4_no_sr"]]
    entry = json.loads((tmp_path / "o" / "main" / "ledger.json").read_text())
    assert entry["result"] == {"main/s10m-nvfp4_no_sr-s1-t265m": f"{crun.NOT_STARTED}: 12 s of max_seconds left"}
    assert sorted(p.name for p in (tmp_path / "o" / "main").iterdir()) == ["ledger.json"]
    batch.main([*argv, "--redo"])
    assert calls[-1] == ["bf16", "nvfp4", "nvfp4_no_sr"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams need a GPU (the device machine)")
def test_runs_on_concurrent_cuda_streams_give_their_alone_bits(tmp_path):
    """The campaign may run its arms side by side in one process (``batch --streams``) only if a run's bits do not
    depend on its neighbours: weights and AdamW state at a checkpoint, and the curve, of three graph runs on
    concurrent streams equal each run's alone."""
    from safetensors.numpy import load_file

    args = dict(batch=4, val_tokens=64 * 64, corpus=_corpus(), device="cuda", log_every=1, cuda_graph=True)
    specs = [dict(arm=arm, seed=1, size="tiny", tokens=4 * 64 * 16, lr=3e-3, out=tmp_path / "many")
             for arm in ("nvfp4", "bf16", "nvfp4_late_bf16")]
    many = crun.train_many(specs, parallel=3, stop_at=10, **args)
    assert all(r["status"] == "partial" and r["cuda_graph"] for r in many), many
    for s, rec in zip(specs, many):
        crun.train(s["arm"], 1, "tiny", s["tokens"], 3e-3, tmp_path / "alone", stop_at=10, **args)
        a, b = (load_file(str(tmp_path / d / "ckpt" / rec["run"] / "state.safetensors")) for d in ("many", "alone"))
        assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a), rec["run"]
        ca, cb = ([",".join(r.split(",")[:5]) for r in (tmp_path / d / f"{rec['run']}.csv").read_text().splitlines()]
                  for d in ("many", "alone"))
        assert ca == cb, rec["run"]


def test_the_batch_driver_runs_its_plan_in_one_process_with_streams(tmp_path, monkeypatch):
    """``--streams`` hands the plan's slice to run.train_many with the batch's step size and time limit, collects
    each run as it stops and records error statuses in the ledger entry."""
    from studies.campaign import batch, data

    calls = {}

    def fake_many(specs, *, parallel, on_done, **kw):
        calls.update(parallel=parallel, specs=specs, kw=kw)
        for i, s in enumerate(specs):
            rid = crun.run_id(s["arm"], s["seed"], s["size"], s["tokens"])
            s["out"].mkdir(parents=True, exist_ok=True)
            rec = {"run": rid, "status": "done" if i else "error: RuntimeError: boom"}
            (s["out"] / f"{rid}.json").write_text(json.dumps(rec))
            (s["out"] / f"{rid}.csv").write_text("step\n")
            on_done(s, rec)

    monkeypatch.setattr(crun, "train_many", fake_many)
    monkeypatch.setattr(data, "python_sources", lambda holdout=None: "corpus")
    batch.main(["--plan", "main", "--runs", "3:5", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                "--manifest", str(tmp_path / "none.json"),
                "--parallel", "2", "--streams", "--cuda-graph", "--max-seconds", "100", "--loose"])
    assert calls["parallel"] == 2 and [s["arm"] for s in calls["specs"]] == ["bf16", "nvfp4"]
    assert calls["kw"] == dict(batch=batch.BATCH, max_seconds=100.0, corpus="corpus", cuda_graph=True)
    entry = json.loads((tmp_path / "o" / "main" / "ledger.json").read_text())
    assert entry["result"] == {"main/s10m-bf16-s1-t265m": "error: RuntimeError: boom",
                               "main/s10m-nvfp4-s1-t265m": "done"}
    assert (tmp_path / "o" / "main" / "s10m-nvfp4-s1-t265m.csv").exists()


def test_the_batch_driver_spreads_its_runs_over_gpus_one_child_batch_each(tmp_path, monkeypatch):
    """``--gpus 2`` gives GPU k the runs ``idx[k::2]`` as a child batch with the command's other options and
    CUDA_VISIBLE_DEVICES=k; the children's files land under --out in one archive with one ledger entry for every
    run, and a child that dies before writing a record leaves its runs as "exit N, no record"."""
    import tarfile

    from studies.campaign import batch, data

    def fake_many(specs, *, parallel, on_done, **kw):
        for s in specs:
            rid = crun.run_id(s["arm"], s["seed"], s["size"], s["tokens"])
            s["out"].mkdir(parents=True, exist_ok=True)
            (s["out"] / f"{rid}.json").write_text(json.dumps({"run": rid, "status": "done"}))
            (s["out"] / f"{rid}.csv").write_text("step\n")
            on_done(s, {"run": rid, "status": "done"})

    children = []

    class FakeChild:  # runs the child batch in this process; the child on GPU "1" dies first
        def __init__(self, cmd, env):
            assert cmd[1:3] == ["-m", "studies.campaign.batch"]
            children.append((cmd[3:], env["CUDA_VISIBLE_DEVICES"]))
            self.code = 3 if env["CUDA_VISIBLE_DEVICES"] == "1" else 0
            if not self.code:
                batch.main(cmd[3:])

        def wait(self):
            return self.code

    monkeypatch.setattr(crun, "train_many", fake_many)
    monkeypatch.setattr(data, "python_sources", lambda holdout=None: "corpus")
    monkeypatch.setattr(batch.subprocess, "Popen", FakeChild)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    out = tmp_path / "o"
    argv = ["--plan", "main", "--runs", "3:6", "--work", str(tmp_path / "w"), "--out", str(out), "--parallel", "2",
            "--streams", "--gpus", "2", "--max-seconds=100", "--manifest", str(tmp_path / "none.json")]
    batch.main(argv)
    assert [(c[c.index("--runs") + 1], g) for c, g in children] == [("3,5", "0"), ("4", "1")]
    assert all("--gpus" not in c and "--max-seconds=100" in c and "--loose" in c and "--streams" in c
               and c[c.index("--out") + 1] == str(out / f"gpu{g}") for c, g in children)
    assert [p.name for p in out.iterdir()] == ["main.tar"]  # the children's folders are gone
    with tarfile.open(out / "main.tar") as tf:
        tf.extractall(tmp_path / "x", filter="data")
    entry = json.loads((tmp_path / "x" / "main" / "ledger.json").read_text())
    assert entry["gpus"] == 2 and entry["command"] == "batch " + " ".join(argv)
    assert entry["result"] == {"main/s10m-bf16-s1-t265m": "done", "main/s10m-nvfp4-s1-t265m": "exit 3, no record",
                               "main/s10m-nvfp4_no_sr-s1-t265m": "done"}
    assert sorted(p.name for p in (tmp_path / "x" / "main").iterdir()) == [
        "ledger.json", "s10m-bf16-s1-t265m.csv", "s10m-bf16-s1-t265m.json", "s10m-nvfp4_no_sr-s1-t265m.csv",
        "s10m-nvfp4_no_sr-s1-t265m.json"]
    led = batch.add_ledger(tmp_path / "x" / "main" / "ledger.json", tmp_path / "sessions.json", gpu="NVIDIA H200")
    assert led[-1]["gpu"] == "2 × NVIDIA H200" and "gpus" not in led[-1]
    # more GPUs than the machine shows: one clear message before anything starts
    children.clear()
    with pytest.raises(SystemExit, match="--gpus 3, but this machine shows 2"):
        batch.main([("3" if a == "2" and argv[i - 1] == "--gpus" else a) for i, a in enumerate(argv)])
    assert children == []


def test_runs_are_selected_by_slices_and_indices_and_a_bad_selection_is_one_clear_error():
    from studies.campaign.batch import select_runs

    runs = [{"i": i} for i in range(36)]
    assert [r["i"] for r in select_runs(runs, "9:11,17")] == [9, 10, 17]
    assert [r["i"] for r in select_runs(runs, "11, 14, 17")] == [11, 14, 17]
    assert [r["i"] for r in select_runs(runs, "34:")] == [34, 35] and select_runs(runs, "-1") == [runs[35]]
    for bad, why in (("36", "past the plan"), ("3:5,4", "twice"), ("40:", "no run"), ("a", "invalid literal")):
        with pytest.raises(ValueError, match=why):
            select_runs(runs, bad)


def test_a_checkpoint_carried_in_parts_to_a_fresh_work_folder_resumes_to_the_uninterrupted_curve(tmp_path,
                                                                                                  monkeypatch):
    """The shuttle between device sessions: a stopped run packed into parts over two calls, reassembled in another
    folder (as on a fresh machine) and resumed gives the uninterrupted run's curve; a damaged, missing or foreign
    part is one ValueError and writes nothing."""
    import pandas as pd

    from studies.campaign import shuttle

    assert _train(tmp_path / "full" / "main", "nvfp4")["status"] == "done"
    part = _train(tmp_path / "a" / "main", "nvfp4", max_seconds=0.0)
    assert part["status"] == "partial"
    rid = part["run"]
    blob = shuttle.archive_bytes(tmp_path / "a", "main", rid)
    assert blob == shuttle.archive_bytes(tmp_path / "a", "main", rid)  # the same parts in every call
    monkeypatch.setattr(shuttle, "PART_BYTES", len(blob) // 3 + 1)  # three parts
    first = shuttle.pack(tmp_path / "a", "main", rid, tmp_path / "call1", slice(0, 2))
    second = shuttle.pack(tmp_path / "a", "main", rid, tmp_path / "call2", slice(2, None))
    assert [f.name for f in first] == [f"{rid}.part-000", f"{rid}.part-001", f"{rid}.shuttle.json"]
    assert [f.name for f in second] == [f"{rid}.part-002", f"{rid}.shuttle.json"]

    with pytest.raises(ValueError, match="part-002 is missing"):
        shuttle.unpack([tmp_path / "call1"], tmp_path / "b")
    assert not (tmp_path / "b").exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in second:
        (bad / f.name).write_bytes(f.read_bytes())
    p = bad / f"{rid}.part-002"
    p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1]))
    with pytest.raises(ValueError, match="SHA-256"):
        shuttle.unpack([tmp_path / "call1", bad], tmp_path / "b")
    assert not (tmp_path / "b").exists()

    assert shuttle.unpack([tmp_path / "call1", tmp_path / "call2"], tmp_path / "b") == rid
    done = _train(tmp_path / "b" / "main", "nvfp4")
    assert done["status"] == "done"
    a, b = (pd.read_csv(tmp_path / d / "main" / f"{rid}.csv") for d in ("full", "b"))
    assert a[["step", "train_loss", "val_loss"]].equals(b[["step", "train_loss", "val_loss"]])


def test_a_shuttle_archive_with_other_files_than_the_runs_four_is_refused(tmp_path):
    """A manifest whose hashes match but whose tar holds another path (a hostile archive) writes nothing."""
    import hashlib
    import io
    import tarfile

    from studies.campaign import shuttle

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("../../escape.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    blob = buf.getvalue()
    src = tmp_path / "in"
    src.mkdir()
    (src / "r.part-000").write_bytes(blob)
    sha = hashlib.sha256(blob).hexdigest()
    (src / "r.shuttle.json").write_text(json.dumps({"run": "r", "plan": "main", "bytes": len(blob), "sha256": sha,
                                                    "parts": [{"name": "r.part-000", "bytes": len(blob),
                                                               "sha256": sha}]}))
    with pytest.raises(ValueError, match="not the run's four files"):
        shuttle.unpack([src], tmp_path / "w")
    assert not (tmp_path / "w").exists() and not (tmp_path.parent / "escape.txt").exists()
    with pytest.raises(ValueError, match="no checkpoint to pack"):
        shuttle.pack(tmp_path / "w", "main", "r", tmp_path / "o")


def test_a_checkpoint_resumed_on_another_corpus_is_one_clear_error(tmp_path):
    """Resuming needs the stream the run started on (a checkpoint carried to a machine with other packages)."""
    part = _train(tmp_path, "bf16", max_seconds=0.0)
    assert part["status"] == "partial"
    c = _corpus()
    other = Corpus(train=c.train[::-1].copy(), val=c.val, roots=c.roots, holdout=c.holdout,
                   train_files=c.train_files, val_files=c.val_files)
    with pytest.raises(ValueError, match="train stream with SHA-256"):
        _train(tmp_path, "bf16", corpus=other)
    assert _train(tmp_path, "bf16")["status"] == "done"  # the same corpus resumes


def test_budget_costs_each_arm_at_its_rate_alone_and_flags_runs_longer_than_a_command():
    """The plan estimate: a run costs its tokens at its arm's rate alone where measured (FP8 blockwise 265e6 / 394e3
    = 673 s, BF16 265e6 / 1.53e6 = 173 s), any other s10m run 265e6 / 1.23e6 = 215 s; horizon runs alone take
    1,062e6 / 1.53e6 = 694 s (BF16) to 1,062e6 / 1.10e6 = 965 s (the recipe): more than a command, less than a
    session; a size run costs its arm's measured s20m rate (the recipe 482e6 / 795e3 = 606 s, BF16 482e6 / 1.17e6 =
    412 s), and any other arm its s10m rate times the recipe's ratio 795e3 / 1.10e6: without SR 482e6 / (1.12e6 ×
    0.7227) = 595 s.  A finished plan says so."""
    from studies.campaign import report as rep
    from studies.campaign.batch import plan_runs

    main = plan_runs("main", lr=1.0)
    fp8 = [r for r in main if r["arm"] == "fp8_blockwise"]
    assert rep._run_seconds(fp8[0]) == pytest.approx(265e6 / 394e3)
    assert main[0]["arm"] == "bf16" and rep._run_seconds(main[0]) == pytest.approx(265e6 / 1.53e6)
    no_rht = next(r for r in main if r["arm"] == "nvfp4_no_rht")
    assert rep._run_seconds(no_rht) == pytest.approx(265e6 / 1.23e6)
    done = {(r["arm"], r["size"], r["seed"], r["tokens"]) for r in main if r["arm"] != "fp8_blockwise"}
    text = rep._budget_text(done)
    assert "main 33 of 36 runs done, 0.6 h left (~2 sessions)" in text  # 2,018 s: more than one session
    assert "horizon runs of 1,062 M tokens take 694–965 s alone" in text
    assert "size runs of 482 M tokens take 412–606 s alone" in text and "do not end within" not in text
    size = plan_runs("size", lr=1.0)
    assert rep._run_seconds(next(r for r in size if r["arm"] == "nvfp4")) == pytest.approx(482e6 / 795e3)
    bf16 = next(r for r in size if r["arm"] == "bf16")
    assert rep._run_seconds(bf16) == pytest.approx(482e6 / 1.17e6)
    no_sr = next(r for r in size if r["arm"] == "nvfp4_no_sr")
    assert rep._run_seconds(no_sr) == pytest.approx(482e6 / (1.12e6 * 795e3 / 1.10e6))
    one = done | {(r["arm"], r["size"], r["seed"], r["tokens"]) for r in fp8[:2]}
    assert "main 35 of 36 runs done, 0.2 h left (~1 session)" in rep._budget_text(one)
    everything = done | {(r["arm"], r["size"], r["seed"], r["tokens"]) for r in fp8}
    assert "main: all 36 runs done;" in rep._budget_text(everything) and "0.0 h" not in rep._budget_text(everything)
    assert rep._holm_text(1) == "" and "1 − 0.95^5 = 23 %" in rep._holm_text(5)


def test_two_finished_records_of_one_run_are_refused_not_one_silently_kept(tmp_path):
    """The same (arm, seed, size, budget) finished in two plans' folders used to let the later file replace the
    earlier one in every paired gap; it is one clear error naming both files."""
    from studies.campaign.report import load_runs

    for plan, final in (("main", 1.0), ("size", 1.2)):
        (tmp_path / plan).mkdir()
        _fake_run(tmp_path / plan, "bf16", 0, final)
    with pytest.raises(ValueError, match=r"two finished runs of arm bf16, seed 0.*main.*size"):
        load_runs(tmp_path)
    _fake_run(tmp_path / "size", "bf16", 0, 1.2, status="stopped")  # an unfinished copy is no conflict
    assert len(load_runs(tmp_path)[1]) == 2


def test_also_queues_another_plans_runs_in_the_same_command_and_archive(tmp_path, monkeypatch):
    """``--also size=1`` queues the size plan's run 1 after the horizon plan's runs in one command: both train in
    the one train_many call, each under its own plan's folder; the ledger entry names both; the one archive
    (named after --plan) holds both folders.  A done run of --also is skipped; a malformed --also, a run named
    twice (by --also, or by --runs and --also), or --also with --gpus, is refused before anything runs."""
    import tarfile

    from studies.campaign import batch, data

    calls = []

    def fake_many(specs, *, parallel, on_done, **kw):
        calls.append([(s["out"].name, s["arm"], s["size"]) for s in specs])
        for s in specs:
            rid = crun.run_id(s["arm"], s["seed"], s["size"], s["tokens"])
            s["out"].mkdir(parents=True, exist_ok=True)
            rec = {"run": rid, "status": "done", "arm": s["arm"], "seed": s["seed"], "size": s["size"],
                   "tokens_budget": s["tokens"], "tokens_done": s["tokens"], "lr": s["lr"], "seconds_total": 1.0,
                   "device": "cpu"}
            (s["out"] / f"{rid}.json").write_text(json.dumps(rec))
            (s["out"] / f"{rid}.csv").write_text("step\n")
            on_done(s, rec)

    monkeypatch.setattr(crun, "train_many", fake_many)
    monkeypatch.setattr(data, "python_sources", lambda holdout=None: "corpus")
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"size/s20m-bf16-s0-t482m": {"status": "done"}}))
    argv = ["--plan", "horizon", "--runs", "1", "--also", "size=1,0", "--work", str(tmp_path / "w"), "--out",
            str(tmp_path / "o"), "--parallel", "1", "--streams", "--manifest", str(man)]
    batch.main(argv)
    assert calls == [[("horizon", "nvfp4", "s10m"), ("size", "nvfp4", "s20m")]]  # size run 0 (BF16) was done
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["horizon.tar"]
    with tarfile.open(tmp_path / "o" / "horizon.tar") as tf:
        names = sorted(tf.getnames())
        tf.extractall(tmp_path / "x", filter="data")
    assert names == ["horizon/ledger.json", "horizon/s10m-nvfp4-s0-t1062m.csv", "horizon/s10m-nvfp4-s0-t1062m.json",
                     "size/s20m-nvfp4-s0-t482m.csv", "size/s20m-nvfp4-s0-t482m.json"]
    entry = json.loads((tmp_path / "x" / "horizon" / "ledger.json").read_text())
    assert entry["result"] == {"horizon/s10m-nvfp4-s0-t1062m": "done", "size/s20m-nvfp4-s0-t482m": "done"}
    upd = batch.update_manifest(tmp_path / "x", man)
    assert upd["size/s20m-nvfp4-s0-t482m"]["status"] == "done" and "horizon/s10m-nvfp4-s0-t1062m" in upd
    for bad, msg in ((["--also", "size"], "expected PLAN=RUNS"), (["--also", "nope=1"], "expected PLAN=RUNS"),
                     (["--also", "size=9"], "past the plan"), (["--also", "size=1", "--also", "size=1"], "twice"),
                     (["--also", "horizon=2"], "twice"),
                     (["--also", "size=1", "--gpus", "2"], "one plan per command")):
        with pytest.raises(SystemExit, match=msg):
            batch.main(["--plan", "horizon", "--runs", "2", *bad, "--work", str(tmp_path / "w"), "--out",
                        str(tmp_path / "o2"), "--streams", "--manifest", str(man)])
    assert len(calls) == 1 and not (tmp_path / "o2").exists()


def test_the_todo_list_packs_every_left_run_into_sessions_and_its_commands_run_exactly_those(tmp_path):
    """``python -m studies.campaign.spend``: from a manifest, the runs not done (a partial run costed from zero),
    packed first-fit by decreasing length into queues of at most SESSION_S; with the horizon plan's eight runs and
    the size plan's six recipe runs left that is 7 sessions, where one plan per session needs 9 (no two of the
    recipe's horizon runs fit one, each fits beside a size run).  Each queue's printed command, parsed by the batch
    driver's own rules, selects exactly the queue's runs."""
    import shlex

    from studies.campaign import batch, spend

    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"horizon/s10m-bf16-s0-t1062m": {"status": "done"},
                               "horizon/s10m-nvfp4-s0-t1062m": {"status": "partial", "tokens_done": 611_123_200},
                               **{f"size/s20m-bf16-s{s}-t482m": {"status": "done"} for s in range(3)}}))
    left = spend.todo("horizon", man) + spend.todo("size", man)
    assert len(left) == 14 and left[0]["key"] == "horizon/s10m-nvfp4-s0-t1062m"
    assert left[0]["seconds"] == pytest.approx(1_062e6 / 1.10e6)  # the partial run is costed from zero
    queues = spend.session_queues(left)
    assert len(queues) == 7
    assert sum(len(spend.session_queues(spend.todo(p, man))) for p in ("horizon", "size")) == 9  # one plan each
    assert sorted(t["key"] for q in queues for t in q) == sorted(t["key"] for t in left)
    assert all(sum(t["seconds"] for t in q) <= spend.SESSION_S for q in queues)
    for q in queues:
        cmd = shlex.split(spend.queue_command(q).split("; ", 1)[1].split(" 2>&1")[0])
        args = cmd[cmd.index("studies.campaign.batch") + 1:]
        plan = args[args.index("--plan") + 1]
        runs = plan_runs_of(plan)
        got = [batch.run_key(plan, runs[i]) for i in batch.select_indices(len(runs), args[args.index("--runs") + 1])]
        also = [args[i + 1] for i, w in enumerate(args) if w == "--also"]
        got += [batch.run_key(p, r) for p, r in batch._also_runs(also, None)]
        assert got == [t["key"] for t in sorted(q, key=lambda t: t["plan"] != plan)]
    text = spend.todo_text(("horizon", "size"), man)
    assert "7 session(s)" in text and "size: 6 of 9 runs left" in text
    assert "partial at 611 M tokens; restarts from zero" in text


def plan_runs_of(plan):
    from studies.campaign.batch import plan_runs

    return plan_runs(plan)
