"""Study 8's campaign section, rendered from the committed run CSVs and JSONs (no GPU; issue 20).

For each size and budget: the final validation loss of every arm and seed, the paired gap to BF16 (mean over
seeds of arm − BF16, nats per byte) with its 95 % t-interval, each recipe component's gap with the paper's claim
and the verdict of :func:`studies.campaign.stats.verdict`, loss curves with the seed band, the gap along the
schedule; across budgets and sizes, the recipe's and SR's gaps against tokens per parameter with their paired change
from the main budget (once a second budget or size has runs); throughput per arm, the GPU time spent and the ledger
of device commands.  Runs that are not ``"done"`` are listed and left out of the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from studies.campaign.arms import ARMS, COMPONENTS
from studies.campaign.batch import LR, PARAMS, plan_runs
from studies.campaign.spend import _budget_text, _ledger_table, _ledger_text, _plan_text, _run_seconds, ledger_sums  # noqa: F401
from studies.campaign.stats import has_interval, paired_gap, verdict
from studies.common import save_fig

__all__ = ["load_runs", "render", "headline"]


def load_runs(data: Path) -> tuple[pd.DataFrame, list[dict]]:
    """(validation rows of every run: run, arm, seed, size, budget, tokens, val_loss, tokens_per_s; the run
    records), from ``data/**/<run>.csv`` and ``.json``."""
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
        df = pd.read_csv(csv)
        df = df.assign(run=rec["run"], arm=rec["arm"], seed=rec["seed"], size=rec["size"],
                       budget=rec["tokens_budget"])
        frames.append(df)
    cols = ["run", "arm", "seed", "size", "budget", "step", "tokens", "val_loss", "tokens_per_s"]
    return (pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)), recs


PROTOCOL = (
    "**Paired-seed campaign (issue 20): protocol.** Llama-style byte-level decoders (RMSNorm, RoPE, SwiGLU, no "
    "biases, context 512) of 10.6 M and 19.3 M non-embedding parameters; AdamW (β2 = 0.95, weight decay 0.1), "
    "2 % linear warmup then cosine to 10 %, clipping at 1.0, bf16 autocast, batches of 64 × 512 bytes, the learning "
    "rate chosen once by a BF16 sweep and fixed for every arm. Data: the Python sources of the packages installed on "
    "the GPU machine in sorted path order, whole packages (sympy, pandas) held out; each run records the file and "
    "byte counts and the SHA-256 of both streams. Validation: the first 1,048,576 held-out bytes, at 20 evenly "
    "spaced token counts. Arms: BF16; the NVFP4 recipe (last ~15 % of blocks BF16); without SR, RHT or 2-D weights; "
    "every block NVFP4; forward only; backward only; MXFP4; FP8 blockwise; four-over-six; the recipe with BF16 for "
    "the last 18 % of tokens. The embedding, the LM head, the norms and attention stay high precision in every arm; "
    "block linears run the arm's recipe through `fpsim.torch` (`gemm=\"blas\"`). A seed fixes the initial weights and "
    "the data order, so arms differ only by the recipe; the reported number is the mean over seeds of the per-seed "
    "difference in final validation loss with a 95 % t-interval; a component is *resolved* when the interval "
    "excludes zero in the claimed direction, *contradicted* when it excludes zero the other way, else *not resolved "
    "at this scale*."
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
        df = pd.read_csv(js.with_suffix(".csv"))
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


def _chance_any(k: int) -> float:
    """The probability that at least one of ``k`` independent 95 % intervals excludes zero with no real effect."""
    return 1 - 0.95 ** k


def _multiplicity_text(k: int) -> str:
    """How often ``k`` intervals at 95 % would exclude zero by chance alone (independent tests, no real effect);
    empty for a single interval."""
    if k < 2:
        return ""
    return (f"Each interval is a 95 % interval on its own: with {k} of them (one per component with two or more seeds) "
            f"and none of those components doing anything, "
            f"at least one interval would exclude zero with probability 1 − 0.95^{k} = {100 * _chance_any(k):.0f} % "
            f"(were they independent; they share the recipe's runs), so a "
            f"single *resolved* verdict among them is evidence, not proof.")


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


def _gap_cells(arm: dict, base: dict):
    """(the paired gap of ``arm`` over ``base`` (seed → final loss), its table cells: mean, interval, per seed);
    without a common seed (None, cells that say so)."""
    gap = _pair(arm, base)
    if gap is None:
        return None, {"gap": "", "95 % CI": "— (no seed in common yet)", "per seed": ""}
    return gap, {"gap": gap.mean, "95 % CI": _ci(gap), "per seed": _per_seed(arm, base)}


def _component_runs(fin: dict[str, dict[int, float]]) -> list[tuple[str, str, dict, dict]]:
    """(component, claim, runs without it, runs with it) of each recipe component whose two arms both have final
    losses in :func:`_final`'s ``fin``; the study's table and its verdict both read this list."""
    return [(name, claim, fin[w], fin[c]) for name, w, c, claim in COMPONENTS if w in fin and c in fin]


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
                         "gap": label, "seeds": gap.n, "mean (nats/byte)": gap.mean, "95 % CI": _ci(gap)})
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
                              "gap change (nats/byte)": d.mean, "95 % CI": _ci(d)})
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
            text += f", {d.mean:+.4f} {_ci(d)} from {main_size}, {main_budget / 1e6:,.0f} M on the same seeds"
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
    blocks, figs = [PROTOCOL, *early], [first] if first else []
    run_h = sum(r.get("seconds_total", 0) for r in recs) / 3600  # the plans' runs (load_runs skips sweep, probes)
    finals = {}  # (size, budget) → arm → seed → final loss, for the tables here and the scaling block
    for (size, budget), sub in val.groupby(["size", "budget"]):
        fin = finals[(size, int(budget))] = _final(sub, size, budget)
        rows = _gap_rows(fin)
        if rows:
            blocks.append(f"Paired gaps to BF16, {size}, {budget / 1e6:.0f} M tokens:\n\n"
                          + md_table(pd.DataFrame(rows), "+.4f"))
        comp, intervals = [], 0
        for name, claim, without, with_ in _component_runs(fin):
            gap, cells = _gap_cells(without, with_)
            comp.append({"component": name, "claim": claim, "gap (nats/byte)": cells.pop("gap"), **cells,
                         "verdict": "no verdict (no seed in common yet)" if gap is None else verdict(gap, claim)})
            intervals += has_interval(gap)
        if comp:
            blocks.append(f"Recipe components, {size}, {budget / 1e6:.0f} M tokens (gap = without − with):\n\n"
                          + md_table(pd.DataFrame(comp), "+.4f"))
            if intervals > 1:  # a one-seed component has no interval, so it cannot exclude zero by chance
                blocks.append(_multiplicity_text(intervals))
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


def _final(val: pd.DataFrame, size: str, budget: int) -> dict[str, dict[int, float]]:
    """arm → seed → final validation loss of the done runs of one size and budget (arms in their order in
    ``val``)."""
    sub = val[(val["size"] == size) & (val.budget == budget)].dropna(subset=["val_loss"])
    last = sub[sub.step == sub.groupby("run").step.transform("max")]
    return {arm: g.set_index("seed").val_loss.to_dict() for arm, g in last.groupby("arm", sort=False)}


def _gap_phrase(gap, base_loss: float) -> str:
    """``+0.0062 [-0.0013, +0.0137] (+0.9 %, 3 seeds)``: the mean paired gap, its 95 % interval, the mean as a
    share of BF16's loss and the seed count."""
    ci = f" {_ci(gap)}" if has_interval(gap) else ""
    return f"{gap.mean:+.4f}{ci} ({100 * gap.mean / base_loss:+.1f} %, {gap.n} seed{'s' if gap.n > 1 else ''})"


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
        f"seeds)): " + "; ".join(f"{ARMS[a].label} {_gap_phrase(gaps[a], base_loss)}" for a in order) + "."
    )
    paired = [(name, g, claim) for name, claim, w, c in _component_runs(fin) if (g := _pair(w, c)) is not None]
    comp = [(name, g, claim) for name, g, claim in paired if has_interval(g)]
    single = [name for name, g, _ in paired if not has_interval(g)]
    words = {name: verdict(g, claim) for name, g, claim in comp}
    res = [n for n, v in words.items() if v == "resolved"]
    contra = [n for n, v in words.items() if v == "contradicted"]
    open_ = [n for n, v in words.items() if v.startswith("not resolved")]
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
    parts.append(
        f"Of the {len(comp)} recipe component{'s' if len(comp) != 1 else ''} with an interval, "
        + (f"resolved in the paper's direction: {', '.join(res)}" if res else "none is resolved")
        + (f"; not resolved at this scale (interval includes zero): {', '.join(open_)}" if open_ else "")
        + (f"; contradicted: {', '.join(contra)}" if contra else "")
        + (f"; one seed so far, no interval: {', '.join(single)}" if single else "")
        + (f" (with {len(comp)} intervals and no real effect, at least one would exclude zero "
           f"{100 * _chance_any(len(comp)):.0f} % of the time, so one resolved is evidence, not proof)"
           if len(res) == 1 and len(comp) > 1 else "") + ".")
    split = _split_text(gaps)
    if split:
        parts.append(split)
    fmt = _format_text(fin, gaps)
    if fmt:
        parts.append(fmt)
    missing = [ARMS[a].label for a in ARMS if len(fin.get(a, {})) < 3]
    if missing:
        parts.append(f"Arms with fewer than three seeds so far: {', '.join(missing)}.")
    return measured, " ".join(parts)


