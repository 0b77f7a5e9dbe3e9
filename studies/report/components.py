"""What each component buys: one table over the tensor, gradient and training levels.

A row per component of the NVFP4 recipe (two-level scaling and the tensor scale, 16×16 weight tiles, RHT, SR,
four-over-six, BF16 layers, the late BF16 switch) and per format comparison (NVFP4 vs MXFP4, NVFP4 vs FP8, the
paper's headline), plus the A/A control, with

* the published claim and whose it is (four-over-six is Cook et al. 2025's, not NVIDIA's);
* the tensor-level number, read from the CSVs studies 1-7 wrote under ``<out>/<study>/``;
* the gradient-level number, read from study 10's ``<out>/probes/probes.csv`` (:mod:`studies.probes.study`);
* the training-level number, computed from study 8's data, the paired-seed campaign's run CSVs under
  ``studies/data/campaign/`` (read by :func:`studies.campaign.report.load_runs`, the statistics of
  :mod:`studies.campaign.stats`, the same as study 8's tables);
* a verdict that says where the levels agree and, where they disagree, why they can.

Every number is read from those files when the page is rendered; a missing file or row gives "not measured".
The study runs after the others (it reads their outputs) while its section opens ``index.md``
(:mod:`studies.run_all`).  Writes ``<out>/components/components.csv`` (one row per plotted or quoted effect),
``forest.png`` (one panel per level, since the units differ) and ``section.md``.

Sign convention, every level: a positive effect means the component (or NVFP4, in a format comparison) is the
better one: it lowers the error or the loss.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from studies.common import ROOT, md_table, parse_args, progress, save_fig, write_csv, write_section

NAME = "components"
#: Study 8's data: the paired-seed campaign's committed runs.
CAMPAIGN = ROOT / "studies" / "data" / "campaign"
LEVELS = ("tensor", "gradient", "training")
LEVEL_TITLES = {"tensor": "tensor level (studies 1–7)", "gradient": "gradient level (study 10)",
                "training": "training level (study 8)"}
NOT_MEASURED = "not measured"
#: The errors a missing or partial source raises while it is read: the cell then says "not measured".
MISSING = (FileNotFoundError, KeyError, IndexError, ValueError, ZeroDivisionError, pd.errors.EmptyDataError)
PAPER = "NVIDIA's NVFP4 paper (arXiv 2509.25149)"


# ==================================================================================================== data model
@dataclass
class Point:
    """One number: ``value`` in the group's unit with its interval (NaN bounds: none), and the same on the
    forest plot's scale of its level (``plot*``; NaN: not drawn)."""

    item: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    plot: float = math.nan
    plot_lo: float = math.nan
    plot_hi: float = math.nan
    #: a status given by the source (study 10's Holm-corrected verdict), else read from the interval
    given: str = ""

    def status(self, exact: bool) -> str:
        """``helps`` / ``hurts`` (interval, or an exact value, on one side of 0), ``unresolved``, ``zero``."""
        if self.given:
            return self.given
        v, lo, hi = (self.plot, self.plot_lo, self.plot_hi) if not math.isnan(self.plot) else (
            self.value, self.lo, self.hi)
        if exact or math.isnan(lo):
            return "helps" if v > 0 else "hurts" if v < 0 else "zero"
        return "helps" if lo > 0 else "hurts" if hi < 0 else "unresolved"


@dataclass
class Group:
    """Numbers of one kind at one level: a label, the unit and denominator, the kind of interval (``exact``, a
    t-interval over something, one run), the source file, and what the cell says."""

    label: str
    unit: str
    interval: str
    source: str
    text: str
    points: list[Point] = field(default_factory=list)
    exact: bool = False
    #: statuses of the points that count for the verdict (False: context only, e.g. a consistency figure)
    counts: bool = True


@dataclass
class Cell:
    """A level's cell: its groups, or why it has none."""

    groups: list[Group] = field(default_factory=list)
    missing: str = ""
    #: extra words on the verdict (e.g. a training comparison's Holm p and detectable gap)
    detail: str = ""
    #: a training comparison's p-value (Holm-corrected for study 8's components), NaN elsewhere
    p: float = math.nan

    def text(self) -> str:
        if not self.groups:
            return f"{NOT_MEASURED} ({self.missing})" if self.missing else NOT_MEASURED
        return " ".join(g.text for g in self.groups if g.text)

    def statuses(self) -> list[str]:
        return [p.status(g.exact) for g in self.groups if g.counts for p in g.points]


@dataclass
class Row:
    key: str
    label: str
    claim: str
    cells: dict[str, Cell]
    verdict: str = ""
    category: str = ""


# ===================================================================================================== formatting
def _f(v: float, fmt: str) -> str:
    """A number as the page prints it, with a true minus sign."""
    return format(v, fmt).replace("-", "−")


def _ci(lo: float, hi: float, fmt: str) -> str:
    return f"[{_f(lo, fmt)}, {_f(hi, fmt)}]"


def _range(vals, fmt: str) -> str:
    vals = list(vals)
    return _f(min(vals), fmt) if min(vals) == max(vals) else f"{_f(min(vals), fmt)} to {_f(max(vals), fmt)}"


def _db(ratio: float) -> float:
    """An error ratio (error without / error with) in dB, ``20·log10``; > 0 when the component lowers the error."""
    return 20 * math.log10(ratio) if ratio > 0 else math.nan


def _src(out: Path, path: Path) -> str:
    """A source path as the page names it: relative to the reports directory, or to the repository."""
    for base in (out, ROOT):
        try:
            return str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def _tinylm(name: str) -> str:
    return name.removeprefix("tinylm:")


# ================================================================================================= tensor level
def tensor_two_level(out: Path) -> Cell:
    """Study 2: the FP32 tensor scale on and off (E4M3 block scales, block 16) on the toy LM's captured gradients,
    and E4M3 (+ tensor scale) against E8M0 block scales at block 16 on its 9 captured tensors."""
    path = out / "design_space" / "design_space.csv"
    ds = _read(path)
    b16 = ds[(ds["block"] == 16) & ds["data"].str.startswith("tinylm:")]
    piv = b16.pivot_table(index="data", columns="scale", values="sqnr_db", sort=True)
    flush = b16.pivot_table(index="data", columns="scale", values="flushed_to_zero", sort=True)
    with_ts, no_ts, e8 = "E4M3 + FP32 tensor scale", "E4M3, no tensor scale", "E8M0 (rceil)"
    grads = [d for d in piv.index if d.endswith(".grad_output")]
    if not grads:
        raise KeyError("no captured gradient tensor")
    pts = [Point(_tinylm(d), float(piv.loc[d, with_ts] - piv.loc[d, no_ts])) for d in grads]
    for p in pts:
        p.plot = p.value
    worst = max(flush.loc[d, no_ts] for d in grads)
    g1 = Group("tensor scale on vs off (toy LM gradients)", "dB SQNR", "exact", _src(out, path),
               f"FP32 tensor scale on vs off, E4M3 block scales, block 16, the toy LM's {len(grads)} captured "
               f"gradients: SQNR {_range([p.value for p in pts], '+.2f')} dB (exact, deterministic; without it up "
               f"to {_f(100 * worst, '.1f')} % of values flush to zero).", pts, exact=True)
    pts2 = [Point(_tinylm(d), float(piv.loc[d, with_ts] - piv.loc[d, e8])) for d in piv.index]
    for p in pts2:
        p.plot = p.value
    g2 = Group("E4M3 vs E8M0 block scales (9 toy LM tensors)", "dB SQNR", "exact", _src(out, path),
               f"E4M3 (+ tensor scale) vs E8M0 (rceil) block scales at block 16, {len(pts2)} captured tensors: "
               f"{_range([p.value for p in pts2], '+.2f')} dB SQNR (exact) (`{_src(out, path)}`, §2).",
               pts2, exact=True)
    return Cell([g1, g2])


