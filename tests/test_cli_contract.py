"""The ``fpsim`` command-line contract (docs/analyze.md "Exit codes", docs/oracle.md) over every command and option: an
unexpected exception is one line and exit 3 (never a traceback or exit 1); an option value or combination that
would be ignored is refused; a scheme named twice is one row; a closed pipe ends quietly, a full disk is exit 4
and Ctrl-C exits 130, never read as "different" or "some files unreadable"."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from fpsim_cli.main import main
from tests.cliutil import strict_json

FAST = ["--formats", "nvfp4", "--seeds", "0"]


def invoke(*args):
    r = CliRunner().invoke(main, [*map(str, args)])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def error_lines(r) -> list[str]:
    return [ln for ln in r.output.splitlines() if ln.lower().startswith("error")]


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.npz"
    rng = np.random.default_rng(0)
    np.savez(p, w=rng.standard_normal((8, 32)).astype(np.float32), dx=rng.standard_normal((4, 32)).astype(np.float32))
    return p


# --- analyze --formats: the same scheme twice, or spelt in capitals ----------------------------------------------


@pytest.mark.parametrize("spec", ["nvfp4,nvfp4", "NVFP4,nvfp4", " Nvfp4 "])
def test_a_scheme_named_twice_is_analysed_once_under_its_own_name(good, spec):
    r = invoke("analyze", good, "--formats", spec, "--seeds", "0", "--format", "json")
    assert r.exit_code == 0, r.output
    d = strict_json(r.stdout)
    assert [(row["tensor"][-1], row["scheme"]) for row in d["rows"]] == [("w", "nvfp4"), ("x", "nvfp4")]
    assert sorted(e["tensor"] for e in d["summary"]["ranking"]) == [f"{good.name}:dx", f"{good.name}:w"]


# --- an unexpected exception: one line, exit 3, never a traceback or 1 -------------------------------------------


def test_a_renderer_bug_is_one_line_exit_3_and_leaves_no_file(tmp_path, good, monkeypatch):
    import fpsim_cli.analyze_cmd as ac

    def broken(*a, **k):
        raise KeyError("renderer bug")

    monkeypatch.setattr(ac, "render", broken)
    out = tmp_path / "out.json"
    r = invoke("analyze", good, *FAST, "-o", out)
    assert r.exit_code == 3, r.output
    assert error_lines(r) == ["error: internal error (KeyError: 'renderer bug'): a bug in fpsim; please report it"]
    assert sorted(os.listdir(tmp_path)) == ["good.npz"]  # no output, no temporary file


def test_a_bug_in_formats_is_one_line_exit_3(monkeypatch):
    import fpsim_cli.formats_cmd as fc

    monkeypatch.setattr(fc, "sheet", lambda spec: 1 / 0)
    r = invoke("formats", "e2m1")
    assert r.exit_code == 3 and len(error_lines(r)) == 1 and "internal error (ZeroDivisionError" in r.output


def test_ctrl_c_is_130_not_diffs_different(tmp_path, good, monkeypatch):
    import fpsim_cli.analyze_cmd as ac

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ac, "render", interrupted)
    r = invoke("analyze", good, *FAST)
    assert r.exit_code == 130 and error_lines(r) == ["error: interrupted"], r.output


def _closed_pipe_run(args):
    """Run ``fpsim ARGS`` with stdout a pipe whose reader is already gone: every write is EPIPE."""
    rd, wr = os.pipe()
    os.close(rd)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        p = subprocess.run([sys.executable, "-m", "fpsim", *map(str, args)], stdout=wr, stderr=subprocess.PIPE,
                           env=env, timeout=300)
    finally:
        os.close(wr)
    return p


@pytest.mark.parametrize("args", [["formats", "--format", "markdown"], ["explain", "0.3", "--format", "e2m1"]])
def test_a_closed_stdout_ends_quietly_as_sigpipe_would(args):
    p = _closed_pipe_run(args)
    assert p.returncode == 141 and p.stderr == b"", (p.returncode, p.stderr.decode())


def test_analyze_into_a_closed_pipe_is_not_exit_1(good):
    p = _closed_pipe_run(["analyze", good, *FAST])
    assert p.returncode == 141 and p.stderr == b"", (p.returncode, p.stderr.decode())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["formats"], ["explain", "0.3", "--format", "e2m1"]])
def test_stdout_on_a_full_disk_is_one_line_exit_4(args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "fpsim", *args], stdout=full, stderr=subprocess.PIPE, env=env,
                           timeout=300)
    assert p.returncode == 4, (p.returncode, p.stderr.decode())
    assert p.stderr.decode() == "error: cannot write to stdout (No space left on device)\n"


# --- option values that were accepted, ignored or crashed ---------------------------------------------------------


@pytest.mark.parametrize("value", ["10^999", "2**2000", "nan", "inf", "-inf", "-1", "1e39", "-2^-6"])
def test_scale_min_must_be_a_finite_float32_at_least_0(tmp_path, value):
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    r = invoke("diff", "--input", tmp_path / "x.npz", "--raw-codes", tmp_path / "c.bin", "--raw-scales",
               tmp_path / "s.bin", "--scale-min", value)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "--scale-min" in r.output, r.output
    r = invoke("vectors", "--out", tmp_path / "v", "--scale-min", value)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "--scale-min" in r.output, r.output
    assert not (tmp_path / "v").exists()


def test_empty_output_names_are_refused(tmp_path, good, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("analyze", good, *FAST, "-o", "")
    assert r.exit_code == 2 and r.stdout == "" and "--output" in r.output, r.output
    r = invoke("vectors", "--out", "")
    assert r.exit_code == 2 and "--out" in r.output, r.output
    assert sorted(os.listdir(tmp_path)) == ["good.npz"]  # vectors wrote into the current directory


def test_vectors_out_that_is_a_device_is_a_usage_error(tmp_path):
    r = invoke("vectors", "--out", os.devnull)
    assert r.exit_code == 2 and error_lines(r) == [f"error: --out {os.devnull}: not a directory"], r.output


def test_vectors_element_refuses_dequantize_order(tmp_path):
    r = invoke("vectors", "--element", "e2m1", "--dequantize-order", "pts_s", "--out", tmp_path / "v")
    assert r.exit_code == 2 and "--dequantize-order" in r.output and not (tmp_path / "v").exists(), r.output


@pytest.mark.parametrize("opt", [["--format", "e4m3"], ["--scale", "2"], ["--rounding", "rtz"], ["--no-saturate"],
                                 ["--rounding", "sr", "--sr-bits", "4"], ["--rounding", "sr", "--random", "3"]])
def test_explain_block_refuses_the_value_options_it_would_ignore(tmp_path, opt):
    np.savez(tmp_path / "x.npz", x=np.arange(32, dtype=np.float32))
    r = invoke("explain", "--block", f"{tmp_path / 'x.npz'}:x:0", *opt)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and opt[-2 if len(opt) > 1 else 0] in r.output, r.output


@pytest.mark.parametrize("opt", [["--scheme", "mxfp4"], ["--axis", "0"]])
def test_explain_value_refuses_the_block_options_it_would_ignore(opt):
    r = invoke("explain", "0.3", "--format", "e2m1", *opt)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and opt[0] in r.output, r.output


@pytest.mark.parametrize("idx", ["", "1,2,3", "a", "1.5"])
def test_explain_block_index_that_cannot_be_read_is_usage(tmp_path, idx):
    np.savez(tmp_path / "x.npz", x=np.arange(64, dtype=np.float32).reshape(2, 32))
    r = invoke("explain", "--block", f"{tmp_path / 'x.npz'}:x:{idx}")
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "block index" in r.output, r.output


def test_diff_show_must_not_be_negative(tmp_path):
    r = invoke("diff", "cand.npz", "--input", "x.npz", "--show", "-1")
    assert r.exit_code == 2 and "--show" in r.output, r.output


def _raw(tmp_path):
    import fpsim

    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    q = fpsim.quantize(x, "nvfp4")
    np.asarray(q.data).tofile(tmp_path / "c.bin")
    np.asarray(q.scales).tofile(tmp_path / "s.bin")
    return ["--input", tmp_path / "x.npz", "--raw-codes", tmp_path / "c.bin", "--raw-scales", tmp_path / "s.bin"]


@pytest.mark.parametrize("shape", ["4,-16", "-4,-16", "0,64", ",", "4,16,0"])
def test_diff_shape_with_a_dimension_below_1_says_so(tmp_path, shape):
    r = invoke("diff", *_raw(tmp_path), "--shape", shape)
    assert r.exit_code == 2 and error_lines(r) == [f"error: --shape {shape!r}: give positive integers like 4,32"]


def test_diff_raw_file_that_is_a_directory_or_device_is_not_called_missing(tmp_path):
    args = _raw(tmp_path)
    (tmp_path / "d").mkdir()
    for path, what in ((tmp_path / "d", "a directory"), (os.devnull, "not a regular file")):
        r = invoke("diff", *args[:3], path, *args[4:])
        assert r.exit_code == 2 and f"{path}: {what} (codes)" in r.output and "no such file" not in r.output


def test_workers_and_scheduler_together_are_refused(good):
    r = invoke("analyze", good, *FAST, "--workers", "2", "--scheduler", "tcp://127.0.0.1:1")
    assert r.exit_code == 2 and error_lines(r) == ["error: give --workers or --scheduler, not both"], r.output


# --- the table: a column shown only when a row has something in it ------------------------------------------------


def test_nonfinite_out_column_is_not_shown_for_a_row_that_could_not_be_computed(good):
    r = invoke("analyze", good, *FAST, "--rht", "64")  # 32 columns: the RHT rows cannot be computed
    assert r.exit_code == 0 and "not a multiple of the Hadamard size 64" in r.stdout, r.output
    headers = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  scheme")]
    assert len(headers) == 2 and all("nonfinite_out" not in h for h in headers), headers


def test_ctrl_c_with_workers_cancels_the_queued_batches(tmp_path, monkeypatch):
    """Ctrl-C while --workers N waits: the workers are ended and the batches not started cancelled, exit 130.  The
    workers survived their own KeyboardInterrupt (the pool returns it as a result and runs the next queued batch) and
    the pool's exit waited for every batch: Ctrl-C 8 s into a 36 s run ended it after 34 s."""
    import concurrent.futures as cf

    rng = np.random.default_rng(3)
    np.savez(tmp_path / "g.npz", **{f"g{i}": rng.standard_normal((4, 32)).astype(np.float32) for i in range(6)})
    shutdowns, terminated = [], []

    class Worker:
        def terminate(self):
            terminated.append(self)

    class Interrupted(cf.Future):
        def result(self, timeout=None):
            raise KeyboardInterrupt

    class Pool:
        def __init__(self, *a, **k):
            self._processes = {1: Worker(), 2: Worker()}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.shutdown()

        def submit(self, fn, *args):
            return Interrupted()

        def shutdown(self, wait=True, cancel_futures=False):
            shutdowns.append(cancel_futures)

    monkeypatch.setattr(cf, "ProcessPoolExecutor", Pool)
    r = invoke("analyze", tmp_path / "g.npz", *FAST, "--workers", "2")
    assert r.exit_code == 130 and error_lines(r) == ["error: interrupted"], r.output
    assert shutdowns[0] is True and len(terminated) == 2, (shutdowns, terminated)


@pytest.mark.parametrize("exc, says", [(RuntimeError("a reader bug"), "internal error opening the file, please "
                                        "report it (RuntimeError: a reader bug)"),
                                       (MemoryError(), "out of memory opening the file")])
def test_a_reader_bug_in_a_worker_is_not_called_a_worker_failure(monkeypatch, exc, says):
    # with --workers / --scheduler each batch reopens its file in the worker; a reader that raised there escaped the
    # task, and the run reported "not analysed: its worker failed", though the worker was fine
    import fpsim.io
    from cli import analyze_cmd

    def broken(path, strict=True):
        raise exc

    monkeypatch.setattr(fpsim.io, "open_file", broken)
    items = [("w", "f.npz", None), ("x", "f.npz", None)]
    out = analyze_cmd._task("f.npz", items, -1, {})
    assert out == [([], f"error: f.npz:w: {says}"), ([], f"error: f.npz:x: {says}")]
