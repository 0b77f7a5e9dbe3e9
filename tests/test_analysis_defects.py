"""Issue 16, items 1–5: what `fpsim analyze` prints measures what its label says (one test per defect)."""

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fpsim
from fpsim import analysis, recipe
from fpsim.analysis import METRIC_COLUMNS, analyze_tensor
from tests.cliutil import run, strict_json

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "studies" / "data" / "tinylm_capture.safetensors"




def row_of(rows, scheme):
    return next(r for r in rows if r["scheme"] == scheme)


# --- item 1: saturated and flushed are disjoint --------------------------------------------------------


def test_zero_scale_block_counts_as_flushed_not_saturated():
    """A block whose E4M3 scale underflows to 0 holds the max code but decodes to 0: flushed, not saturated."""
    x = np.zeros((1, 32), np.float32)
    x[0, :16] = 1000.0  # block 0: the tensor amax, exact
    x[0, 16:] = 1e-8  # block 1: s_b = e4m3(1e-8 · 2688/1000/6) = 0
    q = fpsim.quantize(x, "nvfp4")
    assert q.scales.reshape(-1)[1] == 0 and not q.dequantize()[0, 16:].any()
    r = row_of(analyze_tensor("t.weight", x, schemes=("nvfp4",)), "nvfp4")
    assert r["flushed_frac"] == 0.5 and r["saturated_frac"] == 0.0
    assert r["small_scale_block_frac"] == 0.5


def test_bundled_gradient_fractions_add_up():
    rows = analyze_tensor("head.grad_output", _capture("head.grad_output"), schemes=("nvfp4",))
    r = rows[0]
    assert r["flushed_frac"] + r["saturated_frac"] <= 1.0  # were 0.7268 + 0.4808
    assert r["flushed_frac"] > 0.7 and r["saturated_frac"] < 0.05


def _capture(name):
    from fpsim.io import open_tensors

    return np.asarray(next(t for t in open_tensors([str(EXAMPLE)]) if t.name == name).load(), np.float32)


# --- item 2: NaN and inf -------------------------------------------------------------------------------


def test_one_nan_and_one_inf_metrics_over_finite_elements():
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    x[3, 5], x[10, 40] = np.nan, np.inf
    rows = analyze_tensor("l.weight", x, schemes=("nvfp4", "mxfp8_e4m3"))
    nv, mx = row_of(rows, "nvfp4"), row_of(rows, "mxfp8_e4m3")
    assert nv["nan_count"] == 1 and nv["inf_count"] == 1
    # NVFP4: the NaN tensor amax propagates to every element (SPEC §9) and the row says so.
    assert math.isnan(nv["sqnr_db"]) and "amax is NaN" in nv["notes"]["sqnr_db"]
    assert math.isnan(nv["flushed_frac"]) and math.isnan(nv["saturated_frac"])
    assert nv["nonfinite_out_count"] == 64 * 64 - 2
    # MXFP8: only the NaN's block of 32 is lost; the metrics are over the other finite elements.
    assert mx["nonfinite_out_count"] == 31 and "exclude" in mx["notes"]["nonfinite_out_count"]
    assert 15 < mx["sqnr_db"] < 40 and math.isfinite(mx["mse"])  # (the inf's block flushes: scale 2^127)
    assert mx["saturated_frac"] == 0.0  # the inf decodes to 448·2^127 = inf: not clipped


def test_nan_is_never_ranked_best(tmp_path):
    rng = np.random.default_rng(1)
    bad = rng.standard_normal((32, 64)).astype(np.float32)
    bad[0, 0] = np.nan
    p = tmp_path / "t.npz"
    np.savez(p, a_weight=rng.standard_normal((32, 64)).astype(np.float32),
             b_weight=(rng.standard_t(3, (32, 64))).astype(np.float32), bad_weight=bad,
             c_weight=rng.laplace(size=(32, 64)).astype(np.float32))
    r = run(p, "--formats", "nvfp4", "--format", "json", "--seeds", "0", "--keep-above", "0")
    s = strict_json(r.output)["summary"]
    key = [e["bulk_vs_gaussian"] for e in s["ranking"]]
    assert all(isinstance(k, float) for k in key) and key == sorted(key, reverse=True)
    assert [u["tensor"] for u in s["unranked"]] == ["t.npz:bad_weight"] and "NaN" in s["unranked"][0]["reason"]
    assert "t.npz:bad_weight" not in s["keep_bf16"] and len(s["keep_bf16"]) == 3  # every ranked one is above 0


