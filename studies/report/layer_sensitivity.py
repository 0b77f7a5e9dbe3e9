"""Study 7 — layer sensitivity: per-layer Wgrad (and Fprop, Dgrad) quantization error across depth.

The paper proposes measuring each layer's Wgrad quantization error to choose which layers stay in BF16,
and keeps the first 2 and last 8 blocks of its 12B model in BF16. This study runs every linear layer of
a 12-linear-layer residual MLP LM (studies/capture/deep.py, cached in
studies/data/deep_capture.safetensors) through ``fpsim.linear`` under the ``nvfp4_paper`` recipe,
measures the relative error of dW, Y and dX against FP64 (mean over SR seeds), and compares the most
sensitive layers with the paper's first/last rule scaled to this depth, and its depth trend with SmolLM2's
(section 9e, from the committed results in studies/data/llm/).
"""

from __future__ import annotations

import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.recipe import LayerPolicy
from studies.capture.deep import layer_names, load
from studies.common import md_table, parse_args, progress, save_fig, write_csv, write_section

NAME = "layer_sensitivity"
#: The paper's 12B keeps 2 + 8 blocks of ~62 in BF16 (≈ 16 % of linear layers); at 12 layers that is
#: 2·12/62 ≈ 0.4 → 1 first and 8·12/62 ≈ 1.5 → 2 last (3 of 12 layers, 25 %).
SCALED_RULE = LayerPolicy(first=1, last=2)


#: What section 7 measures, for the comparison of its depth trend with SmolLM2's (section 9e).
TOY_MODEL = "a toy 12-linear residual MLP LM of width 256 after 150 Adam steps (`studies/capture/deep.py`)"
TOY_DATA = "128 tokens of stdlib source bytes in one captured step"
Z95 = 1.959963984540054


def depth_correlation(values, depth=None) -> tuple[float, float, float]:
    """Pearson r of ``values`` against their depth (default: the index 0, 1, …) and its 95 % interval by Fisher's z
    (z = atanh r, standard error 1/√(n − 3)): with few layers a sizeable r can still be noise."""
    v = np.asarray(values, dtype=np.float64)
    d = np.arange(v.size) if depth is None else np.asarray(depth, dtype=np.float64)
    r = float(np.corrcoef(d, v)[0, 1])
    z, hw = math.atanh(r), Z95 / math.sqrt(v.size - 3)
    return r, math.tanh(z - hw), math.tanh(z + hw)


def depth_trend(values, unit: str, model: str, data: str, metric: str, depth=None) -> dict:
    """One study's depth trend of Wgrad error, described for :func:`depth_comparison`."""
    r, lo, hi = depth_correlation(values, depth)
    return {"r": r, "lo": lo, "hi": hi, "n": len(values), "unit": unit, "model": model, "data": data,
            "metric": metric}


def toy_depth_trend(wg, seeds: int) -> dict:
    """Section 7's trend: each linear layer's Wgrad error under nvfp4_paper (mean over ``seeds`` SR seeds)."""
    return depth_trend(wg, "linear layers", TOY_MODEL, TOY_DATA,
                       f"each linear's Wgrad error, mean over {seeds} SR seed{'s' * (seeds > 1)}")


def depth_comparison(toy: dict, smol: dict) -> str:
    """The sentence sections 7 and 9e both print: the two depth trends with their intervals, whether they point the
    same way, the difference of their Fisher z values, and what differs between the two measurements."""
    def trend(t, where):
        resolved = t["lo"] > 0 or t["hi"] < 0
        way = ("" if resolved else "tends to ") + ("rise" if t["r"] > 0 else "fall") + ("s" if resolved else "")
        sig = "" if resolved else "; not significant, the interval includes 0"
        return (f"{way} with depth on {where} (r = {t['r']:+.2f}, 95 % CI {t['lo']:+.2f} to {t['hi']:+.2f}, "
                f"n = {t['n']} {t['unit']}{sig})")

    se = math.sqrt(1 / (toy["n"] - 3) + 1 / (smol["n"] - 3))
    zd = (math.atanh(toy["r"]) - math.atanh(smol["r"])) / se
    p = math.erfc(abs(zd) / math.sqrt(2))
    way = "opposite ways" if (toy["r"] > 0) != (smol["r"] > 0) else "the same way"
    return (f"Depth trend, section 7 against section 9e: Wgrad error {trend(toy, 'the toy LM of section 7')} and "
            f"{trend(smol, 'SmolLM2-135M in section 9e')}; the two point {way} (their Fisher z values differ by "
            f"{zd:+.2f} standard errors, p = {p:.3f}, counting layers as independent draws as the intervals do). "
            f"What differs: the model ({toy['model']}, against {smol['model']}), the data ({toy['data']}, against "
            f"{smol['data']}) and the metric ({toy['metric']}, against {smol['metric']}). These data do not say "
            "which trend, if either, holds for the paper's 12B model.")