def tensor_2d(out: Path) -> Cell:
    """Study 5: the Fprop/Dgrad weight mismatch (1×16 blocks along different axes vs 16×16 tiles) and the whole
    recipe's Fprop and Dgrad error with 16×16 vs 1×16 weights."""
    path = out / "weight_2d" / "weight_2d.csv"
    d = _read(path)
    mm = d[d["metric"] == "w_mismatch"].pivot_table(index="data", columns="scheme", values="value", sort=False)
    one, tiles = mm["1×16 different dims"], mm["16×16 tiles"]
    g0 = Group("Fprop/Dgrad weight mismatch", "fraction of ‖W‖_F", "exact", _src(out, path),
               f"Consistency: the weight Fprop and Dgrad see differs by {_range(one, '.3f')} of ‖W‖_F with 1×16 "
               f"blocks along different axes and by {_range(tiles, '.3g')} with 16×16 tiles ({len(one)} weights, "
               f"exact).", [Point(k, float(one[k] - tiles[k])) for k in one.index], exact=True, counts=False)
    m = d[d["data"] == "mean over layers"].set_index(["scheme", "metric"])
    layers = int(((d["scheme"] == "recipe: 1×16 W") & (d["metric"] == "dgrad_rel_error")
                  & (d["data"] != "mean over layers")).sum())
    out_groups = [g0]
    for gemm in ("dgrad", "fprop"):
        base = float(m.loc[("recipe: 1×16 W", f"{gemm}_rel_error"), "value"])
        tile = float(m.loc[("recipe: 16×16 W (paper)", f"{gemm}_rel_error"), "value"])
        diff = float(m.loc[("recipe: 16×16 W − 1×16 W (paired)", f"{gemm}_rel_error"), "value"])
        hw = float(m.loc[("recipe: 16×16 W − 1×16 W (paired)", f"{gemm}_rel_error"), "ci95"])
        # effect: error without the tiles − with them (> 0: the tiles lower the error)
        p = Point(f"mean over {layers} layers", -diff, -diff - hw, -diff + hw, _db(base / (base + diff)),
                  _db(base / (base + diff + hw)), _db(base / (base + diff - hw)))
        iv = (f"± {_f(hw, '.4f')}, 95 % t over study 5's recipe seeds" if hw > 0 else "the same on every seed")
        out_groups.append(Group(
            f"whole-recipe {gemm.capitalize()} error", "relative error ‖out − out_FP64‖/‖out_FP64‖",
            "95 % t over the recipe seeds" if hw > 0 else "exact (the same on every seed)", _src(out, path),
            f"Whole recipe, {gemm.capitalize()} relative error (‖out − out_FP64‖/‖out_FP64‖, mean over {layers} "
            f"layers): "
            f"{_f(base, '.4f')} with 1×16 weights, {_f(tile, '.4f')} with 16×16 tiles, paired difference "
            f"(1×16 − 16×16) {_f(-diff, '+.4f')} ({iv}).", [p], exact=hw == 0))
    out_groups[-1].text += f" (`{_src(out, path)}`, §5)"
    return Cell(out_groups)


def tensor_rht(out: Path) -> Cell:
    """Study 4: the change of the Wgrad error when RHT16 is added to its operands (the paper's placement), per layer,
    mean ± 95 % t over 6 paired SR seeds."""
    path = out / "outliers_rht" / "outliers_rht.csv"
    d = _read(path)
    g = d[(d["experiment"] == "gemm_placement") & (d["variant"] == "Wgrad (paper)")]
    v = g.pivot_table(index="data", columns="metric", values="value", sort=False)
    seeds = int(g["param"].iloc[0])
    pts, parts = [], []
    for data, r in v.iterrows():
        c, h = float(r["wgrad_change_pct"]), float(r["wgrad_change_pct_ci95"])
        label = _tinylm(data) if data.startswith("tinylm:") else data.removeprefix("synthetic: ")
        pts.append(Point(label, -c, -c - h, -c + h, _db(1 / (1 + c / 100)), _db(1 / (1 + (c + h) / 100)),
                         _db(1 / (1 + (c - h) / 100))))
        parts.append(f"{label} {_f(c, '+.1f')} ± {_f(h, '.1f')} %")
    text = (f"Adding RHT16 to Wgrad's operands changes that GEMM's relative error (vs FP64, the recipe without RHT "
            f"as the base; mean ± 95 % t over {seeds} paired SR seeds, the data fixed): " + "; ".join(parts)
            + f" (> 0: RHT raises the error) (`{_src(out, path)}`, §4).")
    return Cell([Group("Wgrad error with RHT16 (per layer)", "% change of Wgrad relative error",
                       f"95 % t over {seeds} SR seeds", _src(out, path), text, pts)])


