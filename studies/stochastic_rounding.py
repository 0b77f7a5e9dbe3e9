"""Study 6 — stochastic rounding: gradient bias of RNE vs SR, its accumulation, and SR's variance cost.

Per real captured tensor (NVFP4, 1×16 blocks): the bias of RNE, SR with 8 random bits (the hardware's
``cvt.rs`` width) and SR "exact" (24 bits), estimated over seeds with 95 % confidence intervals (and, for
k = 8, computed exactly by enumerating all 256 random values); the accumulated error when the same
small gradient is summed N times (a weight updated by N quantized steps with an FP32 master copy);
SR's variance cost (MSE, SQNR) on gradients and on forward tensors; and, at GEMM level, the error of
dW averaged over many steps under the paper's recipe with and without SR, and of Y with SR forced on
the forward operands.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

import fpsim
from fpsim.analysis import mean_ci95
from studies.common import md_table, parse_args, progress, real_tensors, save_fig, sqnr_db, write_csv, write_section

NAME = "stochastic_rounding"
MODES = [("RNE", {"rounding": "rne"}), ("SR k=8", {"rounding": "sr", "k": 8}),
         ("SR exact (k=24)", {"rounding": "sr", "k": 24})]
COLORS = {"RNE": "tab:red", "SR k=8": "tab:blue", "SR exact (k=24)": "tab:green"}


def _q(x, kw, seed=None, **extra):
    kw = dict(kw, **extra)
    if kw["rounding"] == "sr" and "rbits" not in kw:
        kw["seed"] = seed
    return fpsim.quantize(x, "nvfp4", **kw).dequantize().astype(np.float64)


def _ci(v):
    """Mean and 95 % half-width; identical samples give exactly their value and 0 (fpsim.analysis.mean_ci95).
    A single value is the one draw of a deterministic rounding (RNE): exact, so its interval is 0."""
    m, ci = mean_ci95(v)
    return m, 0.0 if len(v) == 1 else ci


def sr8_exact_moments(x, amax):
    """E[x̂] and Var[x̂] per element under SR with k = 8, by enumerating all 256 random values."""
    n = x.size
    tiled = np.tile(x.reshape(1, -1), (256, 1))
    rb = np.repeat(np.arange(256, dtype=np.uint32)[:, None], n, axis=1)
    xq = fpsim.quantize(tiled, "nvfp4", rounding="sr", k=8, rbits=rb, tensor_amax=amax).dequantize()
    xq = xq.astype(np.float64).reshape(256, *x.shape)
    return xq.mean(axis=0), xq.var(axis=0)


def exact_sr_moments(x, amax):
    """Exact SR (k→∞) moments from the grid neighbours (random bits 0 and 2^24−1), per element.

    Returns E[x̂], Var[x̂] and two masks of elements SR cannot round without bias: ``clamp`` (|x| above
    its block's largest code — the E4M3 block scale was rounded down, so x·enc > 6 saturates) and
    ``flush`` (the block's E4M3 scale underflowed to zero).
    """
    x64 = x.astype(np.float64)
    lo = _q(x, {"rounding": "sr", "k": 24}, rbits=np.zeros(x.shape, np.uint32), tensor_amax=amax)
    hi = _q(x, {"rounding": "sr", "k": 24}, rbits=np.full(x.shape, 2**24 - 1, np.uint32), tensor_amax=amax)
    step = np.abs(hi - lo)
    p = np.where(step > 0, np.abs(x64 - lo) / np.where(step > 0, step, 1), 0.0)
    mean = lo + np.sign(x64) * p * step
    flush = (lo == 0) & (hi == 0) & (x64 != 0)
    clamp = (hi == lo) & (lo != 0) & (np.abs(x64) > np.abs(lo))
    return mean, step * step * p * (1 - p), clamp, flush


def tensor_bias(name, x, seeds, rows):
    """Bias / MSE rows for one tensor (all modes)."""
    kind = name.split(".", 1)[1]
    amax = float(np.max(np.abs(x)))
    x = x[:rows]
    x64 = x.astype(np.float64)
    mabs, rms = float(np.abs(x64).mean()), float(np.sqrt((x64 * x64).mean()))
    out = []
    for label, kw in MODES:
        n_draws = 1 if kw["rounding"] == "rne" else seeds
        signed, aligned, mse, sq = [], [], [], []
        s1 = np.zeros_like(x64)
        s2 = np.zeros_like(x64)
        for s in range(n_draws):
            xq = _q(x, kw, seed=1000 + s, tensor_amax=amax)
            d = xq - x64
            signed.append(d.mean() / mabs)
            aligned.append((np.sign(x64) * d).mean() / mabs)
            mse.append((d * d).mean())
            sq.append(sqnr_db(x, xq))
            s1 += xq
            s2 += xq * xq
        mean = s1 / n_draws
        if n_draws > 1:  # unbiased per-element squared bias: (x̄−x)² − s²/S
            var = (s2 - n_draws * mean * mean) / (n_draws - 1)
            b2 = float(np.mean((mean - x64) ** 2 - var / n_draws))
        else:
            b2 = float(np.mean((mean - x64) ** 2))
        base = {"part": "bias", "tensor": name, "kind": kind, "mode": label, "N": n_draws}
        for metric, vals in (("signed_bias_rel_meanabs", signed), ("aligned_bias_rel_meanabs", aligned),
                             ("mse", mse), ("sqnr_db", sq)):
            m, ci = _ci(vals)
            out.append(dict(base, metric=metric, value=m, ci95=ci))
        out.append(dict(base, metric="elementwise_bias_rms_rel_rms", value=np.sqrt(max(b2, 0.0)) / rms, ci95=0.0))
        if label == "RNE":  # where RNE's magnitude bias comes from
            _, _, clamp, flush = exact_sr_moments(x, amax)
            a = np.sign(x64) * (mean - x64) / mabs / x.size
            for part, msk in (("clamp", clamp), ("flush", flush), ("rounding", ~(clamp | flush))):
                out.append(dict(base, metric=f"aligned_bias_part_{part}", value=float(a[msk].sum()), ci95=0.0))
            out.append(dict(base, metric="fraction_clamped", value=float(clamp.mean()), ci95=0.0))
            out.append(dict(base, metric="fraction_flushed", value=float(flush.mean()), ci95=0.0))
        if label == "SR exact (k=24)" and kind == "grad_output":
            e, v, clamp, flush = exact_sr_moments(x, amax)
            d = e - x64
            ex = {"part": "bias", "tensor": name, "kind": kind, "mode": "SR exact (expected)", "N": 0}
            out += [dict(ex, metric="aligned_bias_rel_meanabs", value=(np.sign(x64) * d).mean() / mabs, ci95=0.0),
                    dict(ex, metric="elementwise_bias_rms_rel_rms", value=float(np.sqrt((d * d).mean())) / rms,
                         ci95=0.0)]
        if label == "SR k=8" and kind == "grad_output":  # exact expectation by enumeration
            e, v = sr8_exact_moments(x, amax)
            ex = {"part": "bias", "tensor": name, "kind": kind, "mode": "SR k=8 (exact enumeration)", "N": 256}
            d = e - x64
            out += [dict(ex, metric="signed_bias_rel_meanabs", value=d.mean() / mabs, ci95=0.0),
                    dict(ex, metric="aligned_bias_rel_meanabs", value=(np.sign(x64) * d).mean() / mabs, ci95=0.0),
                    dict(ex, metric="mse", value=float((v + d * d).mean()), ci95=0.0),
                    dict(ex, metric="elementwise_bias_rms_rel_rms", value=float(np.sqrt((d * d).mean())) / rms,
                         ci95=0.0)]
    return out


def accumulation(g, n_max, noise, seed):
    """Error of Σ_{n≤N} Q(g_n) against Σ g_n, in units of rms(g), for N = 1..n_max (one tiled quantize call).

    ``noise`` = 0: the same gradient every step; otherwise g_n = g + noise·rms(g)·ξ_n (ξ standard normal).
    """
    r, c = g.shape
    rms = float(np.sqrt(np.mean(g.astype(np.float64) ** 2)))
    rng = np.random.default_rng(seed)
    tiled = np.tile(g, (n_max, 1))
    if noise:
        tiled = (tiled + noise * rms * rng.standard_normal(tiled.shape)).astype(np.float32)
    exact = np.cumsum(tiled.astype(np.float64).reshape(n_max, r * c), axis=0)
    ns = np.unique(np.round(np.logspace(0, np.log10(n_max), 25)).astype(int))
    res = {}
    for label, kw in MODES:
        xq = _q(tiled, kw, seed=seed + 7).reshape(n_max, r * c)
        err = np.cumsum(xq, axis=0) - exact
        res[label] = np.sqrt((err[ns - 1] ** 2).mean(axis=1)) / rms
    return ns, res


def main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    quick = args.quick
    seeds = 12 if quick else 64
    rows = 32 if quick else 128            # rows of each 128×256 captured tensor used for the bias table
    acc_rows, n_max = (4, 256) if quick else (16, 4096)
    gemm_steps = 3 if quick else 32
    rt = real_tensors()
    out = []

    # --- 1. bias, MSE and SQNR per tensor ---------------------------------------------------------------
    for name, x in rt.items():
        progress(f"[{NAME}] bias/MSE {name} ({min(rows, x.shape[0])}×{x.shape[1]}, {seeds} seeds)")
        out += tensor_bias(name, x, seeds if name.endswith("grad_output") else max(4, seeds // 4), rows)

    # --- 2. accumulation of the same small gradient ----------------------------------------------------
    g = rt["fc2.grad_output"][:acc_rows]
    amax = float(np.max(np.abs(rt["fc2.grad_output"])))
    curves = {}
    for noise in (0.0, 1.0):
        progress(f"[{NAME}] accumulation N ≤ {n_max}, noise {noise}")
        ns, res = accumulation(g, n_max, noise, args.seed)
        curves[noise] = (ns, res)
        for label, v in res.items():
            out += [{"part": f"accumulation_noise{noise:g}", "tensor": "fc2.grad_output", "kind": "grad_output",
                     "mode": label, "N": int(n), "metric": "accum_error_rel_rms", "value": float(e), "ci95": 0.0}
                    for n, e in zip(ns, v)]
    # expected curves (exact moments) far beyond the simulation, same gradient every step
    g64 = g.astype(np.float64)
    rms = float(np.sqrt((g64 * g64).mean()))
    n_th = np.unique(np.round(np.logspace(0, 6, 31)).astype(int))
    e8, v8 = sr8_exact_moments(g, amax)
    e24, v24, _, _ = exact_sr_moments(g, amax)
    b_rne = _q(g, {"rounding": "rne"}, tensor_amax=amax) - g64
    theory = {
        "RNE": n_th * np.sqrt((b_rne**2).mean()) / rms,
        "SR k=8": np.sqrt(n_th**2 * ((e8 - g64) ** 2).mean() + n_th * v8.mean()) / rms,
        "SR exact (k=24)": np.sqrt(n_th**2 * ((e24 - g64) ** 2).mean() + n_th * v24.mean()) / rms,
    }
    for label, v in theory.items():
        out += [{"part": "accumulation_expected", "tensor": "fc2.grad_output", "kind": "grad_output", "mode": label,
                 "N": int(n), "metric": "accum_error_rel_rms", "value": float(e), "ci95": 0.0}
                for n, e in zip(n_th, v)]
    k8_cross = float(v8.mean() / ((e8 - g64) ** 2).mean())  # N where N²b² = Nσ²
    k24_cross = float(v24.mean() / ((e24 - g64) ** 2).mean())

    # --- 3. GEMM level: dW averaged over steps, Y with SR on forward operands --------------------------
    paper = fpsim.get_recipe("nvfp4_paper")
    recipes = {"paper (SR on gradients)": paper, "paper without SR (RNE everywhere)": paper.without("sr"),
               "paper + SR on forward operands": paper.replace_roles(["fprop_x", "fprop_w"], rounding="sr")}
    layers = ["fc2"] if quick else ["fc1", "fc2", "head"]
    avg_curves = {}
    for layer in layers:
        x, w, dy = rt[f"{layer}.input"], rt[f"{layer}.weight"], rt[f"{layer}.grad_output"]
        for rname, rec in recipes.items():
            progress(f"[{NAME}] GEMM {layer} {rname} ({gemm_steps} steps)")
            acc, errs = None, {"fprop": [], "dgrad": [], "wgrad": []}
            curve = []
            n_steps = gemm_steps if rname != "paper + SR on forward operands" else max(2, gemm_steps // 4)
            for s in range(n_steps):
                r = fpsim.linear(x, w, dy, rec, seed=args.seed, layer=layer, step=s)
                rel = r.relative_errors()
                for k in errs:
                    errs[k].append(rel[k])
                acc = r.dw.astype(np.float64) if acc is None else acc + r.dw
                curve.append(np.linalg.norm(acc / (s + 1) - r.dw_ref) / np.linalg.norm(r.dw_ref))
            for k, v in errs.items():
                m, ci = _ci(v)
                out.append({"part": "gemm_single_step", "tensor": layer, "kind": "linear", "mode": rname,
                            "N": n_steps, "metric": f"{k}_rel_error", "value": m, "ci95": ci})
            out += [{"part": "gemm_dw_running_mean", "tensor": layer, "kind": "linear", "mode": rname, "N": i + 1,
                     "metric": "wgrad_mean_rel_error", "value": float(e), "ci95": 0.0} for i, e in enumerate(curve)]
            avg_curves[(layer, rname)] = curve

    df = pd.DataFrame(out)
    write_csv(df, args.dir / f"{NAME}.csv")

    # --- figures ------------------------------------------------------------------------------------------
    bias = df[df.part == "bias"]
    grads = [n for n in rt if n.endswith("grad_output")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, metric, title in ((axes[0], "aligned_bias_rel_meanabs", "magnitude bias  mean(sign(x)·(x̂−x))"),
                              (axes[1], "elementwise_bias_rms_rel_rms",
                               "per-element bias  rms(E[x̂]−x)  (sampled: noise-corrected, floored at 0)")):
        modes = [m[0] for m in MODES] + ["SR k=8 (exact enumeration)", "SR exact (expected)"]
        width = 0.8 / len(modes)
        for j, mode in enumerate(modes):
            sub = bias[(bias.metric == metric) & (bias["mode"] == mode)].set_index("tensor").reindex(grads)
            scale = 100.0
            ax.bar(np.arange(len(grads)) + (j - (len(modes) - 1) / 2) * width, sub["value"] * scale, width,
                   yerr=sub["ci95"].fillna(0.0) * scale, capsize=3, label=mode,
                   color=COLORS.get(mode, {"SR exact (expected)": "tab:olive"}.get(mode, "tab:cyan")),
                   alpha=0.85 if mode in COLORS else 0.6)
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(np.arange(len(grads)), grads, fontsize=8)
        ax.set_xlabel("captured gradient tensor (tiny LM)")
        ax.set_ylabel("bias (% of mean|x|)" if "aligned" in metric else "bias (% of rms(x))")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"NVFP4 rounding bias per gradient tensor (SR: {seeds} seeds, 95 % CI)")
    save_fig(fig, args.dir / "bias_per_tensor.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, noise in zip(axes, (0.0, 1.0)):
        ns, res = curves[noise]
        for label, v in res.items():
            ax.loglog(ns, v, "o-", ms=3, color=COLORS[label], label=f"{label} (simulated)")
        if noise == 0.0:
            for label, v in theory.items():
                ax.loglog(n_th, v, "--", color=COLORS[label], lw=1, label=f"{label} (expected)")
            ax.set_title("same gradient every step", fontsize=10)
        else:
            ax.set_title("gradient + step-to-step noise (noise rms = gradient rms)", fontsize=10)
        ref = res["SR exact (k=24)"][0]
        xs = np.array([1, ns[-1] if noise else n_th[-1]], dtype=float)
        ax.loglog(xs, ref * xs, ":", color="gray", lw=1, label="∝ N")
        ax.loglog(xs, ref * np.sqrt(xs), "-.", color="gray", lw=1, label="∝ √N")
        ax.set_xlabel("number of accumulated quantized updates N")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("rms accumulated error (units of rms(gradient))")
    fig.suptitle(f"Accumulating NVFP4-quantized copies of fc2.grad_output ({g.shape[0]}×{g.shape[1]} elements)")
    save_fig(fig, args.dir / "accumulation.png")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    names = list(rt)
    sq = bias[bias.metric == "sqnr_db"]
    width = 0.27
    for j, (mode, _) in enumerate(MODES):
        sub = sq[sq["mode"] == mode].set_index("tensor").reindex(names)
        axes[0].bar(np.arange(len(names)) + (j - 1) * width, sub["value"], width, label=mode, color=COLORS[mode])
    axes[0].set_xticks(np.arange(len(names)), names, rotation=45, ha="right", fontsize=8)
    axes[0].set_ylabel("SQNR (dB), higher is better")
    axes[0].set_xlabel("captured tensor")
    axes[0].set_ylim(bottom=max(0.0, float(sq["value"].min()) - 3))
    axes[0].set_title("Single-shot error: SR's variance cost", fontsize=10)
    axes[0].legend(fontsize=7)
    axes[0].grid(axis="y", alpha=0.3)
    styles = {"fc1": "-", "fc2": "--", "head": ":"}
    for (layer, rname), curve in avg_curves.items():
        if rname == "paper + SR on forward operands":
            continue
        col = "tab:blue" if rname.startswith("paper (SR") else "tab:red"
        axes[1].loglog(np.arange(1, len(curve) + 1), curve, styles[layer], color=col, label=f"{layer}: {rname}")
    axes[1].set_xlabel("steps averaged (same X, dY; fresh SR bits each step)")
    axes[1].set_ylabel("‖mean dW − dW_fp64‖ / ‖dW_fp64‖")
    axes[1].set_title("Wgrad under the recipe, averaged over steps", fontsize=10)
    axes[1].legend(fontsize=7)
    axes[1].grid(alpha=0.3, which="both")
    for axis in (axes[1].xaxis, axes[1].yaxis):
        axis.set_major_formatter(mticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(mticker.NullFormatter())
    save_fig(fig, args.dir / "variance_and_gemm.png")

    # --- section ------------------------------------------------------------------------------------------
    def val(tensor, mode, metric, part="bias"):
        s = df[(df.part == part) & (df.tensor == tensor) & (df["mode"] == mode) & (df.metric == metric)]
        return float(s["value"].iloc[0]), float(s["ci95"].iloc[0])

    tab = []
    for t in grads:
        r = {"tensor": t}
        for mode, short in (("RNE", "RNE"), ("SR k=8", "SR8"), ("SR exact (k=24)", "SR24")):
            m, ci = val(t, mode, "aligned_bias_rel_meanabs")
            r[f"{short} bias %"] = f"{100 * m:+.3f} ± {100 * ci:.3f}"
        r["SR8 exact bias %"] = f"{100 * val(t, 'SR k=8 (exact enumeration)', 'aligned_bias_rel_meanabs')[0]:+.3f}"
        r["SR24 expected bias %"] = f"{100 * val(t, 'SR exact (expected)', 'aligned_bias_rel_meanabs')[0]:+.3f}"
        r["RNE: clamp / flush / rounding part %"] = " / ".join(
            f"{100 * val(t, 'RNE', f'aligned_bias_part_{q}')[0]:+.3f}" for q in ("clamp", "flush", "rounding"))
        r["clamped / flushed elements %"] = (f"{100 * val(t, 'RNE', 'fraction_clamped')[0]:.1f} / "
                                             f"{100 * val(t, 'RNE', 'fraction_flushed')[0]:.1f}")
        r["MSE SR8/RNE"] = val(t, "SR k=8", "mse")[0] / val(t, "RNE", "mse")[0]
        tab.append(r)
    tab = pd.DataFrame(tab)
    fwd = [n for n in rt if not n.endswith("grad_output")]
    drop_fwd = [val(t, "RNE", "sqnr_db")[0] - val(t, "SR k=8", "sqnr_db")[0] for t in fwd]
    drop_grad = [val(t, "RNE", "sqnr_db")[0] - val(t, "SR k=8", "sqnr_db")[0] for t in grads]
    rne_b = [abs(val(t, "RNE", "aligned_bias_rel_meanabs")[0]) for t in grads]
    ns0, res0 = curves[0.0]
    ns1, res1 = curves[1.0]

    def slope(ns, v):
        return float(np.polyfit(np.log(ns[ns >= 8]), np.log(v[ns >= 8]), 1)[0])

    sl = {m: slope(ns0, v) for m, v in res0.items()}
    sl1 = {m: slope(ns1, v) for m, v in res1.items()}
    gtab = []
    for layer in layers:
        row = {"layer": layer}
        for rname, short in (("paper (SR on gradients)", "SR"), ("paper without SR (RNE everywhere)", "RNE")):
            row[f"wgrad 1 step ({short})"] = val(layer, rname, "wgrad_rel_error", "gemm_single_step")[0]
            row[f"wgrad mean of {gemm_steps} ({short})"] = avg_curves[(layer, rname)][-1]
        row["fprop (paper)"] = val(layer, "paper (SR on gradients)", "fprop_rel_error", "gemm_single_step")[0]
        row["fprop (fwd SR)"] = val(layer, "paper + SR on forward operands", "fprop_rel_error", "gemm_single_step")[0]
        gtab.append(row)
    gtab = pd.DataFrame(gtab)
    fprop_ratio = (gtab["fprop (fwd SR)"] / gtab["fprop (paper)"]).to_numpy()
    wg_ratio = np.array([avg_curves[(ly, "paper (SR on gradients)")][-1] / avg_curves[(ly, "paper without SR (RNE "
                        "everywhere)")][-1] for ly in layers])
    sr_exp = [abs(val(t, "SR exact (expected)", "aligned_bias_rel_meanabs")[0]) for t in grads]
    rne_round = [abs(val(t, "RNE", "aligned_bias_part_rounding")[0]) for t in grads]
    clamp_frac = [val(t, "RNE", "fraction_clamped")[0] for t in grads]
    measured = (
        f"Per captured gradient tensor ({min(rows, 128)}×256), RNE's magnitude bias mean(sign(x)(x̂−x)) is "
        f"−{100 * min(rne_b):.2f} to −{100 * max(rne_b):.2f} % of mean|x| (values pulled toward zero). SR is not "
        f"bias-free in NVFP4: its expected bias (exact, from the grid neighbours) is −{100 * min(sr_exp):.2f} to "
        f"−{100 * max(sr_exp):.2f} %, all of it from the {100 * min(clamp_frac):.1f}–{100 * max(clamp_frac):.1f} % of "
        f"elements (block maxima) whose E4M3 block scale was rounded down so that x·enc > 6 is clamped to 6, and from "
        f"blocks whose scale underflows to zero; the Monte-Carlo SR estimates ({seeds} seeds, 95 % CI) agree. "
        f"Removing those, RNE's pure rounding part is {100 * min(rne_round):.2f}–{100 * max(rne_round):.2f} %. "
        f"Accumulating the same gradient N times (N ≤ {n_max}), the error's log-log slope is {sl['RNE']:.2f} for "
        f"RNE, {sl['SR k=8']:.2f} for SR k=8 and {sl['SR exact (k=24)']:.2f} for SR exact; at N = {n_max} RNE's "
        f"error is {res0['RNE'][-1] / res0['SR exact (k=24)'][-1]:.1f}× SR's. From the exact moments, SR's residual "
        f"(clamp) bias overtakes its noise after N ≈ {k24_cross:.0f} identical updates (k = 8: N ≈ {k8_cross:.0f}), "
        f"after which SR's error also grows linearly, at a rate "
        f"{theory['RNE'][-1] / theory['SR exact (k=24)'][-1]:.1f}× "
        f"below RNE's. With step-to-step noise as large as the gradient, the noise dithers RNE (slopes RNE "
        f"{sl1['RNE']:.2f}, SR {sl1['SR exact (k=24)']:.2f}; RNE/SR error at N = {n_max}: "
        f"{res1['RNE'][-1] / res1['SR exact (k=24)'][-1]:.2f}). Variance cost: SR k=8 has "
        f"{tab['MSE SR8/RNE'].min():.2f}–{tab['MSE SR8/RNE'].max():.2f}× RNE's MSE on gradients "
        f"({min(drop_grad):.1f}–{max(drop_grad):.1f} dB SQNR lost) and loses "
        f"{min(drop_fwd):.1f}–{max(drop_fwd):.1f} dB "
        f"on weights/activations; forcing SR on the Fprop operands changes the Fprop GEMM error by "
        f"{fprop_ratio.min():.2f}–{fprop_ratio.max():.2f}×. At GEMM level one SR Wgrad is noisier than RNE, but "
        f"averaged over {gemm_steps} steps the SR dW error is {wg_ratio.min():.2f}–{wg_ratio.max():.2f}× RNE's; its "
        f"floor is set by the RNE-quantized X operand and the clamp bias, which SR does not remove."
    )
    agrees = sl["RNE"] > 0.9 and sl["SR exact (k=24)"] < sl["RNE"] - 0.2 and min(drop_fwd) > 0
    verdict = (
        ("Mostly agrees: RNE's gradient bias is systematic and its accumulated error grows linearly in N, SR's "
         "much more slowly, and SR costs single-shot accuracy (worse SQNR on every tensor), which is why it "
         "belongs on gradients only. " if agrees else "Only partly agrees (see numbers). ")
        + "Qualifications fpsim finds: (1) NVFP4 SR with Transformer Engine's scale arithmetic is itself biased "
        "toward zero by the block-max clamp (and zero-scale flush), so SR reduces the bias several-fold rather "
        "than removing it; (2) the linear-vs-√N contrast is an idealisation for identical updates — with "
        "realistic step-to-step noise RNE is partly dithered and the gap shrinks or vanishes at these N; "
        "(3) 8-bit SR's own 2^-8-step bias is smaller than the clamp bias here. Training-loss effects at scale "
        "are not measured."
    )
    write_section(
        args, "6. Stochastic rounding",
        "Gradients must be quantized with stochastic rounding: RNE is biased and its bias accumulates over many "
        "updates at scale, while SR is unbiased; SR on forward tensors (weights, activations) only adds error.",
        measured, verdict, ["bias_per_tensor.png", "accumulation.png", "variance_and_gemm.png"],
        ["Magnitude bias mean(sign(x)(x̂−x)) in % of mean|x| (± 95 % CI over seeds; 'exact'/'expected' = "
         "computed, not sampled), RNE's bias split by cause, and SR's MSE cost:\n\n"
         + md_table(tab, ".2f"),
         "GEMM relative error against FP64 (single step means over seeds; 'mean of S' = dW averaged over S steps):"
         "\n\n" + md_table(gtab, ".3g")],
    )
    return args.dir


if __name__ == "__main__":
    main()
