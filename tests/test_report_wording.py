"""The studies' sections say what their data are and what was measured: toy captures are not called real, a
verdict cites the decomposition it rests on, two studies that disagree say so, and superseded figures are gone."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import matplotlib.text
import pandas as pd
import pytest

from studies.common import REPORTS

REAL = re.compile(r"\breal\b", re.IGNORECASE)
#: The studies that measure the bundled capture of the toy byte-level MLP LM (studies/capture_example.py).
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
    module = importlib.import_module(f"studies.{name}")
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
    from studies import format_error

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
    assert not REAL.search((REPORTS / "index.md").read_text().split("## 7.")[0])


# ============================================================================= study 8: the 1.6 M-token figures
def test_study_8_no_longer_draws_the_superseded_small_lm_figures(tmp_path):
    from studies import training

    out = training.main(["--out", str(tmp_path)])
    text = (out / "section.md").read_text()
    committed = (REPORTS / "training" / "section.md").read_text()
    for fig in ("loss_curves.png", "loss_gap.png"):
        assert not (out / fig).exists() and fig not in text, fig
        assert not (REPORTS / "training" / fig).exists() and fig not in committed, fig
    # the earlier runs' numbers stay, as a lesson, and say what replaces them
    assert "1.6 M tokens" in text and "superseded by the paired-seed campaign above" in text