def tensor_sr(out: Path) -> Cell:
    """Study 6: the gradients' magnitude bias and MSE under RNE and SR (8-bit, exact enumeration), and the error
    accumulated over 4096 updates, identical or with step-to-step noise."""
    path = out / "stochastic_rounding" / "stochastic_rounding.csv"
    d = _read(path)
    b = d[(d["part"] == "bias") & (d["kind"] == "grad_output")]
    v = b.pivot_table(index="tensor", columns=["mode", "metric"], values="value", sort=True)
    sr = "SR k=8 (exact enumeration)"
    bias_pts, mse_pts, parts = [], [], []
    for t in v.index:
        rne = float(v.loc[t, ("RNE", "aligned_bias_rel_meanabs")])
        s8 = float(v.loc[t, (sr, "aligned_bias_rel_meanabs")])
        ratio = float(v.loc[t, (sr, "mse")] / v.loc[t, ("RNE", "mse")])
        name = t.removesuffix(".grad_output")
        p = Point(name, abs(rne) - abs(s8))
        p.plot = _db(abs(rne) / abs(s8))
        bias_pts.append(p)
        q = Point(name, 1 / ratio)
        q.plot = 10 * math.log10(1 / ratio)
        mse_pts.append(q)
        parts.append(f"{name} {_f(100 * rne, '.3f')} → {_f(100 * s8, '.3f')} % (MSE ×{ratio:.2f})")
    g1 = Group("gradient bias, RNE vs SR (toy LM gradients)", "magnitude bias, % of mean(abs(g))", "exact",
               _src(out, path),
               "Magnitude bias mean(sign(g)·(ĝ − g)) of the toy LM's captured gradients, % of mean(abs(g)), RNE → SR "
               "(8 random bits, exact over all 256 draws): " + "; ".join(parts) + " (exact).", bias_pts, exact=True)
    g2 = Group("gradient MSE, RNE vs SR (toy LM gradients)", "MSE ratio RNE / SR", "exact", _src(out, path), "",
               mse_pts, exact=True)
    acc = d[(d["metric"] == "error_ratio") & (d["mode"] == "RNE / SR exact (k=24)")].set_index("part")
    n = int(acc.loc["accumulation_noise0", "N"])
    r0 = float(acc.loc["accumulation_noise0", "value"])
    r1, h1 = float(acc.loc["accumulation_noise1", "value"]), float(acc.loc["accumulation_noise1", "ci95"])
    tensor = acc.loc["accumulation_noise0", "tensor"]
    p0 = Point("identical updates", r0 - 1, plot=_db(r0))
    p1 = Point("step-to-step noise", r1 - 1, r1 - h1 - 1, r1 + h1 - 1, _db(r1), _db(r1 - h1), _db(r1 + h1))
    g3 = Group(f"accumulated error after {n} identical updates, RNE / SR", "error ratio", "exact",
               _src(out, path),
               f"Accumulated error after N = {n} updates of {tensor}, RNE / SR: {r0:.2f}× for identical updates "
               f"(exact, from the moments) but {r1:.2f} ± {h1:.2f}× with step-to-step noise of the gradient's rms "
               f"(95 % t over study 6's noise seeds) (`{_src(out, path)}`, §6).", [p0], exact=True)
    g4 = Group(f"accumulated error after {n} noisy updates, RNE / SR", "error ratio", "95 % t over the noise seeds",
               _src(out, path), "", [p1])
    return Cell([g1, g2, g3, g4])


def tensor_four_over_six(out: Path) -> Cell:
    """Study 3: four-over-six's SQNR gain over NVFP4 (block max mapped to 4 or 6 by MSE), per data set."""
    path = out / "scale_arithmetic" / "four_over_six.csv"
    d = _read(path)
    g = d[d["variant"] == "4/6 mse"]
    if g.empty:
        raise KeyError("no four-over-six rows")
    pts = []
    for _, r in g.iterrows():
        p = Point(_tinylm(r["data"]), float(r["gain_db"]))
        p.plot = p.value
        pts.append(p)
    syn = [p.value for p, r in zip(pts, g.itertuples()) if not r.data.startswith("tinylm:")]
    toy = [p.value for p, r in zip(pts, g.itertuples()) if r.data.startswith("tinylm:")]
    text = ("SQNR gain of four-over-six (block max to 4 or 6, chosen by MSE) over NVFP4: "
            + (f"{_range(syn, '+.2f')} dB on {len(syn)} synthetic data sets (one draw each)" if syn else "")
            + ("; " if syn and toy else "")
            + (f"{_range(toy, '+.2f')} dB on the toy LM's {len(toy)} captured tensors" if toy else "")
            + f" (exact, deterministic) (`{_src(out, path)}`, §3).")
    return Cell([Group("SQNR gain (synthetic and toy LM tensors)", "dB SQNR", "exact (one draw per data set)",
                       _src(out, path), text, pts, exact=True)])


def tensor_bf16_layers(out: Path) -> Cell:
    """Study 7: the toy deep MLP's summed squared Wgrad error (Σ err² over its 12 linear layers) with the paper's
    first/last rule's layers in BF16, against the same count of layers chosen at random (every subset)."""
    from fpsim.recipe import LayerPolicy
    from studies.report.layer_sensitivity import SCALED_RULE

    path = out / "layer_sensitivity" / "layer_sensitivity.csv"
    d = _read(path)
    w = d[(d["gemm"] == "wgrad") & (d["metric"] == "rel_error")]
    nv = w[w["precision"] == "nvfp4_paper"].sort_values("index")
    bf = w[w["precision"] == "bf16"].set_index("layer")["value"]
    names = nv["layer"].tolist()
    e = nv.set_index("layer")["value"]
    if not names:
        raise KeyError("no Wgrad rows")
    pm = LayerPolicy(first=SCALED_RULE.first, last=SCALED_RULE.last).precision_map(names)
    rule = [nm for nm in names if pm[nm] == "bf16"]
    total = float((e**2).sum())

    def reduction(subset) -> float:
        kept = total - sum(e[nm] ** 2 for nm in subset) + sum(bf[nm] ** 2 for nm in subset)
        return 10 * math.log10(total / kept)

    k = len(rule)
    subsets = list(itertools.combinations(names, k))
    rand = [reduction(s) for s in subsets]
    r_rule = reduction(rule)
    share = float(sum(e[nm] ** 2 for nm in rule) / total)
    beat = float(np.mean([r >= r_rule - 1e-12 for r in rand]))
    seeds = int(nv["seeds"].iloc[0])
    p = Point("rule's layers", r_rule, plot=r_rule)
    q = Point(f"mean of all {len(subsets)} random {k}-layer sets", float(np.mean(rand)), plot=float(np.mean(rand)))
    # the rule's pick against chance: better only where few of the possible sets do as well (permutation p)
    diff = Point("rule − random sets", r_rule - float(np.mean(rand)), plot=r_rule - float(np.mean(rand)),
                 given="helps" if beat <= 0.05 else "hurts" if beat >= 0.95 else "unresolved")
    chance = "better than" if beat <= 0.05 else "worse than" if beat >= 0.95 else "no better than"
    text = (f"The paper's first/last rule scaled to the toy deep MLP (first {SCALED_RULE.first}, last "
            f"{SCALED_RULE.last} of {len(names)} linear layers: {', '.join(rule)}) in BF16 lowers the summed squared "
            f"Wgrad relative error of the {len(names)} layers by {_f(r_rule, '.2f')} dB (they hold "
            f"{_f(100 * share, '.1f')} % of it); {k} layers at random: {_f(float(np.mean(rand)), '.2f')} dB on "
            f"average, and {_f(100 * beat, '.0f')} % of the {len(subsets)} possible sets do as well, so the rule "
            f"picks {chance} chance (permutation p = that share; "
            f"errors: mean over {seeds} SR seeds) (`{_src(out, path)}`, §7).")
    src = _src(out, path)
    return Cell([Group("Σ Wgrad err² lowered, rule's vs random layers in BF16", "dB of Σ err²",
                       f"exact (per-layer means over {seeds} seeds)", src, text, [p, q], exact=True, counts=False),
                 Group("rule − random layers", "dB of Σ err²", "permutation over every layer set", src, "", [diff],
                       exact=True)])


