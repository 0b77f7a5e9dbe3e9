"""An independent audit of study 8's campaign numbers (issue 20): every figure that reports/training/section.md
states about the paired-seed campaign is derived again here from the committed raw data only (the run CSVs and
JSONs, the manifest and the ledger under studies/data/campaign/), with this file's own code (scipy's Student t,
numpy), and compared with the committed report.  The semantics are checked on the raw data too (a pair's losses
at the same token count, the same seed ids on both sides, partial runs left out, units), and the renderer is run
on synthetic data in tmp_path for cases the committed data does not exercise yet.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "studies" / "data" / "campaign"
SECTION = ROOT / "reports" / "training" / "section.md"
NOTES = ROOT / "docs" / "notes.md"  # the campaign's state (Measurements and history)
PLAN_DIRS = ("main", "horizon", "size")  # the plans' runs; the sweep and the probes are reported on their own
#: arm name → label as the report prints it (checked against studies.campaign.arms below)
LABELS = {"bf16": "BF16", "nvfp4": "NVFP4 recipe", "nvfp4_no_sr": "NVFP4 − SR", "nvfp4_no_rht": "NVFP4 − RHT",
          "nvfp4_no_2d": "NVFP4 − 2D weights", "nvfp4_all": "NVFP4 every block", "nvfp4_fwd": "NVFP4 forward only",
          "nvfp4_bwd": "NVFP4 backward only", "mxfp4": "MXFP4 recipe", "fp8_blockwise": "FP8 blockwise",
          "nvfp4_46": "NVFP4 + four-over-six", "nvfp4_late_bf16": "NVFP4, BF16 for the last 18 % of tokens"}
#: (component, arm without it, arm with it): the gap is without − with; the paper says each component helps
COMPONENTS = (("stochastic rounding of gradients", "nvfp4_no_sr", "nvfp4"),
              ("random Hadamard transform (Wgrad)", "nvfp4_no_rht", "nvfp4"),
              ("16×16 2-D weight scaling", "nvfp4_no_2d", "nvfp4"),
              ("last ~15 % of blocks in BF16", "nvfp4_all", "nvfp4"),
              ("four-over-six block scales", "nvfp4", "nvfp4_46"),
              ("BF16 for the last 18 % of tokens", "nvfp4", "nvfp4_late_bf16"))


# ---------------------------------------------------------------------------------------------------- raw data
def _records(dirs=PLAN_DIRS) -> list[tuple[dict, pd.DataFrame]]:
    out = []
    for d in dirs:
        for js in sorted((DATA / d).rglob("*.json")):
            rec = json.loads(js.read_text())
            rec["_key"] = js.relative_to(DATA).with_suffix("").as_posix()  # the manifest's key
            out.append((rec, pd.read_csv(js.with_suffix(".csv"))))
    return out


def _finals() -> dict[tuple[str, int], dict[str, dict[int, tuple[int, float]]]]:
    """(size, budget) → arm → seed → (tokens of the last evaluation, loss there), done runs only."""
    out: dict = {}
    for rec, df in _records():
        if rec["status"] != "done":
            continue
        ev = df.dropna(subset=["val_loss"])
        out.setdefault((rec["size"], rec["tokens_budget"]), {}).setdefault(rec["arm"], {})[rec["seed"]] = (
            int(ev.tokens.iloc[-1]), float(ev.val_loss.iloc[-1]))
    return out


def _t_gap(arm: dict, base: dict) -> tuple[float, float, float, list[int], list[float]]:
    """(mean, lo, hi, seeds, differences) of arm − base over their common seeds, t with n − 1 dof."""
    seeds = sorted(set(arm) & set(base))
    d = np.array([arm[s][1] - base[s][1] for s in seeds])
    n = len(d)
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half), seeds, list(d)


def _power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test of the differences: P(|T| > t(1 − α/2, n − 1)) for T noncentral t
    with n − 1 degrees of freedom and noncentrality effect·√n/sd (the upper tail of each side taken with
    ``sf``)."""
    t, nc = stats.t.ppf(1 - alpha / 2, n - 1), effect * math.sqrt(n) / sd
    return float(stats.nct.sf(t, n - 1, nc) + stats.nct.sf(t, n - 1, -nc))


def _seeds_needed(d: list[float], alpha: float = 0.05):
    """The fewest seeds n with 80 % power at the sample's mean and standard deviation (a bisection over n, the
    power rising with n)."""
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    lo, hi = 1, 2
    while _power(mean, sd, hi, alpha) < 0.8:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _power(mean, sd, mid, alpha) < 0.8:
            lo = mid
        else:
            hi = mid
    return hi


def _detectable(d: list[float], alpha: float = 0.05) -> float:
    """The true mean gap at which the test has 80 % power, at the sample's n and standard deviation."""
    from scipy.optimize import brentq

    sd, n = float(np.std(d, ddof=1)), len(d)
    return float(brentq(lambda e: _power(e, sd, n, alpha) - 0.8, 0.0, 100 * sd, xtol=1e-14))


def _p(d: list[float]) -> float:
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def _holm(ps: list[float]) -> list[float]:
    order, m, out, run = sorted(range(len(ps)), key=lambda i: ps[i]), len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (m - rank) * ps[i]))
        out[i] = run
    return out


def _ledger() -> list[dict]:
    return json.loads((DATA / "sessions.json").read_text())


# --------------------------------------------------------------------------------------------- the report's text
def _section() -> str:
    return SECTION.read_text()


def _table(text: str, caption: str) -> list[dict[str, str]]:
    """The Markdown table that follows the paragraph starting with ``caption``, as rows of cells."""
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(caption))
    i = next(j for j in range(at + 1, len(lines)) if lines[j].startswith("|"))
    body = []
    for ln in lines[i:]:
        if not ln.startswith("|"):
            break
        body.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]])
    head, rows = body[0], body[2:]
    return [dict(zip(head, r)) for r in rows]


def _para(text: str, start: str) -> str:
    return next(p for p in text.split("\n\n") if p.startswith(start))


def _f4(x: float) -> str:
    return f"{x:+.4f}"


def _ci(lo: float, hi: float) -> str:
    return f"[{_f4(lo)}, {_f4(hi)}]"


