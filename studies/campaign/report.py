"""Study 8's campaign section, rendered from the committed run CSVs and JSONs (no GPU).

For each size and budget: the final validation loss of every arm and seed, the paired gap to BF16 (mean over
seeds of arm − BF16, nats per byte) with its 95 % t-interval, each recipe component's gap with the paper's claim
and the verdict of :func:`studies.campaign.stats.verdict`, loss curves with the seed band, the gap along the
schedule; across budgets and sizes, the recipe's and SR's gaps against tokens per parameter with their paired change
from the main budget (once a second budget or size has runs); throughput per arm, the GPU time spent and the ledger
of device commands.  Runs that are not ``"done"`` are listed and left out of the numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from studies.campaign.arms import ARMS, CLAIMED_BY, COMPONENTS, MXFP4_FORMAT, MXFP4_OTHER_CHANGES
from studies.campaign.batch import LR, PARAMS, plan_runs
from studies.campaign.spend import _budget_text, _ledger_table, _ledger_text, _plan_text, _run_seconds, ledger_sums  # noqa: F401
from studies.campaign.stats import ALPHA, detectable, has_interval, holm, p_value, paired_gap, verdict
from studies.common import save_fig

__all__ = ["read_curve", "load_runs", "render", "headline"]


def read_curve(csv: Path, rec: dict) -> pd.DataFrame:
    """A run's curve with its ``tokens_per_s`` column: in the CSV of the runs written before the curve held only
    computed values, else from the record's ``throughput`` ([step, tokens/s] per logged row; NaN where missing)."""
    df = pd.read_csv(csv)
    if "tokens_per_s" not in df.columns:
        rate = dict(map(tuple, rec.get("throughput", [])))
        df["tokens_per_s"] = df.step.map(rate).astype(float)
    return df


def load_runs(data: Path) -> tuple[pd.DataFrame, list[dict]]:
    """(the logged rows of every run: run, arm, seed, size, budget, step, tokens, train_loss, val_loss,
    tokens_per_s; the run records), from ``data/**/<run>.csv`` and ``.json`` (:func:`read_curve`)."""
    frames, recs, seen = [], [], {}
    for rec, js in _runs(sorted(Path(data).rglob("*.json"))):
        if "lr_sweep" in js.parts or any(q.startswith("probe") for q in js.parts):
            continue  # the sweep and the throughput probes are reported on their own
        recs.append(rec)
        csv = js.with_suffix(".csv")
        if rec["status"] != "done" or not csv.exists():
            continue
        # two finished records of one (arm, seed, size, budget) — a run committed from two plans' folders — would
        # have one silently replace the other in every paired statistic: refuse, naming both
        key = (rec["arm"], rec["seed"], rec["size"], rec["tokens_budget"])
        if key in seen:
            raise ValueError(f"two finished runs of arm {key[0]}, seed {key[1]}, size {key[2]}, budget {key[3]}: "
                             f"{seen[key]} and {js}; keep one")
        seen[key] = js
        df = read_curve(csv, rec)
        df = df.assign(run=rec["run"], arm=rec["arm"], seed=rec["seed"], size=rec["size"],
                       budget=rec["tokens_budget"])
        frames.append(df)
    cols = ["run", "arm", "seed", "size", "budget", "step", "tokens", "train_loss", "val_loss", "tokens_per_s"]
    return (pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)), recs


PROTOCOL = (
    "**Paired-seed campaign (issue 20): protocol.** Llama-style byte-level decoders (RMSNorm, RoPE, SwiGLU, no "
    "biases, context 512) of 10.6 M and 19.3 M non-embedding parameters; AdamW (β2 = 0.95, weight decay 0.1), "
    "2 % linear warmup then cosine to 10 %, clipping at 1.0, bf16 autocast, batches of 64 × 512 bytes, the learning "
    "rate chosen once by a BF16 sweep and fixed for every arm. Data: the Python sources of the packages installed on "
    "the GPU machine in sorted path order, whole packages (sympy, pandas) held out; each run records the file and "
    "byte counts and the SHA-256 of both streams. Validation: held-out bytes (which ones each run used: below), at 20 "
    "evenly spaced token counts. Arms: BF16; the NVFP4 recipe (last ~15 % of blocks BF16); without SR, RHT or 2-D "
    "weights; every block NVFP4; forward only; backward only; MXFP4 (its preset also differs from the recipe in "
    "more than the format: below); FP8 blockwise; four-over-six; the recipe with BF16 for the last 18 % of tokens. "
    "The embedding, the LM head, the norms and attention stay high precision in every arm; block linears run the "
    "arm's recipe through `fpsim.torch` (`gemm=\"blas\"`). A seed fixes the initial weights and the data order, so "
    "arms differ by the recipe and by whatever the GPU does not repeat from run to run (measured below, in the A/A "
    "comparison inside the late-switch component). The reported number is the mean over seeds of the per-seed "
    "difference in final validation loss with a 95 % t-interval, its two-sided paired t-test p-value and the "
    "smallest gap that test detects with 80 % power at that seed count and the observed spread of the per-seed "
    "differences (`studies.campaign.stats`); the components' p-values are corrected over the components of a table "
    "with Holm's method, and a component is *resolved* when its corrected p is below 0.05 with the gap in the "
    "claimed direction, *contradicted* when it is below 0.05 the other way, else *not resolved at this scale*."
)


def _runs(paths) -> list[tuple[dict, Path]]:
    """(record, JSON path) of the run records among ``paths``, in order (a batch's ``ledger.json`` and any other
    JSON without a run and its CSV are skipped)."""
    out = []
    for js in paths:
        rec = json.loads(js.read_text())
        if isinstance(rec, dict) and "run" in rec and js.with_suffix(".csv").exists():
            out.append((rec, js))
    return out


def _sweep_block(data: Path, md_table) -> str | None:
    """The BF16 learning-rate sweep: final and best validation loss per learning rate, and the one chosen."""
    rows = []
    for rec, js in _runs(sorted((Path(data) / "lr_sweep").rglob("*.json"))):
        df = pd.read_csv(js.with_suffix(".csv")).dropna(subset=["val_loss"])
        if rec.get("status") != "done" or df.empty:
            continue
        rows.append({"learning rate": f"{rec['lr']:g}", "tokens": f"{rec['tokens_done']:,}",
                     "final val loss": df.val_loss.iloc[-1], "best val loss": df.val_loss.min(),
                     "run wall s": f"{rec['seconds_total']:.0f}"})
    if not rows:
        return None
    best = min(rows, key=lambda r: r["final val loss"])
    return (f"Learning-rate sweep (BF16, seed 0, s10m, 40 M tokens, four runs side by side; nats per byte). The "
            f"lowest final loss is at {best['learning rate']}, which every arm uses "
            f"(`studies.campaign.batch.LR = {LR:g}`):\n\n" + md_table(pd.DataFrame(rows), ".4f"))