def _format_points(out: Path, other: str, synthetic_seeds: bool) -> tuple[list[Group], str]:
    """NVFP4's SQNR minus ``other``'s (study 1): per synthetic distribution (mean ± 95 % t over the independent
    draws of ``gap_seeds.csv`` where it holds ``other``, else the one draw of ``format_error.csv``) and per toy LM
    tensor (exact)."""
    from fpsim.analysis import mean_ci95

    path = out / "format_error" / "format_error.csv"
    fe = _read(path)
    piv = fe.pivot_table(index="data", columns="scheme", values="sqnr_db", sort=False)
    diff = (piv["NVFP4"] - piv[other]).dropna()
    syn = [k for k in diff.index if not k.startswith("tinylm:")]
    toy = [k for k in diff.index if k.startswith("tinylm:")]
    groups = []
    seeds_path = out / "format_error" / "gap_seeds.csv"
    gs = _read(seeds_path) if synthetic_seeds and seeds_path.exists() else None
    if gs is not None and other in set(gs["scheme"]):
        gp = gs.pivot_table(index=["data", "replica"], columns="scheme", values="sqnr_db", sort=False)
        pts, parts = [], []
        for data in dict.fromkeys(gp.index.get_level_values(0)):
            dd = (gp.loc[data, "NVFP4"] - gp.loc[data, other]).to_numpy()
            m, h = mean_ci95(dd)
            pts.append(Point(data, m, m - h, m + h, m, m - h, m + h))
            parts.append(f"{data} {_f(m, '+.2f')} ± {_f(h, '.2f')}")
        n = int(gp.loc[syn[0]].shape[0]) if syn else 0
        groups.append(Group(f"NVFP4 − {other} SQNR, synthetic", "dB SQNR", f"95 % t over {n} draws",
                            _src(out, seeds_path),
                            f"SQNR NVFP4 − {other}, synthetic 1024×2048 (mean ± 95 % t over {n} independent "
                            f"draws): " + "; ".join(parts) + " dB.", pts))
    elif syn:
        pts = [Point(k, float(diff[k]), plot=float(diff[k])) for k in syn]
        groups.append(Group(f"NVFP4 − {other} SQNR, synthetic", "dB SQNR", "one draw each, no interval",
                            _src(out, path),
                            f"SQNR NVFP4 − {other}, {len(syn)} synthetic distributions (one draw each, no interval): "
                            f"{_range([p.value for p in pts], '+.2f')} dB.", pts, exact=True))
    if toy:
        pts = [Point(_tinylm(k), float(diff[k]), plot=float(diff[k])) for k in toy]
        groups.append(Group(f"NVFP4 − {other} SQNR, toy LM tensors", "dB SQNR", "exact", _src(out, path),
                            f"On the toy LM's {len(toy)} captured tensors: {_range([p.value for p in pts], '+.2f')} dB "
                            f"(exact) (`{_src(out, path)}`, §1).", pts, exact=True))
    if not groups:
        raise KeyError(f"no {other} rows")
    bits = fe[fe["scheme"].isin(["NVFP4", other]) & ~fe["data"].str.startswith("tinylm:")]
    bpe = bits.groupby("scheme")["bits_per_element"].first()
    return groups, f"{bpe['NVFP4']:.2f} vs {bpe[other]:.2f} bits per element"


def tensor_mxfp4(out: Path) -> Cell:
    groups, bits = _format_points(out, "MXFP4 rceil", True)
    groups[0].text = groups[0].text.rstrip(".") + f" ({bits})."
    return Cell(groups)


def tensor_fp8(out: Path) -> Cell:
    groups, bits = _format_points(out, "FP8 E4M3 1×128", False)
    groups[0].text = (groups[0].text.rstrip(".") + f" ({bits}; 1×128 blocks as the campaign's FP8 arm quantizes "
                      "activations and gradients; negative: FP8 is more accurate).")
    return Cell(groups)


def tensor_none(why: str) -> Callable[[Path], Cell]:
    return lambda out: Cell(missing=why)


# =============================================================================================== gradient level
#: Study 10's component labels (probes.csv) per row.
PROBE_LABELS = {
    "two_level": "tensor scale", "2d": "16×16 weight tiles", "rht": "random Hadamard transform",
    "sr": "stochastic rounding", "four_over_six": "four-over-six", "bf16_layers": "BF16 layers",
    "mxfp4": "NVFP4 vs MXFP4", "fp8": "NVFP4 vs FP8", "aa": "A/A (recipe vs itself)",
}
PROBE_MODELS = {"smollm2": "SmolLM2-135M", "minilm": "all-MiniLM-L6-v2"}


def gradient_cell(out: Path, key: str) -> Cell:
    """Study 10's effects of one component on its target metric (step-ratio rows left to study 10's section): per
    model and GEMM, the paired difference over batches with its 95 % t-interval (fraction of the GEMM result's norm
    ‖g‖; > 0: the component, or NVFP4, has the smaller error) and study 10's Holm-corrected verdict."""
    path = out / "probes" / "probes.csv"
    if not path.exists():
        return Cell(missing=f"`{_src(out, path)}` not written yet: study 10 has not been rendered")
    label = PROBE_LABELS.get(key)
    d = _read(path)
    d = d[(d["component"] == label) & (~d["metric"].isin(("step_ratio", "step_progress")))]
    if label is None or d.empty:
        return Cell(missing=f"no such comparison in `{_src(out, path)}`")
    groups = []
    for model, dm in d.groupby("model", sort=False):
        pts, parts = [], []
        for _, r in dm.iterrows():
            lo, hi = float(r["ci_low"]), float(r["ci_high"])
            v = str(r["verdict"])
            given = ("helps" if v.startswith("resolved: lowers") else "hurts" if v.startswith("resolved: raises")
                     else "unresolved")
            pts.append(Point(f"{r['gemm']}", float(r["effect"]), lo, hi, float(r["effect"]), lo, hi, given))
            ci = "no interval" if math.isnan(lo) else _ci(lo, hi, "+.3g")
            word = str(r["verdict"]).split(" (")[0].replace("resolved: ", "resolved, ")
            parts.append(f"{r['gemm']} {_f(float(r['effect']), '+.3g')} {ci} ({word})")
        first = dm.iloc[0]
        name = PROBE_MODELS.get(model, model)
        groups.append(Group(f"{name}: {first['metric']} ({first['mode']})", "fraction of ‖g‖",
                            f"95 % t over {int(first['n'])} batches", _src(out, path),
                            f"{name}, {first['metric']} ({first['mode']}), {int(first['n'])} batches: "
                            + "; ".join(parts) + ".", pts))
    groups[-1].text += (f" (fraction of ‖g‖, 95 % t over batches, verdict after Holm's correction) "
                        f"(`{_src(out, path)}`, §10)")
    return Cell(groups)


