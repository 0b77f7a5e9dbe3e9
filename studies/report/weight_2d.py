"""Study 5 — 2D (16×16) weight scaling: forward/backward weight consistency and its accuracy cost.

The Fprop GEMM needs W quantized along ``in``, the Dgrad GEMM along ``out``.  With 1×16 blocks the two
copies differ (the backward pass differentiates a different weight than the forward pass used); with
16×16 tiles they are the same quantized matrix.  Measured: ‖W_fprop − W_bprop‖/‖W‖, the cosine of the
resulting dX against the FP64 dX and against the gradient consistent with the forward weight, and the
SQNR cost of 16×16 tiles vs 1×16 blocks.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.recipe import get_recipe, linear
from studies.common import (
    TINYLM,
    TINYLM_TEXT,
    md_table,
    numba_threads,
    parse_args,
    progress,
    save_fig,
    sqnr_db,
    synthetic,
    tinylm_tensors,
    write_csv,
    write_section,
)

NAME = "weight_2d"
SCHEMES = ("1×16 same dim", "1×16 different dims", "16×16 tiles")
RECIPES = ("recipe: 16×16 W (paper)", "recipe: 1×16 W")
#: The verdict's threshold: a mean weight-SQNR cost (1×16 along in → 16×16) below this on the captured weights is
#: "small" (1.5 dB = 41 % more weight MSE).
COST_SMALL_DB = 1.5
#: ``data`` of the CSV rows that aggregate the whole-recipe errors over the layers (mean and seed interval).
ALL = "mean over layers"


def weight_copies(w: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(W_fprop, W_bprop) as decoded out×in float64 matrices.

    ``1×16 same dim``: one copy quantized along ``in`` serves both GEMMs (consistent, but the Dgrad GEMM
    would then reduce across the blocks — not what a tensor core consumes).  ``1×16 different dims``: the
    Fprop copy along ``in``, the Dgrad copy along ``out`` (what a 1-D recipe does).  ``16×16 tiles``:
    the Fprop copy and the transpose of the Dgrad copy, both in 16×16 tiles.
    """
    if scheme == "1×16 same dim":
        wf = fpsim.quantize(w, "nvfp4").dequantize()
        wb = wf
    elif scheme == "1×16 different dims":
        wf = fpsim.quantize(w, "nvfp4").dequantize()
        wb = fpsim.quantize(w, "nvfp4", axis=0).dequantize()
    elif scheme == "16×16 tiles":
        wf = fpsim.quantize(w, "nvfp4", block=(16, 16)).dequantize()
        wb = fpsim.quantize(np.ascontiguousarray(w.T), "nvfp4", block=(16, 16)).dequantize().T
    else:
        raise ValueError(scheme)
    return wf.astype(np.float64), wb.astype(np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(name, x, w, dy):
    w64, x64, dy64 = (a.astype(np.float64) for a in (w, x, dy))
    dx_ref, y_ref = dy64 @ w64, x64 @ w64.T
    rows = []
    for scheme in SCHEMES:
        wf, wb = weight_copies(w, scheme)
        dx_b, dx_f = dy64 @ wb, dy64 @ wf
        vals = {
            "w_mismatch": np.linalg.norm(wf - wb) / np.linalg.norm(w64),
            "w_fprop_sqnr_db": sqnr_db(w, wf),
            "w_bprop_sqnr_db": sqnr_db(w, wb),
            "y_rel_error": rel(x64 @ wf.T, y_ref),
            "dx_cos_vs_fp64": cosine(dx_b, dx_ref),
            "dx_rel_error_vs_fp64": rel(dx_b, dx_ref),
            # The gradient consistent with the forward pass that ran: dY · W_fprop.
            "dx_cos_vs_consistent": cosine(dx_b, dx_f),
            "dx_rel_diff_vs_consistent": rel(dx_b, dx_f),
        }
        rows += [{"data": name, "scheme": scheme, "metric": k, "value": float(v)} for k, v in vals.items()]
    return rows


def measure_recipe(name, x, w, dy, seeds, seed0):
    """Whole-recipe view: nvfp4_paper (16×16 weights) vs the same recipe with 1×16 weights (``without("2d")``).

    Returns the CSV rows (mean over the seeds and its 95 % t half-width) and the per-seed errors
    ``{(recipe label, gemm): [error per seed]}``, which the layer-mean's seed interval needs.
    """
    rows, per_seed = [], {}
    for label, rec in zip(RECIPES, (get_recipe("nvfp4_paper"), get_recipe("nvfp4_paper").without("2d"))):
        errs = [linear(x, w, dy, rec, seed=seed0 + s, layer=name).relative_errors() for s in range(seeds)]
        for g in ("fprop", "dgrad"):
            per_seed[(label, g)] = [e[g] for e in errs]
            mean, ci = mean_ci95(per_seed[(label, g)])
            rows.append({"data": name, "scheme": label, "metric": f"{g}_rel_error", "value": mean, "ci95": ci})
    return rows, per_seed


def recipe_summary(per_layer: list[dict]) -> list[dict]:
    """Mean over the layers of the whole-recipe errors, with a 95 % t half-width over the seeds.

    Each seed gives one layer-mean; the interval is over those (the same seed drives both recipes, so the
    16×16 − 1×16 difference is paired).  It covers the stochastic-rounding / random-sign variation only: the
    layers themselves are a fixed set, not a sample.
    """
    rows = []
    for g in ("fprop", "dgrad"):
        by = {lab: np.mean([p[(lab, g)] for p in per_layer], axis=0) for lab in RECIPES}  # one value per seed
        for lab in RECIPES:
            mean, ci = mean_ci95(by[lab])
            rows.append({"data": ALL, "scheme": lab, "metric": f"{g}_rel_error", "value": mean, "ci95": ci})
        mean, ci = mean_ci95(by[RECIPES[0]] - by[RECIPES[1]])
        rows.append({"data": ALL, "scheme": "recipe: 16×16 W − 1×16 W (paired)", "metric": f"{g}_rel_error",
                     "value": mean, "ci95": ci})
    return rows


def main(argv=None):
    with numba_threads(1):
        return _main(argv)


def _main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    toy_tensors = tinylm_tensors()
    layers = [(f"{TINYLM}{n}", toy_tensors[f"{n}.input"], toy_tensors[f"{n}.weight"],
               toy_tensors[f"{n}.grad_output"])
              for n in ("fc1", "fc2", "head")]
    t, i, o = (128, 256, 256) if args.quick else (512, 1024, 1024)
    for j, kind in enumerate(("gaussian", "student_t3", "channel_outliers")):
        w = synthetic(kind, (o, i), args.seed + 10 + j) / np.float32(np.sqrt(i))
        layers.append((f"W {kind}", synthetic("gaussian", (t, i), args.seed + 20 + j), w,
                       synthetic("gaussian", (t, o), args.seed + 30 + j)))
    rows, per_layer, shapes = [], [], {}
    seeds = 1 if args.quick else 4
    for name, x, w, dy in layers:
        progress(f"[{NAME}] {name}: W {w.shape}, dY {dy.shape}")
        rows += measure(name, x, w, dy)
        if name.startswith(TINYLM) or not args.quick:
            # The recipe runs through the emulated FP32-accumulator GEMM: keep it ≤ 512³.
            xs, ws, dys = x[:512, :512], w[:512, :512], dy[:512, :512]
            r, p = measure_recipe(name, xs, ws, dys, seeds, args.seed)
            rows += r
            per_layer.append(p)
            shapes[name] = (x.shape, w.shape, xs.shape, ws.shape)  # for the caption: full vs sliced sizes
    rows += recipe_summary(per_layer)
    df = pd.DataFrame(rows)
    write_csv(df, args.dir / f"{NAME}.csv")

    datas = list(dict.fromkeys(df.data[df.data != ALL]))  # the per-tensor rows, in measurement order
    short = [d.removeprefix(TINYLM) for d in datas]
    core = df[df.scheme.isin(SCHEMES)]

    def piv(metric):
        p = core[core.metric == metric].pivot(index="data", columns="scheme", values="value")
        p = p.loc[datas][list(SCHEMES)]
        p.index = short
        return p

    figs = ["weight_mismatch.png", "dx_cosine.png", "sqnr_cost.png"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    piv("w_mismatch").plot.bar(ax=ax, width=0.8)
    ax.set_ylabel("‖W_fprop − W_bprop‖ / ‖W‖ (ratio)")
    ax.set_xlabel("weight tensor (captured tiny LM, synthetic)")
    ax.set_title("Forward vs backward quantized weight mismatch (NVFP4)\n(1×16 same dim and 16×16: exactly 0)")
    ax.set_ylim(0, piv("w_mismatch").max().max() * 1.35)
    ax.legend(title="weight blocks", fontsize=8, loc="upper left", ncol=3)
    ax.tick_params(axis="x", rotation=20)
    ax.grid(axis="y", alpha=0.3)
    save_fig(fig, args.dir / figs[0])

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    (1 - piv("dx_cos_vs_fp64")).plot.bar(ax=axes[0], width=0.8)
    axes[0].set_ylabel("1 − cos(dX, dX_FP64) (dimensionless)")
    axes[0].set_title("dX = dY·W_bprop against the FP64 dX")
    (1 - piv("dx_cos_vs_consistent")).plot.bar(ax=axes[1], width=0.8)
    axes[1].set_ylabel("1 − cos(dY·W_bprop, dY·W_fprop) (dimensionless)")
    axes[1].set_title("dX against the gradient of the forward actually run")
    for ax in axes:
        ax.set_xlabel("weight tensor (dY exact, only W quantized)")
        ax.tick_params(axis="x", rotation=20)
        ax.legend(title="weight blocks", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    save_fig(fig, args.dir / figs[1])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    sq = pd.DataFrame({"1×16 along in (Fprop copy)": piv("w_fprop_sqnr_db")["1×16 different dims"],
                       "1×16 along out (Dgrad copy)": piv("w_bprop_sqnr_db")["1×16 different dims"],
                       "16×16 tiles": piv("w_fprop_sqnr_db")["16×16 tiles"]})
    sq.plot.bar(ax=ax, width=0.8)
    ax.set_ylabel("SQNR of the quantized W (dB), higher is better")
    ax.set_xlabel("weight tensor")
    ax.set_ylim(sq.min().min() - 3, sq.max().max() + 3)
    ax.set_title("Accuracy cost of 16×16 weight tiles (NVFP4)")
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    ax.tick_params(axis="x", rotation=20)
    ax.grid(axis="y", alpha=0.3)
    save_fig(fig, args.dir / figs[2])

    # Summary numbers.
    mm = piv("w_mismatch")
    cost = sq["1×16 along in (Fprop copy)"] - sq["16×16 tiles"]
    cos_fp = 1 - piv("dx_cos_vs_fp64")
    cos_cons = 1 - piv("dx_cos_vs_consistent")
    y_err = piv("y_rel_error")
    summ = df[df.data == ALL].set_index(["scheme", "metric"])

    diff = "recipe: 16×16 W − 1×16 W (paired)"

    def pm(scheme, g):
        """'mean ± 95 % t half-width over the seeds' of the layer-mean whole-recipe error (CSV rows ``ALL``)."""
        v, ci = summ.loc[(scheme, f"{g}_rel_error"), ["value", "ci95"]]
        # No ± with one seed (NaN) or where every seed gives the same value (0: e.g. Fprop rounds to nearest).
        return f"{v:{'+' if scheme == diff else ''}.4f}" + ("" if ci != ci or ci == 0 else f" ± {ci:.4f}")

    fp_same = seeds > 1 and (summ.xs("fprop_rel_error", level="metric")["ci95"] == 0).all()

    n_rec = len(per_layer)
    d_dg, ci_dg = summ.loc[(diff, "dgrad_rel_error"), ["value", "ci95"]]
    # W-only view: how many times larger the 2D gradient's 1 − cos against FP64 is than the 1-D one's.
    ratio = cos_fp["16×16 tiles"] / cos_fp["1×16 different dims"]
    n_worse, n_t = int((ratio > 1).sum()), len(ratio)
    measured = (
        f"With 1×16 blocks along different dims the two weight copies differ by "
        f"{mm['1×16 different dims'].min():.3f}–{mm['1×16 different dims'].max():.3f} of ‖W‖ "
        f"(16×16 tiles and the single 1×16 copy: exactly {mm['16×16 tiles'].max():.0f}). The resulting dX has "
        f"1 − cos against the gradient of the forward actually run of "
        f"{cos_cons['1×16 different dims'].min():.2e}–{cos_cons['1×16 different dims'].max():.2e} (0 with 16×16). "
        f"Against the FP64 dX (only W quantized), 1 − cos is {cos_fp['1×16 different dims'].min():.2e}–"
        f"{cos_fp['1×16 different dims'].max():.2e} with 1×16 and {cos_fp['16×16 tiles'].min():.2e}–"
        f"{cos_fp['16×16 tiles'].max():.2e} with 16×16 tiles, a 16×16/1×16 ratio of {ratio.min():.2f}–"
        f"{ratio.max():.2f}× per tensor (larger with 16×16 on {n_worse} of {n_t}). The cost of 2D: weight SQNR "
        f"lower by {cost.min():.2f}–{cost.max():.2f} dB (mean {cost.mean():.2f} dB) than 1×16 along in; Fprop "
        f"output error with only W quantized {y_err['1×16 same dim'].mean():.4f} → "
        f"{y_err['16×16 tiles'].mean():.4f} (mean over tensors). In the whole recipe (X and dY quantized too, "
        f"with SR where the recipe uses it), mean over {n_rec} layers"
        + (f" ± 95 % t half-width over {seeds} seeds" if seeds > 1 else " (one seed: no interval)")
        + (f" (--seed {args.seed}: recipe seeds {args.seed}…{args.seed + seeds - 1}" if seeds > 1
           else f" (--seed {args.seed}: recipe seed {args.seed}") + "; synthetic data from --seed + fixed offsets)"
        + f": Dgrad error {pm(RECIPES[1], 'dgrad')} (1×16 W) vs {pm(RECIPES[0], 'dgrad')} (16×16 W), paired "
        f"difference {pm(diff, 'dgrad')}; Fprop error {pm(RECIPES[1], 'fprop')} vs {pm(RECIPES[0], 'fprop')}, "
        f"difference {pm(diff, 'fprop')}" + (" (the same on every seed)." if fp_same else ".")
    )
    consistent = mm["16×16 tiles"].max() == 0
    toy_cost = cost[[not d.startswith("W ") for d in cost.index]]
    small_cost = toy_cost.mean() < COST_SMALL_DB
    if n_worse == n_t:
        acc = f"worse on all {n_t} tensors (1 − cos {ratio.min():.1f}–{ratio.max():.1f}× that of the 1-D gradient)"
    elif n_worse == 0:
        acc = f"better on all {n_t} tensors (1 − cos {ratio.min():.1f}–{ratio.max():.1f}× that of the 1-D gradient)"
    else:
        acc = (f"worse on {n_worse} and better on {n_t - n_worse} of {n_t} tensors (1 − cos "
               f"{ratio.min():.1f}–{ratio.max():.1f}× that of the 1-D gradient)")
    # The whole-recipe difference counts as resolved only when its seed interval excludes 0.
    if ci_dg == ci_dg and abs(d_dg) > ci_dg:
        rec_txt = (f"in the whole recipe its Dgrad error is {'higher' if d_dg > 0 else 'lower'} "
                   f"({pm(diff, 'dgrad')} over {seeds} seeds)")
    else:
        rec_txt = f"in the whole recipe the Dgrad difference ({pm(diff, 'dgrad')}) is not resolved"
    rec_txt += f", and its paired Fprop error difference is {pm(diff, 'fprop')}"
    verdict = (
        ("Agrees on consistency: " if consistent else "Does not agree: ")
        + "16×16 tiles make the Fprop and Dgrad weights bit-identical, removing a "
        f"{mm['1×16 different dims'].mean() * 100:.0f} % forward/backward weight mismatch that a 1-D recipe has. "
        + ("The cost is small on the captured weights: " if small_cost else "The cost is not small: ")
        + f"{toy_cost.mean():.2f} dB of weight SQNR on average there (criterion: a mean weight-SQNR cost on the "
        f"captured weights below {COST_SMALL_DB:g} dB, i.e. under {100 * (10 ** (COST_SMALL_DB / 10) - 1):.0f} % "
        f"more weight MSE), but up to {cost.max():.1f} dB on "
        "heavy-tailed synthetic weights, where one 16×16 tile shares one scale across 256 values. "
        f"The benefit is consistency, not accuracy: against the FP64 dX the 2D gradient is {acc}, and {rec_txt}; "
        "whether the inconsistency matters for training (the paper's argument) cannot be measured from single "
        "GEMMs."
    )
    tab = piv("w_mismatch").rename(columns=lambda c: f"mismatch {c}")
    tab["SQNR 1×16 (dB)"] = sq["1×16 along in (Fprop copy)"]
    tab["SQNR 16×16 (dB)"] = sq["16×16 tiles"]
    tab["1−cos dX vs FP64, 1×16 diff"] = cos_fp["1×16 different dims"]
    tab["1−cos dX vs FP64, 16×16"] = cos_fp["16×16 tiles"]
    tab["ratio 16×16 / 1×16"] = ratio
    tab = tab.reset_index().rename(columns={"index": "tensor"})

    def size_txt(nm):
        (xf, wf, xu, wu) = shapes[nm]
        full = f"X {xf[0]}×{xf[1]}, W {wf[0]}×{wf[1]}"
        return f"full size ({full})" if (xf, wf) == (xu, wu) else (
            f"the first {xu[0]} rows × {xu[1]} columns of X and {wu[0]}×{wu[1]} of W (full: {full})")

    groups = {}
    for nm in shapes:
        groups.setdefault(size_txt(nm), []).append(nm.removeprefix(TINYLM))
    caption = (
        f"Per tensor (layers fc1, fc2 and head captured from {TINYLM_TEXT}; synthetic W = a sample of the named "
        "distribution / √in, with Gaussian X and dY). "
        "mismatch = ‖W_fprop − W_bprop‖_F / ‖W‖_F between the dequantized copy the Fprop GEMM uses and the one "
        "the Dgrad GEMM uses (1×16 same dim: one copy blocked along in serves both; 1×16 different dims: "
        "Fprop copy along in, Dgrad copy along out; 16×16: tiles). SQNR 1×16 = 10·log10(‖W‖²/‖W − W_q‖²) of "
        "the Fprop copy in 1×16 blocks along the input dimension (in, Fprop's reduction axis); SQNR 16×16 the "
        "same for the 16×16-tiled copy. 1−cos dX vs FP64 = 1 − cos(dY·W_bprop, dY·W) in FP64 with only W "
        "quantized (dY and the GEMM exact); ratio = 16×16 column / 1×16 column. All these are deterministic "
        "(no seeds, no interval). The whole-recipe errors quoted above (nvfp4_paper vs the same recipe "
        "without 2D, ‖out − out_FP64‖/‖out_FP64‖) run on "
        + "; ".join(f"{', '.join(v)}: {k}" for k, v in groups.items())
        + (f"; each layer's error is the mean over {seeds} seeds and ± is the 95 % Student-t half-width over "
           "the seeds of the layer-mean (seed-to-seed variation only, the layers are a fixed set)."
           if seeds > 1 else "; one seed, so no interval is computed.")
    )
    write_section(
        args, "5. 2D weight scaling",
        "Quantizing weights in 16×16 tiles makes the forward and backward passes use the same quantized "
        "weight (W and Wᵀ give identical values), keeping the chain rule consistent, at a small cost in "
        "weight quantization accuracy compared with 1×16 blocks.",
        measured, verdict, figs, [caption + "\n\n" + md_table(tab, ".4g", {"ratio 16×16 / 1×16": ".2f"})],
    )
    return args.dir


if __name__ == "__main__":
    main()