def _probe_block(data: Path, md_table) -> str | None:
    """Throughput of the probe runs (alone, and several side by side on the one GPU), tokens/s per run."""
    rows = []
    for rec, js in _runs(sorted(Path(data).glob("probe*/*.json"))):
        df = read_curve(js.with_suffix(".csv"), rec)
        side = int("".join(c for c in js.parent.name if c.isdigit()) or 1)
        rows.append({"arm": ARMS[rec["arm"]].label, "runs side by side": side,
                     "tokens/s (median)": float(df.tokens_per_s.iloc[1:].median()),  # the first log has warm-up
                     "tokens done": f"{rec['tokens_done']:,}", "of budget": f"{rec['tokens_budget']:,}",
                     "run wall s": f"{rec['seconds_total']:.0f}"})
    if not rows:
        return None
    text = ("Throughput probes (H200, s10m, batches of 64 × 512 bytes). The six-run probe was stopped at ~495 s; "
            "its checkpoints stayed on the device machine, which a session does not keep, so those runs start "
            "again from zero in the campaign (two of the six, NVFP4 without SR and without RHT, were not "
            "returned: the device returns at most 8 files per command, fixed since by one archive per batch). "
            "Side by side, the runs time-slice the GPU (it was 100 % busy), so the sum over the six runs, about "
            "1 M tokens/s, is the ceiling for this model:\n\n" + md_table(pd.DataFrame(rows), ".0f"))
    first = _first_look(data, md_table)
    return text + ("\n\n" + first if first else "")


def _first_look(data: Path, md_table) -> str | None:
    """Validation loss of the six-run probe at the last evaluation all of them reached (one seed, the same
    265 M-token schedule, so equal token counts are comparable; not a campaign result)."""
    curves = {}
    for rec, js in _runs(sorted(Path(data).glob("probe_parallel*/*.json"))):
        curves[ARMS[rec["arm"]].label] = pd.read_csv(js.with_suffix(".csv")).dropna(subset=["val_loss"])
    if len(curves) < 2 or "BF16" not in curves:
        return None
    common = min(int(c.tokens.max()) for c in curves.values())
    at = {k: float(c[c.tokens == common].val_loss.iloc[0]) for k, c in curves.items() if (c.tokens == common).any()}
    if "BF16" not in at:
        return None
    rows = [{"arm": k, "val loss": v, "− BF16": v - at["BF16"]} for k, v in at.items()]
    return (f"A first look, not a campaign result: validation loss of those runs at {common / 1e6:.1f} M tokens "
            f"(the last evaluation all reached; one seed, so no interval; nats per byte):\n\n"
            + md_table(pd.DataFrame(rows), ".4f"))


