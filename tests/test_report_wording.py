"""The studies' sections say what their data are and what was measured: toy captures are not called real, a
verdict cites the decomposition it rests on, two studies that disagree say so, and superseded figures are gone."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import matplotlib.text
import numpy as np
import pandas as pd
import pytest

from studies.common import REPORTS

REAL = re.compile(r"\breal\b", re.IGNORECASE)
#: The studies that measure the bundled capture of the toy byte-level MLP LM (studies/capture/example.py).
TOY_CAPTURE_STUDIES = ("format_error", "design_space", "scale_arithmetic", "outliers_rht", "weight_2d",
                       "stochastic_rounding")


def _spy_figures(monkeypatch, module) -> dict[str, list[str]]:
    """Every text drawn in the module's figures (titles, axis labels, tick labels, legends), by file name."""
    texts: dict[str, list[str]] = {}
    save = module.save_fig

    def spy(fig, path):
        save(fig, path)  # drawn: the tick labels exist
        texts[Path(path).name] = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]

    monkeypatch.setattr(module, "save_fig", spy)
    return texts


def _real_cells(csv: Path) -> list[str]:
    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    return [v for v in [*df.columns, *df.to_numpy().ravel()] if REAL.search(v)]


# ============================================================ studies 1-6: the toy LM capture is not "real" data
@pytest.mark.parametrize("name", ["format_error", "design_space", "scale_arithmetic"])
def test_a_study_of_the_toy_capture_does_not_call_it_real(name, tmp_path, monkeypatch):
    module = importlib.import_module(f"studies.report.{name}")
    figures = _spy_figures(monkeypatch, module)
    out = module.main(["--quick", "--out", str(tmp_path)])
    assert not REAL.search((out / "section.md").read_text())
    assert not [p.name for p in out.iterdir() if "real" in p.name]
    for csv in out.glob("*.csv"):
        assert not _real_cells(csv), csv.name
    assert figures
    for fig, texts in figures.items():
        assert not [t for t in texts if REAL.search(t)], fig
    data = pd.read_csv(out / f"{name}.csv").data
    assert data.str.startswith("tinylm:").any(), "the capture's tensors are labelled by their source"


def test_format_error_names_its_capture_figure_and_text_for_the_toy_lm(tmp_path, monkeypatch):
    from studies.report import format_error

    figures = _spy_figures(monkeypatch, format_error)
    out = format_error.main(["--quick", "--out", str(tmp_path)])
    text = (out / "section.md").read_text()
    assert (out / "sqnr_tinylm_capture.png").exists() and "format_error/sqnr_tinylm_capture.png" in text
    assert "toy byte-level MLP language model" in text
    assert any("toy" in t for t in figures["sqnr_tinylm_capture.png"])


@pytest.mark.parametrize("name", TOY_CAPTURE_STUDIES)
def test_committed_reports_of_the_toy_capture_do_not_call_it_real(name):
    d = REPORTS / name
    assert not REAL.search((d / "section.md").read_text())
    assert not [p.name for p in d.iterdir() if "real" in p.name]
    for csv in d.glob("*.csv"):
        assert not _real_cells(csv), csv.name
    studies_1_to_6 = (REPORTS / "index.md").read_text().split("\n## 1. ")[1].split("\n## 7. ")[0]
    assert not REAL.search(studies_1_to_6)


# ============================================================================= study 8: the 1.6 M-token figures
def test_study_8_no_longer_draws_the_superseded_small_lm_figures(tmp_path):
    from studies.report import training

    out = training.main(["--out", str(tmp_path)])
    text = (out / "section.md").read_text()
    committed = (REPORTS / "training" / "section.md").read_text()
    for fig in ("loss_curves.png", "loss_gap.png"):
        assert not (out / fig).exists() and fig not in text, fig
        assert not (REPORTS / "training" / fig).exists() and fig not in committed, fig
    # the earlier runs' numbers stay, as a lesson, and say what replaces them
    assert "1.6 M tokens" in text and "superseded by the paired-seed campaign above" in text


# ====================================================================================== study 9: SmolLM2 wording
def _subsection(text: str, head: str) -> str:
    """One ### sub-section of study 9's section, up to the next heading."""
    return text.split(f"### {head}")[1].split("\n### ")[0].split("\nPer block (")[0]


def _verdict(text: str) -> str:
    return text.split("**Verdict.**")[1]


@pytest.fixture(scope="module")
def smollm2_section(tmp_path_factory):
    from studies.llm import study

    return study.main(["--out", str(tmp_path_factory.mktemp("smollm2"))]).read_text()


