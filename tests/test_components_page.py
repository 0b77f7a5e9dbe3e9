"""The page of what each component buys (issue 46, item 5): every row, every number from the CSV it cites,
"not measured" where a source is missing, the first section of the assembled index, byte-reproducible."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studies.common import REPORTS
from studies.report import components as comp

ROOT = Path(__file__).parents[1]
CAMPAIGN = ROOT / "studies" / "data" / "campaign"
#: The CSVs of studies 1-7 the page reads.
SOURCES = ("format_error/format_error.csv", "format_error/gap_seeds.csv", "design_space/design_space.csv",
           "scale_arithmetic/four_over_six.csv", "outliers_rht/outliers_rht.csv", "weight_2d/weight_2d.csv",
           "stochastic_rounding/stochastic_rounding.csv", "layer_sensitivity/layer_sensitivity.csv")
LABELS = [label for _, label, _ in comp.ROWS]


def _m(x: str) -> str:
    """A formatted number as the page writes it (true minus sign)."""
    return x.replace("-", "−")


def _copy_sources(dst: Path) -> Path:
    for s in SOURCES:
        (dst / s).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPORTS / s, dst / s)
    return dst


def _table(section: str) -> dict[str, list[str]]:
    """The page's table: component → its cells (claim, tensor, gradient, training, verdict)."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| component "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def _probes_fixture(path: Path) -> pd.DataFrame:
    """A probes.csv of study 10's shape: two models, every component, a resolved and an unresolved GEMM each."""
    rows = []
    for m, sign in (("smollm2", 1.0), ("minilm", -1.0)):
        for i, label in enumerate(comp.PROBE_LABELS.values()):
            e = sign * 0.001 * (i + 1)
            rows.append({"model": m, "component": label, "gemm": "wgrad", "metric": "rel_err", "mode": "isolated",
                         "effect": e, "ci_low": e - 0.0004, "ci_high": e + 0.0004, "n": 4, "p_holm": 0.01,
                         "mde80": 0.0005, "verdict": "resolved: " + ("lowers" if e > 0 else "raises") + " the error"})
            rows.append({"model": m, "component": label, "gemm": "dgrad", "metric": "rel_err", "mode": "isolated",
                         "effect": 2e-5, "ci_low": -3e-4, "ci_high": 3.4e-4, "n": 4, "p_holm": 0.9, "mde80": 4e-4,
                         "verdict": "not resolved (80 %-power detectable: 0.0004)"})
            rows.append({"model": m, "component": label, "gemm": "step (sgd)", "metric": "step_progress",
                         "mode": "end_to_end", "effect": 0.123456, "ci_low": 0.1, "ci_high": 0.15, "n": 4,
                         "p_holm": 0.5, "mde80": 0.1, "verdict": "not resolved"})
    df = pd.DataFrame(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return df


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page rendered on the committed CSVs of studies 1-7, a probes.csv fixture and the campaign's runs."""
    out = _copy_sources(tmp_path_factory.mktemp("reports"))
    probes = _probes_fixture(out / "probes" / "probes.csv")
    d = comp.main(["--out", str(out)])
    return {"dir": d, "text": (d / "section.md").read_text(), "csv": pd.read_csv(d / "components.csv"),
            "probes": probes}


def test_every_row_is_present_with_its_claim_levels_and_verdict(page):
    text = page["text"]
    assert text.startswith("## What each component buys\n")
    for part in ("**Paper's claim.**", "**Measured by fpsim.**", "**Verdict.**", "components/forest.png"):
        assert part in text
    table = _table(text)
    assert list(table) == LABELS
    for label, cells in table.items():
        assert len(cells) == 5 and all(cells), label
    for name in ("Two-level", "2D", "Hadamard", "Stochastic rounding", "Four-over-six", "BF16 layers",
                 "Late switch", "MXFP4", "FP8", "A/A"):
        assert any(name in label for label in table), name
    # whose claim: four-over-six is Cook et al.'s, not NVIDIA's; the control has none
    assert "NVIDIA's paper: no claim" in table["Four-over-six block scales"][0]
    assert "Cook et al. 2025" in table["Four-over-six block scales"][0]
    assert table["Control: the recipe against itself (A/A)"][0].startswith("No claim")
    # a level that does not exist for a row says so
    assert table["Late switch to BF16"][1].startswith("not measured")
    assert table["Two-level scaling and the tensor scale"][3].startswith("not measured")
    assert (page["dir"] / "forest.png").stat().st_size > 0
    assert set(page["csv"]["level"]) == {"tensor", "gradient", "training"}


def test_tensor_numbers_are_the_studies_csv_values(page):
    table = _table(page["text"])
    # study 1: NVFP4 − MXFP4 rceil per synthetic distribution, mean ± 95 % t over the independent draws
    gs = pd.read_csv(REPORTS / "format_error" / "gap_seeds.csv")
    piv = gs.pivot_table(index=["data", "replica"], columns="scheme", values="sqnr_db")
    for data in ("gaussian", "channel_outliers"):
        d = (piv.loc[data, "NVFP4"] - piv.loc[data, "MXFP4 rceil"]).to_numpy()
        half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
        assert _m(f"{data} {d.mean():+.2f} ± {half:.2f}") in table["NVFP4 vs MXFP4"][1]
    # study 2: the tensor scale on vs off on the toy LM's gradients (E4M3, block 16), exact
    ds = pd.read_csv(REPORTS / "design_space" / "design_space.csv")
    g = ds[ds.data.str.endswith(".grad_output") & (ds.block == 16)].pivot_table(
        index="data", columns="scale", values="sqnr_db")
    gain = g["E4M3 + FP32 tensor scale"] - g["E4M3, no tensor scale"]
    assert _m(f"SQNR {gain.min():+.2f} to {gain.max():+.2f} dB") in table["Two-level scaling and the tensor scale"][1]
    # study 3: four-over-six's gain on the toy LM's tensors
    fo = pd.read_csv(REPORTS / "scale_arithmetic" / "four_over_six.csv")
    toy = fo[(fo.variant == "4/6 mse") & fo.data.str.startswith("tinylm:")].gain_db
    assert _m(f"{toy.min():+.2f} to {toy.max():+.2f} dB on the toy LM's {toy.size}") in table[
        "Four-over-six block scales"][1]
    # study 4: RHT16 on Wgrad's operands, per captured layer
    rh = pd.read_csv(REPORTS / "outliers_rht" / "outliers_rht.csv")
    w = rh[(rh.experiment == "gemm_placement") & (rh.variant == "Wgrad (paper)") & (rh.data == "tinylm:head")]
    c, h = (w.set_index("metric").value[k] for k in ("wgrad_change_pct", "wgrad_change_pct_ci95"))
    assert _m(f"head {c:+.1f} ± {h:.1f} %") in table["Random Hadamard transform (Wgrad)"][1]
    # study 5: the whole recipe's Dgrad error, 1×16 − 16×16, with its interval
    w2 = pd.read_csv(REPORTS / "weight_2d" / "weight_2d.csv")
    row = w2[(w2.data == "mean over layers") & (w2.scheme == "recipe: 16×16 W − 1×16 W (paired)")
             & (w2.metric == "dgrad_rel_error")].iloc[0]
    assert _m(f"{-row.value:+.4f} (± {row.ci95:.4f}") in table["16×16 2D weight tiles"][1]
    # study 6: RNE's and SR's bias of the head gradient, % of mean(abs(g))
    sr = pd.read_csv(REPORTS / "stochastic_rounding" / "stochastic_rounding.csv")
    b = sr[(sr.part == "bias") & (sr.tensor == "head.grad_output") & (sr.metric == "aligned_bias_rel_meanabs")]
    v = b.set_index("mode").value
    assert _m(f"head {100 * v['RNE']:.3f} → {100 * v['SR k=8 (exact enumeration)']:.3f} %") in table[
        "Stochastic rounding (gradients)"][1]
    # study 7: the scaled rule's layers hold this share of the summed squared Wgrad error
    ls = pd.read_csv(REPORTS / "layer_sensitivity" / "layer_sensitivity.csv")
    e = ls[(ls.gemm == "wgrad") & (ls.precision == "nvfp4_paper")].sort_values("index").value.to_numpy()
    share = (e[0] ** 2 + e[-2] ** 2 + e[-1] ** 2) / (e**2).sum()  # first 1 and last 2 of the 12 layers
    assert f"they hold {100 * share:.1f} % of it" in table["BF16 layers (first and last blocks)"][1]


def _finals() -> dict[str, dict[int, float]]:
    """arm → seed → final validation loss of the campaign's main plan, read here from the run files."""
    out: dict[str, dict[int, float]] = {}
    for js in sorted((CAMPAIGN / "main").glob("*.json")):
        rec = json.loads(js.read_text())
        if rec.get("status") != "done" or rec.get("size") != "s10m" or rec.get("tokens_budget") != 265_000_000:
            continue
        curve = pd.read_csv(js.with_suffix(".csv")).dropna(subset=["val_loss"])
        out.setdefault(rec["arm"], {})[rec["seed"]] = float(curve.sort_values("step").val_loss.iloc[-1])
    return out


def _gap(a: dict, b: dict) -> tuple[float, float, float]:
    d = np.array([a[s] - b[s] for s in sorted(set(a) & set(b))])
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean(), d.mean() - half, d.mean() + half


@pytest.mark.parametrize("label, without, with_", [
    ("Stochastic rounding (gradients)", "nvfp4_no_sr", "nvfp4"),
    ("16×16 2D weight tiles", "nvfp4_no_2d", "nvfp4"),
    ("Four-over-six block scales", "nvfp4", "nvfp4_46"),
    ("NVFP4 vs MXFP4", "mxfp4", "nvfp4"),
    ("NVFP4 vs FP8 (the paper's headline)", "fp8_blockwise", "nvfp4"),
])
def test_training_numbers_are_the_campaigns_paired_gaps(page, label, without, with_):
    fin = _finals()
    m, lo, hi = _gap(fin[without], fin[with_])
    cell = _table(page["text"])[label][3]
    assert _m(f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}] nats/byte") in cell
    # the same numbers as study 8's committed section: its text (MXFP4, FP8, which it writes as recipe − FP8, the
    # opposite sign) or its components' table (gap and interval in two cells)
    s8 = (REPORTS / "training" / "section.md").read_text()
    if "FP8" in label:
        m, lo, hi = -m, -hi, -lo
    assert f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]" in s8 or f"| {m:+.4f} | [{lo:+.4f}, {hi:+.4f}] |" in s8