def _where(gap) -> str:
    """Where a paired gap's 95 % interval lies: above zero, below zero, across zero, or no interval (one seed)."""
    if not has_interval(gap):
        return "one seed, no interval"
    return "interval above zero" if gap.lo > 0 else "interval below zero" if gap.hi < 0 else "interval across zero"


def _split_text(gaps: dict) -> str:
    """Which pass carries the recipe's gap, from the forward-only and backward-only arms (each − BF16), or ""
    before both have two seeds."""
    fwd, bwd = gaps.get("nvfp4_fwd"), gaps.get("nvfp4_bwd")
    if not (has_interval(fwd) and has_interval(bwd)):
        return ""
    text = (f"Split by pass: NVFP4 in the forward pass alone costs {fwd.mean:+.4f} ({_where(fwd)}), in the backward "
            f"pass alone {bwd.mean:+.4f} ({_where(bwd)})")
    ends = _where(fwd), _where(bwd)
    if ends == ("interval above zero", "interval across zero"):
        return text + "; the forward pass's quantization carries the measurable part of the gap."
    if ends == ("interval across zero", "interval above zero"):
        return text + "; the backward pass's quantization carries the measurable part of the gap."
    return text + "."


def _format_text(fin: dict, gaps: dict) -> str:
    """The other formats against the recipe: MXFP4's recipe − NVFP4's (the paper: MXFP4 widens the gap) and FP8
    blockwise − BF16, each once both arms have two common seeds; "" before."""
    out = []
    if "mxfp4" in fin and "nvfp4" in fin:
        g = _pair(fin["mxfp4"], fin["nvfp4"])
        if has_interval(g):
            word = verdict(g, "helps").split(" (")[0]
            out.append(f"MXFP4's recipe − NVFP4's: {g.mean:+.4f} {_ci(g)} ({_where(g)}; the paper's 'MXFP4 widens "
                       f"the gap': {word})")
    f8 = gaps.get("fp8_blockwise")
    if has_interval(f8):
        out.append(f"FP8 blockwise − BF16: {f8.mean:+.4f} {_ci(f8)} ({_where(f8)})")
    return ("; ".join(out) + ".") if out else ""
