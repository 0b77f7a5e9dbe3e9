"""Study 10 — component probes on real models: what each recipe component does to each GEMM, with intervals.

Draws from the committed results of ``studies.probes.measure`` (``studies/data/probes/<model>_*.csv`` and
``<model>.json``: :func:`fpsim.torch.probe` on SmolLM2-135M and all-MiniLM-L6-v2), so ``make reports`` needs
neither model.  Writes ``<out>/probes/``: ``probes.csv`` (one row per model × component × GEMM: the effect on the
metric the component exists to change, its 95 % interval over batches, Holm's p over all of that model's
comparisons, the effect detectable at 80 % power, and the verdict), ``forest.png`` and ``section.md``.

Effects are paired differences over batches, in units of the GEMM result's norm ‖g‖ (rel_err and bias are both
fractions of ‖g‖): for an ablation, metric(recipe without c) − metric(recipe), so a positive effect means the
component lowers that error; for four-over-six, metric(recipe) − metric(with four-over-six); for the other formats,
metric(other) − metric(NVFP4 recipe), positive where NVFP4 has the smaller error; the A/A row is the recipe
against itself with independent random draws (its interval should cover 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from studies.common import md_table, parse_args, save_fig, write_csv, write_section

NAME = "probes"
DATA = Path(__file__).resolve().parents[1] / "data" / "probes"
MODELS = {"smollm2": "SmolLM2-135M", "minilm": "all-MiniLM-L6-v2"}
ALPHA = 0.05


@dataclass(frozen=True)
class Target:
    """A component, the comparison that measures it, the GEMMs and metric it exists to change, and the claim."""

    label: str
    component: str  # the probe's component name (components.csv)
    gemms: tuple[str, ...]
    metric: str
    mode: str
    claim: str
    expect: int = 1  # the sign of effect the claim predicts (0: none)


TARGETS = (
    Target("stochastic rounding", "sr", ("dgrad", "wgrad"), "bias", "isolated",
           "NVIDIA's paper: SR on the gradients removes the rounding bias RNE leaves in Dgrad and Wgrad"),
    Target("random Hadamard transform", "rht", ("wgrad",), "rel_err", "isolated",
           "NVIDIA's paper: RHT on Wgrad's inputs spreads outliers and lowers Wgrad's error"),
    Target("16×16 weight tiles", "2d", ("fprop", "dgrad"), "rel_err", "isolated",
           "NVIDIA's paper: 2D tiles make Fprop and Dgrad see the same quantized weight (a consistency claim; the "
           "probe measures what the tiles cost in error, expected to be some)", -1),
    Target("tensor scale", "tensor scale", ("dgrad", "wgrad"), "rel_err", "isolated",
           "NVIDIA's paper: the FP32 tensor scale keeps the E4M3 block scales out of underflow"),
    Target("four-over-six", "four-over-six", ("fprop", "dgrad", "wgrad"), "rel_err", "isolated",
           "not NVIDIA's paper (the four-over-six block-scale paper): scaling some blocks' max to 4 instead of 6 "
           "lowers the error near the block maximum"),
    Target("BF16 layers", "bf16_layers", ("fprop", "dgrad", "wgrad"), "rel_err", "end_to_end",
           "NVIDIA's paper: keeping the first and last blocks in BF16 shields the most sensitive layers"),
    Target("NVFP4 vs MXFP4", "mxfp4", ("fprop", "dgrad", "wgrad"), "rel_err", "isolated",
           "NVIDIA's paper: NVFP4 (16-element blocks, E4M3 scales) quantizes more accurately than MXFP4 (32, E8M0)"),
    Target("NVFP4 vs FP8", "fp8", ("fprop", "dgrad", "wgrad"), "rel_err", "isolated",
           "NVIDIA's paper: NVFP4 training comes close to FP8's (FP8 blockwise here); per GEMM FP8 is expected to "
           "be more accurate", -1),
    Target("A/A (recipe vs itself)", "A/A (none: two draws sets)", ("fprop", "dgrad", "wgrad"), "rel_err",
           "isolated", "none: two independent sets of random draws of the same recipe; the interval should cover 0", 0),
)


def load(model: str, data: Path | None = None) -> dict | None:
    """The committed results of one model (None when it has not been measured); ``data`` default :data:`DATA`."""
    data = DATA if data is None else data
    meta = data / f"{model}.json"
    if not meta.exists():
        return None
    out = {"meta": json.loads(meta.read_text())}
    for part in ("summary", "components", "steps", "flags"):
        out[part] = pd.read_csv(data / f"{model}_{part}.csv")
    return out


def holm(p: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None); the same rule as ``fpsim.torch.probe_stats.holm``,
    restated so that rendering needs no torch."""
    order = sorted((i for i, x in enumerate(p) if x is not None), key=lambda i: p[i])
    out: list[float | None] = [None] * len(p)
    run = 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (len(order) - k) * p[i]))
        out[i] = run
    return out


def _verdict(row) -> str:
    if row["n"] < 2 or pd.isna(row["p_holm"]):
        return "no interval (fewer than two batches)"
    if row["p_holm"] < ALPHA:
        return "resolved: " + ("lowers" if row["effect"] > 0 else "raises") + " the error"
    return f"not resolved (80 %-power detectable: {row['mde80']:.2g})"