# --- item 3: recipe and RHT rows -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def grad():
    return (np.random.default_rng(2).standard_t(4, (64, 128)) * 1e-3).astype(np.float32)


def test_sr_recipe_rows_report_bias_sr(grad):
    rows = analyze_tensor("l.grad_output", grad, schemes=("nvfp4",), recipe="nvfp4_paper", seeds=3)
    for role in ("dgrad_dy", "wgrad_dy"):
        r = row_of(rows, f"nvfp4_paper:{role}")
        assert math.isnan(r["bias_rne"]) and "SR" in r["notes"]["bias_rne"]
        assert math.isfinite(r["bias_sr"]) and r["bias_sr_ci95"] > 0


def test_wgrad_rows_measure_block_statistics_on_the_rotated_copy(grad):
    """Were saturated 0 and small_scale empty (no block statistics collected for RHT copies)."""
    rows = analyze_tensor("l.grad_output", grad, schemes=("nvfp4",), recipe="nvfp4_paper", seeds=0)
    r = row_of(rows, "nvfp4_paper:wgrad_dy")
    pol = recipe.get_recipe("nvfp4_paper").policy("wgrad_dy")
    copy = np.ascontiguousarray(grad.T)
    xin = fpsim.rht(copy, 16, "recipe")  # what the quantizer sees (the recipe's fixed signs)
    from fpsim.packing import unpack_fp4

    q = recipe.quantize_operand(copy, pol, seed=0, layer="l.grad_output", role="wgrad_dy")
    xq = q.dequantize()
    codes = unpack_fp4(q.data).reshape(xin.shape)
    sat = ((codes & 7) == 7) & (xq != 0) & np.isfinite(xq) & (np.abs(xin) > np.abs(xq))
    assert r["saturated_frac"] == sat.sum() / sat.size > 0
    assert r["flushed_frac"] == ((xin != 0) & (xq == 0)).sum() / (xin != 0).sum()
    assert r["small_scale_block_frac"] is not None and math.isfinite(r["small_scale_block_frac"])


def test_rht_rows_have_their_own_kurtosis(grad):
    rows = analyze_tensor("l.grad_output", grad, schemes=("nvfp4",), rht_d=16)
    plain, rot = row_of(rows, "nvfp4"), row_of(rows, "nvfp4+rht16")
    y = fpsim.rht(grad, 16, "recipe").astype(np.float64)
    want = float(np.mean((y - y.mean()) ** 4) / y.var() ** 2)
    assert math.isclose(rot["kurtosis"], want, rel_tol=1e-9) and not math.isclose(rot["kurtosis"], plain["kurtosis"])


def test_rht_size_that_does_not_divide_gives_rows_with_the_reason(grad):
    rows = analyze_tensor("l.weight", grad, schemes=("nvfp4", "mxfp4"), rht_d=512)
    r = row_of(rows, "nvfp4+rht512")
    assert math.isnan(r["sqnr_db"]) and "not a multiple of the Hadamard size 512" in r["notes"]["sqnr_db"]
    assert {x["scheme"] for x in rows} == {"nvfp4", "mxfp4", "nvfp4+rht512", "mxfp4+rht512"}


# --- item 4: legend, table layout ----------------------------------------------------------------------


def test_every_column_has_a_legend_in_help_and_the_analyze_page():
    """--help prints fpsim.analysis.LEGEND; docs/analyze.md's column table holds it word for word, with a unit."""
    assert set(analysis.LEGEND) == set(METRIC_COLUMNS)
    help_text = " ".join(run("--help").output.split())
    page = (ROOT / "docs" / "analyze.md").read_text()
    for col in METRIC_COLUMNS:
        assert col in help_text, col
        text = analysis.LEGEND[col].replace("|", "\\|")
        assert re.search(rf"^\| `{col}` \| [^|]+ \| {re.escape(text)} \|$", page, re.M), \
            f"docs/analyze.md's legend of {col} differs from fpsim.analysis.LEGEND"
    assert "over the measured non-zero elements" in help_text and "over all elements" in help_text