def test_9c_states_what_was_measured_not_a_reason_study_4_did_not_isolate(smollm2_section):
    c = _subsection(smollm2_section, "c. Outliers and RHT on Wgrad")
    assert "reason found" not in c and "holds here" not in c
    assert "not isolated here" in (REPORTS / "outliers_rht" / "section.md").read_text()
    verdict = _verdict(c)
    assert "section 4" in verdict and "does not isolate" in verdict
    # what the tokens experiment measured, from the committed results: the sink-token rows' error with and without RHT
    df = pd.read_csv(REPORTS.parent / "studies" / "data" / "llm" / "smollm2_results.csv")
    tok = df[df.experiment == "tokens"]
    for t in ("input", "grad_output"):
        m = tok[tok.metric == f"{t}_rel_error_sink_token"].groupby("variant").value.mean()
        assert f"{m['none']:.3f} → {m['rht16']:.3f}" in verdict, t


def _sr_parts() -> pd.DataFrame:
    """Study 6's exact SR bias of the toy LM's gradients, split by cause (in % of mean|g|), from its committed CSV."""
    d = pd.read_csv(REPORTS / "stochastic_rounding" / "stochastic_rounding.csv")
    b = d[(d.part == "bias") & (d.kind == "grad_output")]
    v = b.pivot_table(index="tensor", columns=["mode", "metric"], values="value")
    sr8 = v[("SR k=8 (exact enumeration)", "aligned_bias_rel_meanabs")]
    return 100 * pd.DataFrame({"sr8": sr8, "clamp": v[("RNE", "aligned_bias_part_clamp")],
                               "flush": v[("RNE", "aligned_bias_part_flush")],
                               "sr_exact": v[("SR exact (expected)", "aligned_bias_rel_meanabs")]})


def test_9d_attributes_no_cause_to_smollm2s_sr_bias_and_cites_the_toy_decomposition(smollm2_section):
    d = _subsection(smollm2_section, "d. Stochastic rounding of gradients")
    assert "what remains is the block-maximum clamp" not in d
    assert "not measured on SmolLM2" in d
    p = _sr_parts()
    # exact SR's expected bias is the clamp part plus the flush part: the decomposition adds up
    assert np.allclose(p.sr_exact, p.clamp + p.flush, atol=1e-3)
    rest = p.sr8 - p.clamp - p.flush
    for lo, hi in ((p.sr8.min(), p.sr8.max()), (p.clamp.min(), p.clamp.max()), (rest.min(), rest.max())):
        assert f"{lo:.2f} to {hi:.2f} %" in d, (lo, hi)
    share = 100 * p.clamp / p.sr8
    assert f"{share.min():.0f}–{share.max():.0f} %" in d


# ======================================================================= studies 7 and 9e: the depth trend of Wgrad
def _depth_r(values) -> float:
    v = np.asarray(values, float)
    return float(np.corrcoef(np.arange(v.size), v)[0, 1])


def _smollm2_block_r() -> float:
    df = pd.read_csv(REPORTS.parent / "studies" / "data" / "llm" / "smollm2_results.csv")
    w = df[(df.experiment == "wgrad") & (df.variant == "nvfp4_paper") & (df.metric == "wgrad_rel_error")]
    return _depth_r(np.sqrt((w.value**2).groupby(w.layer).mean()).sort_index())


def _toy_linear_r(csv: Path) -> float:
    d = pd.read_csv(csv)
    w = d[(d.gemm == "wgrad") & (d.precision == "nvfp4_paper") & (d.metric == "rel_error")].sort_values("index")
    return _depth_r(w.value)


def test_section_7_states_that_smollm2s_depth_trend_points_the_other_way(tmp_path):
    from studies.report import layer_sensitivity

    out = layer_sensitivity.main(["--quick", "--out", str(tmp_path)])
    text = (out / "section.md").read_text()
    r_toy, r_smol = _toy_linear_r(out / "layer_sensitivity.csv"), _smollm2_block_r()
    assert r_toy < 0 < r_smol
    verdict = _verdict(text)
    assert "SmolLM2" in verdict and "opposite" in verdict
    assert f"r = {r_toy:+.2f}" in verdict and f"r = {r_smol:+.2f}" in verdict
    for differs in ("model", "data", "metric"):
        assert differs in verdict.split("SmolLM2", 1)[1]


def test_section_9e_states_that_section_7s_depth_trend_points_the_other_way(smollm2_section):
    e = _verdict(_subsection(smollm2_section, "e. Layer sensitivity"))
    r_toy = _toy_linear_r(REPORTS / "layer_sensitivity" / "layer_sensitivity.csv")
    assert "section 7" in e and "opposite" in e
    assert f"r = {r_toy:+.2f}" in e and f"r = {_smollm2_block_r():+.2f}" in e
    for differs in ("model", "data", "metric"):
        assert differs in e.split("section 7", 1)[1]


def test_committed_sections_7_and_9e_both_state_the_depth_disagreement():
    for text in ((REPORTS / "layer_sensitivity" / "section.md").read_text(),
                 _subsection((REPORTS / "smollm2" / "section.md").read_text(), "e. Layer sensitivity")):
        assert "opposite" in _verdict(text)
