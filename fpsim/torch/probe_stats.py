"""The statistics of :mod:`fpsim.torch.probes`: each row's metrics from its draws, intervals over batches, paired
component effects with Holm's correction and the 80 %-power detectable effect, and the as-built flags (the
definitions are in :mod:`fpsim.torch.probes`'s docstring)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

__all__ = ["GEMM_NAMES", "METRICS", "SUMMARY_METRICS", "TOLERANCE", "row_metrics", "t_summary", "paired_test",
           "holm", "summary", "components", "flags", "step_direction", "dot"]

#: The three GEMMs of a linear layer, by the tensor each gives.
GEMM_NAMES = ("fprop", "dgrad", "wgrad")
#: The per-row metrics.
METRICS = ("rel_err", "cos", "gain", "bias", "bias_se", "noise", "bias_to_noise")
#: As-built flags: a difference counts when larger than this fraction of the emulation's rel_err.
TOLERANCE = 0.05


def row_metrics(ref: torch.Tensor, draws: list[torch.Tensor]) -> dict:
    """The metrics of the table for the reference ``ref`` and the draws (see :mod:`fpsim.torch.probes`'s docstring).

    Every statistic is a function of ‖g‖², the draws' errors' dot products with g and their Gram matrix
    G_ij = ⟨e_i, e_j⟩ (float64 sums): one pass over the draws' errors."""
    g = ref.reshape(-1).double()
    gn2 = float(g @ g)
    if gn2 == 0.0 or not math.isfinite(gn2):
        return {m: None for m in METRICS} | {"note": "the reference is zero" if gn2 == 0.0 else "non-finite"}
    gn = math.sqrt(gn2)
    if len(draws) > 1 and all(torch.equal(draws[0], d) for d in draws[1:]):
        # every draw gave the same result (a variant that draws no random bits): the one-draw metrics exactly, not
        # float means of D equal values, which can be an ulp off and pass for an effect in a paired test
        draws = draws[:1]
    D = len(draws)
    E = torch.empty((D, g.numel()), dtype=torch.float64)
    qg, qn2 = np.empty(D), np.empty(D)
    for i, d in enumerate(draws):
        q = d.reshape(-1).double()
        # ⟨q_d, g⟩ and ‖q_d‖² from q itself: through e = q − g they cancel to rounding noise where q ≈ 0 (a draw
        # whose every block flushed), which then passed for a cosine of 1e-8
        qg[i], qn2[i] = float(q @ g), float(q @ q)
        torch.sub(q, g, out=E[i])
    G = (E @ E.T).numpy()  # D × D
    en2 = np.diag(G).copy()
    if not (np.isfinite(G).all() and np.isfinite(qg).all()):
        return {m: None for m in METRICS} | {"note": "non-finite result"}
    nz = qn2 > 0  # a draw whose result is all zeros (every block flushed) has no direction: no cosine
    row = {"rel_err": float(np.sqrt(en2).mean() / gn),
           "cos": float((qg[nz] / (np.sqrt(qn2[nz]) * gn)).mean()) if nz.any() else None,
           "gain": float(qg.mean() / gn2)}
    if not nz.all():
        row["note"] = f"{int((~nz).sum())} of {D} draws gave an all-zero result (cos over the others)"
    if D == 1:
        row.update(bias=row["rel_err"], bias_se=0.0, noise=0.0, bias_to_noise=None)
        return row

    def corrected(idx) -> tuple[float, float]:
        """(noise-corrected bias, s²) of the draws ``idx``: ‖ē‖² = ΣG/n², s² = (Σ‖e‖² − n‖ē‖²)/(n − 1)."""
        n = len(idx)
        sub = G[np.ix_(idx, idx)]
        m2 = sub.sum() / n ** 2
        s2 = (np.trace(sub) - n * m2) / (n - 1)
        return math.sqrt(max(0.0, m2 - s2 / n)) / gn, s2

    bias, s2 = corrected(list(range(D)))
    se = None
    if D >= 3:  # jackknife over the draws: leave one out, recompute the noise-corrected bias
        la = np.array([corrected([j for j in range(D) if j != i])[0] for i in range(D)])
        se = float(math.sqrt((D - 1) / D * ((la - la.mean()) ** 2).sum()))
    noise = math.sqrt(max(s2, 0.0)) / gn
    row.update(bias=bias, bias_se=se, noise=noise, bias_to_noise=bias / noise if noise > 0 else None)
    return row


def t_summary(values: np.ndarray) -> dict:
    """Mean and 95 % t-interval over batches (null interval with a reason for fewer than two)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    n = v.size
    out = {"n": n, "mean": float(v.mean()) if n else None, "ci_low": None, "ci_high": None, "sd": None}
    if n >= 2:
        sd = float(v.std(ddof=1))
        h = float(sps.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        out.update(ci_low=out["mean"] - h, ci_high=out["mean"] + h, sd=sd)
    return out


def paired_test(diffs: np.ndarray) -> dict:
    s = t_summary(diffs)
    n, m, sd = s["n"], s["mean"], s["sd"]
    p = mde = None
    if n >= 2:
        if sd == 0.0:
            p = 0.0 if m != 0.0 else 1.0
        else:
            p = float(2 * sps.t.sf(abs(m) / (sd / math.sqrt(n)), n - 1))
        mde = float((sps.t.ppf(0.975, n - 1) + sps.t.ppf(0.8, n - 1)) * sd / math.sqrt(n))
    return s | {"p": p, "mde80": mde}


def holm(p: list[float | None]) -> list[float | None]:
    idx = [i for i, x in enumerate(p) if x is not None]
    order = sorted(idx, key=lambda i: p[i])
    m = len(order)
    out: list[float | None] = [None] * len(p)
    run = 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (m - k) * p[i]))
        out[i] = run
    return out


def flags(rows) -> pd.DataFrame:
    cols = ["layer", "gemm", "recipe", "metric", "as_built", "emulated", "diff", "ci_low", "ci_high", "n", "p",
            "p_holm", "tolerance", "flagged", "note"]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = []
    keys = sorted({(r["layer"], r["gemm"]) for r in rows}, key=lambda k: (k[0], GEMM_NAMES.index(k[1])))
    for layer, gemm in keys:
        rs = [r for r in rows if r["layer"] == layer and r["gemm"] == gemm]
        for metric in ("rel_err", "gain", "bias"):
            a = np.array([np.nan if r["as_built"][metric] is None else r["as_built"][metric] for r in rs])
            e = np.array([np.nan if r["emulated"][metric] is None else r["emulated"][metric] for r in rs])
            s = paired_test(a - e)
            emu_err = np.nanmean([np.nan if r["emulated"]["rel_err"] is None else r["emulated"]["rel_err"]
                                  for r in rs])
            out.append({"layer": layer, "gemm": gemm, "recipe": rs[0]["recipe"], "metric": metric,
                        "as_built": float(np.nanmean(a)), "emulated": float(np.nanmean(e)), "diff": s["mean"],
                        "ci_low": s["ci_low"], "ci_high": s["ci_high"], "n": s["n"], "p": s["p"],
                        "tolerance": TOLERANCE * float(emu_err),
                        "note": None if s["n"] >= 2 else "fewer than two batches: no test"})
    adjusted = holm([r["p"] for r in out])
    for r, ph in zip(out, adjusted):
        r["p_holm"] = ph
        r["flagged"] = bool(ph is not None and ph < 0.05 and r["diff"] is not None
                            and abs(r["diff"]) > r["tolerance"])
    return pd.DataFrame(out, columns=cols)


# --- summaries -------------------------------------------------------------------------------------------------

SUMMARY_METRICS = ("rel_err", "cos", "gain", "bias", "noise")


def _per_batch(table: pd.DataFrame, layer_all: bool) -> pd.DataFrame:
    t = table
    keys = ["batch", "gemm", "variant", "mode"] + ([] if layer_all else ["layer"])
    return t.groupby(keys, sort=False)[list(SUMMARY_METRICS)].mean().reset_index()


def summary(table: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    out = []
    if len(table):
        for layer_all in (True, False):
            pb = _per_batch(table, layer_all)
            keys = ["gemm", "variant", "mode"] + ([] if layer_all else ["layer"])
            for k, grp in pb.groupby(keys, sort=False):
                kd = dict(zip(keys, k))
                for m in SUMMARY_METRICS:
                    out.append({"layer": "all" if layer_all else kd["layer"], "gemm": kd["gemm"],
                                "variant": kd["variant"], "mode": kd["mode"], "metric": m,
                                **t_summary(grp[m].to_numpy(float))})
    for (v, o), grp in steps.groupby(["variant", "optimizer"], sort=False):
        out.append({"layer": "all", "gemm": "step", "variant": v, "mode": o, "metric": "step_progress",
                    **t_summary(grp["progress"].to_numpy(float) / _fp32_progress(steps, o))})
    return pd.DataFrame(out, columns=["layer", "gemm", "variant", "mode", "metric", "n", "mean", "ci_low", "ci_high",
                                      "sd"])


def _fp32_progress(steps: pd.DataFrame, opt: str) -> float:
    """The FP32 gradients' mean first-order held-out progress over the batches (one value per batch)."""
    return float(steps[steps["optimizer"] == opt].groupby("batch")["progress_fp32"].first().mean())


def components(table: pd.DataFrame, steps: pd.DataFrame, vs: list) -> pd.DataFrame:
    """Each variant's paired effect against the variant it is compared with (``vs``: the probe's variants, with
    ``name``, ``compare``, ``sign`` and ``component``)."""
    out = []
    pb = _per_batch(table, True) if len(table) else None
    for v in vs:
        if v.compare is None:
            continue
        if pb is not None:
            for (gemm, mode), grp in pb.groupby(["gemm", "mode"], sort=False):
                a = grp[grp["variant"] == v.name].set_index("batch")
                c = grp[grp["variant"] == v.compare].set_index("batch")
                common = a.index.intersection(c.index)
                for m in ("rel_err", "gain", "bias"):
                    diffs = v.sign * (a.loc[common, m].to_numpy(float) - c.loc[common, m].to_numpy(float))
                    out.append({"component": v.component, "variant": v.name, "against": v.compare, "gemm": gemm,
                                "mode": mode, "metric": m, **paired_test(diffs)})
        for o, grp in steps.groupby("optimizer", sort=False):
            a = grp[grp["variant"] == v.name].set_index("batch")["progress"] / _fp32_progress(steps, o)
            c = grp[grp["variant"] == v.compare].set_index("batch")["progress"] / _fp32_progress(steps, o)
            common = a.index.intersection(c.index)
            diffs = v.sign * (a.loc[common].to_numpy(float) - c.loc[common].to_numpy(float))
            out.append({"component": v.component, "variant": v.name, "against": v.compare, "gemm": "step",
                        "mode": o, "metric": "step_progress", **paired_test(diffs)})
    adjusted = holm([r["p"] for r in out])
    for r, h in zip(out, adjusted):
        r["p_holm"] = h
    return pd.DataFrame(out, columns=["component", "variant", "against", "gemm", "mode", "metric", "n", "mean", "sd",
                                      "ci_low", "ci_high", "p", "p_holm", "mde80"])


def step_direction(g: dict, opt: str, state, betas, eps) -> dict:
    """The update direction ``u`` of the step ratio (float32): the gradient (SGD) or AdamW's ``m̂ / (√v̂ + ε)``
    after this gradient, from ``state`` ({name: (exp_avg, exp_avg_sq, step)}); without a state, AdamW's first
    step ``g / (|g| + ε)`` (m̂ = g and v̂ = g² after one step from zero)."""
    if opt == "sgd":
        return g
    b1, b2 = betas
    out = {}
    for n, v in g.items():
        v = v.float()
        if state is None or n not in state:
            out[n] = v / (v.abs() + eps)
            continue
        m0, s0, t = state[n][0].float(), state[n][1].float(), int(state[n][2])
        mh = (b1 * m0 + (1 - b1) * v) / (1 - b1 ** (t + 1))
        sh = (b2 * s0 + (1 - b2) * v * v) / (1 - b2 ** (t + 1))
        out[n] = mh / (sh.sqrt() + eps)
    return out


def dot(a: dict, b: dict) -> float:
    """Σ over parameters of ⟨a, b⟩, each product summed in float64 (``b`` float64 already, e.g. ∇L_val)."""
    return float(sum(float(torch.dot(a[n].reshape(-1).double(), b[n].reshape(-1))) for n in a))
