"""Study 10 (component probes on real models) renders from the committed probe results: every effect, interval and
Holm-corrected p in its table is the committed components CSV's, re-derived here; the A/A rows are not resolved;
a model without results is left out, not a crash; two renders give the same bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from studies.probes import study

ROOT = Path(__file__).resolve().parents[1]

COMMITTED = [m for m in study.MODELS if (study.DATA / f"{m}.json").exists()]
pytestmark = pytest.mark.skipif(not COMMITTED, reason="no committed probe results")


def _render(tmp_path, data=None):
    if data is not None:
        study.DATA, old = data, study.DATA
    try:
        study.main(["--out", str(tmp_path)])
    finally:
        if data is not None:
            study.DATA = old
    return (tmp_path / "probes" / "section.md").read_text(), pd.read_csv(tmp_path / "probes" / "probes.csv")


def _holm(p):
    order = np.argsort(p)
    out, run = np.empty(len(p)), 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (len(p) - k) * p[i]))
        out[i] = run
    return out


def test_each_effect_is_the_committed_paired_difference_and_holm_is_over_the_study_rows(tmp_path):
    text, df = _render(tmp_path)
    for m in COMMITTED:
        comp = pd.read_csv(study.DATA / f"{m}_components.csv")
        d = df[df["model"] == m]
        assert len(d) >= 10
        for _, r in d.iterrows():
            t = next(t for t in study.TARGETS if t.label == r["component"])
            if r["metric"] == "step_progress":
                src = comp[(comp["component"] == t.component) & (comp["gemm"] == "step")
                           & (comp["mode"] == r["gemm"][len("step ("):-1])]
            else:
                src = comp[(comp["component"] == t.component) & (comp["gemm"] == r["gemm"])
                           & (comp["mode"] == t.mode) & (comp["metric"] == t.metric)]
            assert len(src) == 1
            s = src.iloc[0]
            assert r["effect"] == pytest.approx(s["mean"], rel=1e-5, abs=1e-12)
            assert (pd.isna(r["ci_low"]) and pd.isna(s["ci_low"])) or r["ci_low"] == pytest.approx(s["ci_low"],
                                                                                                 rel=1e-5, abs=1e-12)
        # Holm over this model's rows, recomputed from the components' raw p-values
        raw = []
        for _, r in d.iterrows():
            t = next(t for t in study.TARGETS if t.label == r["component"])
            sel = (comp["component"] == t.component) & ((comp["gemm"] == "step") & (comp["mode"] == r["gemm"][6:-1])
                                                         if r["metric"] == "step_progress" else
                                                         (comp["gemm"] == r["gemm"]) & (comp["mode"] == t.mode)
                                                         & (comp["metric"] == t.metric))
            raw.append(float(comp[sel]["p"].iloc[0]))
        assert np.allclose(d["p_holm"].to_numpy(float), _holm(np.array(raw)), rtol=1e-5)
        aa = d[d["component"] == "A/A (recipe vs itself)"]
        assert not aa.empty and not aa["verdict"].str.startswith("resolved").any()
        resolved = d[d["verdict"].str.startswith("resolved")]
        assert (resolved["p_holm"] < 0.05).all()
        assert study.MODELS[m] in text
    assert "![10. Component probes on real models](probes/forest.png)" in text


def test_a_model_without_results_is_left_out(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    m = COMMITTED[0]
    for f in study.DATA.glob(f"{m}*"):
        shutil.copy(f, data / f.name)
    text, df = _render(tmp_path / "out", data)
    assert set(df["model"]) == {m} and all(study.MODELS[o] not in text for o in study.MODELS if o != m)
    empty = tmp_path / "empty"
    empty.mkdir()
    study.DATA, old = empty, study.DATA
    try:
        path = study.main(["--out", str(tmp_path / "out3")])
    finally:
        study.DATA = old
    assert "No model has been measured yet" in path.read_text()


def test_two_renders_are_byte_identical(tmp_path):
    _render(tmp_path / "a")
    _render(tmp_path / "b")
    for f in ("section.md", "probes.csv", "forest.png"):
        assert (tmp_path / "a" / "probes" / f).read_bytes() == (tmp_path / "b" / "probes" / f).read_bytes(), f


def test_the_probe_benchmark_page_is_rendered_from_the_committed_records():
    """reports/bench_probe.md is what studies.probes.bench renders from the runs' records (no timing asserted)."""
    from studies.probes import bench

    assert (ROOT / "reports" / "bench_probe.md").read_text() == bench.render()
    text = bench.render()
    assert "| all-MiniLM-L6-v2 | full |" in text and "| SmolLM2-135M | report |" in text
