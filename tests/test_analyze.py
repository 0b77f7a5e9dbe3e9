"""`fpsim analyze`: the bundled example, output formats, every bad-input class, parallel and Dask paths."""

import math
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pandas as pd
import pytest

from fpsim.analysis import analyze_tensor, guess_role
from fpsim.io import InputError, open_tensors, write_safetensors
from tests.cliutil import run, strict_json

EXAMPLE = Path(__file__).parents[1] / "studies" / "data" / "tinylm_capture.safetensors"
FAST = ["--formats", "nvfp4,mxfp8_e4m3", "--seeds", "2"]




@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.safetensors"
    rng = np.random.default_rng(0)
    write_safetensors(p, {"l.weight": rng.standard_normal((32, 48)).astype(np.float32),
                          "l.grad_output": (rng.standard_normal((64, 32)) * 1e-3).astype(ml_dtypes.bfloat16)})
    return p


def test_bundled_example_table():
    r = run(EXAMPLE)
    assert r.exit_code == 0, r.output
    for layer in ("fc1", "fc2", "head"):
        for kind in ("weight", "input", "grad_output"):
            assert f"{layer}.{kind}" in r.output
    assert "ranking: keep BF16 when bulk_rel_error under nvfp4" in r.output and "  1/" in r.output
    assert max(map(len, r.output.splitlines())) <= 160


def test_json_is_valid_and_complete_as_a_subprocess(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "fpsim", "analyze", str(EXAMPLE), "--rht", "16", "--recipe",
                        "nvfp4_paper", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    d = strict_json(out.read_text())
    schemes = {r["scheme"] for r in d["rows"]}
    assert {"nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3", "bf16", "nvfp4+rht16", "nvfp4_paper:fprop_w",
            "nvfp4_paper:wgrad_dy"} <= schemes
    grads = [r for r in d["rows"] if r["role"] == "gradient" and r["scheme"] == "nvfp4"]
    assert len(grads) == 3 and all(r["bias_sr"] is not None and r["bias_sr_ci95"] is not None for r in grads)
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temporary behind


def test_csv_and_markdown_outputs(tmp_path, good):
    out = tmp_path / "r.csv"
    assert run(good, *FAST, "--output", out).exit_code == 0
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df["scheme"]) == {"nvfp4", "mxfp8_e4m3"}
    assert (df["sqnr_db"] > 10).all()
    r = run(good, *FAST, "--format", "markdown")
    assert r.output.startswith("**good.safetensors:") and "| scheme | bits |" in r.output
    assert "**Ranking by bulk error over a Gaussian's**" in r.output


def test_metrics_match_a_direct_computation(good):
    import fpsim

    r = run(good, "--formats", "nvfp4", "--format", "json", "--seeds", "0")
    row = next(x for x in strict_json(r.output)["rows"] if x["tensor"].endswith("l.weight"))
    w = open_tensors([str(good)])[0].load()
    xq = fpsim.quantize(np.asarray(w), "nvfp4").dequantize().astype(np.float64)
    err = np.asarray(w, np.float64) - xq
    assert math.isclose(row["mse"], float(np.mean(err**2)), rel_tol=1e-9)
    assert math.isclose(row["sqnr_db"], 10 * math.log10(np.sum(np.asarray(w, np.float64) ** 2) / np.sum(err**2)),
                        rel_tol=1e-9)
    assert math.isclose(row["max_abs_error"], float(np.abs(err).max()), rel_tol=1e-12)


def test_chunked_analysis_equals_whole_tensor():
    x = np.random.default_rng(1).standard_normal((200, 96)).astype(np.float32)
    x[:, 5] *= 40
    whole = analyze_tensor("t.grad", x, seeds=2, rht_d=16)
    chunked = analyze_tensor("t.grad", x, seeds=2, rht_d=16, chunk_bytes=96 * 4 * 16)
    for a, b in zip(whole, chunked):
        for k in a:
            if isinstance(a[k], float) and math.isnan(a[k]):
                assert math.isnan(b[k]), k
            elif isinstance(a[k], float):
                assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-15), (a["scheme"], k)
            else:
                assert a[k] == b[k], k


# --- bad input, one class per test --------------------------------------------------------------


def test_missing_path_is_a_usage_error(tmp_path):
    r = run(tmp_path / "nope.npz")
    assert r.exit_code == 2 and "no such file or directory" in r.output


