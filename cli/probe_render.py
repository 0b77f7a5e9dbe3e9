"""``fpsim probe``'s outputs: the text summary on stdout, the CSV summary table and a figure per component."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

GEMMS = ("fprop", "dgrad", "wgrad")
MODES = ("isolated", "end_to_end")


def _num(v, fmt: str = "+.3g") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return format(float(v), fmt)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _effect(r) -> list[str]:
    """effect, 95 % CI, Holm's p (a star below 0.05), mde80 of a component row (dashes for none)."""
    if r is None:
        return ["–", "", "", ""]
    star = "*" if r["p_holm"] is not None and math.isfinite(r["p_holm"]) and r["p_holm"] < 0.05 else ""
    return [_num(r["mean"]), f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]", _num(r["p_holm"], ".2g") + star,
            _num(r["mde80"], ".2g")]


def _nothing(r) -> bool:
    """A row the component does not change: every batch's difference 0 (to rounding)."""
    vals = [r[k] for k in ("mean", "ci_low", "ci_high") if r is not None and r[k] is not None]
    return all(math.isfinite(v) and abs(v) < 1e-12 for v in vals)


def summary_text(res, wall_s: float) -> str:
    """What ran; each component's paired effect on rel_err and bias per GEMM and mode, and on the one-step loss
    change (effect, 95 % CI, Holm's p, the effect detectable at 80 % power); then the flags."""
    m = res.meta
    mod, data, keep = m.get("model", {}), m.get("data", {}), m.get("keep_bf16", {})
    lines = [f"model: {mod.get('path')} ({mod.get('arch')}, {mod.get('blocks')} blocks, {mod.get('linear_layers')} "
             f"linear layers, {len(m['layers_measured'])} measured); recipe {m['recipe']}; BF16 blocks: first "
             f"{keep.get('first')}, last {keep.get('last')}",
             f"data: {data.get('source')}, {data.get('tokens_available')} tokens: {m['batches']} batches of "
             f"{data.get('batch_size')} × {data.get('seq_len')} tokens, {data.get('val_batches')} held out; draws "
             f"{m['draws']} (end to end {m['end_to_end_draws']}); modes {', '.join(m['modes'])}; {wall_s:.1f} s", "",
             *textwrap.wrap("Component effects, paired over batches: the metric without the component − with it "
                            "(four-over-six: with − without; A/A: the recipe's second set of draws − its first), mean "
                            "over the measured layers; 95 % CI; p: Holm's over every component row (* below 0.05); "
                            "mde80: the effect detectable at 80 % power. Rows the component leaves unchanged are left "
                            "out; gain and every layer are in --output FILE.json.", 116), ""]
    recs = res.components.to_dict("records")
    by = {(r["component"], r["gemm"], r["mode"], r["metric"]): r for r in recs}
    step_metric = next((r["metric"] for r in recs if r["gemm"] == "step"), "step")  # the probe's model-level metric
    head = ["component", "gemm", "mode", "Δ rel_err", "95 % CI", "p", "mde80", "Δ bias", "95 % CI", "p", "mde80"]
    rows, steps, last = [head], [["component", "optimizer", f"Δ {step_metric}", "95 % CI", "p", "mde80"]], None
    for comp in dict.fromkeys(r["component"] for r in recs):
        name = "A/A" if str(comp).startswith("A/A") else str(comp)
        for gemm in GEMMS:
            for mode in MODES:
                re_, bi = by.get((comp, gemm, mode, "rel_err")), by.get((comp, gemm, mode, "bias"))
                if (re_ is None and bi is None) or (_nothing(re_) and _nothing(bi)):
                    continue
                rows.append([name if name != last else "", gemm, mode, *_effect(re_), *_effect(bi)])
                last = name
        for opt in ("sgd", "adamw"):
            r = by.get((comp, "step", opt, step_metric))
            if r is not None:
                steps.append([name if opt == "sgd" else "", opt, *_effect(r)])
    lines += _table(rows, {3, 5, 6, 7, 9, 10}) if len(rows) > 1 else ["(no component: the variants compare nothing)"]
    if len(steps) > 1:
        lines += ["", f"One optimizer step: the held-out loss's first-order change relative to FP32's ({step_metric}; "
                  "see fpsim.torch.probes)", ""]
        lines += _table(steps, {2, 4, 5})
    lines += [""] + _flag_lines(res.flags)
    return "\n".join(lines) + "\n"