# ------------------------------------------------------------------------------------------ semantics of the data
def test_the_raw_records_agree_with_their_curves_and_the_manifest_and_units_are_bytes():
    """Each run's JSON matches its CSV (tokens done = the last logged token count) and the manifest; the model
    is byte-level (vocabulary 256, so a token is a byte and nats per token are nats per byte, as labelled)."""
    man = json.loads((DATA / "manifest.json").read_text())
    n = 0
    for rec, df in _records((*PLAN_DIRS, "lr_sweep", "probe_alone", "probe_parallel6")):
        key = rec["_key"]
        for f in ("arm", "seed", "size", "tokens_budget", "tokens_done", "status", "seconds_total"):
            assert man[key][f] == rec[f], (rec["run"], f)
        assert int(df.tokens.iloc[-1]) == rec["tokens_done"]
        assert df.step.is_unique and df.tokens.is_monotonic_increasing
        assert rec.get("config", {"vocab": 256})["vocab"] == 256
        assert (df.tokens == df.step * rec.get("batch", 64) * 512).all()  # tokens are bytes: 64 × 512 per step
        n += 1
    assert n == len(man) == 50


def test_every_pair_is_taken_at_the_same_token_count_on_the_same_seed_ids():
    """Within a (size, budget) every done run ends with an evaluation at its last step and the same token count
    (so arm − BF16 compares equal training), evaluates at the same 20 token counts, and every arm of the main plan
    has exactly BF16's seeds {0, 1, 2}."""
    fin = _finals()
    assert set(fin) == {("s10m", 265_000_000), ("s10m", 1_062_000_000), ("s20m", 482_000_000)}
    for group, arms in fin.items():
        ends = {t for seeds in arms.values() for t, _ in seeds.values()}
        assert len(ends) == 1, group
    assert fin[("s10m", 265_000_000)].keys() == LABELS.keys()
    assert all(set(s) == {0, 1, 2} for s in fin[("s10m", 265_000_000)].values())
    grids = {(rec["size"], rec["tokens_budget"], tuple(df.dropna(subset=["val_loss"]).tokens))
             for rec, df in _records() if rec["status"] == "done"}
    assert len(grids) == 3 and all(len(g[2]) == 20 for g in grids)
    # and the recorded batch and model are one per group: the same steps, batch and parameter count
    shapes = {(rec["size"], rec["tokens_budget"], rec["steps"], rec["batch"], rec["non_embedding_params"])
              for rec, _ in _records() if rec["status"] == "done"}
    assert len(shapes) == 3


def test_partial_runs_stay_out_of_every_final_loss_and_are_named():
    """The recipe's horizon seed 0 stopped at 611 M of 1,062 M tokens (last evaluation 0.6626 at 584 M): no final
    loss or gap of the 1,062 M budget uses it, and the report names it as not finished."""
    partial = [rec for rec, _ in _records() if rec["status"] != "done"]
    assert [(r["run"], r["tokens_done"]) for r in partial] == [("s10m-nvfp4-s0-t1062m", 611_123_200)]
    text = _section().split("The ledger, one row per device command")[0]  # the ledger tells its story apart
    assert "Not finished: s10m-nvfp4-s0-t1062m." in text
    assert "Paired gaps to BF16, s10m, 1062 M tokens" not in text and "0.6626" not in text
    assert "campaign_gap_vs_tokens.png" not in text  # one seed at 1,062 M: no gap against tokens yet
    assert "neither has such runs yet" in text


# ------------------------------------------------------------------------------------------ the report's numbers
def test_the_paired_gap_table_is_the_t_interval_of_the_per_seed_differences():
    fin = _finals()[("s10m", 265_000_000)]
    rows = {r["arm"]: r for r in _table(_section(), "Paired gaps to BF16, s10m, 265 M tokens")}
    assert set(rows) == {LABELS[a] for a in fin if a != "bf16"}
    for arm in fin:
        if arm == "bf16":
            continue
        mean, lo, hi, seeds, d = _t_gap(fin[arm], fin["bf16"])
        r = rows[LABELS[arm]]
        assert r["seeds"] == str(len(seeds)) == "3"
        assert r["gap vs BF16 (nats/byte)"] == _f4(mean) and r["95 % CI"] == _ci(lo, hi)
        assert r["per seed"] == ", ".join(f"s{s}: {_f4(x)}" for s, x in zip(seeds, d))
        # the check tells the paired t-interval from the ones a slip would give: the normal 1.96 and the unpaired
        # (Welch) interval of the two arms' means both print other bounds on every arm
        z = 1.959964 * np.std(d, ddof=1) / math.sqrt(3)
        a_, b_ = (np.array([v for _, v in fin[k].values()]) for k in (arm, "bf16"))
        se = math.sqrt(a_.var(ddof=1) / 3 + b_.var(ddof=1) / 3)
        nu = se ** 4 / ((a_.var(ddof=1) / 3) ** 2 / 2 + (b_.var(ddof=1) / 3) ** 2 / 2)
        welch = stats.t.ppf(0.975, nu) * se
        assert r["95 % CI"] != _ci(mean - z, mean + z) and r["95 % CI"] != _ci(mean - welch, mean + welch)


