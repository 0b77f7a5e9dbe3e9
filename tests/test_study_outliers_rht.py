"""Study 4 (outliers and RHT) prints what its labels say: the Gaussian block-kurtosis reference, the placement
intervals over SR seeds, and section numbers that come from the CSV."""

import re

import numpy as np
import pandas as pd
import pytest

from studies.report import outliers_rht as st


def test_gaussian_block_kurtosis_reference_is_the_expectation_of_the_plotted_16_sample_statistic():
    # block_stats' kurtosis is biased for 16 samples: 3n/(n+2) = 8/3, not the population value 3.
    assert st.GAUSS_BLOCK_KURT == pytest.approx(8 / 3)
    x = np.random.default_rng(0).standard_normal((200_000, 16))
    k, _ = st.block_stats(x)
    assert abs(k - 8 / 3) < 0.005  # standard error of the mean ≈ 0.0008 at 200k blocks


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = st.main(["--quick", "--out", str(tmp_path_factory.mktemp("reports"))])
    return pd.read_csv(out / f"{st.NAME}.csv"), (out / "section.md").read_text()


def test_placement_cells_carry_their_95_interval_and_rne_fprop_is_exact(quick):
    df, _ = quick
    gp = df[df.experiment == "gemm_placement"]
    for g in ("fprop", "dgrad", "wgrad"):
        means = gp[gp.metric == f"{g}_rel_error"].set_index(["data", "variant"]).value
        hws = gp[gp.metric == f"{g}_rel_error_ci95"].set_index(["data", "variant"]).value
        assert means.index.equals(hws.index) and (hws >= 0).all()
        changes = gp[gp.metric == f"{g}_change_pct"]
        assert len(changes) == len(means) - means.index.get_level_values("data").nunique()  # all but "none"
    # Fprop uses RNE only and fixed recipe signs: no seed dependence, so its interval is exactly 0.
    assert (gp[gp.metric == "fprop_rel_error_ci95"].value == 0).all()


def test_section_change_table_matches_the_csv_and_marks_changes_within_noise(quick):
    df, text = quick
    gp = df[df.experiment == "gemm_placement"]
    table = text.split("≈0 marks a change whose interval contains 0):")[1].split("\n\n")[1]
    own = {"Wgrad": ("Wgrad (paper)", "wgrad"), "Fprop": ("Fprop", "fprop"), "Dgrad": ("Dgrad", "dgrad")}
    lines = table.splitlines()
    heads = [c.strip().split(" ")[0] for c in lines[0].split("|")[1:-1]]
    for line in lines[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        for head, cell in zip(heads[1:], cells[1:]):
            variant, g = own[head]
            m, hw = (float(v) for v in re.match(r"([+-][\d.]+) ± ([\d.]+) %", cell).groups())
            sel = gp[(gp.data == cells[0]) & (gp.variant == variant)].set_index("metric").value
            assert m == pytest.approx(sel[f"{g}_change_pct"], abs=0.051)
            assert hw == pytest.approx(sel[f"{g}_change_pct_ci95"], abs=0.051)
            assert cell.endswith("≈0") == (abs(sel[f"{g}_change_pct"]) <= sel[f"{g}_change_pct_ci95"])


def test_verdict_words_where_rht_lowers_and_raises_the_error(quick):
    _, text = quick
    verdict = text.split("**Verdict.**")[1]
    assert "no lower NVFP4 error" not in verdict and "No size helps" not in verdict.lower()
    assert "RHT16 lowers the error on the captured weights" in verdict
    assert "It raises it on" in verdict and "captured activations" in verdict