def _flag_lines(flags) -> list[str]:
    if not len(flags):
        return ["flags: none to check (the as-built check compares a model's own fpsim layers with fpsim's emulation "
                "of their recipe; this model has none)"]
    hit = flags[flags["flagged"]]
    if not len(hit):
        return [f"flags: none of {len(flags)} as-built checks (layer × GEMM × metric) flagged"]
    out = [f"flags: {len(hit)} of {len(flags)} as-built checks differ from fpsim's emulation:"]
    for r in hit.to_dict("records"):
        out.append(f"  {r['layer']} {r['gemm']} {r['metric']}: as built {_num(r['as_built'], '.4g')}, emulated "
                   f"{_num(r['emulated'], '.4g')}, diff {_num(r['diff'])} [{_num(r['ci_low'])}, "
                   f"{_num(r['ci_high'])}], p_holm {_num(r['p_holm'], '.3g')}")
    return out


def summary_csv(res) -> str:
    """The summary table (per layer and "all" × GEMM × variant × mode × metric: mean and 95 % CI) as CSV; a value
    that cannot be computed is an empty cell."""
    return res.summary.to_csv(index=False, lineterminator="\n")


def _slug(component: str) -> str:
    if component.startswith("A/A"):
        return "aa"
    return re.sub(r"[^a-z0-9]+", "_", component.lower()).strip("_") or "component"


def _sig6(v):
    return None if v is None or not math.isfinite(float(v)) else float(f"{float(v):.6g}")


def _panel(ax, rows, keys, key_col, series, series_col, title):
    import numpy as np

    for j, s in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for i, k in enumerate(keys):
            r = next((r for r in rows if r[key_col] == k and r[series_col] == s), None)
            y = _sig6(r["mean"]) if r is not None else None
            if y is None:
                continue
            a, b = _sig6(r["ci_low"]), _sig6(r["ci_high"])
            xs.append(i + (j - (len(series) - 1) / 2) * 0.18)
            ys.append(y)
            lo.append(max(y - a, 0.0) if a is not None else 0.0)
            hi.append(max(b - y, 0.0) if b is not None else 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=np.array([lo, hi]), fmt="os"[j % 2], capsize=3, ms=5, label=s.replace("_", " "))
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(keys)), keys)
    ax.set_xlim(-0.5, len(keys) - 0.5)
    ax.set_title(title, fontsize=10)
    if len(series) > 1 and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_components(components, folder: Path) -> list[Path]:
    """``component_<name>.png`` in ``folder`` per component: its paired effect on rel_err and bias per GEMM, isolated
    and end to end, with 95 % CI bars (and on the step ratio, when measured).  Deterministic bytes: values rounded to
    6 significant digits, no timestamp or version in the PNG."""
    from matplotlib.figure import Figure

    from fpsim.io import atomic_write

    out = []
    recs = components.to_dict("records")
    for comp in dict.fromkeys(r["component"] for r in recs):
        rows = [r for r in recs if r["component"] == comp]
        steps = [r for r in rows if r["gemm"] == "step"]
        fig = Figure(figsize=(11 if steps else 8, 3.6))
        axes = fig.subplots(1, 3 if steps else 2)
        for ax, metric in zip(axes, ("rel_err", "bias")):
            _panel(ax, [r for r in rows if r["metric"] == metric], GEMMS, "gemm", MODES, "mode",
                   f"Δ {metric} (paired)")
        if steps:
            _panel(axes[2], [dict(r, series="step") for r in steps], ("sgd", "adamw"), "mode", ("step",), "series",
                   f"Δ {steps[0]['metric']} (held-out loss, one step)")
        r0 = rows[0]
        diff = (f"{r0['against']} − {r0['variant']}" if comp == "four-over-six" else
                f"{r0['variant']} − {r0['against']}")
        fig.suptitle(f"{comp}: paired effect, {diff} (mean over batches, 95 % CI, n = {r0['n']})", fontsize=11)
        axes[0].set_ylabel("effect")
        fig.tight_layout()
        path = folder / f"component_{_slug(str(comp))}.png"
        atomic_write(path, lambda f, fig=fig: fig.savefig(f, format="png", dpi=110, metadata={"Software": None}))
        out.append(path)
    return out
