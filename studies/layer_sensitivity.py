"""Study 7 — layer sensitivity: per-layer Wgrad (and Fprop, Dgrad) quantization error across depth.

The paper proposes measuring each layer's Wgrad quantization error to choose which layers stay in BF16,
and keeps the first 2 and last 8 blocks of its 12B model in BF16. This study runs every linear layer of
a 12-linear-layer residual MLP LM (studies/capture_deep.py, cached in
studies/data/deep_capture.safetensors) through ``fpsim.linear`` under the ``nvfp4_paper`` recipe,
measures the relative error of dW, Y and dX against FP64 (mean over SR seeds), and compares the most
sensitive layers with the paper's first/last rule scaled to this depth.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.recipe import LayerPolicy
from studies.capture_deep import layer_names, load
from studies.common import md_table, parse_args, progress, save_fig, write_csv, write_section

NAME = "layer_sensitivity"
#: The paper's 12B keeps 2 + 8 blocks of ~62 in BF16 (≈ 16 % of linear layers); at 12 layers that is
#: 2·12/62 ≈ 0.4 → 1 first and 8·12/62 ≈ 1.5 → 2 last (3 of 12 layers, 25 %).
SCALED_RULE = LayerPolicy(first=1, last=2)


def kurtosis(x):
    x = x.astype(np.float64).ravel()
    x = x - x.mean()
    return float((x**4).mean() / (x * x).mean() ** 2)


def main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    seeds = 1 if args.quick else 6
    cap = load()
    names = layer_names()
    n = len(names)
    recipe = fpsim.get_recipe("nvfp4_paper")
    rows = []
    for i, layer in enumerate(names):
        x, w, dy = cap[f"{layer}.input"], cap[f"{layer}.weight"], cap[f"{layer}.grad_output"]
        progress(f"[{NAME}] layer {i} {layer} x{x.shape} w{w.shape} ({seeds} seed{'s' * (seeds > 1)})")
        errs = {}
        for s in range(seeds):
            rel = fpsim.linear(x, w, dy, recipe, seed=args.seed + s, layer=layer, step=0).relative_errors()
            for k, v in rel.items():
                errs.setdefault(k, []).append(v)
        for k, v in errs.items():
            mean, ci = mean_ci95(v)  # identical draws give exactly their value and 0 (not a rounding residue)
            gemm, prec = (k.split("_")[0], "bf16") if k.endswith("_bf16") else (k, "nvfp4_paper")
            rows.append({"index": i, "layer": layer, "gemm": gemm, "precision": prec, "metric": "rel_error",
                         "value": mean, "ci95": ci, "seeds": seeds})
        for t, arr in (("input", x), ("grad_output", dy), ("weight", w)):
            rows.append({"index": i, "layer": layer, "gemm": "-", "precision": "-", "metric": f"kurtosis_{t}",
                         "value": kurtosis(arr), "ci95": 0.0, "seeds": 0})
    df = pd.DataFrame(rows)
    write_csv(df, args.dir / f"{NAME}.csv")

    def series(gemm, prec="nvfp4_paper"):
        s = df[(df.gemm == gemm) & (df.precision == prec) & (df.metric == "rel_error")].sort_values("index")
        return s["value"].to_numpy(), np.nan_to_num(s["ci95"].to_numpy())  # no interval (one seed): no bar

    wg, wg_ci = series("wgrad")
    fp, fp_ci = series("fprop")
    dg, dg_ci = series("dgrad")
    pm = SCALED_RULE.precision_map(names)
    rule_set = [i for i, nm in enumerate(names) if pm[nm] == "bf16"]
    k = len(rule_set)
    top = sorted(np.argsort(-wg, kind="stable")[:k].tolist())
    overlap = sorted(set(rule_set) & set(top))
    sq = wg**2
    cover_rule, cover_top = float(sq[rule_set].sum() / sq.sum()), float(sq[top].sum() / sq.sum())
    rank = np.argsort(np.argsort(-wg, kind="stable"), kind="stable") + 1  # 1 = most sensitive
    depth_corr = float(np.corrcoef(np.arange(n), wg)[0, 1])
    literal = LayerPolicy(first=2, last=8).precision_map(names)
    n_literal = sum(v == "bf16" for v in literal.values())

    # --- figures -------------------------------------------------------------------------------------------
    idx = np.arange(n)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for i in rule_set:
        ax.axvspan(i - 0.5, i + 0.5, color="0.85", zorder=0)
    for vals, ci, lab, mk in ((wg, wg_ci, "Wgrad dW", "o"), (dg, dg_ci, "Dgrad dX", "s"), (fp, fp_ci, "Fprop Y", "^")):
        ax.errorbar(idx, vals, yerr=ci, marker=mk, capsize=3, label=lab)
    ax.plot(top, wg[top], "o", ms=13, mfc="none", mec="k", label=f"top-{k} Wgrad error (measured)")
    ax.plot([], [], "s", color="0.85", ms=10, label=f"BF16 under scaled rule first={SCALED_RULE.first}, "
                                                    f"last={SCALED_RULE.last}")
    ax.set_xticks(idx, names, rotation=40, ha="right", fontsize=8)
    ax.set_xlabel("linear layer (input → output order)")
    ax.set_ylabel("relative error vs FP64  ‖out − ref‖/‖ref‖")
    ax.set_title(f"NVFP4 (paper recipe) GEMM error per layer, 12-layer residual MLP LM ({seeds} SR seed"
                 f"{'s' * (seeds > 1)})", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    save_fig(fig, args.dir / "error_vs_depth.png")

    order = np.argsort(-wg, kind="stable")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    cols = ["tab:gray" if i in rule_set else "tab:blue" for i in order]
    ax.bar(np.arange(n), wg[order], yerr=wg_ci[order], capsize=3, color=cols)
    line = ax.axvline(k - 0.5, color="k", ls="--", lw=1)
    ax.legend([Patch(color="tab:gray"), Patch(color="tab:blue"), line],
              ["kept in BF16 by the scaled first/last rule", "NVFP4 under the rule",
               f"left of the line: measured top-{k} (a Wgrad-error policy's BF16 set)"], fontsize=8)
    ax.set_xticks(np.arange(n), [names[i] for i in order], rotation=40, ha="right", fontsize=8)
    ax.set_xlabel("linear layer, sorted by Wgrad error")
    ax.set_ylabel("Wgrad relative error vs FP64")
    ax.set_title("Layers ranked by the paper's proposed sensitivity metric", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    save_fig(fig, args.dir / "wgrad_ranking.png")

    # --- section -------------------------------------------------------------------------------------------
    kd = df[df.metric == "kurtosis_grad_output"].sort_values("index")["value"].to_numpy()
    tab = pd.DataFrame({"layer": names, "rank": rank, "Wgrad err": wg, "Dgrad err": dg, "Fprop err": fp,
                        "kurtosis dY": kd, "scaled rule": [pm[nm] for nm in names]})
    nm = [names[i] for i in top]
    rn = [names[i] for i in rule_set]
    measured = (
        f"Wgrad relative error under nvfp4_paper ranges {wg.min():.3f}–{wg.max():.3f} across the {n} linear layers "
        f"(Fprop {fp.min():.3f}–{fp.max():.3f}, Dgrad {dg.min():.3f}–{dg.max():.3f}); correlation of Wgrad error "
        f"with depth index {depth_corr:+.2f}. The {k} highest-Wgrad-error layers are {', '.join(nm)}; the paper's "
        f"rule scaled to this depth (first {SCALED_RULE.first}, last {SCALED_RULE.last}: {', '.join(rn)}) shares "
        f"{len(overlap)} of {k} with them ({', '.join(names[i] for i in overlap) or 'none'}) and covers "
        f"{100 * cover_rule:.0f} % of the summed squared Wgrad error, against {100 * cover_top:.0f} % for the "
        f"measured top-{k}. The spread is narrow: max/min Wgrad error {wg.max() / wg.min():.2f}×, mean 95 % CI "
        f"±{wg_ci.mean():.4f}, so the ranking separates layers only weakly. "
        f"The literal rule (first 2, last 8) would keep {n_literal} of {n} layers in BF16 here."
    )
    if len(overlap) == k:
        verdict = ("Agrees here: the layers with the largest Wgrad error are exactly the ones the scaled "
                   "first/last rule keeps in BF16.")
    elif len(overlap) > 0:
        verdict = (f"Partly agrees: the scaled rule catches {len(overlap)} of the {k} most sensitive layers; "
                   "measuring Wgrad error per layer (the paper's proposed metric) would pick a different set.")
    else:
        verdict = ("Does not agree at this scale: none of the most sensitive layers by Wgrad error is at the "
                   "positions the first/last rule protects; a measured policy would choose differently.")
    verdict += (" Caveats: one tiny model (12 linear layers, width 256, 128 tokens per batch, trained 150 steps), "
                "one captured step; single-GEMM error is a proxy — the paper's choice rests on training-loss "
                "behaviour of a 12B model over 10T tokens, which this study cannot reproduce.")
    write_section(
        args, "7. Layer sensitivity",
        "Some layers are more sensitive to FP4 than others; the paper keeps the first 2 and last 8 blocks of its "
        "12B model in BF16 (≈ 16 % of linear layers) and proposes each layer's Wgrad quantization error as the "
        "metric for choosing them, the final layers being the most sensitive.",
        measured, verdict, ["error_vs_depth.png", "wgrad_ranking.png"],
        [f"Per-layer relative error vs FP64 (mean over {seeds} SR seed{'s' * (seeds > 1)}; rank 1 = highest "
         "Wgrad error):\n\n" + md_table(tab, ".3g")],
    )
    return args.dir


if __name__ == "__main__":
    main()
