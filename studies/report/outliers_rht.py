"""Study 4 — outliers and the random Hadamard transform (RHT): when rotating before NVFP4 helps.

NVFP4 error vs injected outlier magnitude with and without RHT16; Hadamard size 2..256; sign policy
(none / the recipe's fixed vector / a fresh vector per call) on structured rows; block kurtosis before
and after rotation; RHT added to the Fprop, Dgrad or Wgrad operands of a linear layer, measured as each
GEMM's output error against FP64.
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import fpsim
from fpsim.analysis import mean_ci95
from fpsim.recipe import get_recipe, linear
from fpsim.transforms import derive_seed, sign_vector
from studies.common import (
    TINYLM,
    TINYLM_TEXT,
    md_table,
    numba_threads,
    parse_args,
    progress,
    rel_error,
    save_fig,
    synthetic,
    tinylm_tensors,
    write_csv,
    write_section,
)

NAME = "outliers_rht"
D_RECIPE = 16
# Expected value of block_stats' kurtosis on n = 16 i.i.d. Gaussian samples (raw moments about 0, biased): for
# Gaussian x ∈ Rⁿ the ratio Σx⁴/(Σx²)² depends only on x's direction, so it is independent of Σx², hence
# E[ratio] = E[Σx⁴]/E[(Σx²)²] = 3n/(n(n+2)) and E[kurtosis] = n·E[ratio] = 3n/(n+2) = 8/3 — not the population 3.
GAUSS_BLOCK_KURT = 3 * 16 / (16 + 2)


# --------------------------------------------------------------------------------------------- helpers
def nvfp4_roundtrip(x: np.ndarray, d: int = 0, signs="recipe") -> np.ndarray:
    """x → [RHT_d] → NVFP4 (1×16 along the last axis, RNE) → decode → [inverse RHT], float64.

    The forward rotation follows the recipe (BF16 in/out); the inverse is the exact float32 transform,
    so the measured error is the quantization error of the rotated tensor seen in the original basis.
    """
    xr = fpsim.rht(x, d, signs) if d else x
    xq = fpsim.quantize(xr, "nvfp4").dequantize()
    if d:
        xq = fpsim.rht(xq, d, signs, inverse=True, bf16_in=False, bf16_out=False)
    return xq.astype(np.float64)


def block_stats(x: np.ndarray, block: int = 16) -> tuple[float, float]:
    """Mean per-block kurtosis E[x⁴]/E[x²]² (raw moments; 3n/(n+2) = 2.67 expected for 16 Gaussian samples, 3 only as
    n → ∞) and mean block crest amax/rms."""
    b = x.astype(np.float64).reshape(-1, block)
    m2 = np.mean(b * b, axis=1)
    keep = m2 > 0
    b, m2 = b[keep], m2[keep]
    kurt = np.mean(b**4, axis=1) / m2**2
    crest = np.max(np.abs(b), axis=1) / np.sqrt(m2)
    return float(kurt.mean()), float(crest.mean())


def with_outliers(shape, m: float, seed: int, every: int = 128):
    """Gaussian rows (σ = 1) with one outlier per ``every`` elements of magnitude m·σ·U(0.5, 1), random sign."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    mask = np.zeros(shape, bool)
    n = x.size // every
    idx = rng.choice(x.size, n, replace=False)
    mask.flat[idx] = True
    x.flat[idx] = m * rng.uniform(0.5, 1.0, n) * rng.choice([-1.0, 1.0], n)
    return x.astype(np.float32), mask


def gemm_rel_error(x: np.ndarray, w: np.ndarray, d: int, signs="recipe") -> float:
    """‖Q(X R)·Q(W R)ᵀ − X·Wᵀ‖ / ‖X·Wᵀ‖ with both operands NVFP4 along K (R = RHT_d, or identity)."""
    xa, wa = (fpsim.rht(a, d, signs) if d else a for a in (x, w))
    out = fpsim.gemm(fpsim.quantize(xa, "nvfp4"), fpsim.quantize(wa, "nvfp4"), accumulator="blas")
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def row(experiment, data, variant, param, metric, value):
    return {"experiment": experiment, "data": data, "variant": variant, "param": param, "metric": metric,
            "value": float(value)}


# ----------------------------------------------------------------------------------------- experiments
def exp_outlier_magnitude(args, quick):
    shape = (64, 1024) if quick else (256, 4096)
    mags = [1, 3, 10, 30, 100, 300, 1000] if quick else list(np.round(np.logspace(0, 3, 13), 3))
    w = synthetic("gaussian", (128 if quick else 256, shape[1]), args.seed + 101)
    rows = []
    for i, m in enumerate(mags):
        progress(f"[{NAME}] outlier magnitude m = {m}")
        x, mask = with_outliers(shape, m, args.seed + 1000 + i)
        x64 = x.astype(np.float64)
        for variant, d in (("no RHT", 0), ("RHT16", D_RECIPE)):
            xq = nvfp4_roundtrip(x, d)
            inl = ~mask
            rows += [
                row("outlier_magnitude", "gaussian+outliers", variant, m, "rel_error", rel_error(x, xq)),
                row("outlier_magnitude", "gaussian+outliers", variant, m, "inlier_rel_error",
                    np.linalg.norm((x64 - xq)[inl]) / np.linalg.norm(x64[inl])),
                row("outlier_magnitude", "gaussian+outliers", variant, m, "gemm_rel_error",
                    gemm_rel_error(x, w, d)),
            ]
    return rows


