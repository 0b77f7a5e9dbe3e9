"""The studies' sections say what their data are and what was measured: toy captures are not called real, a
verdict cites the decomposition it rests on, two studies that disagree say so, and superseded figures are gone."""

from __future__ import annotations

from studies.common import REPORTS


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