def test_table_fits_160_columns_and_keep_bf16_is_shown_once_per_tensor():
    r = run(EXAMPLE, "--formats", "nvfp4,mxfp4,mxfp8_e4m3,fp8_e4m3,bf16", "--rht", "16", "--recipe",
            "nvfp4_paper", "--seeds", "2")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(map(len, lines)) <= 160
    headers = [ln for ln in lines if ln.startswith("tinylm_capture.safetensors:")]
    # flagged: the three whose bulk fares > 1.5× worse than a Gaussian's (head/fc2 gradients, head input: 32-73 %
    # of their elements flushed under NVFP4), fpsim.ranking
    flagged = [ln.split()[0] for ln in headers if "→ keep BF16" in ln]
    assert len(headers) == 9 and flagged == ["tinylm_capture.safetensors:fc2.grad_output",
                                             "tinylm_capture.safetensors:head.input",
                                             "tinylm_capture.safetensors:head.grad_output"]
    assert not any("keep" in ln.lower() for ln in lines if ln.startswith("  nvfp4"))


# --- item 5: JSON and CSV types ------------------------------------------------------------------------


def test_json_numbers_are_numbers_or_null_with_a_note(tmp_path):
    x = np.random.default_rng(3).standard_normal((16, 32)).astype(np.float32)
    exact = fpsim.quantize(x, "bf16").dequantize()  # BF16 of a BF16 tensor: exact, zero bias
    p = tmp_path / "e.npz"
    np.savez(p, act=exact, other=x)
    r = run(p, "--formats", "nvfp4,bf16", "--format", "json", "--seeds", "0")
    assert r.exit_code == 0, r.output
    assert "-0.0" not in r.output and '"inf"' not in r.output
    d = strict_json(r.output)
    for row in d["rows"]:
        assert row["shape"] in ([16, 32],) and all(type(n) is int for n in row["shape"])
        for c in METRIC_COLUMNS[5:]:
            assert row[c] is None or type(row[c]) in (int, float), (c, row[c])
            if row[c] is None:
                assert row["notes"][c], c
    ex = next(r for r in d["rows"] if r["tensor"].endswith(":act") and r["scheme"] == "bf16")
    assert ex["sqnr_db"] is None and ex["notes"]["sqnr_db"] == "exact (no error)" and ex["mse"] == 0.0
    assert ex["bias_rne"] == 0.0
    sorted(d["rows"], key=lambda r: (r["sqnr_db"] is None, r["sqnr_db"] or 0.0))  # sortable, no TypeError


def test_csv_empty_cell_and_notes_column(tmp_path):
    x = np.random.default_rng(4).standard_normal((16, 32)).astype(np.float32)
    p = tmp_path / "e.npz"
    np.savez(p, act=fpsim.quantize(x, "bf16").dequantize())
    out = tmp_path / "r.csv"
    assert run(p, "--formats", "nvfp4,bf16", "--seeds", "0", "-o", out).exit_code == 0
    import csv

    cells = [c for row in csv.reader(out.read_text().splitlines()[1:]) for c in row]
    assert not {"-0.0", "nan", "inf", "-inf", "None"} & set(cells)
    df = pd.read_csv(out)
    assert df["sqnr_db"].dtype == np.float64 and pd.api.types.is_string_dtype(df["notes"])
    bf = df[df.scheme == "bf16"].iloc[0]
    assert math.isnan(bf["sqnr_db"]) and "sqnr_db: exact (no error)" in bf["notes"]


# --- item 13: intervals of identical samples -----------------------------------------------------------


def test_interval_of_identical_samples_is_exactly_zero():
    mean_ci95 = analysis.mean_ci95
    v = [0.1 + 0.2] * 6
    assert mean_ci95(v) == (0.1 + 0.2, 0.0)  # the textbook formula gives a residue (5.8e-24 in a report)
    m, h = mean_ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and math.isclose(h, 4.302652729911275 * 1.0 / math.sqrt(3))  # t(0.975, 2 dof), not 1.96
    assert math.isnan(mean_ci95([1.0])[1])