# =============================================================================================== training level
@dataclass
class Campaign:
    """Final validation losses of the campaign's main plan (arm → seed → loss) and its A/A comparison."""

    fin: dict[str, dict[int, float]]
    aa: dict | None
    source: str
    size: str
    budget: int


def load_campaign(data: Path = CAMPAIGN) -> Campaign | None:
    """Study 8's main plan (size s10m, the main budget) from the campaign's run CSVs, or None without runs."""
    from studies.campaign.batch import plan_runs
    from studies.campaign.report import aa_comparison, load_runs

    if not Path(data).exists():
        return None
    size, budget = "s10m", plan_runs("main", lr=1.0)[0]["tokens"]
    logs, recs = load_runs(data)
    val = logs.dropna(subset=["val_loss"])
    sub = val[(val["size"] == size) & (val["budget"] == budget)]
    if sub.empty:
        return None
    last = sub[sub["step"] == sub.groupby("run")["step"].transform("max")]
    fin = {arm: g.set_index("seed")["val_loss"].to_dict() for arm, g in last.groupby("arm", sort=False)}
    try:
        aa = aa_comparison(val, recs, size, budget)
    except ValueError:
        aa = None
    try:
        where = str(Path(data).relative_to(ROOT))
    except ValueError:
        where = str(data)
    return Campaign(fin, aa, f"{where}/main/*.csv", size, budget)


#: Row → (the arm with the component or NVFP4, the arm without it or the other format, what the gap is): the
#: training gap is loss(without / other) − loss(with / NVFP4), > 0 when the component or NVFP4 lowers the loss.
TRAINING = {
    "2d": ("nvfp4", "nvfp4_no_2d", "recipe without 2D − recipe"),
    "rht": ("nvfp4", "nvfp4_no_rht", "recipe without RHT − recipe"),
    "sr": ("nvfp4", "nvfp4_no_sr", "recipe without SR − recipe"),
    "four_over_six": ("nvfp4_46", "nvfp4", "recipe − recipe with four-over-six"),
    "bf16_layers": ("nvfp4", "nvfp4_all", "every block NVFP4 − recipe (last ~15 % of blocks BF16)"),
    "late_switch": ("nvfp4_late_bf16", "nvfp4", "recipe − recipe with BF16 for the last 18 % of tokens"),
    "mxfp4": ("nvfp4", "mxfp4", "MXFP4 recipe − NVFP4 recipe"),
    "fp8": ("nvfp4", "fp8_blockwise", "FP8 blockwise − NVFP4 recipe"),
}
#: The rows whose training gap is one of study 8's recipe components (Holm-corrected over that family).
FAMILY = ("2d", "rht", "sr", "four_over_six", "bf16_layers", "late_switch")


def training_cells(camp: Campaign | None) -> dict[str, Cell]:
    """Each row's training cell: the paired gap over the seeds both arms finished (mean, 95 % t-interval, p; Holm
    p over study 8's six components for those; the gap detectable at 80 % power), and the A/A comparison."""
    from studies.campaign.stats import detectable, has_interval, holm, p_value, paired_gap

    cells: dict[str, Cell] = {}
    if camp is None:
        why = f"no campaign run under `{_src(ROOT, CAMPAIGN)}`"
        return {k: Cell(missing=why) for k in (*TRAINING, "aa")}
    gaps = {}
    for key, (with_, without, _) in TRAINING.items():
        if with_ in camp.fin and without in camp.fin and set(camp.fin[with_]) & set(camp.fin[without]):
            gaps[key] = paired_gap(camp.fin[without], camp.fin[with_])
    fam = [k for k in FAMILY if k in gaps and has_interval(gaps[k])]
    adj = dict(zip(fam, holm([p_value(gaps[k]) for k in fam])))
    base = camp.fin.get("bf16", {})
    bf16_loss = sum(base.values()) / len(base) if base else math.nan
    for key, (_, _, what) in TRAINING.items():
        if key not in gaps:
            cells[key] = Cell(missing=f"no runs of both arms on a common seed in `{camp.source}`")
            continue
        g = gaps[key]
        if not has_interval(g):
            pt = Point("paired gap", g.mean)
            cells[key] = Cell([Group(what, "nats/byte", "one run, no interval", camp.source,
                                     f"{what}: {_f(g.mean, '+.4f')} nats/byte on one seed (one run, no interval).",
                                     [pt], exact=True)])
            continue
        p = p_value(g)
        mde = detectable(g)
        holm_txt = f", Holm p {adj[key]:.2g} over {len(fam)} components" if key in adj else ""
        pt = Point(f"{g.n} seeds", g.mean, g.lo, g.hi, g.mean, g.lo, g.hi)
        text = (f"{what}, final validation loss: {_f(g.mean, '+.4f')} {_ci(g.lo, g.hi, '+.4f')} nats/byte (mean "
                f"over {g.n} paired seeds, 95 % t; {_f(100 * g.mean / bf16_loss, '+.1f')} % of BF16's loss; p "
                f"{p:.2g}{holm_txt}; detectable at 80 % power and α = 0.05: {mde:.4f}) (`{camp.source}`, §8).")
        cell = Cell([Group(what, "nats/byte", f"95 % t over {g.n} paired seeds", camp.source, text, [pt])])
        cell.detail = (f"p {p:.2g}" + (f", Holm p {adj[key]:.2g}" if key in adj else "")
                       + f"; 80 %-power detectable gap {mde:.4f} nats/byte")
        cell.p = adj.get(key, p)
        cells[key] = cell
    aa = camp.aa
    if aa is None or not has_interval(aa["gap"]):
        cells["aa"] = Cell(missing=f"no late-switch and recipe runs on common seeds in `{camp.source}`")
    else:
        g = aa["gap"]
        pt = Point(f"{g.n} seeds", g.mean, g.lo, g.hi, g.mean, g.lo, g.hi)
        text = (f"Late-switch arm − recipe at {aa['tokens'] / 1e6:.0f} M tokens, before the switch (one "
                f"computation run twice): {_f(g.mean, '+.4f')} {_ci(g.lo, g.hi, '+.4f')} nats/byte (mean over {g.n} "
                f"paired seeds, 95 % t; p {p_value(g):.2g}); {aa['zeros']} of the {aa['n']} per-seed differences "
                f"from 15 % of the steps to the switch are 0, their standard deviation {aa['sd']:.4f} nats/byte "
                f"(`{camp.source}`, §8).")
        cell = Cell([Group("A/A before the late switch", "nats/byte", f"95 % t over {g.n} paired seeds",
                           camp.source, text, [pt])])
        cell.detail = f"p {p_value(g):.2g}"
        cell.p = p_value(g)
        cells["aa"] = cell
    return cells