def test_the_component_table_gaps_verdicts_and_seeds_needed():
    """Each component's gap, t-interval, p-value, Holm-corrected p over the six, the gap detectable at 80 % power
    (at α = 0.05 and at 0.05/6) and the verdict's seed counts for 80 % power, recomputed here: none is resolved after
    the correction (the late switch's p 0.026 becomes 0.15), and the seed counts are those of issue 46 (SR 28, RHT
    25, 2-D 5, BF16 tail 4, four-over-six ~11,500, computed at 80 % power, not as the fewest seeds whose interval
    would exclude zero, which said 16, 14, 4, 4, > 1000)."""
    fin = _finals()[("s10m", 265_000_000)]
    rows = {r["component"]: r for r in _table(_section(), "Recipe components, s10m, 265 M tokens")}
    assert list(rows) == [c[0] for c in COMPONENTS]
    diffs = {name: _t_gap(fin[w], fin[c]) for name, w, c in COMPONENTS}
    holm = dict(zip(diffs, _holm([_p(g[4]) for g in diffs.values()])))
    k = len(rows)
    for name, (mean, lo, hi, seeds, d) in diffs.items():
        r = rows[name]
        assert r["claim"] == "helps" and r["gap (nats/byte)"] == _f4(mean) and r["95 % CI"] == _ci(lo, hi)
        assert r["per seed"] == ", ".join(f"s{s}: {_f4(x)}" for s, x in zip(seeds, d))
        assert r["p"] == f"{_p(d):.2g}" and r["Holm p"] == f"{holm[name]:.2g}"
        assert r[f"detectable (80 % power; α/{k})"] == f"{_detectable(d):.4f}; {_detectable(d, 0.05 / k):.4f}"
        assert holm[name] >= 0.05 and hi >= 0  # none resolved, none contradicted on the committed data
        need, strict = _seeds_needed(d), _seeds_needed(d, 0.05 / k)
        assert r["verdict"].startswith("not resolved at this scale (") and (
            f"needs {need} seeds in a paired t-test at α = 0.05 and {strict} at α = 0.05/{k}") in r["verdict"]
    assert [_seeds_needed(diffs[n][4]) for n in rows] == [28, 25, 5, 4, 11532, 3]
    late = diffs["BF16 for the last 18 % of tokens"]
    assert late[1] > 0 and f"{_p(late[4]):.2g}" == "0.026"
    assert f"{holm['BF16 for the last 18 % of tokens']:.2g}" == "0.15"
    assert "p 0.026 alone, 0.15 after the Holm correction over 6 components" in rows[
        "BF16 for the last 18 % of tokens"]["verdict"]
    assert rows["four-over-six block scales"]["claimed by"] == "Cook et al. 2025, Four Over Six; not NVIDIA's paper"
    assert {rows[n]["claimed by"] for n in rows if n != "four-over-six block scales"} == {"NVIDIA's NVFP4 paper"}
    assert f"with {k} intervals and no real effect" in _section()
    assert f"1 − 0.95^{k} = {100 * (1 - 0.95 ** k):.0f} %" in _section()


def test_the_headline_numbers():
    """Study 8's measured and verdict paragraphs: run count, model size, tokens per parameter, BF16's mean final
    loss, every arm's gap phrase with its 80 %-power detectable gap, the recipe's bound, NVFP4 − FP8 (the paper's
    headline), the component lists after the Holm correction, the late switch's caveats, the split by pass with the
    paired forward − backward difference (its interval includes zero, so no pass is said to carry the gap) and the
    formats, with what the MXFP4 arm changes besides the format."""
    fin = _finals()[("s10m", 265_000_000)]
    recs = {r["run"]: r for r, _ in _records(("main",))}
    measured, verdict = _para(_section(), "**Measured by fpsim.**"), _para(_section(), "**Verdict.**")
    n_done = sum(r["status"] == "done" for r in recs.values())
    assert f"All {n_done} main runs" in measured and n_done == 36
    params = {r["non_embedding_params"] for r in recs.values()}
    assert len(params) == 1 and f"{params.pop() / 1e6:.1f} M non-embedding" in measured
    assert "265 M tokens (25 per parameter)" in measured and round(265e6 / 10_621_824) == 25
    base = np.mean([v for _, v in fin["bf16"].values()])
    assert f"BF16's final validation loss: {base:.4f} nats/byte (mean of 3 seeds)" in measured
    gaps = {a: _t_gap(fin[a], fin["bf16"]) for a in fin if a != "bf16"}
    for a, (mean, lo, hi, seeds, d) in gaps.items():
        assert (f"{LABELS[a]} {_f4(mean)} {_ci(lo, hi)} ({100 * mean / base:+.1f} %, {len(seeds)} seeds; detectable "
                f"{_detectable(d):.4f})") in measured
    mean, lo, hi, *_ = gaps["nvfp4"]
    assert lo < 0 < hi
    assert (f"The recipe's gap to BF16 ({_f4(mean)} nats/byte, {100 * mean / base:+.1f} %) is not distinguishable "
            f"from zero with 3 seeds; at 95 % confidence it trails BF16 here by less than {_f4(hi)} "
            f"({100 * hi / base:+.1f} %)") in verdict
    assert gaps["nvfp4_all"][1] > 0 and f"NVFP4 on every block is behind BF16 ({_f4(gaps['nvfp4_all'][0])}" in verdict
    f8r = _t_gap(fin["nvfp4"], fin["fp8_blockwise"])
    f8base = np.mean([v for _, v in fin["fp8_blockwise"].values()])
    assert f8r[1] < 0 < f8r[2]
    assert ("The NVFP4 paper's headline comparison is NVFP4 against FP8" in verdict and
            "here the recipe − FP8 blockwise" in verdict and
            f"= {_f4(f8r[0])} {_ci(f8r[1], f8r[2])} nats/byte ({100 * f8r[0] / f8base:+.1f} % of FP8's loss, p "
            f"{_p(f8r[4]):.2g}, 3 seeds; detectable at 80 % power: {_detectable(f8r[4]):.4f}), not distinguishable "
            f"from zero" in verdict)
    comp = {n: _t_gap(fin[w], fin[c]) for n, w, c in COMPONENTS}
    assert ("Of the 6 recipe components with an interval (Holm-corrected p below 0.05 over the 6), none is resolved; "
            "not resolved at this scale: stochastic rounding of gradients, random Hadamard transform (Wgrad), 16×16 "
            "2-D weight scaling, last ~15 % of blocks in BF16, four-over-six block scales (claimed by Cook et al. "
            "2025, Four Over Six; not NVIDIA's paper), BF16 for the last 18 % of tokens (p 0.026 alone, 0.15 after "
            "the correction).") in verdict and len(comp) == 6
    assert "resolved in the paper's direction" not in verdict and "carries the measurable part" not in verdict
    fwd, bwd = gaps["nvfp4_fwd"], gaps["nvfp4_bwd"]
    assert fwd[1] > 0 and bwd[1] < 0 < bwd[2]
    assert (f"NVFP4 in the forward pass alone costs {_f4(fwd[0])} (interval above zero), in the backward pass alone "
            f"{_f4(bwd[0])} (interval across zero)") in verdict
    fb = _t_gap(fin["nvfp4_fwd"], fin["nvfp4_bwd"])
    assert fb[1] < 0 < fb[2] and _ci(fb[1], fb[2]) == "[-0.0038, +0.0160]"  # issue 46's figure
    assert (f"forward − backward, paired per seed: {_f4(fb[0])} {_ci(fb[1], fb[2])} (p {_p(fb[4]):.2g}, detectable "
            f"at 80 % power: {_detectable(fb[4]):.4f}), an interval that includes zero, so these runs do not tell "
            f"which pass costs more.") in verdict
    assert ("1×32 blocks instead of 16×16 tiles" in verdict and "32-point RHT with per-layer seeded signs" in verdict
            and "E8M0" in verdict and "not the format's alone" in verdict)
    mx = _t_gap(fin["mxfp4"], fin["nvfp4"])
    assert mx[1] > 0 and f"MXFP4's recipe − NVFP4's: {_f4(mx[0])} {_ci(mx[1], mx[2])} (interval above zero" in verdict
    assert f"(interval above zero, detectable at 80 % power: {_detectable(mx[4]):.4f}; the paper's" in verdict
    f8 = gaps["fp8_blockwise"]
    assert (f"FP8 blockwise − BF16: {_f4(f8[0])} {_ci(f8[1], f8[2])} (interval across zero, detectable at 80 % "
            f"power: {_detectable(f8[4]):.4f})") in verdict


