"""The statistics of :mod:`fpsim.torch.probe`: each row's metrics from its draws, intervals over batches, paired
component effects with Holm's correction and the 80 %-power detectable effect, and the as-built flags (the
definitions are in :mod:`fpsim.torch.probe`'s docstring)."""

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
    """The metrics of the table for the float64 reference ``ref`` and the draws (see the module docstring)."""
    g = ref.reshape(-1).double()
    gn2 = float(g @ g)
    if gn2 == 0.0 or not math.isfinite(gn2):
        return {m: None for m in METRICS} | {"note": "the reference is zero" if gn2 == 0.0 else "non-finite"}
    gn = math.sqrt(gn2)
    D = len(draws)
    E = torch.stack([d.reshape(-1).double() for d in draws]) - g  # D × N
    Q = E + g
    en2 = (E * E).sum(1)
    qg = Q @ g
    qn = torch.sqrt((Q * Q).sum(1))
    rel = torch.sqrt(en2) / gn
    gain = qg / gn2
    nz = qn > 0  # a draw whose result is all zeros (every block flushed) has no direction: no cosine
    row = {"rel_err": float(rel.mean()), "cos": float((qg[nz] / (qn[nz] * gn)).mean()) if bool(nz.any()) else None,
           "gain": float(gain.mean())}
    if not all(math.isfinite(v) for v in row.values() if v is not None):
        return {m: None for m in METRICS} | {"note": "non-finite result"}
    if not bool(nz.all()):
        row["note"] = f"{int((~nz).sum())} of {D} draws gave an all-zero result (cos over the others)"
    if D == 1:
        row.update(bias=row["rel_err"], bias_se=0.0, noise=0.0, bias_to_noise=None)
        return row
    ebar = E.mean(0)
    s2 = float((en2.sum() - D * (ebar @ ebar)) / (D - 1))
    bias = math.sqrt(max(0.0, float(ebar @ ebar) - s2 / D)) / gn
    se = None
    if D >= 3:  # jackknife over the draws: leave one out, recompute the noise-corrected bias
        dots = E @ ebar
        loo = []
        for i in range(D):
            m2 = float((D * D * (ebar @ ebar) - 2 * D * dots[i] + en2[i]) / (D - 1) ** 2)
            s2i = float((en2.sum() - en2[i] - (D - 1) * m2) / (D - 2))
            loo.append(math.sqrt(max(0.0, m2 - s2i / (D - 1))) / gn)
        la = np.asarray(loo)
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
        out.append({"layer": "all", "gemm": "step", "variant": v, "mode": o, "metric": "step_ratio",
                    **t_summary(grp["step_ratio"].to_numpy(float))})
    return pd.DataFrame(out, columns=["layer", "gemm", "variant", "mode", "metric", "n", "mean", "ci_low", "ci_high",
                                      "sd"])


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
            a = grp[grp["variant"] == v.name].set_index("batch")["step_ratio"]
            c = grp[grp["variant"] == v.compare].set_index("batch")["step_ratio"]
            common = a.index.intersection(c.index)
            diffs = v.sign * (a.loc[common].to_numpy(float) - c.loc[common].to_numpy(float))
            out.append({"component": v.component, "variant": v.name, "against": v.compare, "gemm": "step",
                        "mode": o, "metric": "step_ratio", **paired_test(diffs)})
    adjusted = holm([r["p"] for r in out])
    for r, h in zip(out, adjusted):
        r["p_holm"] = h
    return pd.DataFrame(out, columns=["component", "variant", "against", "gemm", "mode", "metric", "n", "mean", "sd",
                                      "ci_low", "ci_high", "p", "p_holm", "mde80"])


def step_direction(g: dict, opt: str, state, betas, eps) -> dict:
    """The update direction ``u`` of the step ratio: the gradient (SGD) or AdamW's ``m̂ / (√v̂ + ε)`` after this
    gradient, from ``state`` ({name: (exp_avg, exp_avg_sq, step)}) or a fresh state."""
    if opt == "sgd":
        return {n: v.double() for n, v in g.items()}
    b1, b2 = betas
    out = {}
    for n, v in g.items():
        v = v.double()
        m0, s0, t = (torch.zeros_like(v), torch.zeros_like(v), 0) if state is None or n not in state else \
            (state[n][0].double(), state[n][1].double(), int(state[n][2]))
        m = b1 * m0 + (1 - b1) * v
        s = b2 * s0 + (1 - b2) * v * v
        mh, sh = m / (1 - b1 ** (t + 1)), s / (1 - b2 ** (t + 1))
        out[n] = mh / (sh.sqrt() + eps)
    return out


def dot(a: dict, b: dict) -> float:
    return float(sum(float((a[n] * b[n]).sum()) for n in a))