# ======================================================================================================= rows
ROWS = (
    ("two_level", "Two-level scaling and the tensor scale",
     f"{PAPER}: E4M3 block scales (fractional, not powers of two) under a second-level FP32 tensor scale quantize "
     "more accurately than MXFP4's E8M0 scales; the tensor scale maps the tensor into the block scales' E4M3 range."),
    ("2d", "16×16 2D weight tiles",
     f"{PAPER}: 16×16 weight tiles make Fprop and Dgrad use the same quantized weight, keeping the chain rule "
     "consistent, at a small cost in weight accuracy; removing them raises the training loss."),
    ("rht", "Random Hadamard transform (Wgrad)",
     f"{PAPER}: a 16-point RHT on Wgrad's operands spreads outliers so a block's scale is not set by one value; "
     "on Wgrad only (no benefit on Fprop/Dgrad at the paper's scale); removing it raises the training loss."),
    ("sr", "Stochastic rounding (gradients)",
     f"{PAPER}: gradients need SR, since RNE's bias accumulates over many updates; SR on forward tensors only adds "
     "error; removing it raises the training loss."),
    ("four_over_six", "Four-over-six block scales",
     "NVIDIA's paper: no claim (not part of its recipe). Cook et al. 2025, Four Over Six (arXiv 2512.02010): "
     "scaling a block's max to 4 or 6, whichever quantizes the block better, lowers the error near the block max "
     "and brings NVFP4 pre-training loss closer to BF16."),
    ("bf16_layers", "BF16 layers (first and last blocks)",
     f"{PAPER}: some layers are more sensitive; keeping the first 2 and last 8 of 62 blocks in BF16 (the final ones "
     "the most sensitive) is needed, NVFP4 on every block raises the loss."),
    ("late_switch", "Late switch to BF16",
     f"{PAPER}: switching to BF16 for the last ~18 % of tokens recovers part of the remaining gap to BF16."),
    ("mxfp4", "NVFP4 vs MXFP4",
     f"{PAPER}: NVFP4 (blocks of 16, E4M3 scales, FP32 tensor scale) quantizes more accurately than MXFP4 (blocks "
     "of 32, E8M0 scales) and trains to a lower loss."),
    ("fp8", "NVFP4 vs FP8 (the paper's headline)",
     f"{PAPER}: a 12 B model trained on 10 T tokens with the NVFP4 recipe reaches a training loss and downstream "
     "accuracy comparable to its FP8 baseline's."),
    ("aa", "Control: the recipe against itself (A/A)",
     "No claim: a control. Two runs of one computation should differ by nothing but their random draws."),
)

TENSOR: dict[str, Callable[[Path], Cell]] = {
    "two_level": tensor_two_level, "2d": tensor_2d, "rht": tensor_rht, "sr": tensor_sr,
    "four_over_six": tensor_four_over_six, "bf16_layers": tensor_bf16_layers,
    "late_switch": tensor_none("a change of schedule over training: no tensor-level counterpart"),
    "mxfp4": tensor_mxfp4, "fp8": tensor_fp8,
    "aa": tensor_none("no A/A at this level: the tensor studies are seeded and repeat bit for bit"),
}
#: The tensor studies each row reads (their files, for the "not measured" note).
TENSOR_FILES = {
    "two_level": "design_space/design_space.csv", "2d": "weight_2d/weight_2d.csv",
    "rht": "outliers_rht/outliers_rht.csv", "sr": "stochastic_rounding/stochastic_rounding.csv",
    "four_over_six": "scale_arithmetic/four_over_six.csv", "bf16_layers": "layer_sensitivity/layer_sensitivity.csv",
    "mxfp4": "format_error/format_error.csv", "fp8": "format_error/format_error.csv",
}


def tensor_cell(out: Path, key: str) -> Cell:
    try:
        return TENSOR[key](out)
    except MISSING as e:
        f = TENSOR_FILES.get(key, "")
        why = (f"`{f}` not written" if f and not (out / f).exists() else
               f"`{f}` lacks the rows ({type(e).__name__}: {e})")
        return Cell(missing=why)


# ===================================================================================================== verdicts
def _level_says(level: str, cell: Cell) -> tuple[str, str]:
    """(direction: helps / hurts / mixed / unresolved / none, the words)."""
    st = cell.statuses()
    if not st:
        return "none", NOT_MEASURED
    n, h, x = len(st), st.count("helps"), st.count("hurts")
    u = n - h - x
    if level == "training":
        p, g = cell.p, cell.groups[0].points[0]
        if math.isnan(g.lo):
            return "unresolved", "one run, no interval"
        if p < 0.05:
            return ("helps" if g.value > 0 else "hurts"), f"resolved ({cell.detail})"
        return "unresolved", f"not resolved ({cell.detail})"
    what = "comparisons (Holm-corrected)" if level == "gradient" else "numbers"
    one = what.replace("comparisons", "comparison").replace("numbers", "number")
    every = f"its one {one}" if n == 1 else f"both {what}" if n == 2 else f"all {n} {what}"
    if h == n:
        return "helps", f"better on {every}"
    if x == n:
        return "hurts", f"worse on {every}"
    if u == n:
        return "unresolved", f"no difference resolved on {every}"
    parts = [f"better on {h}" if h else "", f"worse on {x}" if x else "", f"unresolved on {u}" if u else ""]
    return ("mixed" if h and x else "helps" if h else "hurts"), ", ".join(p for p in parts if p) + f" of {n} {what}"