def test_gradient_numbers_are_study_10s(page):
    table, probes = _table(page["text"]), page["probes"]
    for key, label in comp.PROBE_LABELS.items():
        row = next(lbl for k, lbl, _ in comp.ROWS if k == key)
        cell = table[row][2]
        steps = probes.metric.isin(("step_ratio", "step_progress"))
        for _, r in probes[(probes.component == label) & ~steps].iterrows():
            assert _m(f"{r.gemm} {r.effect:+.3g} [{r.ci_low:+.3g}, {r.ci_high:+.3g}]") in cell, (row, r.gemm)
        assert "0.123456" not in cell and "step" not in cell  # the step-ratio rows are section 10's
    assert table["Late switch to BF16"][2].startswith("not measured")
    # the verdict counts study 10's Holm-corrected verdicts: one GEMM resolved per model, in opposite directions
    assert "gradient: better on 1, worse on 1, unresolved on 2 of 4 comparisons" in table[
        "Random Hadamard transform (Wgrad)"][4]


def _numbers(text: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(r"[+−-]?\d+\.\d+", text)]


def test_components_csv_holds_every_number_the_page_quotes(page):
    """components.csv (6 significant digits) and the page (the values rounded for reading) carry the same numbers:
    each training gap and interval of the page within half a unit of its last printed digit of the CSV's."""
    df, table = page["csv"], _table(page["text"])
    tr = df[(df.level == "training") & df.value.notna()]
    assert len(tr) >= 9
    for _, r in tr.iterrows():
        cell = table[r.component][3]
        got = _numbers(cell.split(" nats/byte")[0].split(": ")[-1])[:3]
        assert np.allclose(got, [r.value, r.ci_low, r.ci_high], rtol=0, atol=0.5e-4 + 1e-7), (r.component, got)
    gr = df[(df.level == "gradient") & df.value.notna()]
    assert len(gr) == 2 * 2 * len(comp.PROBE_LABELS)  # two models × two GEMMs, the step ratios left out
    for _, r in gr.iterrows():
        assert _m(f"{r['item']} {r.value:+.3g}") in table[r.component][2]
    for _, r in df[df.measure == comp.NOT_MEASURED].iterrows():
        assert np.isnan(r.value) and r.source  # why it is missing


