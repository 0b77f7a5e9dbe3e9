"""Defects found by the audit of the SmolLM2 study (studies/llm/): a relative error of a part without energy, the
SR interval (normal → Student-t), the committed data's one-off edit and the section's wording and units."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from studies.llm import measure
from tests.test_llm_study import planted


def test_rel_is_empty_for_a_part_without_energy():
    rng = np.random.default_rng(1)
    whole = rng.standard_normal((64, 8))
    part = whole[:1] * 1e-8  # a row with ~1e-17 of the tensor's energy: the ratio would divide by ~0
    e = float((whole**2).sum())
    assert math.isnan(measure.rel(part + 1e-3, part, e))
    assert math.isnan(measure.rel(np.ones((1, 8)), np.zeros((1, 8))))
    assert measure.rel(whole[:1] * 1.01, whole[:1], e) == pytest.approx(0.01)
    assert measure.rel(part * 1.01, part) == pytest.approx(0.01)  # no whole given: only an exact 0 is empty


def test_measure_linear_empties_the_sink_token_error_of_a_gradient_without_energy():
    """As q_proj's dY under causal attention: the first token's gradient is ~0 (share ~1e-20 of ‖dY‖²); its
    relative error came out as 1 without RHT and ~1e7 with RHT16 (the tile's error spread back onto ~0)."""
    x, w, dy = planted()
    dy[:: measure.SEQ_LEN] *= 1e-10
    df = {(r["experiment"], r["variant"], r["metric"]): r["value"] for r in measure.measure_linear(0, "q", x, dy, w)}
    for v in ("none", "rht16"):
        assert df[("tokens", v, "grad_output_energy_share_sink_token")] < measure.MIN_ENERGY_SHARE
        assert math.isnan(df[("tokens", v, "grad_output_rel_error_sink_token")])
        assert 0 < df[("tokens", v, "grad_output_rel_error_sink_neighbours")] < 1
        assert 0 <= df[("tokens", v, "input_rel_error_sink_token")] < 1  # X's sink row holds most of ‖X‖²


def _tidy(rows):
    return pd.DataFrame(rows, columns=["layer", "linear", "experiment", "variant", "metric", "value"])


def test_fix_results_rescales_the_interval_and_empties_parts_without_energy():
    from studies.llm.fix_results import fix

    df = _tidy([(0, "q", "sr", "-", "bias_sr", -0.003), (0, "q", "sr", "-", "bias_sr_ci95", 0.001),
                (0, "q", "tokens", "rht16", "grad_output_rel_error_sink_token", 1.2e7),
                (0, "q", "tokens", "rht16", "grad_output_energy_share_sink_token", 3e-19),
                (0, "q", "tokens", "none", "grad_output_rel_error_sink_token", 1.0),
                (0, "q", "tokens", "none", "grad_output_energy_share_sink_token", 3e-19),
                (0, "k", "tokens", "none", "grad_output_rel_error_sink_token", 0.2),
                (0, "k", "tokens", "none", "grad_output_energy_share_sink_token", 9e-6),
                (0, "k", "tokens", "none", "input_rel_error_sink_token", 0.3),
                (0, "k", "tokens", "none", "input_energy_share_sink_token", 2e-13)])
    out, notes = fix(df)
    v = out.value.tolist()
    assert v[1] == pytest.approx(0.001 * 3.182446305 / 1.96)  # t(0.975, 3) for SR_SEEDS = 4 draws
    assert math.isnan(v[2]) and math.isnan(v[4]) and math.isnan(v[8])
    assert v[0] == -0.003 and v[3] == 3e-19 and v[6] == 0.2 and v[7] == 9e-6 and v[9] == 2e-13
    assert [(n["metric"], n["rows"]) for n in notes] == [
        ("bias_sr_ci95", 1), ("grad_output_rel_error_sink_token", 2), ("input_rel_error_sink_token", 1)]
    assert all(n["date"] == "2026-12-04" for n in notes)


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    if not measure.RESULTS.exists():
        pytest.skip("studies/data/llm/smollm2_results.csv not built")
    from studies.llm import study

    out = tmp_path_factory.mktemp("rep")
    text = study.main(["--out", str(out)]).read_text()
    return text, pd.read_csv(measure.RESULTS), study


def test_committed_data_has_no_relative_error_of_a_part_without_energy(section):
    _, df, _ = section
    t = df[df.experiment == "tokens"].pivot_table(index=["layer", "linear", "variant"], columns="metric",
                                                  values="value", dropna=False)
    for c in (c for c in t.columns if "_energy_share_" in c):
        low = t[c] < measure.MIN_ENERGY_SHARE
        assert t.loc[low, c.replace("_energy_share_", "_rel_error_")].isna().all(), c
        assert t.loc[~low, c.replace("_energy_share_", "_rel_error_")].notna().all(), c
    assert df[df.metric.str.contains("_rel_error_")].value.max() < 10
    notes = json.loads((measure.DATA / "smollm2_check.json").read_text())["results_notes"]
    assert {n["metric"] for n in notes} >= {"bias_sr_ci95", "grad_output_rel_error_sink_token"}


def test_section_states_units_intervals_and_the_with_rht_sink_split(section):
    text, df, study = section
    assert "nan" not in text.lower().split() and "nan " not in text.lower() and "nan)" not in text.lower()
    # table: the RHT change in %, with a caption defining every column
    head = "| block | wgrad_rms_rel_error | rht_change_mean_pct | resid_max_first_token |"
    assert head in text
    cap = text[:text.index(head)].rstrip().rsplit("\n", 1)[-1]
    assert "in %" in cap and "`resid_max_first_token` = max |value|" in cap and "SR seed 0" in cap
    full, norht, change, _ = study.rht_numbers(df)
    row0 = text.split(head)[1].splitlines()[2]
    assert row0.split(" | ")[2] == f"{100 * change['wgrad_rel_error'].loc[0].mean():+.1f}"
    # section c: seed 0, no uncertainty; the sink-tile split with RHT too; the empty sink-token errors explained
    c = text[text.index("### c."):text.index("### d.")]
    assert "SR seed 0 only" in c and "no uncertainty" in c
    d_r = full["wgrad_rel_error_no_sink_tiles"] / full["wgrad_rel_error"] - 1
    assert f"by {study._pct(d_r.to_numpy().mean())} with RHT" in c
    assert f"v {study._pct(d_r['v'].mean())}" in c
    assert "are not where the Wgrad error comes from" not in c
    assert "empty for 30 q_proj linears" in c and "gradient is zero up to rounding" in c
    # section d: Student-t half-width from the CSV, zero-in-interval count from the data
    d = text[text.index("### d."):text.index("### e.")]
    sr, ci = (study.pivot(df, "sr", "-", m) for m in ("bias_sr", "bias_sr_ci95"))
    assert "t(0.975, 3) = 3.182" in d and f"≤ {100 * ci.to_numpy().max():.3f} %" in d
    n_in = int((sr.abs() <= ci).to_numpy().sum())
    assert re.search(rf"zero lies inside the interval for {n_in} of", d)
    assert "**Data notes.**" in text and "2026-12-04" in text