def _how(rec: dict) -> str:
    steps = "graph steps" if rec.get("cuda_graph") else "eager steps"
    n = rec.get("side_by_side")
    return f"{n} on streams, {steps}" if n else f"separate processes (see the ledger), {steps}"


def test_throughput_counts_the_training_steps_rate_of_each_row_of_runs():
    """Each row pools the done runs of one arm, size and way of sharing the GPU; its figure is the median of the
    tokens/s logged over the training steps (each run's first log, with the start-up, left out).  The rates logged
    at the validation points alone are not that: in a batch on streams one run's window at an evaluation also
    spans its partner's validation pass (the runs evaluate at the same steps), which pulled e.g. four-over-six
    seed 0's median from 273 k to 203 k tokens/s and MXFP4 seed 0's from 605 k to 395 k."""
    want: dict = {}
    for rec, df in _records():
        if rec["status"] != "done":
            continue
        key = (LABELS[rec["arm"]], rec["size"], _how(rec))
        want.setdefault(key, []).append(df.tokens_per_s.iloc[1:])
    rows = _table(_section(), "Training throughput")
    got = {(r["arm"], r["size"], r["how the batch ran"]): r for r in rows}
    assert set(got) == set(want) and len(rows) == len(want)
    for key, parts in want.items():
        assert got[key]["runs"] == str(len(parts))
        assert got[key]["tokens/s (median)"] == f"{float(pd.concat(parts).median()):.0f}", key
    # how a batch ran, from the ledger: the command that finished a run had --parallel N = its side_by_side
    for c in _ledger():
        if isinstance(c["result"], dict):
            par = int(re.search(r"--parallel (\d+)", c["command"]).group(1))
            for run, status in c["result"].items():
                rec = json.loads((DATA / f"{run}.json").read_text()) if status == "done" else None
                if rec is not None and "--streams" in c["command"]:
                    assert rec["side_by_side"] == par, run


def test_run_time_and_device_time_from_the_records_and_the_ledger():
    recs = [r for r, _ in _records()]
    run_h = sum(r["seconds_total"] for r in recs) / 3600
    text = _section()
    # the sum covers the plans' runs only (the sweep's and probes' 0.72 h are not in it), partial ones included
    others = sum(r["seconds_total"] for r, _ in _records(("lr_sweep", "probe_alone", "probe_parallel6"))) / 3600
    assert f"{others:.2f}" == "0.72" and f"{run_h:.2f}" == "6.70"
    assert (f"Run time summed over the committed runs of the main, horizon and size plans (the sweep and the probes "
            f"apart; a run's time is that of its kept curve, every call of it): {run_h:.2f} h") in text
    walls = [c["wall_s"] for c in _ledger()]
    known = [w for w in walls if w is not None]
    assert (len(walls), len(known)) == (48, 45)
    assert (f"{sum(known) / 3600:.2f} h over {len(known)} commands, plus {len(walls) - len(known)} command(s) whose "
            f"machine was taken back") in text
    measured = _para(text, "**Measured by fpsim.**")
    assert f"{sum(known) / 3600:.1f} h of device time" in measured
    rows = _table(text, "The ledger, one row per device command")
    assert len(rows) == len(walls)
    assert [r["wall s"] for r in rows] == ["" if w is None else f"{w:.0f}" for w in walls]
    assert [r["date"] for r in rows] == [c["date"] for c in _ledger()]


def test_the_sweep_probe_and_first_look_tables():
    sweep = {r["learning rate"]: r for r in _table(_section(), "Learning-rate sweep")}
    for rec, df in _records(("lr_sweep",)):
        r, ev = sweep[f"{rec['lr']:g}"], df.dropna(subset=["val_loss"])
        assert r["tokens"] == f"{rec['tokens_done']:,}" and r["run wall s"] == f"{rec['seconds_total']:.0f}"
        assert r["final val loss"] == f"{ev.val_loss.iloc[-1]:.4f}" and r["best val loss"] == f"{ev.val_loss.min():.4f}"
    best = min(sweep.values(), key=lambda r: float(r["final val loss"]))["learning rate"]
    assert best == "0.002" and "The lowest final loss is at 0.002" in _section()
    probe = _table(_section(), "Throughput probes")
    got = [(r["arm"], r["runs side by side"], r["tokens/s (median)"], r["tokens done"]) for r in probe]
    want = [(LABELS[rec["arm"]], "6" if "parallel6" in str(df) or rec.get("tokens_budget") != 6_553_600 else "1",
             f"{df.tokens_per_s.iloc[1:].median():.0f}", f"{rec['tokens_done']:,}")
            for rec, df in _records(("probe_alone", "probe_parallel6"))]
    assert got == want
    curves = {LABELS[rec["arm"]]: df.dropna(subset=["val_loss"]) for rec, df in _records(("probe_parallel6",))}
    common = min(int(c.tokens.max()) for c in curves.values())
    first = {r["arm"]: r for r in _table(_section(), "A first look")}
    assert f"at {common / 1e6:.1f} M tokens" in _section() and common == 66_256_896
    at = {k: float(c[c.tokens == common].val_loss.iloc[0]) for k, c in curves.items()}
    for k, v in at.items():
        assert first[k]["val loss"] == f"{v:.4f}" and first[k]["− BF16"] == f"{v - at['BF16']:.4f}"