def test_not_a_tensor_file_and_unsupported_type(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(os.urandom(100))
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    r = run(junk, txt)
    assert r.exit_code == 3
    assert "not an npz file" in r.output and "unsupported file type" in r.output


def test_truncated_safetensors_keeps_the_other_results(tmp_path, good):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    r = run(good, cut, *FAST)
    assert r.exit_code == 1
    assert "truncated" in r.output and "good.safetensors:l.weight" in r.output


def test_corrupt_safetensors_header(tmp_path):
    bad = tmp_path / "bad.safetensors"
    body = b"{not json at all!!}"
    bad.write_bytes(len(body).to_bytes(8, "little") + body)
    r = run(bad)
    assert r.exit_code == 3 and "bad.safetensors: malformed safetensors: header (not JSON" in r.output


def test_pickled_member_is_refused(tmp_path):
    p = tmp_path / "pickled.npz"
    np.savez(p, ok=np.ones((4, 16), np.float32), evil=np.array([{"a": 1}], dtype=object))
    r = run(p, *FAST)
    assert r.exit_code == 1 and "holds Python objects (a pickle); refusing" in r.output
    assert "pickled.npz:ok" in r.output


@pytest.mark.parametrize(
    "arr,reason",
    [
        (np.array(["a", "b"]), "not a floating-point tensor"),
        (np.arange(32, dtype=np.int32), "not a floating-point tensor"),
        (np.ones(16, np.complex64), "not a floating-point tensor"),
        (np.array(1.5, np.float32), "0-d tensor"),
        (np.zeros((0, 16), np.float32), "empty tensor"),
    ],
)
def test_tensors_skipped_by_design_are_noted(tmp_path, arr, reason):
    p = tmp_path / "t.npz"
    np.savez(p, odd=arr, fine=np.ones((2, 16), np.float32))
    r = run(p, *FAST)
    assert r.exit_code == 0 and "note: skipped t.npz:odd" in r.output and reason in r.output


def test_only_skipped_tensors_means_nothing_analysed(tmp_path):
    p = tmp_path / "t.npz"
    np.savez(p, s=np.array(["x"]))
    assert run(p).exit_code == 3


def test_nan_and_inf_are_reported_not_hidden(tmp_path):
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    x[0, 0], x[1, 1] = np.nan, np.inf
    p = tmp_path / "n.npz"
    np.savez(p, act=x)
    r = run(p, "--formats", "nvfp4", "--format", "json", "--seeds", "0")
    assert r.exit_code == 0
    row = strict_json(r.output)["rows"][0]
    assert row["nan_count"] == 1 and row["inf_count"] == 1 and row["mse"] is None  # NaN propagates (SPEC §9)
    assert "amax is NaN" in row["notes"]["mse"] and row["nonfinite_out_count"] == 126


def test_ragged_shapes_and_high_rank(tmp_path):
    rng = np.random.default_rng(3)
    p = tmp_path / "r.npz"
    np.savez(p, ragged=rng.standard_normal((5, 37)).astype(np.float32),
             cube=rng.standard_normal((2, 3, 64)).astype(np.float16), vec=rng.standard_normal(20).astype(np.float64))
    r = run(p, "--formats", "nvfp4", "--format", "json", "--seeds", "0")
    rows = strict_json(r.output)["rows"]
    assert r.exit_code == 0 and sorted(x["shape"] for x in rows) == [[2, 3, 64], [5, 37], [20]]
    assert all(x["sqnr_db"] > 15 for x in rows)


def test_duplicate_file_is_analysed_once_and_same_names_in_two_files_both(tmp_path, good):
    other = tmp_path / "other.safetensors"
    other.write_bytes(good.read_bytes())
    r = run(good, good, other, *FAST, "--format", "json")
    assert r.exit_code == 0 and "duplicate" in r.output
    d = strict_json(r.output[r.output.index("{"):])
    assert {x["tensor"] for x in d["rows"]} == {"good.safetensors:l.weight", "good.safetensors:l.grad_output",
                                                "other.safetensors:l.weight", "other.safetensors:l.grad_output"}


def test_select_role_override_and_bad_options(good):
    r = run(good, *FAST, "--select", "*weight", "--role", "*weight=gradient", "--format", "json")
    rows = strict_json(r.output)["rows"]
    assert {x["tensor"] for x in rows} == {"good.safetensors:l.weight"} and rows[0]["role"] == "gradient"
    assert run(good, "--formats", "nvfp5").exit_code == 2
    assert run(good, "--role", "x=biases").exit_code == 2
    assert run(good, "--rht", "12").exit_code == 2


def test_guess_role():
    assert guess_role("layers.3.mlp.fc1.weight") == "weight"
    assert guess_role("fc1.grad_output") == "gradient"
    assert guess_role("dY") == "gradient"
    assert guess_role("fc1.input") == "activation"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file; permission errors cannot be produced")
def test_unreadable_file(tmp_path, good):
    good.chmod(0)
    assert run(good).exit_code == 3


def test_open_tensors_raises_input_error_without_callback(tmp_path):
    with pytest.raises(InputError, match="no file matches"):
        open_tensors([str(tmp_path / "*.safetensors")])


# --- scale-out ------------------------------------------------------------------------------------


def test_workers_give_identical_results():
    a = run(EXAMPLE, *FAST, "--format", "csv")
    b = run(EXAMPLE, *FAST, "--format", "csv", "--workers", "2")
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout
    if len(os.sched_getaffinity(0)) >= 2:  # workers within the cores: the note says why they do not make it faster
        assert "one process's kernels already run on all" in b.stderr and "already run" not in a.stderr


def test_dask_cluster_gives_identical_results():
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed (pip install fpsim[dask])")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        a = run(EXAMPLE, *FAST, "--format", "csv")
        b = run(EXAMPLE, *FAST, "--format", "csv", "--scheduler", c.scheduler_address)
    assert a.exit_code == b.exit_code == 0 and a.output == b.output


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8_e4m3", "mxfp6_e3m2", "fp8_e4m3"])
def test_error_and_block_sums_equal_numpy(scheme):
    """The one-pass kernels behind the metrics against NumPy's float64 formulas, with zeros, NaN, ±inf,
    subnormals and a ragged last block; counts exactly, sums to float64 rounding."""
    import fpsim
    from fpsim.analysis import _Acc, _moments
    from fpsim.packing import unpack_fp4

    rng = np.random.default_rng(5)
    x = (rng.standard_t(3, (37, 100)) * 10.0 ** rng.integers(-40, 5, (37, 1))).astype(np.float32)
    x[0, :16] = 0
    x[1, 3], x[2, 50], x[3, 99], x[4, 7] = np.nan, np.inf, -np.inf, 1e-45
    q = fpsim.quantize(x, scheme)
    xq = q.dequantize()
    acc = _Acc()
    acc.add(x, xq, q if q.scheme.block is not None else None)
    with np.errstate(invalid="ignore"):
        m = np.isfinite(x) & np.isfinite(xq)  # the measured elements
        x64, d = x[m].astype(np.float64), x[m].astype(np.float64) - xq[m].astype(np.float64)
        assert acc.measured == int(m.sum()) and acc.nonfinite_out == int((np.isfinite(x) & ~np.isfinite(xq)).sum())
        assert acc.nonzero == int((m & (x != 0)).sum()) and acc.flushed == int((m & (x != 0) & (xq == 0)).sum())
        for got, want in ((acc.sq, np.sum(x64 * x64)), (acc.err_sq, np.sum(d * d)), (acc.err_sum, np.sum(d))):
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=0 if d.size else 1e-300), (got, want)
        # over the measured elements: a NaN input is counted apart
        assert acc.max_abs_err == (float(np.abs(d).max()) if d.size else 0.0)
        if q.scheme.block is not None:
            el = q.scheme.element
            codes = (unpack_fp4(q.data) if el.bits == 4 else q.data).reshape(37, -1)[:, :100]
            top = np.isfinite(xq) & (xq != 0)  # x̂ at the block max with a finite non-zero scale
            sat = ((codes & el.magnitude_mask) == el.max_code) & top & (np.abs(x) > np.abs(xq))
            assert acc.saturated == int(sat.sum())
            bc = q.scheme.block[1]
            a = np.abs(np.pad(x, ((0, 0), (0, -100 % bc)))).reshape(37, -1, bc)
            amax, amin = a.max(axis=-1), np.where(a > 0, a, np.inf).min(axis=-1)
            ok = (amax > 0) & np.isfinite(amin) & np.isfinite(amax)
            assert acc.dyn_n == int(ok.sum())
            assert math.isclose(acc.dyn_sum, float(np.sum(np.log2(amax[ok].astype(np.float64) / amin[ok]))),
                                rel_tol=1e-12)
    fin = x[np.isfinite(x)].astype(np.float64)
    m = _moments(x, 8)
    assert m["nan_count"] == 1 and m["inf_count"] == 2 and m["amax"] == float(np.abs(fin).max())
    assert math.isclose(m["std"], float(fin.std()), rel_tol=1e-9)
    kurt = float(np.mean((fin - fin.mean()) ** 4) / fin.var() ** 2)
    assert math.isclose(m["kurtosis"], kurt, rel_tol=1e-9)
