"""`make reports --quick` runs end to end and its CSVs, figures and index.html are deterministic."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).parents[1]


def test_quick_reports_run_and_are_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        p = subprocess.run([sys.executable, "-m", "studies.run_all", "--quick", "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-2000:]
    csvs = sorted(a.glob("*/*.csv"))
    assert csvs, "no study wrote a CSV"
    for c in csvs:
        assert c.read_bytes() == (b / c.relative_to(a)).read_bytes(), f"{c.name} differs between two runs"
        assert len(pd.read_csv(c)) > 0
    pngs = sorted(a.glob("*/*.png"))
    assert pngs, "no study drew a figure"
    for f in pngs:  # figures too (issue 16 item 13): fixed fonts, no metadata, data rounded as the CSVs
        assert f.read_bytes() == (b / f.relative_to(a)).read_bytes(), f"{f.name} differs between two runs"
    assert (a / "index.html").read_bytes() == (b / "index.html").read_bytes()
    html = (a / "index.html").read_text()
    assert html.count("data:image/png;base64,") >= len(csvs) and "<table>" in html
    for sec in a.glob("*/section.md"):
        text = sec.read_text()
        assert "**Paper's claim.**" in text and "**Measured by fpsim.**" in text and "**Verdict.**" in text


def test_scaling_benchmark_runs_and_its_baselines_compute_fpsim_bits(tmp_path):
    """`make bench`'s block-scaling script on a small input: every row is written, and each hand-written
    baseline (plain NumPy, ml_dtypes casts, the NumPy dequantizer) gives the same bits as fpsim."""
    out = tmp_path / "bench.md"
    p = subprocess.run([sys.executable, "-m", "studies.bench.scaling", "--n", str(1 << 16), "--repeat", "1",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    text = out.read_text()
    assert text.count("same bits: True") == 4 and "same bits: False" not in text
    for row in ("| nvfp4 1×16 |", "| nvfp4 16×16 |", "| mxfp4 |", "| mxfp8_e4m3 |"):
        assert row in text