def test_the_remaining_budget_at_the_stated_rates():
    """Hours left per plan from the plan's runs not done, at the rates the text states (tokens/s alone; at s20m
    an unmeasured arm at its s10m rate × the recipe's s20m/s10m ratio), and sessions of ~1,650 s of runs: a run
    does not cross sessions, so no fewer sessions than the summed time needs, nor than the runs longer than half a
    session (no two of those share one); here that bound is reached, per plan and with the plans packed together."""
    from studies.campaign.batch import plan_runs

    text = _section()
    s10 = {"bf16": 1.53e6, "nvfp4": 1.10e6, "nvfp4_no_sr": 1.12e6}
    s20 = {"bf16": 1.17e6, "nvfp4": 795e3}
    assert "BF16 1.53 M, NVFP4 recipe 1.10 M, NVFP4 − SR 1.12 M" in text
    assert "s20m BF16 1.17 M, NVFP4 recipe 0.80 M" in text
    done = {(r["arm"], r["size"], r["seed"], r["tokens_budget"]) for r, _ in _records() if r["status"] == "done"}
    def secs(r):
        return r["tokens"] / (s20.get(r["arm"], s10[r["arm"]] * 795e3 / 1.10e6) if r["size"] == "s20m"
                              else s10[r["arm"]])

    def bound(left):
        return max(math.ceil(sum(map(secs, left)) / 1650), sum(secs(r) > 1650 / 2 for r in left))

    every = []
    for plan, n_done, hours, sessions in (("horizon", 1, "2.0", 6), ("size", 3, "1.0", 3)):
        runs = plan_runs(plan, lr=1.0)
        left = [r for r in runs if (r["arm"], r["size"], r["seed"], r["tokens"]) not in done]
        every += left
        sec = sum(map(secs, left))
        assert len(runs) - len(left) == n_done and f"{sec / 3600:.1f}" == hours and bound(left) == sessions
        assert f"{plan} {n_done} of {len(runs)} runs done, {hours} h left (~{sessions} sessions)" in text
    assert "main: all 36 runs done" in text
    assert f"the runs left take {bound(every)} sessions" in text and bound(every) == 7


def test_the_docs_campaign_paragraph_states_the_reports_numbers():
    fin = _finals()
    main = fin[("s10m", 265_000_000)]
    readme = " ".join(NOTES.read_text().split())
    for arm, words in (("nvfp4", "the recipe"), ("nvfp4_all", "every block"), ("mxfp4", "MXFP4"),
                       ("nvfp4_fwd", "forward only"), ("nvfp4_bwd", "backward only"),
                       ("nvfp4_no_2d", "without 2-D weights"), ("nvfp4_no_rht", "without RHT"),
                       ("fp8_blockwise", "FP8 blockwise"), ("nvfp4_46", "four-over-six")):
        mean, lo, hi, *_ = _t_gap(main[arm], main["bf16"])
        assert f"{words} {_f4(mean)} {_ci(lo, hi)}" in readme, arm
    mean, lo, hi, *_ = _t_gap(main["mxfp4"], main["nvfp4"])
    assert f"MXFP4 − NVFP4 recipe: {_f4(mean)} {_ci(lo, hi)}" in readme
    mean, lo, hi, *_ = _t_gap(main["nvfp4"], main["nvfp4_late_bf16"])
    assert f"recipe − switched: {_f4(mean)} {_ci(lo, hi)}" in readme
    mean, lo, hi, *_ = _t_gap(main["nvfp4"], main["nvfp4_46"])
    assert f"four-over-six ({_f4(mean)} {_ci(lo, hi)})" in readme
    assert mean < 0 and "four-over-six's mean is on the wrong side, so more seeds would contradict it" in readme
    assert f"1,062 M tokens: {fin[('s10m', 1_062_000_000)]['bf16'][0][1]:.4f} nats/byte" in readme
    big = fin[("s20m", 482_000_000)]["bf16"]
    mean, lo, hi, *_ = _t_gap(big, main["bf16"])
    assert len(big) == 3 and f"482 M tokens: {np.mean([v[1] for v in big.values()]):.4f} nats/byte, {_f4(mean)} " \
        f"{_ci(lo, hi)} from the main BF16 on the same seeds" in readme
    assert "all 36 main runs" in readme and "reached 611 M tokens" in readme
    # "two runs side by side sum to no more than 1.25 M": the pairs one command took from zero to done (a kept
    # curve whose run time fits in the command), both runs' tokens over the command's wall time
    sums = []
    for c in _ledger():
        res = c["result"] if isinstance(c["result"], dict) else {}
        recs = [json.loads((DATA / f"{k}.json").read_text()) for k in res]
        if "--parallel 2" in c["command"] and len(recs) == 2 and all(
                r["status"] == "done" and r["seconds_total"] <= c["wall_s"] for r in recs):
            sums.append(sum(r["tokens_done"] for r in recs) / c["wall_s"])
    assert len(sums) == 8 and f"{max(sums) / 1e6:.2f}" == "1.25"
    assert "sum to no more than 1.25 M over a command's wall time" in readme


def test_the_labels_here_are_the_arms_of_the_code():
    from studies.campaign.arms import ARMS
    from studies.campaign.arms import COMPONENTS as CODE

    assert {a: ARMS[a].label for a in ARMS} == LABELS
    assert [(n, w, c) for n, w, c, claim in CODE] == list(COMPONENTS) and {c[3] for c in CODE} == {"helps"}


def test_the_figures_plot_the_mean_band_and_paired_gap_at_each_evaluation(tmp_path, monkeypatch):
    """The committed data rendered again with the figures captured: the loss panel's line of each arm is the mean
    over its seeds at each evaluation; the gap panel's line is the mean over seeds of arm − BF16 at the same token
    count (checked on every arm, 20 evaluations each)."""
    from studies.campaign import report as rep
    from studies.common import md_table

    figs = {}
    monkeypatch.setattr(rep, "save_fig", lambda fig, path: figs.__setitem__(Path(path).name, fig))
    rep.render(DATA, tmp_path, md_table)
    loss_ax, gap_ax = figs["campaign_s10m_265m.png"].axes[:2]
    curves = {}
    for rec, df in _records(("main",)):
        ev = df.dropna(subset=["val_loss"])
        curves.setdefault(LABELS[rec["arm"]], {})[rec["seed"]] = ev.set_index("tokens").val_loss
    mean = {k: pd.DataFrame(v).mean(axis=1) for k, v in curves.items()}
    lines = {ln.get_label(): ln for ln in loss_ax.lines}
    gaps = {ln.get_label(): ln for ln in gap_ax.lines if not ln.get_label().startswith("_")}
    assert set(gaps) == set(curves) - {"BF16"}
    for k, m in mean.items():
        assert np.allclose(lines[k].get_xdata(), m.index / 1e6) and np.allclose(lines[k].get_ydata(), m, atol=1e-6)
        if k != "BF16":
            g = pd.DataFrame({s: curves[k][s] - curves["BF16"][s] for s in curves[k]}).mean(axis=1)
            assert np.allclose(gaps[k].get_ydata(), g, atol=1e-6) and len(g) == 20