#: Per row: what the levels measure differently, said where they disagree or only one resolves an effect (no
#: number here: the numbers are the cells').
NOTES = {
    "two_level": "the tensor scale matters only for tensors far from E4M3's range, such as the toy LM's small "
                 "gradients, and no campaign arm removes it, so what it buys in training is not measured.",
    "2d": "the tiles buy consistency (Fprop and Dgrad see one weight), which a GEMM's error against FP64 does not "
          "reward (a tile shares one scale over 256 values instead of 16); whether the consistency lowers the loss "
          "is the training level's question.",
    "rht": "the tensor level is one GEMM's error on a toy MLP's captured tensors and on synthetic data, where a "
           "16-point rotation spreads a block's outlier over the block but cannot move it out, and study 4 does "
           "not isolate why RHT changes the error as it does; the paper's evidence is the loss of far larger runs, "
           "and a training gap below the campaign's detectable one cannot be told from zero.",
    "sr": "SR trades a lower bias for a higher single-shot error; which of the two the loss feels depends on how "
          "many updates accumulate and how noisy they are (in study 6 identical updates favour SR, noisy ones RNE).",
    "four_over_six": "a per-tensor SQNR gain does not say how large its effect on the loss is; only the training "
                     "comparison tests Cook et al.'s claim, and at this scale its interval is the answer.",
    "bf16_layers": "the tensor level asks whether the rule picks the most error-prone layers of a toy deep MLP, the "
                   "training level whether keeping the last blocks in BF16 lowers the loss; the two are different "
                   "questions.",
    "late_switch": "a schedule has no tensor- or gradient-level counterpart.",
    "mxfp4": "",
    "fp8": "per GEMM FP8 is far more accurate, yet the headline is about the loss, where the campaign does not "
           "resolve a difference: 'comparable' holds within the interval, not beyond it.",
    "aa": "the GPU runs do not repeat bit for bit, so every training gap on this page carries this noise besides "
          "the seeds'.",
}
_WORD = {"helps": "better", "hurts": "worse", "mixed": "mixed"}


def _mxfp4_caveat() -> str:
    from studies.campaign.arms import MXFP4_OTHER_CHANGES

    return ("The campaign's MXFP4 arm changes more than the format: " + "; and ".join(MXFP4_OTHER_CHANGES)
            + ", so its training gap is theirs together.")


def verdict(row: Row, aa: Row | None = None) -> tuple[str, str]:
    """(category, sentence): ``agree``, ``single`` (one level measured), ``disagree`` (opposite directions or
    mixed), ``partial`` (some levels resolve an effect, others do not), ``unresolved``, ``none``, ``control``."""
    says = {lv: _level_says(lv, row.cells[lv]) for lv in LEVELS}
    measured = {lv: s for lv, s in says.items() if s[0] != "none"}
    head = "; ".join(f"{lv}: {w}" for lv, (_, w) in says.items()) + "."
    note = NOTES.get(row.key, "")
    tail = (" " + _mxfp4_caveat()) if row.key == "mxfp4" else ""
    note = note or "the levels measure different things."
    if row.key == "late_switch" and aa is not None and _level_says("training", aa.cells["training"])[0] in (
            "helps", "hurts"):
        note += (" The A/A control (last row) resolves a gap between two runs of one computation, so this "
                 "comparison carries that noise too.")
    if not measured:
        return "none", head + " Nothing measured."
    resolved = {lv: d for lv, (d, _) in measured.items() if d in ("helps", "hurts", "mixed")}
    dirs = set(resolved.values())
    if row.key == "aa":
        text = head
        if measured.get("training", ("",))[0] in ("helps", "hurts"):
            text += " The training A/A gap is not zero: " + note
        if measured.get("gradient", ("",))[0] in ("helps", "hurts", "mixed"):
            text += (" Study 10's A/A comparisons should cover 0; one that does not after Holm's correction is a "
                     "false positive or a sign that its intervals are too narrow.")
        return "control", text if text != head else head + " No A/A difference resolved."
    if row.key == "fp8" and measured.get("training", ("",))[0] == "unresolved":
        return "partial" if resolved else "unresolved", (
            head + " Consistent with the headline's 'comparable' within the campaign's interval; " + note + tail)
    if "mixed" in dirs or dirs >= {"helps", "hurts"}:
        return "disagree", head + " The levels, or the measures within one, point different ways: " + note + tail
    if len(measured) == 1 and resolved:
        (lv, d), = resolved.items()
        return "single", (head + f" Only the {lv} level is measured, and it finds the component {_WORD[d]}: "
                          + note + tail)
    if resolved and len(resolved) < len(measured):
        which = ", ".join(f"the {lv} level ({_WORD[d]})" for lv, d in resolved.items())
        return "partial", head + f" Only {which} resolves an effect; the others do not: " + note + tail
    if resolved:
        who = "NVFP4 is" if row.key in ("mxfp4", "fp8") else "the component is"
        return "agree", head + f" Every measured level agrees: {who} {_WORD[dirs.pop()]}." + tail
    return "unresolved", head + " No level resolves an effect; " + note + tail


# ====================================================================================================== render
def build(out: Path, camp: Campaign | None) -> list[Row]:
    """Every row with its three cells and its verdict, from the files under ``out`` and the campaign's runs."""
    train = training_cells(camp)
    rows = []
    for key, label, claim in ROWS:
        cells = {"tensor": tensor_cell(out, key), "gradient": gradient_cell(out, key),
                 "training": train.get(key, Cell(missing="no campaign arm removes it"))}
        rows.append(Row(key, label, claim, cells))
    aa = next((r for r in rows if r.key == "aa"), None)
    for row in rows:
        row.category, row.verdict = verdict(row, aa)
    return rows


def tidy(rows: list[Row]) -> pd.DataFrame:
    """components.csv: one row per number (component, level, group, item, value, interval, forest value, source)."""
    recs = []
    for r in rows:
        for lv in LEVELS:
            cell = r.cells[lv]
            if not cell.groups:
                recs.append({"component": r.label, "level": lv, "measure": NOT_MEASURED, "item": "", "unit": "",
                             "value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "interval": "",
                             "forest": math.nan, "forest_low": math.nan, "forest_high": math.nan,
                             "source": cell.missing})
            for g in cell.groups:
                for p in g.points:
                    recs.append({"component": r.label, "level": lv, "measure": g.label, "item": p.item,
                                 "unit": g.unit, "value": p.value, "ci_low": p.lo, "ci_high": p.hi,
                                 "interval": g.interval, "forest": p.plot, "forest_low": p.plot_lo,
                                 "forest_high": p.plot_hi, "source": g.source})
    return pd.DataFrame(recs)


FOREST_UNITS = {
    "tensor": "dB: 20·log10(error without / with the component)\n(10·log10 for MSE; SQNR gains as they are)",
    "gradient": "paired difference, fraction of ‖g‖ (symlog scale)\ncolour: Fprop blue, Dgrad orange, Wgrad green",
    "training": "paired gap in final validation loss,\nnats/byte",
}


#: Study 10's GEMM colours.
GEMM_COLORS = {"fprop": "tab:blue", "dgrad": "tab:orange", "wgrad": "tab:green"}


