"""Progress on stderr (fpsim_cli.progress): a bar on a terminal, a line per file on a pipe, nothing with -q or on an
in-memory stream, never on stdout; and the cold-kernel-cache note, from Numba's own cache index files."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest

from fpsim_cli import progress
from fpsim_cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def two_files(tmp_path):
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "a.npz", w=rng.standard_normal((4, 32)).astype(np.float32),
             dx=rng.standard_normal((4, 32)).astype(np.float32))
    np.savez(tmp_path / "b.npz", x=rng.standard_normal((4, 32)).astype(np.float32))
    return [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]


def _analyze(monkeypatch, capsys, stderr, args) -> str:
    """``fpsim analyze ARGS --format json`` in this process with ``stderr`` as sys.stderr; its stdout."""
    monkeypatch.setattr(sys, "stderr", stderr)
    with pytest.raises(SystemExit) as e:
        main(["analyze", *args, "--formats", "nvfp4", "--seeds", "0", "--format", "json"])
    assert e.value.code in (0, None)
    return capsys.readouterr().out


def _stream(fd: int):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True)


def _drain(fd: int) -> str:
    """What was written to the other end of ``fd`` (a pty's output reaches its master a moment later)."""
    out = b""
    while select.select([fd], [], [], 0.5)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty master whose slave is closed
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


@pytest.mark.parametrize("size", [(24, 120), (0, 120), (0, 0)])  # a terminal that reports no height or no size too
def test_a_terminal_gets_a_bar_with_rate_and_eta_and_stdout_only_the_result(monkeypatch, capsys, two_files, size):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))  # rows, columns
    try:
        out = _analyze(monkeypatch, capsys, _stream(slave), two_files)
        shown = _drain(master)
    finally:
        os.close(slave)
        os.close(master)
    assert "fpsim analyze" in shown and "/3" in shown and "tensor/s" in shown, shown  # tqdm: n/total, rate, ETA
    assert "<" in shown  # tqdm's [elapsed<remaining] field
    assert len(json.loads(out)["rows"]) == 3 and "tensor/s" not in out


def test_a_pipe_gets_one_line_per_file_and_stdout_only_the_result(monkeypatch, capsys, two_files):
    rd, wr = os.pipe()
    try:
        out = _analyze(monkeypatch, capsys, _stream(wr), two_files)
        os.close(wr)
        wr = None
        lines = [ln for ln in _drain(rd).splitlines() if not ln.startswith("note: compiling")]
    finally:
        os.close(rd)
        if wr is not None:
            os.close(wr)
    assert [ln.split("] ")[1].split(" (")[0] for ln in lines] == ["a.npz", "b.npz"], lines
    assert lines[0].startswith("fpsim analyze: [1/2 files, 2/3 tensors]") and "tensor/s, ETA" in lines[0]
    assert "\r" not in "".join(lines)  # no bar drawing in a log
    assert len(json.loads(out)["rows"]) == 3


def test_quiet_writes_nothing_on_stderr(monkeypatch, capsys, two_files):
    rd, wr = os.pipe()
    try:
        out = _analyze(monkeypatch, capsys, _stream(wr), [*two_files, "-q"])
        os.close(wr)
        wr = None
        assert _drain(rd) == ""
    finally:
        os.close(rd)
        if wr is not None:
            os.close(wr)
    assert len(json.loads(out)["rows"]) == 3


def test_a_stream_in_memory_gets_no_progress():
    assert progress.progress_mode(io.StringIO()) == "off"  # a caller capturing stderr, e.g. click's CliRunner
    assert progress.progress_mode(sys.__stderr__, quiet=True) == "off"


def test_the_compile_note_follows_the_cached_kernel_count(monkeypatch):
    import fpsim._jit as jit

    monkeypatch.setattr(jit, "uncached_kernels", lambda: (82, 82))
    assert progress.compile_note("about 30 s").startswith("note: compiling fpsim's kernels once (about 30 s)")
    master, slave = pty.openpty()
    rd, wr = os.pipe()
    try:  # said on a terminal; not in a log, nor with -q
        assert progress.announce_compile("about 30 s", stream=_stream(slave))
        assert "note: compiling fpsim's kernels once" in _drain(master)
        assert not progress.announce_compile("about 30 s", stream=_stream(wr))
        assert not progress.announce_compile("about 30 s", quiet=True, stream=_stream(slave))
    finally:
        for fd in (master, slave, rd, wr):
            os.close(fd)
    monkeypatch.setattr(jit, "uncached_kernels", lambda: (57, 82))  # after one fpsim analyze: 25 of 82 cached
    assert progress.compile_note("about 30 s") is None


def test_a_fresh_cache_directory_has_every_kernel_uncached_until_one_compiles(tmp_path):
    code = ("import numpy as np, fpsim.scaling, fpsim._jit as j; from fpsim.codecs import encode; "
            "a = j.uncached_kernels(); encode(np.ones(4, np.float32), 'e4m3'); print(*a, *j.uncached_kernels())")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    m0, n0, m1, n1 = map(int, p.stdout.split())
    assert m0 == n0 > 20 and n1 == n0 and 0 < n0 - m1 < n0 // 4, p.stdout


def test_the_probe_writes_a_line_per_pass_on_a_pipe_and_nothing_when_quiet(monkeypatch):
    from fpsim_cli.probe_cmd import ProbeProgress

    for quiet in (False, True):
        rd, wr = os.pipe()
        try:
            monkeypatch.setattr(sys, "stderr", _stream(wr))
            bar = ProbeProgress(2, False, quiet)  # the unit count is an estimate: here one short
            for msg in ("fp32 batch 1", "isolated fc1", "end to end recipe"):
                bar(msg)
            bar.close()
            os.close(wr)
            wr = None
            lines = _drain(rd).splitlines()
        finally:
            os.close(rd)
            if wr is not None:
                os.close(wr)
        if quiet:
            assert lines == []
        else:
            assert [ln.split("] ")[1].split(" (")[0] for ln in lines] == ["fp32 batch 1", "isolated fc1",
                                                                        "end to end recipe"], lines
            assert lines[0].startswith("fpsim probe: [1/2 passes]")
            assert lines[-1].startswith("fpsim probe: [3/3 passes]")