# ------------------------------------------------------------------ cases the committed data does not exercise yet
def _run(d: Path, arm: str, seed: int, final: float, budget: int = 265_000_000, size: str = "s10m",
         status: str = "done", rates=(300_000.0, 300_000.0), **extra) -> None:
    """A synthetic run as the runner writes it: logs every 50 steps of 64 × 512 tokens, evaluations at four token
    counts ending at the last step; ``rates``: tokens/s logged at the training logs and at the evaluations."""
    steps = budget // (64 * 512)
    ev = {round(steps * (k + 1) / 4) for k in range(4)}
    rows = ["step,tokens,lr,train_loss,val_loss,tokens_per_s"]
    for step in sorted(set(range(50, steps + 1, 50)) | ev):
        vl = f"{final + 0.01 * (steps - step) / steps:.6f}" if step in ev else ""
        rows.append(f"{step},{step * 64 * 512},0.001,1.0,{vl},{rates[step in ev]}")
    rid = f"{size}-{arm}-s{seed}-t{budget // 1_000_000}m"
    (d / f"{rid}.csv").write_text("\n".join(rows) + "\n")
    (d / f"{rid}.json").write_text(json.dumps({"run": rid, "arm": arm, "seed": seed, "size": size,
                                               "tokens_budget": budget, "tokens_done": steps * 64 * 512,
                                               "status": status, "seconds_total": 100.0, **extra}))


def _render(root: Path) -> str:
    from studies.campaign.report import render
    from studies.common import md_table

    return "\n\n".join(render(root, root / "figs", md_table)[0])


def _main_runs(root: Path, gaps=(0.010, 0.012, 0.008), sr=(0.004, 0.006, 0.005), **kw) -> dict:
    d = root / "main"
    d.mkdir(parents=True, exist_ok=True)
    (root / "figs").mkdir(exist_ok=True)
    base = {0: 0.70, 1: 0.71, 2: 0.69}
    for s, b in base.items():
        _run(d, "bf16", s, b, **kw)
        _run(d, "nvfp4", s, b + gaps[s], **kw)
        _run(d, "nvfp4_no_sr", s, b + gaps[s] + sr[s], **kw)
    return base


def test_a_second_budget_with_one_then_two_seeds(tmp_path):
    """One seed at 1,062 M tokens: its table row and component have no interval (and say so), and the gap
    against tokens still waits; two seeds: the interval uses t with 1 degree of freedom (12.706), the budget joins
    the gap-against-tokens table and the per-seed change from the main budget is paired on the same seeds."""
    _main_runs(tmp_path)
    hor = tmp_path / "horizon"
    hor.mkdir()
    _run(hor, "bf16", 0, 0.60, budget=1_062_000_000)
    _run(hor, "nvfp4", 0, 0.615, budget=1_062_000_000)
    _run(hor, "nvfp4_no_sr", 0, 0.625, budget=1_062_000_000)
    text = _render(tmp_path)
    rows = {r["arm"]: r for r in _table(text, "Paired gaps to BF16, s10m, 1062 M tokens")}
    assert rows["NVFP4 recipe"]["seeds"] == "1" and rows["NVFP4 recipe"]["95 % CI"] == "— (1 seed: no interval)"
    comp = _table(text, "Recipe components, s10m, 1062 M tokens")[0]
    assert comp["gap (nats/byte)"] == "+0.0100"
    assert comp["verdict"] == "not resolved at this scale (fewer than two seeds)"
    assert "needs a second budget or size with two or more seeds" in text
    _run(hor, "bf16", 1, 0.62, budget=1_062_000_000)
    _run(hor, "nvfp4", 1, 0.639, budget=1_062_000_000)
    _run(hor, "nvfp4_no_sr", 1, 0.6445, budget=1_062_000_000)
    text = _render(tmp_path)
    d = np.array([0.015, 0.019])
    half = 12.706204736 * d.std(ddof=1) / math.sqrt(2)
    rows = {r["arm"]: r for r in _table(text, "Paired gaps to BF16, s10m, 1062 M tokens")}
    assert rows["NVFP4 recipe"]["95 % CI"] == _ci(d.mean() - half, d.mean() + half) == "[-0.0084, +0.0424]"
    sr = np.array([0.010, 0.0055])
    need = _seeds_needed(list(sr))
    comp = _table(text, "Recipe components, s10m, 1062 M tokens")[0]
    assert comp["gap (nats/byte)"] == _f4(sr.mean()) and f"needs {need} seeds in a paired t-test" in comp["verdict"]
    scale = {(r["tokens"], r["gap"]): r for r in _table(text, "Gap against the token budget")}
    assert scale[("1,062 M", "NVFP4 recipe")]["seeds"] == "2" and scale[("1,062 M", "NVFP4 recipe")][
        "mean (nats/byte)"] == "+0.0170"
    moves = {r["arm"]: r for r in _table(text, "How the gap moves from the main budget")}
    ch = np.array([0.015 - 0.010, 0.019 - 0.012])  # seeds 0 and 1 only: the seeds both budgets ran
    h = 12.706204736 * ch.std(ddof=1) / math.sqrt(2)
    assert moves["NVFP4 recipe"]["seeds"] == "2" and moves["NVFP4 recipe"]["95 % CI"] == _ci(ch.mean() - h,
                                                                                                ch.mean() + h)


def test_an_arm_with_a_seed_bf16_lacks_is_paired_on_the_common_seeds_only(tmp_path):
    base = _main_runs(tmp_path)
    _run(tmp_path / "main", "nvfp4", 3, 0.5)  # seed 3: BF16 has no such run, so it pairs with nothing
    text = _render(tmp_path)
    row = {r["arm"]: r for r in _table(text, "Paired gaps to BF16, s10m, 265 M tokens")}["NVFP4 recipe"]
    d = np.array([0.010, 0.012, 0.008])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert row["seeds"] == "3" and row["95 % CI"] == _ci(d.mean() - half, d.mean() + half)
    assert row["per seed"] == "s0: +0.0100, s1: +0.0120, s2: +0.0080"
    from studies.campaign.report import headline

    measured, _ = headline(tmp_path)
    assert (f"NVFP4 recipe +0.0100 {_ci(d.mean() - half, d.mean() + half)} (+1.4 %, 3 seeds; detectable "
            f"{_detectable(list(d)):.4f})") in measured
    assert len(base) == 3