def exp_hadamard_size(args, quick):
    shape = (64, 1024) if quick else (512, 4096)
    sizes = [0, 2, 4, 8, 16, 32, 64, 128, 256]
    rows = []
    for j, kind in enumerate(("gaussian", "student_t3", "channel_outliers")):
        x = synthetic(kind, shape, args.seed + 200 + j)
        progress(f"[{NAME}] Hadamard size sweep on {kind} {shape}")
        for d in sizes:
            # d = 16 uses the recipe's vector; other sizes a seeded random vector (the recipe's has 16 entries).
            signs = "recipe" if d == D_RECIPE else derive_seed(args.seed, "hadamard_size", d)
            xq = nvfp4_roundtrip(x, d, signs)
            rows.append(row("hadamard_size", kind, "RHT" if d else "no RHT", d, "rel_error", rel_error(x, xq)))
            xr = fpsim.rht(x, d, signs) if d else x
            rows.append(row("hadamard_size", kind, "RHT" if d else "no RHT", d, "block_kurtosis",
                            block_stats(xr)[0]))
    return rows


def structured(kind: str, shape, seed: int) -> np.ndarray:
    """Rows where the sign vector matters (unit-scale signal plus N(0, 0.25²) noise).

    ``constant``: each row a constant c ~ N(0, 1) — an unsigned Hadamard maps each tile to one coefficient.
    ``periodic``: square waves of period 2, 4 or 8 per row — again one Walsh coefficient per tile.
    ``recipe-aligned``: tiles equal to c·s_recipe (the recipe's sign vector repeated): the fixed
    vector's own worst case, which it turns into one coefficient.
    """
    rng = np.random.default_rng(seed)
    r, c = shape
    noise = 0.25 * rng.standard_normal(shape)
    amp = rng.standard_normal((r, 1))
    if kind == "constant":
        sig = np.broadcast_to(amp, shape)
    elif kind == "periodic":
        per = rng.choice([2, 4, 8], r)[:, None]
        sig = amp * np.where((np.arange(c)[None, :] // (per // 2)) % 2 == 0, 1.0, -1.0)
    elif kind == "recipe-aligned":
        sig = amp * np.tile(sign_vector(16, "recipe").astype(np.float64), c // 16)[None, :]
    else:
        raise ValueError(kind)
    return (sig + noise).astype(np.float32)


def exp_sign_policy(args, quick, toy_tensors):
    shape = (64, 512) if quick else (512, 2048)
    calls = 2 if quick else 16
    data = [(k, structured(k, shape, args.seed + 300 + i))
            for i, k in enumerate(("constant", "periodic", "recipe-aligned"))]
    data += [("student_t3", synthetic("student_t3", shape, args.seed + 310))]
    data += [(f"{TINYLM}{k}", v.reshape(-1, v.shape[-1])) for k, v in toy_tensors.items()
             if not quick or "head" in k]
    rows = []
    for name, x in data:
        progress(f"[{NAME}] sign policy on {name}")
        rows.append(row("sign_policy", name, "no RHT", 0, "rel_error", rel_error(x, nvfp4_roundtrip(x, 0))))
        rows.append(row("sign_policy", name, "unsigned H16", 0, "rel_error",
                        rel_error(x, nvfp4_roundtrip(x, 16, "none"))))
        rows.append(row("sign_policy", name, "recipe fixed signs", 0, "rel_error",
                        rel_error(x, nvfp4_roundtrip(x, 16, "recipe"))))
        # A fresh random vector per call: `calls` independent calls; report mean and spread.
        errs = [rel_error(x, nvfp4_roundtrip(x, 16, derive_seed(args.seed, "per_call", name, c))) for c in range(calls)]
        rows.append(row("sign_policy", name, "random per call", 0, "rel_error", np.mean(errs)))
        rows.append(row("sign_policy", name, "random per call", 0, "rel_error_std", np.std(errs, ddof=1)))  # sample SD
    return rows


def exp_kurtosis(args, quick, toy_tensors):
    shape = (64, 1024) if quick else (512, 4096)
    data = [(k, synthetic(k, shape, args.seed + 400 + i))
            for i, k in enumerate(("gaussian", "laplace", "student_t3", "channel_outliers"))]
    data += [(f"{TINYLM}{k}", v.reshape(-1, v.shape[-1])) for k, v in toy_tensors.items()]
    rows = []
    for name, x in data:
        progress(f"[{NAME}] block kurtosis on {name}")
        for variant, xr in (("before", x), ("after RHT16", fpsim.rht(x, D_RECIPE, "recipe"))):
            k, c = block_stats(xr)
            rows += [row("kurtosis", name, variant, 16, "block_kurtosis", k),
                     row("kurtosis", name, variant, 16, "block_crest", c)]
        for variant, d in (("before", 0), ("after RHT16", D_RECIPE)):
            rows.append(row("kurtosis", name, variant, 16, "nvfp4_rel_error", rel_error(x, nvfp4_roundtrip(x, d))))
    return rows


PLACEMENTS = {
    "none": (),
    "Wgrad (paper)": ("wgrad_dy", "wgrad_x"),
    "Fprop": ("fprop_x", "fprop_w"),
    "Dgrad": ("dgrad_dy", "dgrad_w"),
    "all three": ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x"),
}


def placement_recipe(roles):
    base = get_recipe("nvfp4_paper").without("rht")
    r = base.replace_roles(roles, rht=D_RECIPE, rht_signs="recipe") if roles else base
    return dataclasses.replace(r, name=f"rht:{'+'.join(roles) or 'none'}")


def exp_gemm_placement(args, quick, toy_tensors):
    layers = []
    for lname in ("fc1", "fc2", "head"):
        layers.append((f"{TINYLM}{lname}", toy_tensors[f"{lname}.input"], toy_tensors[f"{lname}.weight"],
                       toy_tensors[f"{lname}.grad_output"]))
    if not quick:
        t, i, o = 512, 512, 512
        layers.append(("synthetic: X channel outliers, W gaussian/√in, dY student-t",
                       synthetic("channel_outliers", (t, i), args.seed + 500),
                       synthetic("gaussian", (o, i), args.seed + 501) / np.float32(np.sqrt(i)),
                       synthetic("student_t3", (t, o), args.seed + 502)))
        layers.append(("synthetic: all gaussian",
                       synthetic("gaussian", (t, i), args.seed + 503),
                       synthetic("gaussian", (o, i), args.seed + 504) / np.float32(np.sqrt(i)),
                       synthetic("gaussian", (t, o), args.seed + 505)))
    seeds = 2 if quick else 6
    rows = []
    for lname, x, w, dy in layers:
        progress(f"[{NAME}] RHT placement on {lname} x{x.shape} w{w.shape}")
        errs = {}
        for pname, roles in PLACEMENTS.items():
            rec = placement_recipe(roles)
            runs = [linear(x, w, dy, rec, seed=derive_seed(args.seed, "placement", s), layer=lname).relative_errors()
                    for s in range(seeds)]
            errs[pname] = {g: np.array([e[g] for e in runs]) for g in ("fprop", "dgrad", "wgrad")}
            for g, e in errs[pname].items():
                m, hw = mean_ci95(e)
                rows += [row("gemm_placement", lname, pname, seeds, f"{g}_rel_error", m),
                         row("gemm_placement", lname, pname, seeds, f"{g}_rel_error_ci95", hw)]
                if pname == "none":
                    continue
                # Seed s draws the same SR bits per role in every placement (derive_seed(seed, "sr", layer, step,
                # role)), so the change is paired per seed: its interval excludes the seed-to-seed noise that
                # both placements share. RNE-only GEMMs (Fprop) are deterministic: half-width 0.
                cm, chw = mean_ci95((e / errs["none"][g] - 1) * 100)
                rows += [row("gemm_placement", lname, pname, seeds, f"{g}_change_pct", cm),
                         row("gemm_placement", lname, pname, seeds, f"{g}_change_pct_ci95", chw)]
    return rows


# --------------------------------------------------------------------------------------------- figures
def fig_outliers(df, path):
    sub = df[df.experiment == "outlier_magnitude"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, metric, label in zip(axes, ("inlier_rel_error", "rel_error", "gemm_rel_error"),
                                 ("error on the non-outlier elements\n‖x̂−x‖/‖x‖ over inliers",
                                  "whole-tensor relative error ‖x̂−x‖/‖x‖",
                                  "GEMM X·Wᵀ relative error vs FP64")):
        for variant, st in (("no RHT", "o-"), ("RHT16", "s-")):
            s = sub[(sub.metric == metric) & (sub.variant == variant)]
            ax.plot(s.param, s.value, st, label=variant)
        ax.set_xscale("log")
        ax.set_xlabel("outlier magnitude m (multiples of σ)")
        ax.set_ylabel(label + " (ratio)")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    axes[0].set_title("Inlier damage")
    axes[1].set_title("Whole tensor")
    axes[2].set_title("GEMM output (W gaussian, both NVFP4)")
    fig.suptitle("NVFP4 with one outlier per 128 Gaussian elements, with and without RHT16")
    save_fig(fig, path)


def fig_hadamard(df, path):
    sub = df[(df.experiment == "hadamard_size")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, s in sub.groupby("data", sort=False):
        for ax, metric in zip(axes, ("rel_error", "block_kurtosis")):
            t = s[s.metric == metric]
            xs = np.where(t.param == 0, 1, t.param)
            ax.plot(xs, t.value, "o-", label=kind)
    for ax, lab in zip(axes, ("NVFP4 relative error ‖x̂−x‖/‖x‖ (ratio)", "mean 16-block kurtosis (dimensionless)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Hadamard size d (elements; 1 = no RHT)")
        ax.set_ylabel(lab)
        ax.axvline(16, color="gray", ls=":", lw=1)
        ax.grid(alpha=0.3)
        ax.legend(title="data")
    axes[0].set_title("Quantization error after RHT_d + NVFP4")
    axes[1].set_title(f"Block kurtosis after RHT_d (16-sample blocks: Gaussian {GAUSS_BLOCK_KURT:.2f})")
    save_fig(fig, path)


def fig_signs_kurtosis(df, path):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    sub = df[(df.experiment == "sign_policy") & (df.metric == "rel_error")]
    piv = sub.pivot(index="data", columns="variant", values="value")
    piv = piv.loc[list(dict.fromkeys(sub.data))][["no RHT", "unsigned H16", "recipe fixed signs", "random per call"]]
    piv.index = [i.removeprefix(TINYLM) for i in piv.index]
    piv.plot.bar(ax=axes[0], width=0.8)
    axes[0].set_ylabel("NVFP4 relative error ‖x̂−x‖/‖x‖ (ratio)")
    axes[0].set_xlabel("data (structured synthetic rows, Student-t, captured tensors)")
    axes[0].set_title("Sign policy of the 16-point RHT")
    axes[0].legend(fontsize=7, title="signs", loc="lower left", framealpha=0.95)
    axes[0].tick_params(axis="x", labelsize=7)
    sub = df[(df.experiment == "kurtosis") & (df.metric == "block_kurtosis")]
    piv = sub.pivot(index="data", columns="variant", values="value").loc[list(dict.fromkeys(sub.data))]
    piv = piv[["before", "after RHT16"]]
    piv.index = [i.removeprefix(TINYLM) for i in piv.index]
    piv.plot.bar(ax=axes[1], width=0.8)
    axes[1].axhline(GAUSS_BLOCK_KURT, color="gray", ls=":", lw=1,
                    label=f"Gaussian, 16-sample blocks (3·16/18 = {GAUSS_BLOCK_KURT:.2f})")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("mean 16-block kurtosis E[x⁴]/E[x²]² (log)")
    axes[1].set_xlabel("tensor")
    axes[1].set_title("Block kurtosis before / after RHT16 (recipe signs)")
    axes[1].legend(fontsize=8)
    axes[1].tick_params(axis="x", labelsize=7)
    save_fig(fig, path)


def fig_placement(df, path):
    sub = df[df.experiment == "gemm_placement"]
    datas = list(dict.fromkeys(sub.data))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), sharey=False)
    for ax, g in zip(axes, ("fprop", "dgrad", "wgrad")):
        piv, err = (sub[sub.metric == m].pivot(index="data", columns="variant", values="value").loc[datas]
                    [list(PLACEMENTS)] for m in (f"{g}_rel_error", f"{g}_rel_error_ci95"))
        piv.index = err.index = [d.removeprefix(TINYLM).split(",")[0] for d in datas]
        piv.plot.bar(ax=ax, width=0.8, legend=(g == "fprop"), yerr=err, capsize=2)
        ax.set_title(f"{g.capitalize()} output error")
        ax.set_ylabel(f"‖{ {'fprop': 'Y', 'dgrad': 'dX', 'wgrad': 'dW'}[g]} − FP64‖ / ‖FP64‖ (ratio)")
        ax.set_xlabel("layer")
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, title="RHT16 on")
    fig.suptitle("NVFP4 linear layer (paper recipe without RHT, then RHT16 added to one GEMM's operands); "
                 "mean over SR seeds, bars 95 % t-interval")
    save_fig(fig, path)


# ------------------------------------------------------------------------------------------------ main


def main(argv=None):
    with numba_threads(1):
        return _main(argv)


def _main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    toy_tensors = tinylm_tensors()
    rows = []
    rows += exp_outlier_magnitude(args, args.quick)
    rows += exp_hadamard_size(args, args.quick)
    rows += exp_sign_policy(args, args.quick, toy_tensors)
    rows += exp_kurtosis(args, args.quick, toy_tensors)
    rows += exp_gemm_placement(args, args.quick, toy_tensors)
    write_csv(pd.DataFrame(rows), args.dir / f"{NAME}.csv")
    # Figures and text from the CSV as written (6 significant digits), so every printed number can be checked
    # against it.
    df = pd.read_csv(args.dir / f"{NAME}.csv")

    figs = ["outlier_magnitude.png", "hadamard_size.png", "sign_policy_kurtosis.png", "rht_placement.png"]
    fig_outliers(df, args.dir / figs[0])
    fig_hadamard(df, args.dir / figs[1])
    fig_signs_kurtosis(df, args.dir / figs[2])
    fig_placement(df, args.dir / figs[3])

    measured, verdict, tables = summarize(df, args.seed)
    write_section(
        args, "4. Outliers and the random Hadamard transform",
        "A 16-point random Hadamard transform before quantization spreads outliers across each block so "
        "that NVFP4's block scale is not set by one large value; it is applied only to the Wgrad operands "
        "because it gives no benefit (or hurts) on Fprop/Dgrad at the paper's scale; d = 16 is large "
        "enough; one fixed random sign vector shared by all layers and steps is enough.",
        measured, verdict, figs, tables,
    )
    return args.dir


def _get(df, **kw):
    s = df
    for k, v in kw.items():
        s = s[s[k] == v]
    return s


def _pct(v: float) -> str:
    # Two decimals below 0.1 %, so that a small change is not printed as "-0.0 %".
    return f"{v:+.2f} %" if abs(v) < 0.1 else f"{v:+.1f} %"


def _list_m(ms) -> str:
    return ", ".join(f"{m:g}" for m in ms)


def summarize(df, seed: int = 0):
    om = _get(df, experiment="outlier_magnitude")
    ms = sorted(om.param.unique())
    mmax, m_lo = ms[-1], ms[0]

    def om_val(variant, metric, m):
        return float(_get(om, variant=variant, metric=metric, param=m).value.iloc[0])

    def om_lower(metric):
        """The magnitudes m at which RHT16 lowers ``metric``."""
        return [m for m in ms if om_val("RHT16", metric, m) < om_val("no RHT", metric, m)]

    hs = _get(df, experiment="hadamard_size", metric="rel_error")
    sizes = sorted(d for d in hs.param.unique() if d > 0)

    def hs_val(kind, d):
        return float(_get(hs, data=kind, param=d).value.iloc[0])

    sp = _get(df, experiment="sign_policy", metric="rel_error")
    spp = sp.pivot(index="data", columns="variant", values="value")
    toy_sp = spp[spp.index.str.startswith(TINYLM)]
    fix_vs_call = (toy_sp["recipe fixed signs"] / toy_sp["random per call"] - 1) * 100
    sd = _get(df, experiment="sign_policy", metric="rel_error_std").set_index("data").value
    n_sd = ((toy_sp["recipe fixed signs"] - toy_sp["random per call"]).abs() / sd[toy_sp.index]).max()
    structured_rows = [k for k in ("constant", "periodic", "recipe-aligned") if k in spp.index]
    st_chg = (spp.loc[structured_rows, "recipe fixed signs"] / spp.loc[structured_rows, "no RHT"] - 1) * 100

    ku = _get(df, experiment="kurtosis")
    kp = _get(ku, metric="block_kurtosis").pivot(index="data", columns="variant", values="value")
    ep = _get(ku, metric="nvfp4_rel_error").pivot(index="data", columns="variant", values="value")
    toy_k = kp[kp.index.str.startswith(TINYLM)]
    e_chg = (ep["after RHT16"] / ep["before"] - 1) * 100  # positive = RHT16 raises the round-trip error
    toy_chg = e_chg[e_chg.index.str.startswith(TINYLM)]
    syn_chg = e_chg[~e_chg.index.str.startswith(TINYLM)].loc[[k for k in ku.data.unique() if k in e_chg.index
                                                               and not k.startswith(TINYLM)]]

    # Placement: each GEMM under the placement that puts RHT16 on its own operands (the others leave it unchanged).
    gp = _get(df, experiment="gemm_placement")
    own = {"Wgrad (paper)": "wgrad", "Fprop": "fprop", "Dgrad": "dgrad"}

    def gser(variant, metric):
        return gp[(gp.variant == variant) & (gp.metric == metric)].set_index("data").value

    ch = {v: gser(v, f"{g}_change_pct") for v, g in own.items()}
    chw = {v: gser(v, f"{g}_change_pct_ci95") for v, g in own.items()}
    n_seeds = int(gp.param.iloc[0])
    datas = list(dict.fromkeys(gp.data))
    toymask = [d.startswith(TINYLM) for d in datas]

    def rng_(v, mask):
        s = ch[v][mask]
        return f"{s.min():+.1f} to {s.max():+.1f} %"

    def ci_txt(v, d):
        return f"{ch[v][d]:+.1f} ± {chw[v][d]:.1f} %"

    # A change is "within noise" when its paired 95 % interval over the SR seeds contains 0.
    in_noise = [(d, v) for v in own for d in datas if abs(ch[v][d]) <= chw[v][d]]

    inl_no, inl_rht = om_val("no RHT", "inlier_rel_error", mmax), om_val("RHT16", "inlier_rel_error", mmax)
    g_no, g_rht = om_val("no RHT", "gemm_rel_error", mmax), om_val("RHT16", "gemm_rel_error", mmax)
    g1_no, g1_rht = om_val("no RHT", "gemm_rel_error", m_lo), om_val("RHT16", "gemm_rel_error", m_lo)
    w_no, w_rht = om_val("no RHT", "rel_error", mmax), om_val("RHT16", "rel_error", mmax)

    measured = (
        f"Seeds: --seed {seed} (synthetic data from seed + a fixed offset per experiment; SR and per-call sign "
        "vectors from derive_seed(seed, …)). "
        f"Captured tensors and layers: fc1, fc2 and head of {TINYLM_TEXT} (their weights, layer inputs and output "
        f"gradients; rows labelled {TINYLM}<tensor>). "
        f"(a) Outliers (one per 128 Gaussian elements): at m = {m_lo:g}σ RHT16 changes the GEMM error from "
        f"{g1_no:.4f} to {g1_rht:.4f}; at m = {mmax:g}σ the inlier error is {inl_no:.4f} without and "
        f"{inl_rht:.4f} with RHT16, the whole-tensor error {w_no:.4f} vs {w_rht:.4f}, and the GEMM X·Wᵀ error "
        f"{g_no:.4f} vs {g_rht:.4f}. "
        "(b) Hadamard size (d = 16 with the recipe's signs, other d with seeded random signs): "
        f"Student-t ν=3 error {hs_val('student_t3', 0):.4f} (no RHT) → "
        f"{hs_val('student_t3', 16):.4f} (d=16) → {hs_val('student_t3', 256):.4f} (d=256); channel outliers "
        f"{hs_val('channel_outliers', 0):.4f} → {hs_val('channel_outliers', 16):.4f} → "
        f"{hs_val('channel_outliers', 256):.4f}; Gaussian {hs_val('gaussian', 0):.4f} → "
        f"{hs_val('gaussian', 16):.4f} → {hs_val('gaussian', 256):.4f}. "
        f"(c) Signs: on constant rows the unsigned H16 gives {spp.loc['constant', 'unsigned H16']:.4f} vs "
        f"{spp.loc['constant', 'recipe fixed signs']:.4f} with the recipe vector; on rows aligned with the recipe "
        f"vector the fixed vector gives {spp.loc['recipe-aligned', 'recipe fixed signs']:.4f} vs "
        f"{spp.loc['recipe-aligned', 'random per call']:.4f} for a fresh vector per call; on the "
        f"{len(toy_sp)} captured tensors fixed vs per-call differ by {fix_vs_call.min():+.1f} to "
        f"{fix_vs_call.max():+.1f} %. "
        f"(d) Block kurtosis on captured tensors: {toy_k['before'].min():.2f}–{toy_k['before'].max():.2f} before, "
        f"{toy_k['after RHT16'].min():.2f}–{toy_k['after RHT16'].max():.2f} after RHT16 (16 Gaussian samples: "
        f"{GAUSS_BLOCK_KURT:.2f}); NVFP4 round-trip error change {toy_chg.min():+.1f} to {toy_chg.max():+.1f} %. "
        f"(e) Adding RHT16 to one GEMM's operands (vs the recipe without RHT; mean over {n_seeds} SR seeds of the "
        f"per-seed change), on the captured layers: Wgrad error {rng_('Wgrad (paper)', toymask)}, Fprop error "
        f"{rng_('Fprop', toymask)}, Dgrad error {rng_('Dgrad', toymask)}"
    )
    if not all(toymask):
        syn = [not m for m in toymask]
        measured += (f"; on the synthetic 512³ layers: Wgrad {rng_('Wgrad (paper)', syn)}, "
                     f"Fprop {rng_('Fprop', syn)}, Dgrad {rng_('Dgrad', syn)}")
    measured += (" (negative = RHT lowers the error). Changes whose paired 95 % t-interval over the seeds contains "
                 "0 (not distinguishable from SR noise): "
                 + ("; ".join(f"{d.removeprefix(TINYLM)} {own[v]} {ci_txt(v, d)}" for d, v in in_noise)
                    if in_noise else "none")
                 + ". The intervals cover the SR seeds only, not the draw of the data; RNE-only Fprop is "
                 "deterministic (half-width 0).")

    # Verdict, from the numbers.
    parts = []
    kurt_down = bool((toy_k["after RHT16"] < toy_k["before"]).mean() >= 0.5)

    def group(suffix):
        return toy_chg[toy_chg.index.str.endswith(suffix)]

    def group_txt(s):
        """Per-tensor changes when few, else their range."""
        if len(s) <= 3:
            return ", ".join(f"{k.removeprefix(TINYLM).split('.')[0]} {v:+.1f} %" for k, v in s.items())
        return f"{s.min():+.1f} to {s.max():+.1f} %"

    lowers, raises, mixed = [], [], []

    def sort_in(s, txt):
        (lowers if (s < 0).all() else raises if (s > 0).all() else mixed).append(txt)

    for label, s in (("captured weights", group(".weight")), ("captured activations", group(".input")),
                     ("captured output gradients", group(".grad_output"))):
        if len(s):
            sort_in(s, f"the {label} ({group_txt(s)})")
    if len(st_chg):
        sort_in(st_chg, f"structured rows ({', '.join(structured_rows)}: {st_chg.min():+.1f} to "
                        f"{st_chg.max():+.1f} %, e.g. constant rows {spp.loc['constant', 'no RHT']:.4f} → "
                        f"{spp.loc['constant', 'recipe fixed signs']:.4f}; recipe signs)")
    for k, v in syn_chg.items():
        (lowers if v < 0 else raises).append(f"synthetic {k} ({v:+.1f} %)")
    m_whole, m_gemm, m_inl = om_lower("rel_error"), om_lower("gemm_rel_error"), om_lower("inlier_rel_error")
    if m_whole:
        lowers.append(f"the whole-tensor error with injected outliers at m = {_list_m(m_whole)}σ (at {mmax:g}σ "
                      f"{w_no:.4f} → {w_rht:.4f}, {_pct((w_rht / w_no - 1) * 100)})")
    if m_gemm:
        lowers.append(f"the outlier GEMM error at m = {_list_m(m_gemm)}σ (at {mmax:g}σ {g_no:.4f} → {g_rht:.4f}, "
                      f"{_pct((g_rht / g_no - 1) * 100)})")
    m_mid = ms[len(ms) * 2 // 3]
    i_no, i_rht = om_val("no RHT", "inlier_rel_error", m_mid), om_val("RHT16", "inlier_rel_error", m_mid)
    raises.append(("the inlier error at every injected magnitude" if not m_inl else
                   f"the inlier error at {len(ms) - len(m_inl)} of {len(ms)} magnitudes")
                  + f" (at m = {m_mid:g}σ {i_no:.4f} → {i_rht:.4f})")
    n_falls, n_lowers = int((toy_k["after RHT16"] < toy_k["before"]).sum()), int((toy_chg < 0).sum())
    err_down = n_lowers * 2 > len(toy_chg)
    supp = "agrees" if err_down else "partly" if kurt_down else "does not agree"
    parts.append(
        f"Outlier suppression: {supp}. "
        f"(criterion: 'agrees' when RHT16 lowers the NVFP4 error on most captured tensors, 'partly' when it only "
        f"lowers their block kurtosis on at least half; here kurtosis falls on {n_falls} of {len(toy_k)} captured "
        f"tensors, error falls on {n_lowers} of {len(toy_chg)}.) "
        + f"RHT16 does Gaussianize blocks (mean block kurtosis of the captured tensors "
        f"{toy_k['before'].mean():.2f} → {toy_k['after RHT16'].mean():.2f}; {GAUSS_BLOCK_KURT:.2f} is the "
        "16-sample Gaussian value), but the NVFP4 error follows only in places. RHT16 lowers the error on "
        + "; ".join(lowers) + ". It raises it on " + "; ".join(raises) + ". "
        + ("It moves it both ways on " + "; ".join(mixed) + ". " if mixed else "")
        + "The 16-point tile is the 16-element block, so rotation cannot move an outlier's energy out of its block, "
        "only spread it over the block; a likely cost (not isolated here) is losing the near-exact coding NVFP4 "
        "gives each block's maximum.")

    def per_layer(v, mask=None):
        ds = [d for d, m in zip(datas, toymask) if (m if mask is None else mask == m)]
        return ", ".join(f"{d.removeprefix(TINYLM)} {ci_txt(v, d)}" for d in ds)

    w_toy, f_toy, d_toy = (ch[v][toymask] for v in ("Wgrad (paper)", "Fprop", "Dgrad"))
    f_gain = [d.removeprefix(TINYLM) for d in f_toy.index if ch["Fprop"][d] + chw["Fprop"][d] < 0]
    parts.append(
        "Wgrad-only placement: "
        + ("agrees — " if (w_toy.mean() < 0 and f_toy.mean() >= 0 and d_toy.mean() >= 0)
           else "does not agree at this scale — ")
        + "(criterion: RHT16 lowers the captured layers' mean Wgrad error and does not lower their mean Fprop or "
        "Dgrad error) "
        + f"adding RHT16 changes the captured layers' Wgrad error by {w_toy.mean():+.1f} % on average "
        f"({per_layer('Wgrad (paper)')}), Fprop by {f_toy.mean():+.1f} % ({per_layer('Fprop')}), Dgrad by "
        f"{d_toy.mean():+.1f} % ({per_layer('Dgrad')}). "
        + (f"The only captured GEMM whose error RHT16 lowers beyond its interval is the Fprop of "
           f"{', '.join(f_gain)}; no experiment here isolates why"
           if f_gain else "No captured Fprop error drops beyond its interval")
        + "".join(f"; on the synthetic layer with channel outliers in X (along Fprop's reduction axis) the Fprop "
                  f"error changes by {ci_txt('Fprop', d)}" for d in datas if "channel outliers" in d)
        + ". A single-step GEMM error on a tiny model cannot test the paper's actual evidence (loss curves of a "
        "12B model over 10T tokens).")

    size_txt = []
    for kind, label in (("student_t3", "Student-t"), ("channel_outliers", "channel outliers"),
                        ("gaussian", "Gaussian")):
        e0 = hs_val(kind, 0)
        chg = {d: (hs_val(kind, d) / e0 - 1) * 100 for d in sizes}
        low = [d for d in sizes if chg[d] < 0]
        if max(abs(v) for v in chg.values()) < 0.5:
            size_txt.append(f"{label}: every d within ±{max(abs(v) for v in chg.values()):.2f} % of no RHT "
                            f"({e0:.4f})")
        elif not low:
            best = min(sizes, key=lambda d: chg[d])
            size_txt.append(f"{label}: no d lowers it ({e0:.4f} without RHT, best d = {best:g}: "
                            f"{hs_val(kind, best):.4f}, d = 16: {hs_val(kind, 16):.4f}, d = 256: "
                            f"{hs_val(kind, 256):.4f})")
        else:
            size_txt.append(f"{label}: only d = {', '.join(f'{d:g}' for d in low)} lowers it ("
                            + ", ".join(f"{hs_val(kind, d):.4f}, {_pct(chg[d])}" for d in low)
                            + f" vs {e0:.4f} without RHT); d = 16 gives {hs_val(kind, 16):.4f}, "
                            f"d = 256 {hs_val(kind, 256):.4f}")
    ck = _get(df, experiment="hadamard_size", metric="block_kurtosis", data="channel_outliers")
    ck = ck.set_index("param").value.sort_index()
    ck_falls = bool((np.diff(ck.to_numpy()) < 0).all())
    parts.append(
        "d = 16 is enough: not testable as stated — on this data rotation itself rarely lowers the error, at any "
        "size: " + "; ".join(size_txt) + ". "
        + (f"Block kurtosis of the channel outliers falls at every step of d ({ck.iloc[0]:.2f} → "
           f"{ck.iloc[-1]:.2f}) while their error does not." if ck_falls else ""))
    pol = ["unsigned H16", "recipe fixed signs", "random per call"]
    st_spread = float(((spp.loc[structured_rows, pol].max(axis=1) / spp.loc[structured_rows, pol].min(axis=1)) - 1)
                      .max() * 100) if structured_rows else float("nan")
    parts.append(
        f"One fixed sign vector: {'agrees' if n_sd <= 2 else 'does not agree'} (criterion: within 2 standard "
        "deviations of the per-call spread on every captured tensor) — on the captured tensors fixed vs "
        f"fresh-per-call signs differ by {fix_vs_call.min():+.1f} to {fix_vs_call.max():+.1f} % (at most "
        f"{n_sd:.1f} standard deviations of the per-call spread)"
        + (f", and on structured rows ({', '.join(structured_rows)}) the three sign policies (none, the recipe's, "
           f"fresh per call) differ by at most {st_spread:.1f} %" if structured_rows else "")
        + ".")
    verdict = " ".join(parts)

    t1 = spp.loc[list(dict.fromkeys(sp.data))][["no RHT", "unsigned H16", "recipe fixed signs", "random per call"]]
    t1 = t1.reset_index().rename(columns={"data": "data (rel. error)"})
    rows2 = []
    for d in datas:
        for g in ("fprop", "dgrad", "wgrad"):
            r = {"data": d, "gemm": g}
            for v in PLACEMENTS:
                m = _get(gp, data=d, variant=v, metric=f"{g}_rel_error").value.iloc[0]
                hw = _get(gp, data=d, variant=v, metric=f"{g}_rel_error_ci95").value.iloc[0]
                r[v] = f"{m:.4f} ± {hw:.4f}"
            rows2.append(r)
    t2 = pd.DataFrame(rows2)
    t3 = pd.DataFrame([{"data": d, **{f"{own[v].capitalize()} (RHT16 on its operands)":
                                      ci_txt(v, d) + (" ≈0" if (d, v) in in_noise else "") for v in own}}
                       for d in datas])
    tables = [
        "Sign policy, NVFP4 relative error:\n\n" + md_table(t1, ".4f"),
        f"RHT16 placement, per-GEMM relative error vs FP64 (mean ± 95 % t half-width over {n_seeds} SR seeds; "
        "the seeds cover stochastic rounding only, not the data draw):\n\n" + md_table(t2),
        "Change of each GEMM's error when RHT16 is added to its own operands, vs the recipe without RHT "
        f"(mean ± 95 % t half-width of the per-seed change over {n_seeds} paired SR seeds; ≈0 marks a change whose "
        "interval contains 0):\n\n" + md_table(t3),
    ]
    return measured, verdict, tables


if __name__ == "__main__":
    main()