def test_a_missing_source_says_not_measured(tmp_path):
    empty = comp.build(tmp_path, comp.load_campaign(tmp_path / "no_campaign"))
    for r in empty:
        for lv in comp.LEVELS:
            assert r.cells[lv].text().startswith("not measured"), (r.label, lv)
        assert r.category == "none"
    # a source that exists but lacks the rows a cell needs
    (tmp_path / "design_space").mkdir()
    pd.DataFrame({"data": ["gaussian"], "block": [16], "scale": ["E4M3 + FP32 tensor scale"], "sqnr_db": [20.0],
                  "flushed_to_zero": [0.0]}).to_csv(tmp_path / "design_space" / "design_space.csv", index=False)
    (tmp_path / "probes").mkdir()
    pd.DataFrame(columns=["model", "component", "gemm", "metric", "mode", "effect", "ci_low", "ci_high", "n",
                          "p_holm", "mde80", "verdict"]).to_csv(tmp_path / "probes" / "probes.csv", index=False)
    out = comp.main(["--out", str(tmp_path)])
    table = _table((out / "section.md").read_text())
    assert list(table) == LABELS
    assert table["Two-level scaling and the tensor scale"][1].startswith("not measured (`design_space/")
    assert all(cells[2].startswith("not measured") for cells in table.values())
    assert table["NVFP4 vs MXFP4"][1] == "not measured (`format_error/format_error.csv` not written)"
    assert "+0.0" in table["Stochastic rounding (gradients)"][3]  # the campaign is still read


def test_the_page_opens_the_index_and_renders_byte_for_byte(tmp_path):
    from studies import run_all

    assert run_all.STUDIES[0] == "components" and "components" in run_all.RUN_LAST
    out = tmp_path / "reports"
    _copy_sources(out)
    for sec in REPORTS.glob("*/section.md"):  # the other studies keep their committed sections
        (out / sec.parent.name).mkdir(exist_ok=True)
        shutil.copy(sec, out / sec.parent.name / "section.md")
    files = ("components/section.md", "components/components.csv", "components/forest.png", "index.md", "index.html")
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-m", "studies.run_all", "--only", "components", "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append({f: (out / f).read_bytes() for f in files})
    assert runs[0] == runs[1]
    index = (out / "index.md").read_text()
    heads = [line for line in index.splitlines() if line.startswith("## ")]
    assert heads[0] == "## What each component buys" and heads[1].startswith("## 1. ")
    assert index.count("## What each component buys") == 1
    html = (out / "index.html").read_text()
    assert html.index("What each component buys") < html.index("1. Format error")