def test_the_headline_does_not_call_the_known_device_time_that_of_all_commands(tmp_path):
    """The ledger's lost commands have no wall time: the headline's device time covers the commands that reported
    one and says how many were lost, as the section's own sentence does."""
    from studies.campaign.report import headline

    _main_runs(tmp_path)
    (tmp_path / "sessions.json").write_text(json.dumps([
        {"date": "d", "command": "batch a", "wall_s": 3600.0, "result": "done"},
        {"date": "d", "command": "batch b", "wall_s": None, "result": "lost"}]))
    measured, _ = headline(tmp_path)
    assert "in all commands" not in measured
    assert "1.0 h of device time in the 1 command that reported a wall time (1 more lost with its machine)" in measured


def test_a_component_whose_mean_goes_against_the_claim_is_not_said_to_resolve_with_more_seeds():
    """Without four-over-six the recipe ends 0.0002 below it on the committed data: more seeds at that mean would
    exclude 0 below, which contradicts the claim; the verdict must say so rather than count seeds 'to resolve'."""
    from studies.campaign.stats import paired_gap, verdict

    g = paired_gap({0: 0.990, 1: 0.985, 2: 1.003}, {0: 1.0, 1: 1.0, 2: 1.0})  # mean −0.0073, across zero
    assert g.lo < 0 < g.hi
    word = verdict(g, "helps")
    need = _seeds_needed([-0.010, -0.015, 0.003])
    assert word.startswith("not resolved at this scale (") and "contradict" in word and f"{need} seeds" in word
    up = verdict(paired_gap({0: 1.010, 1: 1.015, 2: 0.997}, {0: 1.0, 1: 1.0, 2: 1.0}), "helps")
    assert "contradict" not in up and f"80 % power to exclude 0 at this mean and seed spread needs {need} seeds" in up


def test_throughput_is_not_the_rate_at_the_evaluations(tmp_path):
    """Runs whose logs at the evaluations are slow (a partner's validation pass in the window) and 300 k tokens/s
    at every training log: the row's figure is 300000, not the evaluations' 100000."""
    _main_runs(tmp_path, rates=(300_000.0, 100_000.0), side_by_side=2, cuda_graph=True)
    rows = _table(_render(tmp_path), "Training throughput")
    assert {r["tokens/s (median)"] for r in rows} == {"300000"} and len(rows) == 3


def test_a_command_on_several_gpus_counts_its_gpu_time_once_per_gpu(tmp_path):
    """`batch --gpus 2` keeps two GPUs busy for its wall time, and add_ledger records it as "2 × NVIDIA H200":
    the ledger's sums give the wall time and, apart, the GPU-hours (here 1.00 h of wall time, 1.50 GPU-hours)."""
    from studies.campaign.report import headline

    _main_runs(tmp_path)
    (tmp_path / "sessions.json").write_text(json.dumps([
        {"date": "d", "gpu": "2 × NVIDIA H200", "command": "batch --gpus 2", "wall_s": 1800.0, "result": "done"},
        {"date": "d", "gpu": "NVIDIA H200", "command": "batch b", "wall_s": 1800.0, "result": "done"}]))
    text = _render(tmp_path)
    assert "1.00 h over 2 commands (1.50 GPU-hours: a command on several GPUs counts once per GPU)." in text
    measured, _ = headline(tmp_path)
    assert "1.0 h of device time (1.5 GPU-hours) in all 2 commands." in measured
    assert {r["GPU"] for r in _table(text, "The ledger, one row per device command")} == {"2 × NVIDIA H200",
                                                                                          "NVIDIA H200"}


def test_the_protocol_paragraph_matches_the_recorded_runs():
    """What the protocol says and the records can show: sizes 10.6 M and 19.3 M non-embedding parameters, 25 and
    100 tokens per parameter, batches of 64 × 512, a 2 % linear warmup then cosine to 10 % of the swept 2e-3, and
    20 evaluations evenly spaced (to within one step) ending at the last step."""
    text = _section()
    protocol = _para(text, "**Paired-seed campaign (issue 20): protocol.**")
    assert "10.6 M and 19.3 M non-embedding parameters" in protocol and "at 20 evenly spaced token counts" in protocol
    for rec, df in _records():
        params, steps, budget = rec["non_embedding_params"], rec["steps"], rec["tokens_budget"]
        assert f"{params / 1e6:.1f}" == {"s10m": "10.6", "s20m": "19.3"}[rec["size"]]
        assert round(budget / params) == {("s10m", 265_000_000): 25, ("s10m", 1_062_000_000): 100,
                                          ("s20m", 482_000_000): 25}[(rec["size"], budget)]
        assert rec["batch"] == 64 and rec["config"]["ctx"] == 512 and rec["lr"] == 0.002
        if rec["status"] != "done":
            continue
        warm = 0.02 * steps
        s = df.step.to_numpy() - 1  # the logged lr is the one of the step just run (0-based step - 1)
        up = s < warm
        assert np.allclose(df.lr[up], 0.002 * (s[up] + 1) / warm, rtol=2e-3)
        assert df.lr.max() <= 0.002 + 1e-9 and abs(df.lr.iloc[-1] - 0.0002) < 1e-9
        ev = df.dropna(subset=["val_loss"]).step.to_numpy()
        assert len(ev) == 20 and ev[-1] == steps
        assert np.abs(ev - steps * np.arange(1, 21) / 20).max() <= 1


def test_the_ledger_and_the_records_name_the_same_finished_runs():
    """Every run the ledger's commands report done is a committed done record of the plans, once, and every such
    record was reported done by exactly one command (40: the 36 main runs, one horizon and three size runs)."""
    said = [run for c in _ledger() if isinstance(c["result"], dict)
            for run, status in c["result"].items() if status == "done"]
    have = sorted(r["_key"] for r, _ in _records() if r["status"] == "done")
    assert sorted(said) == have and len(have) == 40