def kurtosis(x):
    """Pearson kurtosis E[(x−μ)⁴]/σ⁴ (a normal distribution gives 3), not the excess kurtosis (normal = 0)."""
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
                         "value": kurtosis(arr), "ci95": np.nan, "seeds": 0})  # one tensor: no interval
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
    bottom = sorted(np.argsort(wg, kind="stable")[:k].tolist())
    cover_bottom = float(sq[bottom].sum() / sq.sum())
    # The chance baseline: each layer is in a uniformly random k-subset with probability k/n, so the subset's
    # expected share of the summed squared error is exactly k/n whatever the data.  Enumerating all C(n, k)
    # subsets (220 at 12 choose 3) also gives how many cover at least as much as the rule: a permutation p-value.
    cover_rand = k / n
    covers = np.array([sq[list(c)].sum() for c in itertools.combinations(range(n), k)]) / sq.sum()
    assert abs(covers.mean() - cover_rand) < 1e-12
    p_rule = float(np.mean(covers >= cover_rule - 1e-12))  # the tolerance counts the rule's own subset
    rank = np.argsort(np.argsort(-wg, kind="stable"), kind="stable") + 1  # 1 = most sensitive
    depth_corr, corr_lo, corr_hi = depth_correlation(wg)
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
    wg_ci_raw = df[(df.gemm == "wgrad") & (df.precision == "nvfp4_paper")].sort_values("index")["ci95"].to_numpy()
    tab = pd.DataFrame({"layer": names, "rank": rank, "Wgrad err": wg, "Wgrad ±": wg_ci_raw, "Dgrad err": dg,
                        "Fprop err": fp, "kurtosis dY (Pearson)": kd, "scaled rule": [pm[nm] for nm in names]})
    nm = [names[i] for i in top]
    rn = [names[i] for i in rule_set]
    n_sets = math.comb(n, k)
    last_txt = ", ".join(f"{names[i]} {int(rank[i])}" for i in range(n - SCALED_RULE.last, n))
    # The other layers the scaled rule protects at the end, so the verdict does not quote only the final one.
    others = "; ".join(f"{names[i]} ranks {int(rank[i])}" for i in range(n - SCALED_RULE.last, n - 1))
    measured = (
        f"Wgrad relative error under nvfp4_paper ranges {wg.min():.3f}–{wg.max():.3f} across the {n} linear layers "
        f"(Fprop {fp.min():.3f}–{fp.max():.3f}, Dgrad {dg.min():.3f}–{dg.max():.3f}). The {k} highest-Wgrad-error "
        f"layers are {', '.join(nm)}; the paper's rule scaled to this depth (first {SCALED_RULE.first}, last "
        f"{SCALED_RULE.last}: {', '.join(rn)}) shares {len(overlap)} of {k} with them "
        f"({', '.join(names[i] for i in overlap) or 'none'}). Coverage, the share of the summed squared Wgrad "
        f"error (Σ err² over a set's layers / Σ err² over all {n}): the rule {100 * cover_rule:.1f} %, the measured "
        f"top-{k} {100 * cover_top:.1f} %, the bottom-{k} {100 * cover_bottom:.1f} %, and {k} layers drawn at "
        f"random {100 * cover_rand:.1f} % on average (exactly {k}/{n}); {100 * p_rule:.0f} % of all {n_sets} "
        f"possible {k}-layer sets cover at least as much as the rule. Depth: correlation of Wgrad error with depth "
        f"index r = {depth_corr:+.2f} (95 % CI {corr_lo:+.2f} to {corr_hi:+.2f}, Fisher z, n = {n} layers); the last "
        f"{SCALED_RULE.last} layers' ranks: {last_txt} (of {n}; rank 1 = highest Wgrad error). The spread is narrow: "
        f"max/min Wgrad error {wg.max() / wg.min():.2f}×, "
        + (f"mean over layers of the 95 % t half-width over {seeds} seeds ±{np.mean(wg_ci):.4f}" if seeds > 1
           else "no interval with one seed")
        + ", so the ranking separates layers only weakly. "
        f"The literal rule (first 2, last 8) would keep {n_literal} of {n} layers in BF16 here."
    )
    # Both halves of the claim are judged from the numbers above, so the wording follows the data if it changes:
    # the rule's pick against chance (permutation p-value over all k-subsets), the "final layers" part against
    # the depth correlation and the final layer's rank.
    better_than_chance = p_rule <= 0.05
    pos = (f"the final layer, {names[-1]}, has the lowest Wgrad error of all {n}" if rank[-1] == n
           else f"the final layer, {names[-1]}, ranks {int(rank[-1])} of {n}") + (f" ({others})" if others else "")
    ci_txt = f"r = {depth_corr:+.2f}, 95 % CI {corr_lo:+.2f} to {corr_hi:+.2f}"
    # "contradicted" needs the falling trend itself to be significant; a low rank of the final layer on a trend
    # whose interval includes 0 only fails to support the claim.
    contradicted = corr_hi < 0
    unsupported = not contradicted and depth_corr < 0 and rank[-1] > n / 2
    if contradicted:
        depth_txt = (f"The \"final layers most sensitive\" part is contradicted here: {pos}, and Wgrad error falls "
                     f"with depth ({ci_txt}).")
    elif unsupported:
        depth_txt = (f"The \"final layers most sensitive\" part is not supported here: {pos}, and Wgrad error tends "
                     f"to fall with depth ({ci_txt}; the trend alone is not significant, its interval includes 0).")
    elif corr_lo > 0:
        depth_txt = f"The \"final layers most sensitive\" part is supported: Wgrad error rises with depth ({ci_txt})."
    else:
        depth_txt = (f"The \"final layers most sensitive\" part is not resolved: {pos}, and the depth trend "
                     f"({ci_txt}) is indistinguishable from none.")
    pick_txt = (f"The scaled rule keeps {len(overlap)} of the {k} highest-Wgrad-error layers in BF16, "
                + ("and" if better_than_chance else "but") + " its "
                f"coverage of the squared Wgrad error ({100 * cover_rule:.1f} %) is "
                + ("better than" if better_than_chance else "no better than")
                + f" {k} layers chosen at random ({100 * cover_rand:.1f} % expected; {100 * p_rule:.0f} % of the "
                f"{n_sets} possible sets cover as much)"
                + ("." if len(overlap) == k else
                   f"; ranking by measured Wgrad error (the paper's proposed metric) would pick {', '.join(nm)} "
                   f"({100 * cover_top:.1f} %)."))
    if better_than_chance and len(overlap) == k and corr_lo > 0:
        head = "Agrees here. "
    elif not better_than_chance and (contradicted or unsupported):
        head = "Does not agree at this scale. "
    else:
        head = "Partly agrees. "
    from studies.llm.study import smollm2_depth_trend

    verdict = head + pick_txt + " " + depth_txt + " " + depth_comparison(toy_depth_trend(wg, seeds),
                                                                          smollm2_depth_trend())
    verdict += (" Caveats: one tiny model (12 linear layers, width 256, 128 tokens per batch, trained 150 steps), "
                "one captured step; single-GEMM error is a proxy — the paper's choice rests on training-loss "
                "behaviour of a 12B model over 10T tokens, which this study cannot reproduce.")
    write_section(
        args, "7. Layer sensitivity",
        "Some layers are more sensitive to FP4 than others; the paper keeps the first 2 and last 8 blocks of its "
        "12B model in BF16 (≈ 16 % of linear layers) and proposes each layer's Wgrad quantization error as the "
        "metric for choosing them, the final layers being the most sensitive.",
        measured, verdict, ["error_vs_depth.png", "wgrad_ranking.png"],
        [f"Per-layer relative error ‖out − out_FP64‖/‖out_FP64‖ (mean over {seeds} SR seed{'s' * (seeds > 1)}; "
         "rank 1 = highest Wgrad error; Wgrad ± = 95 % t half-width over the seeds, empty with one seed). "
         "kurtosis dY (Pearson) = E[(dY − mean)⁴]/σ⁴ of the layer's output gradient, where a normal "
         "distribution gives 3 (not excess kurtosis, which subtracts 3):\n\n"
         + md_table(tab, ".3g", {"Wgrad ±": ".2g"})],
    )
    return args.dir


if __name__ == "__main__":
    main()