def _probe_figure(data: Path, out_dir: Path) -> str | None:
    """Validation curves of the learning-rate sweep and of the six-run probe (one seed each; the probe's runs stop
    at 66–110 M of their 265 M tokens): ``campaign_first_look.png``, or None without those runs."""
    sweep = sorted((Path(data) / "lr_sweep").rglob("*.json"))
    probe = sorted(Path(data).glob("probe_parallel*/*.json"))
    if not sweep and not probe:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for rec, js in _runs(sweep):
        df = pd.read_csv(js.with_suffix(".csv")).dropna(subset=["val_loss"])
        a1.plot(df.tokens / 1e6, df.val_loss, marker=".", label=f"lr {rec['lr']:g}")
    a1.set_title("BF16 learning-rate sweep (s10m, seed 0)", fontsize=9)
    for rec, js in _runs(probe):
        df = pd.read_csv(js.with_suffix(".csv")).dropna(subset=["val_loss"])
        a2.plot(df.tokens / 1e6, df.val_loss, marker=".", label=ARMS[rec["arm"]].label)
    a2.set_title("six-run probe, first 66–110 M of 265 M tokens (seed 0)", fontsize=9)
    for ax in (a1, a2):
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.set_ylim(top=1.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    name = "campaign_first_look.png"
    save_fig(fig, Path(out_dir) / name)
    return name


def _holm_text(k: int) -> str:
    """What the components' p-values and the Holm correction over ``k`` of them mean; empty for a single one."""
    if k < 2:
        return ""
    return (f"p: the two-sided paired t-test of a zero gap; Holm p: the same p-values corrected over the {k} "
            f"components with two or more seeds (Holm's step-down method), which keeps the chance of any false "
            f"*resolved* among them at or below {ALPHA:g}; the verdict reads the Holm p. Uncorrected, with {k} "
            f"intervals and no real effect, at least one would exclude zero with probability 1 − 0.95^{k} = "
            f"{100 * (1 - 0.95 ** k):.0f} % (were they independent; they share the recipe's runs). Detectable: the "
            f"smallest true gap a two-sided paired t-test would find with 80 % power at the seed count and the "
            f"observed spread of the per-seed differences, at α = {ALPHA:g} and, after the semicolon, at "
            f"α = {ALPHA:g}/{k}, the Holm correction's strictest step (`studies.campaign.stats.detectable`).")


def _arm_color(arm: str):
    """One colour per arm in every figure: tab20's ten dark shades in ``ARMS`` order, then its light ones."""
    i = list(ARMS).index(arm)
    return plt.get_cmap("tab20")((2 * i) % 20 + (2 * i) // 20)


def _ci(gap) -> str:
    """The 95 % interval as text, or why there is none."""
    if not has_interval(gap):
        return f"— ({gap.n} seed: no interval)"
    return f"[{gap.lo:+.4f}, {gap.hi:+.4f}]"


def _per_seed(arm: dict, base: dict) -> str:
    return ", ".join(f"s{s}: {arm[s] - base[s]:+.4f}" for s in sorted(set(arm) & set(base)))


def _pair(arm: dict, base: dict):
    """:func:`paired_gap` of ``arm`` over ``base`` (seed → final loss), or None while they share no seed (a plan
    part-way through can hold an arm's seed 1 before BF16's)."""
    return paired_gap(arm, base) if set(arm) & set(base) else None


def _p(p: float) -> str:
    """A p-value as a table cell: two significant digits, empty without one."""
    return "" if math.isnan(p) else f"{p:.2g}"


def _mde(gap, family: int = 1) -> str:
    """The smallest gap detectable at 80 % power (:func:`studies.campaign.stats.detectable`) at α = 0.05 and, in a
    family of ``family`` comparisons, at α / family after a semicolon; empty with one seed."""
    if not has_interval(gap):
        return ""
    text = f"{detectable(gap):.4f}"
    return text + (f"; {detectable(gap, ALPHA / family):.4f}" if family > 1 else "")


def _gap_cells(arm: dict, base: dict):
    """(the paired gap of ``arm`` over ``base`` (seed → final loss), its table cells: mean, interval, p-value, the
    gap detectable at 80 % power, per seed); without a common seed (None, cells that say so)."""
    gap = _pair(arm, base)
    if gap is None:
        return None, {"gap": "", "95 % CI": "— (no seed in common yet)", "p": "", "detectable (80 % power)": "",
                      "per seed": ""}
    return gap, {"gap": gap.mean, "95 % CI": _ci(gap), "p": _p(p_value(gap)),
                 "detectable (80 % power)": _mde(gap), "per seed": _per_seed(arm, base)}


def _component_runs(fin: dict[str, dict[int, float]]) -> list[tuple[str, str, dict, dict]]:
    """(component, claim, runs without it, runs with it) of each recipe component whose two arms both have final
    losses in :func:`_final`'s ``fin``; the study's table and its verdict both read this list."""
    return [(name, claim, fin[w], fin[c]) for name, w, c, claim in COMPONENTS if w in fin and c in fin]


def _components(fin: dict[str, dict[int, float]]) -> list[dict]:
    """Each component of :func:`_component_runs` with its paired gap (None without a common seed), p-value, Holm
    p-value over the components with two or more seeds (NaN for the others), that family's size and the verdict:
    the one reading of the components that the table and the headline share."""
    out = []
    for name, claim, without, with_ in _component_runs(fin):
        gap = _pair(without, with_)
        out.append({"name": name, "claim": claim, "gap": gap, "without": without, "with": with_,
                    "p": p_value(gap) if gap is not None else math.nan})
    family = sum(has_interval(c["gap"]) for c in out)
    for c, h in zip(out, holm([c["p"] for c in out])):
        c["holm"], c["family"] = h, family
        c["verdict"] = ("no verdict (no seed in common yet)" if c["gap"] is None else
                        verdict(c["gap"], c["claim"], None if math.isnan(h) else h, max(family, 1)))
    return out


def _gap_rows(fin: dict[str, dict[int, float]]) -> list[dict]:
    """The paired-gap table's rows of every arm of :func:`_final`'s ``fin`` against its BF16 runs."""
    rows = []
    base = fin.get("bf16")
    for arm, seeds in fin.items():
        if arm == "bf16" or not base:
            continue
        gap, cells = _gap_cells(seeds, base)
        rows.append({"arm": ARMS[arm].label, "seeds": 0 if gap is None else gap.n,
                     "gap vs BF16 (nats/byte)": cells.pop("gap"), **cells})
    return rows


#: The arms the horizon and size plans run, whose gap to BF16 is compared across budgets and sizes.
SCALING_ARMS = ("nvfp4", "nvfp4_no_sr")


def _scaling_block(groups: dict[tuple[str, int], dict[str, dict[int, float]]], out_dir: Path,
                   md_table) -> tuple[str, str | None]:
    """(Markdown, figure name or None): the paired gap to BF16 of the recipe and of the recipe without SR, and SR's
    component (without − with), at each (size, token budget) with two or more common seeds, against tokens per
    parameter; and how the gap moves from the main budget to each other one, paired per seed (the same seed fixes
    the initial weights and the data order at every budget, so (gap at B) − (gap at the main budget) on each seed
    is a paired difference with its own t-interval).  ``groups``: (size, budget) → :func:`_final`'s arm → seed →
    final loss, as :func:`render` computed them."""
    main_size, main_budget = "s10m", plan_runs("main", lr=1.0)[0]["tokens"]
    rows, series = [], {}
    for (size, budget), fin in groups.items():
        if "bf16" not in fin:
            continue
        pairs = [(ARMS[a].label, fin[a], fin["bf16"]) for a in SCALING_ARMS if a in fin]
        if all(a in fin for a in SCALING_ARMS):
            pairs.append(("SR's component (without − with)", fin["nvfp4_no_sr"], fin["nvfp4"]))
        for label, arm, base in pairs:
            gap = _pair(arm, base)
            if not has_interval(gap):
                continue
            tpp = budget / PARAMS[size]
            rows.append({"size": size, "tokens": f"{budget / 1e6:,.0f} M", "tokens per parameter": f"{tpp:.0f}",
                         "gap": label, "seeds": gap.n, "mean (nats/byte)": gap.mean, "95 % CI": _ci(gap),
                         "detectable (80 % power)": _mde(gap)})
            series.setdefault((label, size), []).append((tpp, gap))
    if len({(r["size"], r["tokens"]) for r in rows}) < 2:
        return ("Gap against the token budget and the model size: needs a second budget or size with two or more "
                "seeds of BF16 and the recipe (the horizon plan, 100 tokens per parameter, and the size plan, "
                "19.3 M parameters; neither has such runs yet)."
                + _bf16_elsewhere(groups, main_size, main_budget)), None
    # the change from the main budget, paired per seed
    moves = []
    main = groups.get((main_size, main_budget), {})
    for (size, budget), fin in groups.items():
        if (size, budget) == (main_size, main_budget) or "bf16" not in fin or "bf16" not in main:
            continue
        for a in SCALING_ARMS:
            if a not in fin or a not in main:
                continue
            here = {s: fin[a][s] - fin["bf16"][s] for s in fin[a] if s in fin["bf16"]}
            there = {s: main[a][s] - main["bf16"][s] for s in main[a] if s in main["bf16"]}
            d = _pair(here, there)
            if has_interval(d):
                moves.append({"arm": ARMS[a].label, "from": f"{main_size}, {main_budget / 1e6:,.0f} M",
                              "to": f"{size}, {budget / 1e6:,.0f} M", "seeds": d.n,
                              "gap change (nats/byte)": d.mean, "95 % CI": _ci(d),
                              "detectable (80 % power)": _mde(d)})
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    markers = {"s10m": "o", "s20m": "s"}
    for k, ((label, size), pts) in enumerate(sorted(series.items())):
        pts.sort(key=lambda p: p[0])
        x = [p[0] * (1 + 0.03 * (k - 1)) for p in pts]  # a small shift keeps the error bars apart
        y = [p[1].mean for p in pts]
        err = [[p[1].mean - p[1].lo for p in pts], [p[1].hi - p[1].mean for p in pts]]
        ax.errorbar(x, y, yerr=err, marker=markers.get(size, "^"), capsize=3, lw=1.2, label=f"{label}, {size}")
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xscale("log")
    budgets = sorted({p[0] for pts in series.values() for p in pts})
    ax.set_xticks(budgets, [f"{b:.0f}" for b in budgets])
    ax.minorticks_off()
    ax.set_xlim(budgets[0] / 1.3, budgets[-1] * 1.3)
    ax.set_xlabel("training tokens per non-embedding parameter (log scale)")
    ax.set_ylabel("paired gap, final validation loss (nats per byte)")
    ax.set_title("paired gaps against the token budget (mean and 95 % t-interval over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    name = "campaign_gap_vs_tokens.png"
    save_fig(fig, Path(out_dir) / name)
    text = ("Gap against the token budget and the model size (final validation loss, paired over seeds; each budget "
            "is its own run with its own cosine schedule):\n\n" + md_table(pd.DataFrame(rows), "+.4f"))
    if moves:
        text += ("\n\nHow the gap moves from the main budget (per seed: gap there − gap at the main budget; the "
                 "literature expects it to grow with tokens):\n\n" + md_table(pd.DataFrame(moves), "+.4f"))
    return text, name


def _bf16_elsewhere(groups: dict, main_size: str, main_budget: int) -> str:
    """BF16's final loss at each other (size, budget) with two or more seeds, and its paired change from the main
    budget's BF16 on the same seeds (the same seed fixes the data order at every size and budget): what the scaling
    plans say before their recipe runs exist."""
    main = groups.get((main_size, main_budget), {}).get("bf16", {})
    parts = []
    for (size, budget), fin in sorted(groups.items()):
        b = fin.get("bf16", {})
        if (size, budget) == (main_size, main_budget) or len(b) < 2:
            continue
        d = _pair(b, main)
        mean = sum(b.values()) / len(b)
        text = f"{size}, {budget / 1e6:,.0f} M tokens: {mean:.4f} nats/byte ({len(b)} seeds)"
        if has_interval(d):
            text += (f", {d.mean:+.4f} {_ci(d)} from {main_size}, {main_budget / 1e6:,.0f} M on the same seeds "
                     f"(detectable at 80 % power: {_mde(d)})")
        parts.append(text)
    return (" BF16's final validation loss so far: " + "; ".join(parts) + ".") if parts else ""


def _how_run(rec: dict) -> str:
    """How a run's batch shared the GPU: N runs on CUDA streams of one process (recorded as ``side_by_side``),
    or, for the records written before that field, separate processes (their count is in the ledger)."""
    steps = "graph steps" if rec.get("cuda_graph") else "eager steps"
    n = rec.get("side_by_side")
    return f"{n} on streams, {steps}" if n else f"separate processes (see the ledger), {steps}"


def render(data: Path, out_dir: Path, md_table) -> tuple[list[str], list[str]]:
    """(Markdown blocks, figure file names written to ``out_dir``) of the campaign section."""
    logs, recs = load_runs(data)
    val = logs.dropna(subset=["val_loss"])
    not_done = [r["run"] for r in recs if r["status"] != "done"]
    early = [b for b in (_sweep_block(data, md_table), _probe_block(data, md_table)) if b]
    ledger = Path(data) / "sessions.json"
    done = {(r["arm"], r["size"], r["seed"], r["tokens_budget"]) for r in recs if r["status"] == "done"}
    early.append(f"{_plan_text()} {_budget_text(done)} Device time of the campaign's commands so far (the ledger "
                 f"`studies/data/campaign/sessions.json`, commands of the GPU sessions with their wall time): "
                 + _ledger_text(ledger))
    first = _probe_figure(data, out_dir)
    table = _ledger_table(ledger, md_table)
    if val.empty:
        return [PROTOCOL, *early, "No main-campaign run has finished yet: the paired-gap numbers above are the "
                "earlier small-model runs, and no verdict on a recipe component comes from this campaign yet.",
                *([table] if table else [])], [first] if first else []
    hygiene = [_validation_text(recs), _passes_text(recs), _repeat_block(logs, recs, md_table)]
    blocks, figs = [PROTOCOL, *hygiene, *early], [first] if first else []
    run_h = sum(r.get("seconds_total", 0) for r in recs) / 3600  # the plans' runs (load_runs skips sweep, probes)
    finals = {}  # (size, budget) → arm → seed → final loss, for the tables here and the scaling block
    for (size, budget), sub in val.groupby(["size", "budget"]):
        fin = finals[(size, int(budget))] = _final(sub, size, budget)
        rows = _gap_rows(fin)
        if rows:
            blocks.append(f"Paired gaps to BF16, {size}, {budget / 1e6:.0f} M tokens (p: two-sided paired t-test; "
                          f"detectable: the smallest true gap found with 80 % power at α = {ALPHA:g}, at this seed "
                          f"count and the observed spread of the per-seed differences):\n\n"
                          + md_table(pd.DataFrame(rows), "+.4f"))
            if "nvfp4" in fin and "fp8_blockwise" in fin:
                blocks.append(_fp8_text(fin))
        comp = _components(fin)
        if comp:
            k = comp[0]["family"]
            mde = f"detectable (80 % power; α/{k})" if k > 1 else "detectable (80 % power)"
            rows = [{"component": c["name"], "claim": c["claim"], "claimed by": CLAIMED_BY[c["name"]],
                     **(dict(zip(("gap (nats/byte)", "95 % CI", "p", "Holm p", mde, "per seed"),
                                 ("", "— (no seed in common yet)", "", "", "", "")))
                        if c["gap"] is None else
                        {"gap (nats/byte)": c["gap"].mean, "95 % CI": _ci(c["gap"]), "p": _p(c["p"]),
                         "Holm p": _p(c["holm"]) if k > 1 else "", mde: _mde(c["gap"], k),
                         "per seed": _per_seed(c["without"], c["with"])}),
                     "verdict": c["verdict"]} for c in comp]
            blocks.append(f"Recipe components, {size}, {budget / 1e6:.0f} M tokens (gap = without − with):\n\n"
                          + md_table(pd.DataFrame(rows), "+.4f"))
            if k > 1:  # a one-seed component has no p-value, so it takes no part in the correction
                blocks.append(_holm_text(k))
            aa = _aa_text(sub, recs, size, budget)
            if aa:
                blocks.append(aa)
        fig = plt.figure(figsize=(12, 6))
        grid = fig.add_gridspec(2, 2, height_ratios=(5.0, 0.8))
        ax, gx, key = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
        zoom = ax.inset_axes((0.42, 0.36, 0.55, 0.36))  # the last quarter of the tokens, where the arms separate
        late = budget * 0.75
        curves = {arm: g.pivot_table(index="tokens", columns="seed", values="val_loss")
                  for arm, g in sub.groupby("arm", sort=False)}
        settled = []  # paired gaps after the first 15 % of the tokens (the warm-up's swings set no axis)
        for arm, band in curves.items():
            color = _arm_color(arm)
            x, mid = band.index / 1e6, band.mean(axis=1)
            ax.plot(x, mid, label=ARMS[arm].label, lw=1.2, color=color)
            ax.fill_between(x, band.min(axis=1), band.max(axis=1), alpha=0.2, color=color)
            tail = band.index >= late
            zoom.plot(x[tail], mid[tail], lw=1.2, color=color)
            zoom.fill_between(x[tail], band.min(axis=1)[tail], band.max(axis=1)[tail], alpha=0.15, color=color)
            if arm != "bf16" and "bf16" in curves:
                # the paired gap at each evaluation: arm − BF16 on the same seed and token count
                gap = (band - curves["bf16"]).dropna(how="all")
                if gap.empty:  # no seed in common with BF16 yet
                    continue
                gx.plot(gap.index / 1e6, gap.mean(axis=1), color=color, label=ARMS[arm].label, lw=1.2)
                gx.fill_between(gap.index / 1e6, gap.min(axis=1), gap.max(axis=1), color=color, alpha=0.15)
                settled.append(gap[gap.index >= 0.15 * budget])
        zoom.set_title(f"evaluations past {late / 1e6:.0f} M tokens", fontsize=7)
        zoom.tick_params(labelsize=7)
        zoom.grid(alpha=0.3)
        ax.set_ylabel("validation loss (nats per byte)")
        ax.set_title("validation loss (line: mean, band: min–max over seeds)", fontsize=9)
        if not settled:  # say why the panel is empty rather than leave blank axes
            gx.text(0.5, 0.5, "no paired gap yet: needs BF16 and another arm\nfinished on the same seed",
                    ha="center", va="center", transform=gx.transAxes)
            gx.set_xticks([])
            gx.set_yticks([])
        gx.axhline(0.0, color="k", lw=0.6)
        if settled and any(len(g) for g in settled):
            lo = min(float(g.min(axis=1).min()) for g in settled if len(g))
            hi = max(float(g.max(axis=1).max()) for g in settled if len(g))
            pad = 0.1 * (hi - lo) or 1e-3
            gx.set_ylim(min(lo, 0.0) - pad, max(hi, 0.0) + pad)
        gx.set_ylabel("arm − BF16, same seed (nats per byte)")
        gx.set_title("paired gap along one cosine schedule (evaluation points, not separate budgets;\n"
                     "y axis fitted after the first 15 % of the tokens)", fontsize=9)
        for a_ in (ax, gx):
            a_.set_xlabel("training tokens (millions)")
            a_.grid(alpha=0.3)
        # one legend for both panels (an arm has the same colour in each), in its own row, covering no curve
        key.axis("off")
        key.legend(*ax.get_legend_handles_labels(), loc="center", ncol=4, fontsize=8, frameon=False)
        name = f"campaign_{size}_{budget // 1_000_000}m.png"
        save_fig(fig, out_dir / name)
        figs.append(name)
    how = {r["run"]: _how_run(r) for r in recs}
    # every log of the training steps but each run's first (its start-up); not only the evaluations' logs: on
    # streams a run's window there also spans its partner's validation pass (the runs evaluate at the same steps)
    steps = logs[logs.groupby("run").cumcount() > 0]
    tput = (steps.assign(how=steps.run.map(how)).groupby(["arm", "size", "how"], sort=False)
            .agg(runs=("run", "nunique"), tps=("tokens_per_s", "median")).reset_index()
            .assign(arm=lambda d: d.arm.map(lambda a: ARMS[a].label))
            .rename(columns={"how": "how the batch ran", "tps": "tokens/s (median)"}))
    blocks.append("Training throughput: the median of the tokens/s logged every 50 steps along the runs of a row "
                  "(each log the rate over the steps since the previous one, the run's own evaluations excluded; a "
                  "run's first log, with its start-up, left out). The logs at the evaluations alone would read low: "
                  "on streams their window also spans the partner runs' evaluations. A run of a batch of two "
                  "or more shared the GPU with the others, so its rate is a share of the GPU; '1 on streams' is a "
                  "run alone. Runs of different batch shapes or sizes are not comparable with each other:\n\n"
                  + md_table(tput, ".0f"))
    blocks.append(f"Run time summed over the committed runs of the main, horizon and size plans (the sweep and the "
                  f"probes apart; a run's time is that of its kept curve, every call of it): {run_h:.2f} h (runs of a "
                  f"batch share the GPU, so this can exceed the device time of their commands)."
                  + (f" Not finished: {', '.join(not_done)}." if not_done else ""))
    scaling, scaling_fig = _scaling_block(finals, out_dir, md_table)
    blocks.append(scaling)
    figs += [scaling_fig] if scaling_fig else []
    if table:
        blocks.append(table)
    return blocks, figs


def _plans() -> dict[tuple[str, int], str]:
    """(size, token budget) → the plan that trains it (main, horizon, size)."""
    return {(r["size"], r["tokens"]): plan for plan in ("main", "horizon", "size") for r in plan_runs(plan, lr=1.0)}


def _validation_text(recs: list[dict]) -> str:
    """Which validation windows the plans' runs used, from their records: those without a ``validation`` entry
    read the first 1,048,576 bytes of the held-out stream, which in path order are pandas's; the others say how many
    windows each held-out package gave (:func:`studies.campaign.run.validation_windows`)."""
    old = [r for r in recs if "validation" not in r]
    new: dict[str, list[dict]] = {}
    for r in recs:
        if "validation" in r:
            v = r["validation"]
            desc = (f"{v['tokens']:,} tokens in {v['windows']:,} windows of {v['window_bytes']} bytes, "
                    + ", ".join(f"{k:,} from {p}" for p, k in v["packages"].items()) + ", evenly spaced over each")
            new.setdefault(desc, []).append(r)
    parts = []
    if old:
        held = sorted({p for r in old for p in (r.get("corpus") or {}).get("holdout", [])}) or ["?"]
        parts.append(f"{'all ' if not new else ''}{len(old)} of the plans' runs"
                     f"{' (every committed one)' if not new else ''} validate on the first 1,048,577 bytes of the "
                     f"held-out stream (2,048 windows of 513 bytes overlapping by one: 1,048,576 predicted bytes), "
                     f"which in path order are all {held[0]}'s"
                     + (f": {', '.join(held[1:])}, also held out, is not in their validation" if held[1:] else ""))
    for desc, rs in new.items():
        parts.append(f"{len(rs)} validate on {desc}")
    future = ("" if new else " Runs made from now on validate on 4,194,304 predicted bytes (8,192 windows of 513) "
              "drawn from every held-out package, an equal share of windows from each, evenly spaced over its bytes "
              "(`studies.campaign.run.validation_windows`); a checkpoint of a run validated the old way is not "
              "resumed under the new windows.")
    return "Validation, run by run: " + "; ".join(parts) + "." + future


def _passes(recs: list[dict]) -> dict[tuple[str, int], float]:
    """(size, budget) → passes over the training stream: the plan's token budget / the stream's bytes (from the
    runs' records; one stream for all of them, else a ValueError)."""
    out = {}
    for r in recs:
        if "corpus" not in r:
            continue
        key = (r["size"], r["tokens_budget"])
        p = r["tokens_budget"] / r["corpus"]["train"]["bytes"]
        if out.setdefault(key, p) != p:
            raise ValueError(f"the runs at {key} trained on streams of different sizes")
    return out


def _passes_text(recs: list[dict]) -> str:
    """Data passes per plan: token budget / training-stream bytes (tokens are bytes), from the records."""
    plans, passes = _plans(), _passes(recs)
    if not passes:
        return "Data passes per plan: no run record states its training stream."
    nbytes = sorted({r["corpus"]["train"]["bytes"] for r in recs if "corpus" in r})
    items = [f"{plans.get(k, '?')} ({k[0]}, {k[1] / 1e6:,.0f} M tokens) {p:.2f}" for k, p in sorted(
        passes.items(), key=lambda kv: kv[1])]
    return (f"Data passes per plan, the token budget over the training stream's {', '.join(f'{b:,}' for b in nbytes)} "
            f"bytes: " + "; ".join(items) + ". A plan past 1.00 trains on bytes it has seen (each epoch a new "
            "permutation of the same windows), so its validation loss can profit less than its training loss: the "
            "check below.")


def _val_minus_train(g: pd.DataFrame) -> pd.Series:
    """Validation − training loss at each evaluation of one run (``g``: its logged rows), indexed 1, 2, … by
    evaluation: the training loss is the mean over every step since the previous evaluation (each logged row's
    train loss is the mean over the steps since the row before, weighted here by those steps)."""
    g = g.sort_values("step")
    ev = g.val_loss.notna().to_numpy()
    block = np.cumsum(ev) - ev  # the evaluation (0-based) each row's steps lead up to
    w = g.step.diff().fillna(g.step).to_numpy()
    train = pd.Series(w * g.train_loss.to_numpy()).groupby(block).sum() / pd.Series(w).groupby(block).sum()
    val = pd.Series(g.val_loss.to_numpy()[ev], index=np.arange(ev.sum()))
    return pd.Series((val - train.reindex(val.index)).to_numpy(), index=np.arange(1, ev.sum() + 1))


def repeat_check(logs: pd.DataFrame, recs: list[dict], main: tuple[str, int]) -> list[dict]:
    """For each (size, budget) past one pass over the training stream and each arm: how much validation − training
    loss (:func:`_val_minus_train`) widens from the last evaluation within the first pass to the end, and by how
    much more than on the same seed of the ``main`` (size, budget), which never repeats data, over the same
    evaluations (the evaluation grids of every plan are the same fractions of the schedule).  The level of
    val − train means little (training and held-out packages differ); its extra widening is what repeated bytes
    add.  Rows: size, budget, arm, passes, the evaluation k where the first pass ends and its tokens, the means of
    val − train there and at the end, and the paired gaps (widening, and widening − the main plan's widening)."""
    passes = _passes(recs)
    per = {(r, a, s, sz, b): _val_minus_train(g) for (r, a, s, sz, b), g in
           logs.groupby(["run", "arm", "seed", "size", "budget"], sort=False)}
    nbytes = {(r["size"], r["tokens_budget"]): r["corpus"]["train"]["bytes"] for r in recs if "corpus" in r}
    out = []
    for (size, budget), p in sorted(passes.items()):
        if p <= 1 or (size, budget) == main:
            continue
        ev = logs[(logs["size"] == size) & (logs.budget == budget)].dropna(subset=["val_loss"])
        for arm in dict.fromkeys(ev.arm):
            runs = {s: v for (_, a, s, sz, b), v in per.items() if (a, sz, b) == (arm, size, budget)}
            ref = {s: v for (_, a, s, sz, b), v in per.items() if (a, sz, b) == (arm, *main)}
            grid = ev[ev.arm == arm].groupby("seed").tokens.apply(lambda t: tuple(sorted(t)))
            k = sum(t <= nbytes[(size, budget)] for t in grid.iloc[0])
            if not runs or k == 0:
                continue
            widen = {s: float(v.iloc[-1] - v.loc[k]) for s, v in runs.items()}
            base = {s: float(v.iloc[-1] - v.loc[k]) for s, v in ref.items() if len(v) == len(runs[next(iter(runs))])}
            out.append({"size": size, "budget": budget, "arm": arm, "passes": p, "k": k,
                        "evaluations": len(grid.iloc[0]), "tokens": grid.iloc[0][k - 1],
                        "there": float(np.mean([v.loc[k] for v in runs.values()])),
                        "end": float(np.mean([v.iloc[-1] for v in runs.values()])),
                        "widening": paired_gap(widen, dict.fromkeys(widen, 0.0)),
                        "excess": _pair(widen, base)})
    return out


def _repeat_block(logs: pd.DataFrame, recs: list[dict], md_table) -> str:
    """The train-vs-validation check of :func:`repeat_check` as a table with its reading."""
    main = ("s10m", plan_runs("main", lr=1.0)[0]["tokens"])
    rows = repeat_check(logs, recs, main)
    if not rows:
        return "Train-vs-validation check: no finished run of a plan that repeats its data."
    table = []
    for r in rows:
        ex = r["excess"]
        table.append({"plan": _plans().get((r["size"], r["budget"]), "?"), "size": r["size"],
                      "tokens": f"{r['budget'] / 1e6:,.0f} M", "arm": ARMS[r["arm"]].label,
                      "passes": f"{r['passes']:.2f}", "seeds": r["widening"].n,
                      "first pass ends": f"evaluation {r['k']} of {r['evaluations']} "
                                         f"({r['tokens'] / 1e6:,.0f} M)",
                      "val − train there": r["there"], "at the end": r["end"], "widening": r["widening"].mean,
                      "minus main's widening": "" if ex is None else ex.mean,
                      "95 % CI": "— (no seed of the main plan)" if ex is None else _ci(ex),
                      "detectable (80 % power)": _mde(ex) if ex is not None else ""})
    passes = _passes(recs)
    partial = [r["run"] for r in recs if r["status"] != "done" and passes.get((r["size"], r["tokens_budget"]), 0) > 1]
    reading = [f"{_plans().get((r['size'], r['budget']), '?')} {ARMS[r['arm']].label}: excess "
               + (f"{_where(r['excess'])}" + (", the repeated bytes show in the validation loss"
                                               if r["excess"].lo > 0 else "") if has_interval(r["excess"])
                  else "on one seed, no interval")
               for r in rows if r["excess"] is not None]
    return (f"Train-vs-validation check for the plans that repeat data (nats/byte): validation − training loss at "
            f"the last evaluation within the first pass and at the end (the training loss averaged over the steps "
            f"since the evaluation before), how much it widens in between, and that widening minus the main plan's "
            f"over the same evaluations on the same seed and arm (the main plan, {main[1] / 1e6:,.0f} M tokens, "
            f"never repeats a byte; every plan evaluates at the same 20 fractions of its schedule). A positive "
            f"excess is what the repeated bytes add to the gap between the two losses; the size plan's model is "
            f"also larger than the main plan's, so its excess mixes repetition with size. Only finished runs "
            f"count" + (f" (not {', '.join(partial)})" if partial else "") + ":\n\n"
            + md_table(pd.DataFrame(table), "+.4f") + ("\n\nReading: " + "; ".join(reading) + "." if reading else ""))


def _mode(rec: dict) -> str:
    """How a run executed its steps, as its record says: eager or CUDA graphs, cuDNN's deterministic flag or not
    (records before that flag have none), torch's deterministic algorithms where recorded."""
    text = ("CUDA graphs" if rec.get("cuda_graph") else "eager") + (
        ", cuDNN deterministic" if rec.get("cudnn_deterministic") else ", no cuDNN deterministic flag")
    return text + (", deterministic algorithms" if rec.get("deterministic") else "")


def aa_comparison(val: pd.DataFrame, recs: list[dict], size: str, budget: int) -> dict | None:
    """The A/A comparison inside the late-switch component: the late-switch arm and the recipe run the same code on
    the same seed until the switch, so their validation losses before it differ only by what the runs do not
    repeat.  From the done runs' evaluations (``val``: :func:`load_runs`'s rows with a validation loss): the step
    of the switch (the first step run in BF16), the last evaluation before it (its token count and the paired gap
    late − recipe there, over the seeds both finished), and the per-seed differences at every evaluation from 15 %
    of the steps to the switch (their count, how many are 0 at the curves' six decimals, their standard deviation);
    with each seed's modes (:func:`_mode`) of the two runs.  None without both arms at (``size``, ``budget``)."""
    arm = ARMS["nvfp4_late_bf16"]
    sub = val[(val["size"] == size) & (val.budget == budget)]
    if not {"nvfp4", arm.name} <= set(sub.arm):
        return None
    by = {r["run"]: r for r in recs}
    steps = {by[r]["steps"] for r in sub[sub.arm.isin(["nvfp4", arm.name])].run.unique()}
    if len(steps) != 1:
        raise ValueError(f"the recipe's and the late switch's runs at {size}, {budget:,} tokens have different step "
                         f"counts {sorted(steps)}: their evaluations do not pair")
    steps = steps.pop()
    switch = math.ceil(arm.switch_at * steps)
    piv = {a: sub[sub.arm == a].pivot_table(index="step", columns="seed", values="val_loss")
           for a in ("nvfp4", arm.name)}
    d = (piv[arm.name] - piv["nvfp4"]).dropna(how="all", axis=0).dropna(how="all", axis=1)
    pre = d[d.index <= switch]  # a row's step counts the steps done: steps 0 .. step - 1, all before the switch
    if pre.empty:
        return None
    last = int(pre.index.max())
    toks = int(sub[sub.step == last].tokens.iloc[0])
    gap = paired_gap(piv[arm.name].loc[last].dropna().to_dict(), piv["nvfp4"].loc[last].dropna().to_dict())
    settled = pre[pre.index >= 0.15 * steps].stack().to_numpy()
    runs = {(r["arm"], r["seed"]): r for r in recs if r.get("size") == size and r.get("tokens_budget") == budget
            and r.get("status") == "done"}
    modes = {s: (_mode(runs[("nvfp4", s)]), _mode(runs[(arm.name, s)])) for s in gap.seeds}
    return {"steps": steps, "switch": switch, "step": last, "tokens": toks, "gap": gap, "n": int(settled.size),
            "evaluations": int((pre.index >= 0.15 * steps).sum()), "zeros": int((settled == 0).sum()),
            "sd": float(settled.std(ddof=1)) if settled.size > 1 else math.nan, "modes": modes}


def _mode_note(recs: list[dict], size: str, budget: int) -> str:
    """Which done runs of (``size``, ``budget``) ran in another mode (:func:`_mode`) than most of them, or ""."""
    runs = [r for r in recs if r.get("size") == size and r.get("tokens_budget") == budget and r["status"] == "done"]
    modes = pd.Series([_mode(r) for r in runs])
    if modes.nunique() < 2:
        return ""
    common = modes.value_counts().index[0]
    odd = [f"{ARMS[r['arm']].label} seed {r['seed']}" for r, m in zip(runs, modes) if m != common]
    return (f"{', '.join(odd)} ran with {' / '.join(sorted(set(modes) - {common}))}, every other run here with "
            f"{common}")


def _aa_text(val: pd.DataFrame, recs: list[dict], size: str, budget: int) -> str:
    """The late-switch component's caveats: the runs' modes and the A/A comparison (:func:`aa_comparison`) before
    the switch, set beside the per-seed spread of the components' gaps; "" without both arms."""
    aa = aa_comparison(val, recs, size, budget)
    if aa is None or not has_interval(aa["gap"]):
        return ""
    g = aa["gap"]
    fin = _final(val, size, budget)
    comps = _components(fin)
    spreads = [c["gap"].sd for c in comps if has_interval(c["gap"])]
    late = next((c["gap"] for c in comps if c["name"] == _LATE and has_interval(c["gap"])), None)
    odd = _mode_note(recs, size, budget)
    return (
        "BF16 for the last 18 % of tokens, read with care. Its baseline is the recipe, "
        + (f"and the runs were not all made alike: {odd}. " if odd else "")
        + f"Up to the switch (step {aa['switch']:,} of {aa['steps']:,}) the late-switch arm runs the recipe's code on "
        f"the recipe's seed and data, so before it the two arms are an A/A comparison, which arithmetic that repeats "
        f"would make exactly 0 on every seed. At the last evaluation before the switch ({aa['tokens'] / 1e6:.0f} M "
        f"tokens) late switch − recipe = {g.mean:+.4f} {_ci(g)} nats/byte (p {_p(p_value(g))}, {g.n} seeds; "
        f"detectable at 80 % power: {_mde(g)}); over the {aa['evaluations']} evaluations from 15 % of the steps to the "
        f"switch, {aa['zeros']} of the {aa['n']} per-seed differences are 0 at the curves' six decimals and their "
        f"standard deviation is {aa['sd']:.4f} nats/byte"
        + (f", as large as the per-seed spread of the components' gaps ({min(spreads):.4f}–{max(spreads):.4f})"
           if spreads else "")
        + ". This measures the runs' own non-repeatability on the GPU (issue 50): until a run repeats bit for bit, "
        "every paired gap here carries that noise besides the seeds'"
        + (f", and the late switch's gap ({late.mean:+.4f}) is {late.mean / aa['sd']:.1f} times its standard deviation"
           if late is not None else "") + "."
    )


def _final(val: pd.DataFrame, size: str, budget: int) -> dict[str, dict[int, float]]:
    """arm → seed → final validation loss of the done runs of one size and budget (arms in their order in
    ``val``)."""
    sub = val[(val["size"] == size) & (val.budget == budget)].dropna(subset=["val_loss"])
    last = sub[sub.step == sub.groupby("run").step.transform("max")]
    return {arm: g.set_index("seed").val_loss.to_dict() for arm, g in last.groupby("arm", sort=False)}


def _gap_phrase(gap, base_loss: float) -> str:
    """``+0.0062 [-0.0013, +0.0137] (+0.9 %, 3 seeds; detectable 0.0093)``: the mean paired gap, its 95 % interval,
    the mean as a share of BF16's loss, the seed count and the gap detectable at 80 % power (:func:`_mde`)."""
    ci = f" {_ci(gap)}" if has_interval(gap) else ""
    mde = f"; detectable {_mde(gap)}" if has_interval(gap) else ""
    return (f"{gap.mean:+.4f}{ci} ({100 * gap.mean / base_loss:+.1f} %, {gap.n} seed{'s' if gap.n > 1 else ''}"
            f"{mde})")


def headline(data: Path, size: str = "s10m", budget: int | None = None) -> tuple[str, str] | None:
    """(measured, verdict) of study 8 from the campaign's main size and budget, or None before its BF16 and
    recipe runs exist.  Every figure is a paired gap over the seeds both arms finished (arm − BF16, or without −
    with for a component), with its t-interval; the verdict words follow :func:`studies.campaign.stats.verdict`."""
    budget = budget if budget is not None else plan_runs("main", lr=1.0)[0]["tokens"]
    val, recs = load_runs(data)
    fin = _final(val, size, budget)
    if "bf16" not in fin or "nvfp4" not in fin:
        return None
    base = fin["bf16"]
    base_loss = sum(base.values()) / len(base)
    planned = plan_runs("main", lr=1.0)
    done = sum(len(v) for v in fin.values())
    ledger = Path(data) / "sessions.json"
    wall, gpu, known, lost = ledger_sums(ledger)  # a command lost with its machine has no wall time to sum
    where = ((f" ({gpu / 3600:.1f} GPU-hours)" if gpu != wall else "") + " in "
             + (f"all {known} commands" if not lost else
                f"the {known} command{'s' if known != 1 else ''} that reported a wall time ({lost} more lost "
                f"with {'its machine' if lost == 1 else 'their machines'})"))
    gaps = {a: g for a in fin if a != "bf16" and (g := _pair(fin[a], base)) is not None}
    if "nvfp4" not in gaps:  # the recipe's seeds are not BF16's yet: no paired number to lead with
        return None
    order = [a for a in ARMS if a in gaps]
    measured = (
        (f"All {done} main runs" if done == len(planned) else f"{done} of the {len(planned)} main runs")
        + " of the paired-seed campaign (issue 20; protocol below): a Llama-style "
        f"byte-level model of {PARAMS[size] / 1e6:.1f} M non-embedding parameters trained on {budget / 1e6:.0f} M "
        f"tokens ({budget / PARAMS[size]:.0f} per parameter) per run on the NVIDIA H200, "
        f"{wall / 3600:.1f} h of device time{where}. BF16's final "
        f"validation loss: {base_loss:.4f} nats/byte (mean of {len(base)} seeds). Paired gap to BF16 in final "
        f"validation loss, arm − BF16 on the same seed (nats/byte, mean [95 % t-interval] (share of BF16's loss, "
        f"seeds; the smallest gap a paired t-test at α = {ALPHA:g} detects with 80 % power at that seed count and "
        f"spread)): " + "; ".join(f"{ARMS[a].label} {_gap_phrase(gaps[a], base_loss)}" for a in order) + "."
    )
    comps = _components(fin)
    rec = gaps["nvfp4"]
    where = _where(rec)
    if where == "interval above zero":
        first = (f"The recipe stays behind BF16 by {rec.mean:+.4f} nats/byte ({100 * rec.mean / base_loss:+.1f} %), "
                 f"its interval above zero")
    elif where == "interval below zero":
        first = f"The recipe ends below BF16 ({rec.mean:+.4f} nats/byte, its interval below zero)"
    elif where == "interval across zero":
        first = (f"The recipe's gap to BF16 ({rec.mean:+.4f} nats/byte, {100 * rec.mean / base_loss:+.1f} %) is not "
                 f"distinguishable from zero with {rec.n} seeds; at 95 % confidence it trails BF16 here by less than "
                 f"{rec.hi:+.4f} ({100 * rec.hi / base_loss:+.1f} %), the interval's upper end")
    else:
        first = f"The recipe's gap to BF16 is {rec.mean:+.4f} nats/byte on one seed, no interval yet"
    parts = [first + "."]
    every = gaps.get("nvfp4_all")
    if every is not None and _where(every) == "interval above zero":
        parts.append(f"NVFP4 on every block is behind BF16 ({every.mean:+.4f}, interval above zero), in the paper's "
                     f"direction.")
    fp8 = _fp8_text(fin)
    if fp8:
        parts.append(fp8)
    parts.append(_components_text(comps))
    aa = aa_comparison(val, recs, size, budget)
    if aa is not None and has_interval(aa["gap"]) and any(c["name"] == _LATE for c in comps):
        g = aa["gap"]
        apart = [f"seed {s} ({' against '.join(m)})" for s, m in aa["modes"].items() if len(set(m)) > 1]
        parts.append(
            "The late switch is measured against the recipe"
            + (f", and the two ran in different modes on {', '.join(apart)}" if apart else "")
            + f". Before the switch the two arms are one computation (an A/A comparison), yet at "
            f"{aa['tokens'] / 1e6:.0f} M tokens late switch − recipe = {g.mean:+.4f} {_ci(g)} nats/byte ({g.n} seeds; "
            f"{aa['zeros']} of the {aa['n']} per-seed differences from 15 % of the steps to the switch are 0 at the "
            f"curves' six decimals, their standard deviation {aa['sd']:.4f}): the GPU runs do not repeat, and that "
            f"noise is of the size of the components' gaps.")
    split = _split_text(gaps, fin)
    if split:
        parts.append(split)
    fmt = _format_text(fin, gaps)
    if fmt:
        parts.append(fmt)
    missing = [ARMS[a].label for a in ARMS if len(fin.get(a, {})) < 3]
    if missing:
        parts.append(f"Arms with fewer than three seeds so far: {', '.join(missing)}.")
    return measured, " ".join(parts)


_LATE = "BF16 for the last 18 % of tokens"


def _fp8_text(fin: dict) -> str:
    """NVFP4 against FP8, the NVFP4 paper's headline comparison: the recipe − FP8 blockwise on their common seeds
    with its interval, p-value and 80 %-power detectable gap, or the statement that it is missing."""
    if "nvfp4" not in fin or "fp8_blockwise" not in fin or not set(fin["nvfp4"]) & set(fin["fp8_blockwise"]):
        return ("NVFP4 − FP8, the NVFP4 paper's headline comparison: missing (no recipe and FP8 runs on common "
                "seeds).")
    g = paired_gap(fin["nvfp4"], fin["fp8_blockwise"])
    ref = sum(fin["fp8_blockwise"][s] for s in g.seeds) / g.n
    head = ("The NVFP4 paper's headline comparison is NVFP4 against FP8 (a 12 B model on 10 T tokens, whose NVFP4 "
            "training loss and downstream accuracy stay comparable to its FP8 baseline's, e.g. MMLU-Pro 62.58 % "
            "against 62.62 %); here the recipe − FP8 blockwise (the campaign's FP8 arm: 1×128 activation and "
            "gradient blocks, 128×128 weight blocks, every block in FP8) = ")
    if not has_interval(g):
        return head + f"{g.mean:+.4f} nats/byte on one seed, no interval yet."
    text = (head + f"{g.mean:+.4f} {_ci(g)} nats/byte ({100 * g.mean / ref:+.1f} % of FP8's loss, p "
            f"{_p(p_value(g))}, {g.n} seeds; detectable at 80 % power: {_mde(g)})")
    if _where(g) == "interval across zero":
        return text + (f", not distinguishable from zero: at 95 % confidence the recipe trails FP8 blockwise here by "
                       f"less than {g.hi:+.4f} ({100 * g.hi / ref:+.1f} %).")
    return text + f", its {_where(g)}."


def _components_text(comps: list[dict]) -> str:
    """The components' verdicts in one sentence: resolved, contradicted and not resolved after the Holm
    correction, with the claims that are not NVIDIA's paper's named, and those with one seed."""
    withp = [c for c in comps if has_interval(c["gap"])]
    single = [c["name"] for c in comps if c["gap"] is not None and not has_interval(c["gap"])]
    k = len(withp)

    def name(c):
        by = CLAIMED_BY[c["name"]]
        extra = [] if by.startswith("NVIDIA") else [f"claimed by {by}"]
        if c["p"] < ALPHA <= c["holm"] and k > 1:
            extra.append(f"p {_p(c['p'])} alone, {_p(c['holm'])} after the correction")
        return c["name"] + (f" ({'; '.join(extra)})" if extra else "")

    res = [name(c) for c in withp if c["verdict"] == "resolved"]
    contra = [name(c) for c in withp if c["verdict"] == "contradicted"]
    open_ = [name(c) for c in withp if c["verdict"].startswith("not resolved")]
    rule = f"Holm-corrected p below {ALPHA:g} over the {k}" if k > 1 else f"p below {ALPHA:g}"
    return (f"Of the {k} recipe component{'s' if k != 1 else ''} with an interval ({rule}), "
            + (f"resolved in the claimed direction: {', '.join(res)}" if res else "none is resolved")
            + (f"; not resolved at this scale: {', '.join(open_)}" if open_ else "")
            + (f"; contradicted: {', '.join(contra)}" if contra else "")
            + (f"; one seed so far, no interval: {', '.join(single)}" if single else "") + ".")


def _where(gap) -> str:
    """Where a paired gap's 95 % interval lies: above zero, below zero, across zero, or no interval (one seed)."""
    if not has_interval(gap):
        return "one seed, no interval"
    return "interval above zero" if gap.lo > 0 else "interval below zero" if gap.hi < 0 else "interval across zero"


def _split_text(gaps: dict, fin: dict | None = None) -> str:
    """The forward-only and backward-only arms (each − BF16), and, with ``fin`` (arm → seed → final loss), their
    paired difference forward − backward, which alone says whether one pass costs more than the other; "" before
    both arms have two seeds."""
    fwd, bwd = gaps.get("nvfp4_fwd"), gaps.get("nvfp4_bwd")
    if not (has_interval(fwd) and has_interval(bwd)):
        return ""
    text = (f"Split by pass: NVFP4 in the forward pass alone costs {fwd.mean:+.4f} ({_where(fwd)}), in the backward "
            f"pass alone {bwd.mean:+.4f} ({_where(bwd)})")
    diff = _pair(fin["nvfp4_fwd"], fin["nvfp4_bwd"]) if fin and "nvfp4_fwd" in fin and "nvfp4_bwd" in fin else None
    if not has_interval(diff):
        return text + "."
    text += (f"; forward − backward, paired per seed: {diff.mean:+.4f} {_ci(diff)} (p {_p(p_value(diff))}, "
             f"detectable at 80 % power: {_mde(diff)})")
    if _where(diff) == "interval across zero":
        return text + ", an interval that includes zero, so these runs do not tell which pass costs more."
    more = "forward" if diff.mean > 0 else "backward"
    return text + f": the {more} pass's quantization costs more than the other's."


def _format_text(fin: dict, gaps: dict) -> str:
    """The other formats against the recipe: MXFP4's recipe − NVFP4's (the paper: MXFP4 widens the gap), with
    what the MXFP4 arm changes besides the format, and FP8 blockwise − BF16, each once both arms have two common
    seeds; "" before."""
    out = []
    if "mxfp4" in fin and "nvfp4" in fin:
        g = _pair(fin["mxfp4"], fin["nvfp4"])
        if has_interval(g):
            word = verdict(g, "helps").split(" (")[0]
            out.append(f"MXFP4's recipe − NVFP4's: {g.mean:+.4f} {_ci(g)} ({_where(g)}, detectable at 80 % power: "
                       f"{_mde(g)}; the paper's 'MXFP4 widens the gap': {word}). {_MXFP4_TEXT}")
    f8 = gaps.get("fp8_blockwise")
    if has_interval(f8):
        out.append(f"FP8 blockwise − BF16: {f8.mean:+.4f} {_ci(f8)} ({_where(f8)}, detectable at 80 % power: "
                   f"{_mde(f8)}).")
    return " ".join(out)


#: What MXFP4 − NVFP4 measures (:data:`studies.campaign.arms.MXFP4_OTHER_CHANGES`).
_MXFP4_TEXT = (f"The MXFP4 arm changes the format ({MXFP4_FORMAT}) and more besides: "
               f"{'; and '.join(MXFP4_OTHER_CHANGES)}. That gap is theirs together, not the format's alone.")