def test_bf16_at_the_other_sizes_and_budgets_before_their_recipe_runs():
    """Until a second (size, budget) has the recipe too, the scaling paragraph states BF16's final loss there and
    its paired change from the main budget's BF16 (same seeds: same data order)."""
    fin = _finals()
    main = fin[("s10m", 265_000_000)]["bf16"]
    text = " ".join(SECTION.read_text().split())
    if sum(len(g.get("nvfp4", {})) >= 2 for g in fin.values()) >= 2:
        return  # the scaling table replaces the sentence (checked by the table's own test)
    for (size, budget), g in fin.items():
        b = g.get("bf16", {})
        if (size, budget) == ("s10m", 265_000_000) or len(b) < 2:
            continue
        mean, lo, hi, *_ = _t_gap(b, main)
        want = (f"{size}, {budget / 1e6:,.0f} M tokens: {np.mean([v[1] for v in b.values()]):.4f} nats/byte "
                f"({len(b)} seeds), {_f4(mean)} {_ci(lo, hi)} from s10m, 265 M on the same seeds")
        assert want in text, want


def test_the_a_a_comparison_before_the_late_switch_from_the_committed_curves():
    """Recipe and late switch are one computation until step ceil(0.82 · 8087) = 6632; their committed validation
    losses at the evaluations before it differ on every seed: at 212 M tokens (step 6470) late − recipe is +0.0026
    [+0.0015, +0.0036] (issue 50's figure), and the 39 differences from 15 % of the steps to the switch have a
    standard deviation of 0.0022; the section states both, with the mode of each seed-0 run."""
    curves = {(rec["arm"], rec["seed"]): df.dropna(subset=["val_loss"]).set_index("step").val_loss
              for rec, df in _records(("main",)) if rec["arm"] in ("nvfp4", "nvfp4_late_bf16")}
    switch = math.ceil(0.82 * 8087)
    d = pd.DataFrame({s: curves[("nvfp4_late_bf16", s)] - curves[("nvfp4", s)] for s in range(3)})
    pre = d[d.index <= switch]
    assert switch == 6632 and pre.index.max() == 6470 and 6470 * 64 * 512 == 212_008_960
    at = pre.loc[6470].to_numpy()
    half = stats.t.ppf(0.975, 2) * at.std(ddof=1) / math.sqrt(3)
    assert _ci(at.mean() - half, at.mean() + half) == "[+0.0015, +0.0036]" and _f4(at.mean()) == "+0.0026"
    settled = pre[pre.index >= 0.15 * 8087].to_numpy().ravel()
    assert settled.size == 39 and (settled == 0).sum() == 0 and f"{settled.std(ddof=1):.4f}" == "0.0022"
    text = " ".join(_section().split())
    assert (f"At the last evaluation before the switch (212 M tokens) late switch − recipe = +0.0026 [+0.0015, "
            f"+0.0036] nats/byte (p {_p(list(at)):.2g}, 3 seeds; detectable at 80 % power: "
            f"{_detectable(list(at)):.4f}); over the 13 evaluations from 15 % of the steps to the switch, 0 of the 39 "
            f"per-seed differences are 0 at the curves' six decimals and their standard deviation is 0.0022 "
            f"nats/byte") in text
    modes = {(r["arm"], r["seed"]): (r["cuda_graph"], r.get("cudnn_deterministic")) for r, _ in _records(("main",))}
    assert modes[("nvfp4", 0)] == (False, None) and modes[("nvfp4_late_bf16", 0)] == (True, True)
    odd = sorted(k for k, m in modes.items() if m != (True, True))
    assert odd == [("bf16", 0), ("nvfp4", 0), ("nvfp4_no_sr", 0)]
    assert ("BF16 seed 0, NVFP4 recipe seed 0, NVFP4 − SR seed 0 ran with eager, no cuDNN deterministic flag, every "
            "other run here with CUDA graphs, cuDNN deterministic") in text


def test_the_validation_passes_and_repeat_check_from_the_committed_records():
    """Every committed run validated on the first 1 MiB of the held-out stream (no record has a ``validation``
    entry); passes per plan = budget / training-stream bytes (0.78, 3.12, 1.42); the size plan's val − train gap
    widens from its first pass's last evaluation (14 of 20) to the end by more than the main plan's over the same
    evaluations, per seed, recomputed here with the training loss averaged over the steps since the evaluation
    before."""
    recs = [r for r, _ in _records()]
    assert not any("validation" in r for r in recs) and len(recs) == 41
    text = " ".join(_section().split())
    assert "all 41 of the plans' runs (every committed one) validate on the first 1,048,577 bytes" in text
    assert "which in path order are all pandas's: sympy, also held out, is not in their validation" in text
    stream = {r["corpus"]["train"]["bytes"] for r in recs}
    assert stream == {340_469_682}
    passes = {b: b / 340_469_682 for b in (265_000_000, 1_062_000_000, 482_000_000)}
    assert [f"{p:.2f}" for p in passes.values()] == ["0.78", "3.12", "1.42"]
    assert ("main (s10m, 265 M tokens) 0.78; size (s20m, 482 M tokens) 1.42; horizon (s10m, 1,062 M tokens) "
            "3.12") in text

    def gap(df):  # val − mean train loss over the steps since the previous evaluation, per evaluation
        out, acc, w, prev = [], 0.0, 0, 0
        for step, tl, vl in df[["step", "train_loss", "val_loss"]].itertuples(index=False):
            acc, w, prev = acc + tl * (step - prev), w + step - prev, step
            if not math.isnan(vl):
                out.append(vl - acc / w)
                acc, w = 0.0, 0
        return out

    runs = {(r["size"], r["seed"]): gap(df) for r, df in _records(("main", "size")) if r["arm"] == "bf16"}
    k = 14  # evaluation 14 of the size plan is at 337 M tokens, the last within the 340 M-byte stream
    widen = np.array([runs[("s20m", s)][-1] - runs[("s20m", s)][k - 1] for s in range(3)])
    main = np.array([runs[("s10m", s)][-1] - runs[("s10m", s)][k - 1] for s in range(3)])
    ex = widen - main
    half = stats.t.ppf(0.975, 2) * ex.std(ddof=1) / math.sqrt(3)
    row = {r["plan"]: r for r in _table(_section(), "Train-vs-validation check")}["size"]
    assert row["first pass ends"] == "evaluation 14 of 20 (337 M)" and row["widening"] == _f4(widen.mean())
    assert row["minus main's widening"] == _f4(ex.mean()) and row["95 % CI"] == _ci(ex.mean() - half, ex.mean() + half)
    assert ex.mean() - half > 0 and "size BF16: excess interval above zero" in text
