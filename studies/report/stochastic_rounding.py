"""Study 6 — stochastic rounding: gradient bias of RNE vs SR, its accumulation, and SR's variance cost.

Per tensor of the bundled capture of a toy byte-level MLP LM (studies/capture/example.py; NVFP4, 1×16 blocks): the
bias of RNE, SR with 8 random bits (the hardware's ``cvt.rs`` width) and SR "exact" (24 bits), estimated over seeds
with 95 % confidence intervals (and, for k = 8, computed exactly by enumerating all 256 random values); the
accumulated error when the same small gradient is summed N times (a weight updated by N quantized steps with an FP32
master copy); SR's variance cost (MSE, SQNR) on gradients and on forward tensors; and, at GEMM level, the error of
dW averaged over many steps under the paper's recipe with and without SR, and of Y with SR forced on the forward
operands.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.transforms import derive_seed
from studies.common import md_table, parse_args, progress, save_fig, sqnr_db, tinylm_tensors, write_csv, write_section

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


def bias_seed(seed, s):
    """The SR seed of draw ``s`` of the bias table: derived from the run's ``--seed``, so that another run seed draws
    other bits (the same seed for every tensor and both k)."""
    return derive_seed(seed, "bias", s)


def noise_seed(seed, i):
    """The seed of noise realisation ``i`` of the noisy accumulation (its noise and its SR bits): derived from the
    run's ``--seed``, so that runs with neighbouring seeds share no realisation (``seed + i`` made ``--seed 0`` and
    ``--seed 1`` share three of four)."""
    return derive_seed(seed, "noise", i)


def tensor_bias(name, x, seeds, rows, seed=0):
    """Bias / MSE rows for one tensor (all modes); SR draw s uses :func:`bias_seed` (seed, s)."""
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
            xq = _q(x, kw, seed=bias_seed(seed, s), tensor_amax=amax)
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
        # RNE: exact (interval 0); SR: a noise-corrected Monte-Carlo estimate whose interval is not computed (empty)
        out.append(dict(base, metric="elementwise_bias_rms_rel_rms", value=np.sqrt(max(b2, 0.0)) / rms,
                        ci95=0.0 if n_draws == 1 else np.nan))
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


GAP_MIN = 2.0  # RNE/SR accumulated-error ratio (identical updates, largest N) that counts as "RNE's bias accumulates"


def local_slope(ns, v, lo, hi):
    """Log-log slope of ``v`` over lo ≤ N ≤ hi.  One fit over 8…4096 would mix SR's √N (noise) and N (clamp
    bias) regimes, which cross near N ≈ 100 here, so the slope is fitted within one regime at a time."""
    m = (ns >= lo) & (ns <= hi)
    return float(np.polyfit(np.log(ns[m]), np.log(v[m]), 1)[0])


def signed_range(vals, digits=2):
    """'a to b' of fractions in %, signed (the table's signs; a magnitude range would hide them)."""
    lo, hi = 100 * min(vals), 100 * max(vals)
    return f"{lo:+.{digits}f} to {hi:+.{digits}f}".replace("-", "−")


def noisy_gap(ratio, ci, ratio_identical):
    """What step-to-step noise does to the RNE/SR gap, from the measured RNE/SR error ratio and its 95 % CI."""
    if ratio + ci < 1:
        return f"the gap reverses: RNE's accumulated error is {ratio:.2f} ± {ci:.2f}× SR's"
    if ratio - ci <= 1:
        return f"the gap vanishes: RNE/SR error {ratio:.2f} ± {ci:.2f}× is consistent with 1"
    if ratio < ratio_identical:
        return f"the gap shrinks to {ratio:.2f} ± {ci:.2f}× (from {ratio_identical:.1f}× for identical updates)"
    return f"the gap persists: {ratio:.2f} ± {ci:.2f}×"


def verdict_text(ratio_identical, ratio_noisy, ratio_noisy_ci, n_max, sqnr_drops):
    """Verdict from the measured numbers, by the printed rule.  'Agrees': with identical updates RNE's expected
    accumulated error at N = n_max is ≥ GAP_MIN × SR exact's, the gap persists with step-to-step noise (the RNE/SR
    error ratio's 95 % interval lies above 1) and SR k=8 lowers SQNR on every captured tensor.  'Partly agrees': the
    identical-update gap holds but not everything else.  'Does not agree': not even that gap."""
    gap = ratio_identical >= GAP_MIN
    persists = ratio_noisy - ratio_noisy_ci > 1
    costs = min(sqnr_drops) > 0
    crit = (f"(criterion: with identical updates RNE's expected accumulated error at N = {n_max} is ≥ {GAP_MIN:g}× "
            f"SR's — here {ratio_identical:.1f}× —, the gap persists with step-to-step noise, i.e. the RNE/SR error "
            f"ratio's 95 % interval lies above 1 — here {ratio_noisy:.2f} ± {ratio_noisy_ci:.2f} —, and SR lowers "
            f"SQNR on every tensor — here by {min(sqnr_drops):.1f}–{max(sqnr_drops):.1f} dB; 'partly agrees' when "
            "the identical-update gap holds but not all of the rest)")
    if gap and persists and costs:
        head = ("Agrees: RNE's gradient bias is systematic and its accumulated error grows linearly in N, well above "
                "SR's, also with step-to-step noise, and SR costs single-shot accuracy, which is why it belongs on "
                "gradients only ")
    elif gap:
        head = ("Partly agrees: RNE's gradient bias is systematic and, for identical updates, its accumulated error "
                "grows linearly in N, well above SR's"
                + ("; SR costs single-shot accuracy, which is why it belongs on gradients only" if costs else "")
                + (" — but the gap does not survive step-to-step noise (qualification 2) " if not persists else " "))
    else:
        head = "Does not agree: even for identical updates RNE's accumulated error is not well above SR's "
    return (head + crit + ". Qualifications fpsim finds: (1) NVFP4 SR with Transformer Engine's scale arithmetic "
            "is itself biased toward zero by the block-max clamp (and zero-scale flush), so SR reduces the bias "
            "several-fold rather than removing it, and past a crossover its error also grows linearly; (2) the "
            "linear-vs-√N contrast is an idealisation for identical updates — with step-to-step noise equal to the "
            f"gradient's rms, at N = {n_max} {noisy_gap(ratio_noisy, ratio_noisy_ci, ratio_identical)}; (3) 8-bit "
            "SR's own 2^-8-step bias is smaller than the clamp bias here. Training-loss effects at scale are not "
            "measured.")


def accumulation(g, n_max, noise, seed, full=None):
    """Error of Σ_{n≤N} Q(g_n) against Σ g_n, in units of rms(g), for N = 1..n_max.

    ``g`` is the first rows of ``full`` (default: ``g`` itself), the captured gradient tensor a step would
    quantize: only ``g`` is simulated, but every step is quantized with its own step tensor's amax, as the
    recipe's per-tensor scale is, never with the amax of the simulated slice alone (that would be a finer
    scale than the recipe's and a different error).  ``noise`` = 0: the same gradient every step, so one
    amax, amax(full); otherwise step n's tensor is full + noise·rms(g)·ξ_n (ξ standard normal over the
    whole tensor), whose amax is drawn afresh each step.
    """
    full = g if full is None else full
    r, c = g.shape
    if full.shape[1] != c or not np.array_equal(full[:r], g):
        raise ValueError("g must be the first rows of full")
    rms = float(np.sqrt(np.mean(g.astype(np.float64) ** 2)))
    ns = np.unique(np.round(np.logspace(0, np.log10(n_max), 25)).astype(int))
    if noise:
        rng = np.random.default_rng(seed)
        steps, amaxes = [], []
        for _ in range(n_max):  # the whole step tensor is drawn only for its amax
            t = (full + noise * rms * rng.standard_normal(full.shape)).astype(np.float32)
            steps.append(t[:r])
            amaxes.append(float(np.max(np.abs(t))))
        tiled = np.concatenate(steps)
    else:
        tiled = np.tile(g, (n_max, 1))
        amaxes = [float(np.max(np.abs(full)))]
    exact = np.cumsum(tiled.astype(np.float64).reshape(n_max, r * c), axis=0)
    res = {}
    for label, kw in MODES:
        if len(amaxes) == 1:  # one amax: every step in a single quantize call
            xq = _q(tiled, kw, seed=derive_seed(seed, "accumulation"), tensor_amax=amaxes[0])
        else:  # quantize takes one tensor amax per call: one call per step, each with fresh SR bits
            xq = np.concatenate([_q(tiled[n * r:(n + 1) * r], kw, seed=derive_seed(seed, "accumulation", n),
                                    tensor_amax=a) for n, a in enumerate(amaxes)])
        err = np.cumsum(xq.reshape(n_max, r * c), axis=0) - exact
        res[label] = np.sqrt((err[ns - 1] ** 2).mean(axis=1)) / rms
    return ns, res


def main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    quick = args.quick
    seeds = 12 if quick else 64
    rows = 32 if quick else 128            # rows of each 128×256 captured tensor used for the bias table
    acc_rows, n_max = (4, 256) if quick else (16, 4096)
    gemm_steps = 3 if quick else 32
    rt = tinylm_tensors()
    out = []

    # --- 1. bias, MSE and SQNR per tensor ---------------------------------------------------------------
    for name, x in rt.items():
        progress(f"[{NAME}] bias/MSE {name} ({min(rows, x.shape[0])}×{x.shape[1]}, {seeds} seeds)")
        out += tensor_bias(name, x, seeds if name.endswith("grad_output") else max(4, seeds // 4), rows, args.seed)

    # --- 2. accumulation of the same small gradient ----------------------------------------------------
    # The simulated rows stand in for the whole captured gradient, so every step is quantized with the whole
    # (step) tensor's amax, as the recipe's per-tensor scale is; the expected curves below use the same amax.
    g_full = rt["fc2.grad_output"]
    g = g_full[:acc_rows]
    amax = float(np.max(np.abs(g_full)))
    noise_seeds = 2 if quick else 4      # the noisy case is random in its noise too: its ratio gets a t-interval
    curves, noisy_ratio = {}, []
    for noise in (0.0, 1.0):
        runs = []
        for i in range(noise_seeds if noise else 1):
            seed = noise_seed(args.seed, i) if noise else args.seed
            progress(f"[{NAME}] accumulation N ≤ {n_max}, noise {noise}, seed {seed}")
            ns, r = accumulation(g, n_max, noise, seed, full=g_full)
            runs.append(r)
        res = {m: np.mean([r[m] for r in runs], axis=0) for m in runs[0]}
        curves[noise] = (ns, res)
        if noise:
            noisy_ratio = [r["RNE"][-1] / r["SR exact (k=24)"][-1] for r in runs]
        for label, v in res.items():
            if len(runs) > 1:
                cis = [_ci([r[label][j] for r in runs])[1] for j in range(len(ns))]
            else:  # RNE without noise is deterministic; one SR draw has no interval
                cis = [0.0 if label == "RNE" else np.nan] * len(ns)
            out += [{"part": f"accumulation_noise{noise:g}", "tensor": "fc2.grad_output", "kind": "grad_output",
                     "mode": label, "N": int(n), "metric": "accum_error_rel_rms", "value": float(e), "ci95": c}
                    for n, e, c in zip(ns, v, cis)]
    res0 = curves[0.0][1]
    ratio0_sim = float(res0["RNE"][-1] / res0["SR exact (k=24)"][-1])
    ratio1, ratio1_ci = _ci(noisy_ratio)
    rmode = "RNE / SR exact (k=24)"
    out += [{"part": "accumulation_noise0", "tensor": "fc2.grad_output", "kind": "grad_output", "mode": rmode,
             "N": n_max, "metric": "error_ratio", "value": ratio0_sim, "ci95": np.nan},
            {"part": "accumulation_noise1", "tensor": "fc2.grad_output", "kind": "grad_output", "mode": rmode,
             "N": n_max, "metric": "error_ratio", "value": ratio1, "ci95": ratio1_ci}]
    # local slopes, one regime at a time: N ≤ 16 (SR's noise dominates) and the last quarter of the range
    ranges = {"low": (1, 16), "high": (max(2, n_max // 4), n_max)}
    slopes = {}
    for noise, (ns, res) in curves.items():
        for label, v in res.items():
            for key, (lo, hi) in ranges.items():
                slopes[noise, label, key] = local_slope(ns, v, lo, hi)
                out.append({"part": f"accumulation_noise{noise:g}", "tensor": "fc2.grad_output",
                            "kind": "grad_output", "mode": label, "N": hi, "metric": f"loglog_slope_N{lo}-{hi}",
                            "value": slopes[noise, label, key], "ci95": np.nan})
    # expected curves (exact moments) far beyond the simulation, same gradient every step
    g64 = g.astype(np.float64)
    rms = float(np.sqrt((g64 * g64).mean()))
    n_th = np.unique(np.r_[np.round(np.logspace(0, 6, 31)).astype(int), n_max])
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
    ratio0 = float(theory["RNE"][n_th == n_max][0] / theory["SR exact (k=24)"][n_th == n_max][0])
    k8_cross = float(v8.mean() / ((e8 - g64) ** 2).mean())  # N where N²b² = Nσ²
    k24_cross = float(v24.mean() / ((e24 - g64) ** 2).mean())
    rate_ratio = float(np.sqrt((b_rne**2).mean() / ((e24 - g64) ** 2).mean()))  # N → ∞: both linear
    ex = {"part": "accumulation_expected", "tensor": "fc2.grad_output", "kind": "grad_output", "ci95": 0.0}
    out += [dict(ex, mode=rmode, N=n_max, metric="error_ratio", value=ratio0),
            dict(ex, mode=rmode, N=0, metric="linear_rate_ratio", value=rate_ratio),
            dict(ex, mode="SR exact (k=24)", N=0, metric="bias_overtakes_noise_N", value=k24_cross),
            dict(ex, mode="SR k=8", N=0, metric="bias_overtakes_noise_N", value=k8_cross)]

    # --- 3. GEMM level: dW averaged over steps, Y with SR on forward operands --------------------------
    paper = fpsim.get_recipe("nvfp4_paper")
    recipes = {"paper (SR on gradients)": paper, "paper without SR (RNE everywhere)": paper.without("sr"),
               "paper + SR on forward operands": paper.replace_roles(["fprop_x", "fprop_w"], rounding="sr")}
    layers = ["fc2"] if quick else ["fc1", "fc2", "head"]
    fwd_steps = max(2, gemm_steps // 4)  # forward SR only shows its single-step cost: fewer steps suffice
    avg_curves = {}
    for layer in layers:
        x, w, dy = rt[f"{layer}.input"], rt[f"{layer}.weight"], rt[f"{layer}.grad_output"]
        for rname, rec in recipes.items():
            n_steps = gemm_steps if rname != "paper + SR on forward operands" else fwd_steps
            progress(f"[{NAME}] GEMM {layer} {rname} ({n_steps} steps)")
            acc, errs = None, {"fprop": [], "dgrad": [], "wgrad": []}
            curve = []
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
            # one realisation of the SR bits: no interval (empty); without SR every step gives the same dW: exact
            run_ci = 0.0 if rname == "paper without SR (RNE everywhere)" else np.nan
            out += [{"part": "gemm_dw_running_mean", "tensor": layer, "kind": "linear", "mode": rname, "N": i + 1,
                     "metric": "wgrad_mean_rel_error", "value": float(e), "ci95": run_ci} for i, e in enumerate(curve)]
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
            ax.set_title(f"gradient + noise of its rms each step\n(per-step amax; mean of {noise_seeds} seeds)",
                         fontsize=10)
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
    rne_b = [val(t, "RNE", "aligned_bias_rel_meanabs")[0] for t in grads]
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
    sr_exp = [val(t, "SR exact (expected)", "aligned_bias_rel_meanabs")[0] for t in grads]
    rne_round = [val(t, "RNE", "aligned_bias_part_rounding")[0] for t in grads]
    clamp_frac = [val(t, "RNE", "fraction_clamped")[0] for t in grads]
    # do the sampled SR biases cover the computed ones? (k=8: exact enumeration; k=24: exact expectation)
    mc = [(val(t, mc_mode, "aligned_bias_rel_meanabs"), val(t, ex_mode, "aligned_bias_rel_meanabs")[0])
          for t in grads for mc_mode, ex_mode in (("SR k=8", "SR k=8 (exact enumeration)"),
                                                  ("SR exact (k=24)", "SR exact (expected)"))]
    covered = sum(abs(m - e) <= ci for (m, ci), e in mc)
    lo, hi = ranges["low"], ranges["high"]
    measured = (
        f"Seeds (--seed {args.seed}): SR seeds derive_seed({args.seed}, 'bias', s), s = 0…{seeds - 1} for the "
        f"gradients' bias table (s = 0…{max(4, seeds // 4) - 1} for weights and activations); accumulation: "
        f"seed {args.seed} for identical updates, derive_seed({args.seed}, 'noise', i), i = 0…{noise_seeds - 1} "
        f"for the noisy realisations (noise and SR bits); GEMM seed {args.seed}. "
        f"Per captured gradient tensor ({min(rows, 128)}×256), RNE's magnitude bias mean(sign(x)(x̂−x)) is "
        f"{signed_range(rne_b)} % of mean|x|"
        + (" (negative: values pulled toward zero)" if max(rne_b) < 0 else "")
        + f". SR is not bias-free in NVFP4: its expected bias (exact, from the grid neighbours) is "
        f"{signed_range(sr_exp)} %, all of it from the {100 * min(clamp_frac):.1f}–{100 * max(clamp_frac):.1f} % of "
        f"elements (block maxima) whose E4M3 block scale was rounded down so that x·enc > 6 is clamped to 6, and from "
        f"blocks whose scale underflows to zero; the Monte-Carlo SR estimates ({seeds} seeds) cover these exact "
        f"values within their 95 % CI in {covered} of {len(mc)} cases. Removing clamp and flush, RNE's pure "
        f"rounding part is {signed_range(rne_round)} %. "
        f"Accumulating the same {g.shape[0]}×{g.shape[1]} gradient slice N times (N ≤ {n_max}; every step quantized "
        f"with the whole tensor's amax, one seed), RNE's error grows linearly (log-log slope "
        f"{slopes[0.0, 'RNE', 'low']:.2f} for N = {lo[0]}–{lo[1]}, {slopes[0.0, 'RNE', 'high']:.2f} for "
        f"N = {hi[0]}–{hi[1]}); SR exact's slope is {slopes[0.0, 'SR exact (k=24)', 'low']:.2f} and "
        f"{slopes[0.0, 'SR exact (k=24)', 'high']:.2f} (k = 8: {slopes[0.0, 'SR k=8', 'low']:.2f} and "
        f"{slopes[0.0, 'SR k=8', 'high']:.2f}), √N-like while its noise dominates, then steeper. At N = {n_max} "
        f"RNE's error is {ratio0_sim:.1f}× SR exact's ({ratio0:.1f}× expected from the exact moments). From those "
        f"moments, SR's residual (clamp) bias overtakes its noise after N ≈ {k24_cross:.0f} identical updates "
        f"(k = 8: N ≈ {k8_cross:.0f}), after which SR's error also grows linearly, at a rate {rate_ratio:.1f}× below "
        f"RNE's. With step-to-step noise equal to the gradient's rms (each step quantized with its own tensor's "
        f"amax; {noise_seeds} seeds), the noise dithers RNE (slopes for N = {hi[0]}–{hi[1]}: RNE "
        f"{slopes[1.0, 'RNE', 'high']:.2f}, SR exact {slopes[1.0, 'SR exact (k=24)', 'high']:.2f}) and RNE's error "
        f"at N = {n_max} is {ratio1:.2f} ± {ratio1_ci:.2f}× SR exact's. Variance cost: SR k=8 has "
        f"{tab['MSE SR8/RNE'].min():.2f}–{tab['MSE SR8/RNE'].max():.2f}× RNE's MSE on gradients "
        f"({min(drop_grad):.1f}–{max(drop_grad):.1f} dB SQNR lost) and loses "
        f"{min(drop_fwd):.1f}–{max(drop_fwd):.1f} dB "
        f"on weights/activations; forcing SR on the Fprop operands changes the Fprop GEMM error by "
        f"{fprop_ratio.min():.2f}–{fprop_ratio.max():.2f}×. At GEMM level one SR Wgrad is noisier than RNE, but "
        f"averaged over {gemm_steps} steps the SR dW error is {wg_ratio.min():.2f}–{wg_ratio.max():.2f}× RNE's; its "
        f"floor is set by the RNE-quantized X operand and the clamp bias, which SR does not remove."
    )
    verdict = verdict_text(ratio0, ratio1, ratio1_ci, n_max, drop_fwd + drop_grad)
    write_section(
        args, "6. Stochastic rounding",
        "Gradients must be quantized with stochastic rounding: RNE is biased and its bias accumulates over many "
        "updates at scale, while SR is unbiased; SR on forward tensors (weights, activations) only adds error.",
        measured, verdict, ["bias_per_tensor.png", "accumulation.png", "variance_and_gemm.png"],
        ["Magnitude bias mean(sign(x)(x̂−x)) in % of mean|x| (± 95 % CI over seeds; 'exact'/'expected' = "
         "computed, not sampled), RNE's bias split by cause, and SR's MSE cost:\n\n"
         + md_table(tab, ".2f"),
         f"GEMM relative error against FP64, seed {args.seed}. '1 step' and 'fprop' columns: one step's error, "
         f"averaged over {gemm_steps} steps (fresh SR bits each step; a GEMM with RNE operands only repeats the same "
         f"error), except 'fprop (fwd SR)': over {fwd_steps} steps; 'mean of {gemm_steps}' = error of dW averaged "
         f"over {gemm_steps} steps:\n\n" + md_table(gtab, ".3g")],
    )
    return args.dir


if __name__ == "__main__":
    main()