def effects(res: dict, model: str) -> pd.DataFrame:
    """One row per component × GEMM on its target metric, plus the SGD and AdamW step-progress effects; Holm's
    correction over the rows of the model (the study's family of comparisons, the A/A rows included)."""
    c = res["components"]
    rows = []
    for t in TARGETS:
        for g in t.gemms:
            hit = c[(c["component"] == t.component) & (c["gemm"] == g) & (c["mode"] == t.mode)
                    & (c["metric"] == t.metric)]
            if hit.empty:
                continue
            r = hit.iloc[0]
            rows.append({"model": model, "component": t.label, "gemm": g, "metric": t.metric, "mode": t.mode,
                         "effect": r["mean"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n": int(r["n"]),
                         "p": r["p"], "mde80": r["mde80"]})
        for opt in ("sgd", "adamw"):
            hit = c[(c["component"] == t.component) & (c["gemm"] == "step") & (c["mode"] == opt)]
            if hit.empty:
                continue
            r = hit.iloc[0]
            rows.append({"model": model, "component": t.label, "gemm": f"step ({opt})", "metric": "step_progress",
                         "mode": "end_to_end", "effect": r["mean"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                         "n": int(r["n"]), "p": r["p"], "mde80": r["mde80"]})
    df = pd.DataFrame(rows)
    df = df[df["n"] > 0].reset_index(drop=True)  # a variant not run end to end has no step rows
    df["p_holm"] = holm([None if pd.isna(x) else float(x) for x in df["p"]])
    df["verdict"] = [_verdict(r) if r["metric"] != "step_progress" else _verdict(r).replace(
        "lowers the error", "keeps more of FP32's progress").replace("raises the error", "loses progress")
        for _, r in df.iterrows()]
    return df.drop(columns=["p"])


def forest(df: pd.DataFrame, path: Path) -> None:
    """Each model's component effects on their target metric with 95 % intervals (step ratios left out)."""
    d = df[df["metric"] != "step_progress"]
    models = [m for m in MODELS if m in set(d["model"])]
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(6.2 * max(1, len(models)), 0.32 * 30 + 1.5),
                             squeeze=False)
    colors = {"fprop": "tab:blue", "dgrad": "tab:orange", "wgrad": "tab:green"}
    for ax, m in zip(axes[0], models):
        s = d[d["model"] == m].reset_index(drop=True)
        y = np.arange(len(s))[::-1]
        for i, r in s.iterrows():
            lo, hi = r["ci_low"], r["ci_high"]
            ax.errorbar([r["effect"]], [y[i]], xerr=None if pd.isna(lo) else [[r["effect"] - lo], [hi - r["effect"]]],
                        fmt="o", color=colors[r["gemm"]], capsize=3, ms=4)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([f"{r['component']} · {r['gemm']} ({r['metric']})" for _, r in s.iterrows()], fontsize=7)
        ax.set_xscale("symlog", linthresh=1e-4)
        ax.set_xlabel("effect, fraction of ‖g‖ (> 0: the component / NVFP4 has the smaller error)")
        ax.set_title(f"{MODELS[m]}: effect with 95 % CI over batches")
        ax.grid(axis="x", alpha=0.3)
    save_fig(fig, path)


def _setting(meta: dict) -> str:
    p, d = meta["plan"], meta["data"]
    layers = "every linear layer" if p["layers"] == ["*"] else "the linear layers of " + ", ".join(
        x.rstrip(".*") for x in p["layers"])
    return (f"{meta['run']} run: {p['batches']} batches of {d['batch']} ({d['text']}; loss: {d['loss']}), "
            f"{p['val_batches']} held-out batches for the step ratio, {p['draws']} random draws per random variant "
            f"in isolated mode and {p['e2e_draws']} end to end, {layers} measured; BF16 layers: first "
            f"{meta['keep_bf16']['first']} and last {meta['keep_bf16']['last']} of {d['blocks']} blocks; weights: "
            f"{d['weights']}; {meta['wall_s']:.0f} s on {meta['threads']} threads")


def main(argv=None) -> Path:
    args = parse_args(NAME, __doc__, argv)
    res = {m: load(m) for m in MODELS}
    have = {m: r for m, r in res.items() if r is not None}
    if not have:
        measured = "No model has been measured yet (`python -m studies.probes.measure`)."
        return write_section(args, "10. Component probes on real models", "—", measured, "No data.", [])
    df = pd.concat([effects(r, m) for m, r in have.items()], ignore_index=True)
    write_csv(df, args.dir / "probes.csv")
    forest(df, args.dir / "forest.png")
    settings = " ".join(f"{MODELS[m]}: {_setting(r['meta'])}." for m, r in have.items())
    claim = ("Each component of the NVFP4 recipe exists to fix one error in one GEMM: " + "; ".join(
        f"{t.label}: {t.claim}" for t in TARGETS[:6]) + ".")
    lines = []
    for m in have:
        d = df[df["model"] == m]
        res_ = d[d["verdict"].str.startswith("resolved")]
        lines.append(f"{MODELS[m]}: {len(res_)} of the {len(d)} comparisons of its table resolved after Holm's "
                     f"correction over those {len(d)}.")
    tables = []
    for m in have:
        d = df[df["model"] == m].drop(columns=["model"])
        tables.append(f"{MODELS[m]}: effect on the target metric (rel_err and bias: fraction of ‖g‖, the GEMM "
                      "result's norm; step_progress: fraction of the FP32 steps' mean first-order held-out-loss "
                      "decrease, for the variants run end to end), per-comparison 95 % t-interval over batches, "
                      "Holm-corrected p over the table's rows (the verdict's test), and the effect a comparison this "
                      "size detects at 80 % power:\n\n"
                      + md_table(d, formats={"effect": ".3g", "ci_low": ".3g", "ci_high": ".3g", "p_holm": ".2g",
                                             "mde80": ".2g"}))
    verdict = " ".join(_component_verdicts(df)) + " " + _qualifications(df, have)
    fr = DATA / "flag_rate.json"
    if fr.exists():
        lines.append(_flag_rate(json.loads(fr.read_text())))
    return write_section(args, "10. Component probes on real models", claim,
                         settings + " " + " ".join(lines), verdict, ["forest.png"], tables)


def _flag_rate(r: dict) -> str:
    """The as-built check's measured false-flag rate and planted-defect detection (``flag_rate.json``)."""
    plants = "; ".join(f"{name} ({p['layer']} {p['gemm']}): found alone in {p['found_exactly']} of {p['seeds']} "
                       f"seeds, missed in {p['missed']}, with another row flagged too in {p['also_flagged_elsewhere']}"
                       for name, p in r["plants"].items())
    return (f"The as-built check (a model's own fpsim layers against fpsim's emulation, `studies/probes/flag_rate.py`"
            f"): a correct small NVFP4 model was flagged in {r['correct_flagged']} of {r['correct_seeds']} seeds "
            f"(false-flag rate {100 * r['false_flag_rate']:.0f} %, seeds {r['correct_flagged_seeds'] or 'none'}); "
            f"planted defects: {plants}.")


def _qualifications(df: pd.DataFrame, have: dict) -> str:
    """What the GEMM-level verdicts do not say: the step-progress rows, the models' weights, one step."""
    st = df[df["metric"] == "step_progress"]
    parts = []
    if not st.empty:
        n_res = int(st["verdict"].str.startswith("resolved").sum())
        parts.append(f"Qualifications: (1) {n_res} of the {len(st)} one-step held-out-progress effects is resolved "
                     f"(the comparisons detect {st['mde80'].min():.2g}–{st['mde80'].max():.2g} of the FP32 steps' "
                     "progress at 80 % power, with one end-to-end draw per variant and "
                     f"{min(int(r['meta']['plan']['val_batches']) for r in have.values())} held-out batches), so at "
                     "this size the probe resolves what a component does to each GEMM, not what it does to the "
                     "progress of a step;")
    if "smollm2" in have:
        parts.append("(2) SmolLM2's linear weights come Q4_1-dequantized from the GGUF, so its Fprop and Dgrad "
                     "numbers quantize weights already on a 4-bit grid (MiniLM's are float32);")
    parts.append("(3) every number is one step at the models' pretrained weights; how these per-step errors add up "
                 "over a run is study 8's question (training level).")
    return " ".join(parts)


def _component_verdicts(df: pd.DataFrame) -> list[str]:
    """Per component: each model's GEMM effects on the target metric, and whether they agree with the claim."""
    out = []
    for t in TARGETS:
        parts, signs = [], []
        for m in MODELS:
            d = df[(df["model"] == m) & (df["component"] == t.label) & (df["metric"] != "step_progress")]
            if d.empty:
                continue
            bits = []
            for _, r in d.iterrows():
                ci = "" if pd.isna(r["ci_low"]) else f" [{r['ci_low']:+.2g}, {r['ci_high']:+.2g}]"
                res = r["verdict"].startswith("resolved")
                signs.append(int(np.sign(r["effect"])) if res else 0)
                bits.append(f"{r['gemm']} {r['effect']:+.2g}{ci}{'' if res else ' (not resolved)'}")
            parts.append(f"{MODELS[m]}: " + ", ".join(bits))
        if not parts:
            continue
        if t.expect == 0:
            word = ("as it should, no A/A difference is resolved" if not any(signs)
                    else "an A/A difference is resolved: the intervals are too narrow")
        elif signs and all(s == t.expect for s in signs):
            word = "every GEMM and model resolved in the claimed direction"
        elif any(s == -t.expect for s in signs):
            word = "resolved against the claimed direction in " + f"{sum(s == -t.expect for s in signs)} of " \
                   f"{len(signs)} GEMM × model comparisons"
        else:
            word = (f"{sum(s == t.expect for s in signs)} of {len(signs)} resolved in the claimed direction, the "
                    "others not resolved")
        out.append(f"**{t.label}** ({t.metric}, {t.mode.replace('_', '-')}): {word}. " + "; ".join(parts) + ".")
    return out