def forest(rows: list[Row], path: Path) -> None:
    """One panel per level; a band per row, a line per group; exact numbers as dots, intervals as bars."""
    n_lines = {r.key: max(1, *(sum(1 for g in r.cells[lv].groups if any(not math.isnan(p.plot) for p in g.points))
                              for lv in LEVELS)) for r in rows}
    total = sum(n_lines.values())
    fig, axes = plt.subplots(1, 3, figsize=(16, 0.36 * total + 2.2), sharey=True)
    colors = plt.get_cmap("tab10")
    for ax, lv in zip(axes, LEVELS):
        top = total
        centers = []
        for r in rows:
            k = n_lines[r.key]
            centers.append(top - k / 2)
            groups = [g for g in r.cells[lv].groups if any(not math.isnan(p.plot) for p in g.points)]
            if not groups:
                ax.text(0.5, top - k / 2, NOT_MEASURED, transform=ax.get_yaxis_transform(), ha="center",
                        va="center", fontsize=7, color="0.5")
            for j, g in enumerate(groups):
                y = top - 0.5 - j
                for p in (q for q in g.points if not math.isnan(q.plot)):
                    c = GEMM_COLORS.get(p.item, "0.4") if lv == "gradient" else colors(j % 10)
                    if math.isnan(p.plot_lo):
                        ax.plot([p.plot], [y], "o", ms=3.5, color=c, alpha=0.8)
                    else:
                        ax.errorbar([p.plot], [y], xerr=[[p.plot - p.plot_lo], [p.plot_hi - p.plot]], fmt="s",
                                    ms=3.5, capsize=2.5, color=c, lw=1)
                ax.text(0.01, y + 0.28, g.label, transform=ax.get_yaxis_transform(), fontsize=5.5, color="0.3",
                        va="center")
            top -= k
            ax.axhline(top, color="0.85", lw=0.6)
        ax.axvline(0, color="k", lw=0.8)
        if lv == "gradient":
            ax.set_xscale("symlog", linthresh=1e-4)
        ax.set_xlabel(FOREST_UNITS[lv], fontsize=7.5)
        ax.set_title(f"{LEVEL_TITLES[lv]}\n> 0: the component (or NVFP4) is better", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
    axes[0].set_yticks(centers)
    axes[0].set_yticklabels([r.label for r in rows], fontsize=8)
    axes[0].set_ylim(0, total)
    save_fig(fig, path)


def _cell_md(text: str) -> str:
    """A table cell: no '|' (the renderer splits cells on it) and no line break."""
    return text.replace("|", "/").replace("\n", " ")


def main(argv=None) -> Path:
    args = parse_args(NAME, __doc__, argv)
    camp = load_campaign(CAMPAIGN)
    rows = build(args.out, camp)
    df = tidy(rows)
    write_csv(df, args.dir / f"{NAME}.csv")
    forest(rows, args.dir / "forest.png")
    table = pd.DataFrame({
        "component": [r.label for r in rows],
        "paper's claim (whose)": [_cell_md(r.claim) for r in rows],
        "tensor level (studies 1–7)": [_cell_md(r.cells["tensor"].text()) for r in rows],
        "gradient level (study 10)": [_cell_md(r.cells["gradient"].text()) for r in rows],
        "training level (study 8)": [_cell_md(r.cells["training"].text()) for r in rows],
        "verdict": [_cell_md(r.verdict) for r in rows],
    })
    missing = {lv: [r.label for r in rows if not r.cells[lv].groups] for lv in LEVELS}
    gaps = "; ".join(f"{lv} level: " + ("every row" if len(m) == len(rows) else ", ".join(m))
                     for lv, m in missing.items() if m)
    model = "the paired-seed campaign's final validation loss"
    if camp is not None:
        from studies.campaign.batch import PARAMS

        model += (f", a {PARAMS[camp.size] / 1e6:.1f} M-parameter byte-level model trained on "
                  f"{camp.budget / 1e6:.0f} M tokens, paired over seeds")
    claim = (f"The NVFP4 training recipe of {PAPER} combines two-level block scaling with an FP32 tensor scale, "
             "16×16 weight tiles, a random Hadamard transform on Wgrad, stochastic rounding of gradients, BF16 first "
             "and last blocks and a late switch to BF16, claims each is needed, and reports that the whole trains "
             "as well as FP8; four-over-six is not part of it (Cook et al. 2025 claim it). Each row below states "
             "its claim and whose it is.")
    measured = (
        "Each row puts one component's numbers from three levels side by side, every one read, when this page is "
        "rendered, from the file named beside it: the tensor level (sections 1–7: single tensors and single GEMMs "
        "of synthetic data and of a toy byte-level MLP language model's captured tensors), the gradient level "
        "(section 10, study 10: each GEMM's error on SmolLM2-135M and all-MiniLM-L6-v2 under the recipe with and "
        f"without the component, paired over batches) and the training level (section 8: {model}). Signs: at "
        "every level a positive effect means the component (or NVFP4, in a format comparison) is the better one. "
        "Intervals are 95 % t-intervals over what the cell names (seeds, draws, batches); 'exact' marks a "
        "deterministic number (a fixed capture and seed, or an expectation computed rather than sampled); a "
        "training component's p is Holm-corrected over study 8's recipe components, as in section 8. "
        + (f"Not measured: {gaps}." if gaps else "Every cell is measured."))
    names = {c: [r.label for r in rows if r.category == c] for c in
             ("agree", "single", "disagree", "partial", "unresolved")}
    words = {"agree": "every measured level agrees", "single": "one level measured",
             "disagree": "the levels or the measures point different ways",
             "partial": "some levels resolve an effect, others do not", "unresolved": "no level resolves an effect"}
    summary = "; ".join(f"{words[c]}: {', '.join(v)}" for c, v in names.items() if v)
    verdict_txt = (summary[:1].upper() + summary[1:] + ". The row verdicts "
                   "say which level says what and why they can differ. A tensor-level effect is a single-tensor or "
                   "single-GEMM proxy on toy or synthetic data, not evidence about the loss; a training gap that "
                   "is not resolved is not evidence of no effect, only of none larger than its detectable gap.")
    notes = ("How each level is computed. Tensor: SQNR differences in dB; error changes as 20·log10 of the error "
             "ratio on the plot (the table keeps each study's own unit); the 2D row's Dgrad interval on the plot "
             "maps the paired difference's interval with the 1×16 error held at its mean. Gradient: study 10's "
             "`probes.csv`, the effect on the metric the component exists to change (rel_err or bias, fractions of "
             "the GEMM result's norm), its step-progress rows left to section 10. Training: paired gap = mean over "
             "seeds of the per-seed difference in final validation loss (nats/byte), computed here from the run "
             "CSVs with `studies.campaign.stats` (the same numbers as section 8's tables); 'detectable' is the "
             "smallest true gap a paired t-test at α = 0.05 finds with 80 % power at that seed count and spread. "
             "Every number, its interval and its source: `components/components.csv`.")
    table_md = md_table(table)
    progress(f"[{NAME}] {len(rows)} rows, {len(df)} numbers, cells not measured: "
             f"{sum(len(m) for m in missing.values())}")
    write_section(args, "What each component buys", claim, measured, verdict_txt, ["forest.png"], [table_md, notes])
    return args.dir


if __name__ == "__main__":
    main()
