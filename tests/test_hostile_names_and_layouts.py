"""`fpsim analyze` under more hostile inputs: names that are not one printable line, colliding names, corrupt
zip directories, odd output paths, Fortran-ordered members bigger than memory should hold, and files that
shrink while they are read.  Each test failed before its fix (a traceback, a lost tensor, a SIGBUS, a wrong
exit code or an unbounded allocation); all inputs are generated here, small and fast.
"""

import json
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fpsim.io import open_tensors, write_safetensors
from tests.test_hostile import FAST, peak, raw_safetensors, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.npz"
    np.savez(p, w=np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    return p


def messages_are_lines(r) -> None:
    """Every stderr line is an "error:" / "note:" / "wrote" line: nothing a name held split one."""
    for line in r.stderr.splitlines():
        assert line.startswith(("error: ", "note: ", "wrote ")), r.stderr


# --- names: one printable line, distinct within a file ------------------------------------------------


def test_names_with_newlines_and_terminal_escapes_stay_on_one_line(tmp_path, good):
    body = np.random.default_rng(1).standard_normal(33).astype(np.float32).tobytes()
    p = raw_safetensors(tmp_path / "nl.safetensors", {
        "a\nerror: forged": {"dtype": "I32", "shape": [16], "data_offsets": [0, 64]},  # skipped: a note
        "b\nx\u2028y": {"dtype": "F32", "shape": [16], "data_offsets": [64, 128]},  # analysed
        "c\r\x1b]0;title\x07": {"dtype": "F32", "shape": [], "data_offsets": [128, 132]},  # 0-d: a note
    }, body)
    r = run(good, p, *FAST)
    assert r.exit_code == 0, r.output
    messages_are_lines(r)
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]  # the forged one included
    assert "note: skipped nl.safetensors:a\\nerror: forged: not a floating-point tensor" in r.stderr
    assert "nl.safetensors:c\\r\\x1b]0;title\\x07: 0-d tensor" in r.stderr
    assert "nl.safetensors:b\\nx\\u2028y  (activation" in r.stdout and "\x1b" not in r.output
    r = run(good, p, *FAST, "--axis", "1")  # an error line naming the tensor (good's 2-d tensor has axis 1)
    assert r.exit_code == 1 and "error: nl.safetensors:b\\nx\\u2028y: axis 1 is out of range" in r.stderr
    messages_are_lines(r)


def test_pt_names_lone_surrogate_and_collisions_keep_every_tensor(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    p = tmp_path / "s.pt"
    torch.save({"w\ud800": torch.ones(16), 5: torch.full((16,), 1.0), "5": torch.full((16,), 2.0),
                "a.b": torch.full((16,), 3.0), "a": {"b": torch.full((16,), 4.0)}}, p)
    out = tmp_path / "r.json"
    r = run(p, *FAST, "-o", out)  # was: UnicodeEncodeError on writing; "5" and "a.b" dropped as "duplicates"
    assert r.exit_code == 0, r.output
    messages_are_lines(r)
    rows = {x["tensor"]: x for x in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"s.pt:w\\ud800", "s.pt:5", "s.pt:5#2", "s.pt:a.b", "s.pt:a.b#2"}
    assert "s.pt:a.b#2: renamed: an earlier entry of this file is also named 'a.b'" in r.stderr
    assert "duplicate" not in r.stderr
    assert run(p, *FAST).exit_code == 0  # the table on stdout too


def test_npz_member_written_twice_is_an_error_serially_and_in_workers(tmp_path):
    from fpsim_cli.analyze_cmd import _task

    p = tmp_path / "dup.npz"
    rng = np.random.default_rng(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
        with zipfile.ZipFile(p, "w") as z:
            for _ in range(2):
                with z.open("a.npy", "w") as f:
                    np.lib.format.write_array(f, rng.standard_normal((4, 32)).astype(np.float32))
    r = run(p, *FAST, "--format", "csv")
    assert r.exit_code == 1, r.output  # was 0: the second member "skipped: duplicate (given twice)"
    assert "dup.npz: member 'a' appears twice in the archive" in r.stderr
    assert "dup.npz:a," in r.stdout
    # what a worker process runs: the same names, so the readable member is analysed there too (was: the error)
    kw = {"schemes": ("nvfp4",), "rht_d": 0, "seeds": 0, "recipe": None}
    (rows, msg), (_, msg2) = _task(str(p), [("a", "dup.npz", None), ("a#2", "dup.npz", None)], -1, kw)
    assert msg is None and rows[0]["tensor"] == "dup.npz:a" and "appears twice" in msg2


def test_file_name_that_is_not_utf8_is_written_to_output(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    np.savez(d / os.fsdecode(b"\xff.npz"), w=np.ones((4, 32), np.float32))
    out = tmp_path / "r.json"
    r = run(d, *FAST, "-o", out)  # was: UnicodeEncodeError after the analysis, no output
    assert r.exit_code == 0, r.output
    assert [x["tensor"] for x in json.loads(out.read_text())["rows"]] == ["\\udcff.npz:w"]


# --- corrupt files: one line each, the rest still reported ----------------------------------------------


@pytest.mark.parametrize("dtype", [["F32"], {"a": 1}])
def test_safetensors_dtype_that_is_not_a_string(tmp_path, good, dtype):
    p = raw_safetensors(tmp_path / "bad.safetensors", {"x": {"dtype": dtype, "shape": [16], "data_offsets": [0, 64]},
                                                       "y": {"dtype": "F32", "shape": [16], "data_offsets": [64, 128]}},
                        np.ones(32, np.float32).tobytes())
    r = run(good, p, *FAST)  # was: TypeError (unhashable) traceback, nothing reported
    assert r.exit_code == 1 and "bad.safetensors: malformed safetensors: tensor 'x': unsupported dtype" in r.stderr
    assert "good.npz:w" in r.stdout and "bad.safetensors:y" not in r.stdout
    messages_are_lines(r)
    r = run(good, p, *FAST, "--lenient")  # y is still unambiguous
    assert r.exit_code == 1 and "read leniently: 1 tensor(s) whose bytes are unambiguous, not 'x'" in r.stderr
    assert "good.npz:w" in r.stdout and "bad.safetensors:y" in r.stdout
    messages_are_lines(r)


def test_npz_with_corrupt_central_directory(tmp_path, good):
    v = tmp_path / "version.npz"
    np.savez(v, w=np.ones((4, 32), np.float32))
    b = bytearray(v.read_bytes())
    b[b.rindex(b"PK\x01\x02") + 6] = 127  # "version needed to extract" 12.7: zipfile raises NotImplementedError
    v.write_bytes(bytes(b))
    e = tmp_path / "emptyname.npz"
    with zipfile.ZipFile(e, "w") as z:
        z.writestr(zipfile.ZipInfo(""), b"x")  # ZipInfo.is_dir() raises IndexError on an empty name
        with z.open("w.npy", "w") as f:
            np.lib.format.write_array(f, np.ones((4, 32), np.float32))
    r = run(good, v, e, *FAST)
    assert r.exit_code == 1, r.output
    assert "error: " + str(v) + ": not an npz file (bad zip: NotImplementedError)" in r.stderr
    assert "member '' is not a .npy array" in r.stderr and "emptyname.npz:w" in r.stdout and "good.npz:w" in r.stdout


def test_file_shrinking_while_read_names_the_tensor(tmp_path):
    from fpsim_cli.analyze_cmd import _analyze_ref

    p = tmp_path / "t.safetensors"
    write_safetensors(p, {"a": np.ones((64, 64), np.float32), "b": np.ones((64, 64), np.float32)})
    refs = open_tensors([str(p)])
    os.truncate(p, p.stat().st_size - 100)
    kw = {"schemes": ("nvfp4",), "rht_d": 0, "seeds": 0, "recipe": None}
    assert _analyze_ref(refs[0], "t.safetensors", -1, kw, None)[1] is None
    assert _analyze_ref(refs[1], "t.safetensors", -1, kw, None)[1] == "error: t.safetensors:b: tensor data is truncated"


_SHRINK = """
import os, sys, torch
from fpsim.io import InputError, open_tensors
p = sys.argv[1]
torch.save({"a": torch.ones(256, 256), "b": torch.ones(256, 256)}, p)
refs = open_tensors([p])
os.truncate(p, 4096)  # as torch.save does when a training run rewrites its dump in place
try:
    refs[1].row_source(-1)[0:1]
except InputError as e:
    print(e)
"""


def test_pt_truncated_while_analysed_is_an_error_not_a_sigbus(tmp_path):
    pytest.importorskip("torch", reason="torch not installed")
    p = tmp_path / "dump_iter_000001.pt"
    r = subprocess.run([sys.executable, "-c", _SHRINK, str(p)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # was -7: SIGBUS on the memory-mapped storage
    assert r.stdout.strip() == f"{p}:b: tensor data is truncated"


# --- bounded memory ---------------------------------------------------------------------------------


def test_fortran_member_is_read_in_bounded_memory(tmp_path):
    p = tmp_path / "f.npz"
    np.savez_compressed(p, f=np.asfortranarray(np.zeros((2048, 16384), np.float32)))  # 128 MiB, ~130 KB on disk
    (ref,) = open_tensors([str(p)])

    def scan():
        src = ref.row_source(-1).as_2d()
        for i in range(0, src.rows, 128):
            assert not src[i : i + 128].any()

    assert peak(scan) < 24 << 20  # was three whole copies (384 MiB)


@pytest.mark.parametrize("spill", [False, True])
def test_fortran_member_along_every_axis(tmp_path, monkeypatch, spill):
    import fpsim.io.npz as npz

    if spill:
        monkeypatch.setattr(npz, "SPILL_BYTES", 0)  # inflate into a temporary file, read through its mapping
    x = np.asfortranarray(np.random.default_rng(3).standard_normal((5, 6, 32)).astype(np.float32))
    p = tmp_path / "f.npz"
    np.savez_compressed(p, f=x)
    (ref,) = open_tensors([str(p)])
    assert np.array_equal(ref.load(), x)
    for ax in range(-3, 3):
        src = ref.row_source(ax).as_2d()
        got = np.concatenate([src[i : i + 7] for i in range(0, src.rows, 7)])
        assert np.array_equal(got, np.moveaxis(x, ax, -1).reshape(-1, x.shape[ax])), ax


# --- odd values, odd outputs ------------------------------------------------------------------------


def test_float64_beyond_float32_adds_no_warning_lines(tmp_path):
    p = tmp_path / "big.npz"
    np.savez(p, w=np.full((2, 32), 1e300), v=np.random.default_rng(4).standard_normal((2, 32)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = run(p, *FAST)
    assert r.exit_code == 0, r.output
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]


def test_output_name_near_the_length_limit(tmp_path, good):
    out = tmp_path / ("o" * 250 + ".csv")  # a valid 254-byte name; its temporary twin used to exceed 255 bytes
    r = run(good, *FAST, "-o", out)
    assert r.exit_code == 0, r.output  # was 4 (File name too long) after the whole analysis
    assert out.read_text().startswith("tensor,")
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []


def test_output_with_a_trailing_slash_is_refused_before_the_analysis(tmp_path, good):
    out = str(tmp_path / "results") + "/"
    r = run(good, *FAST, "-o", out)  # was: a file "results" written where a directory was meant
    assert r.exit_code == 2 and "names a directory that does not exist" in r.stderr, r.output
    assert not (tmp_path / "results").exists()


def test_float64_beyond_float32_is_counted_in_a_note_on_inf_count():
    """A float64 tensor holding 1e300 has no inf, but the float32 analysis sees one: inf_count says so in a note.
    (Before: inf_count 2 with no word on where the infs came from.)"""
    from fpsim.analysis import analyze_tensor

    x = np.linspace(-1.0, 1.0, 64).reshape(4, 16)
    x[0, 0], x[1, 3] = 1e300, -3.4028235e38  # the second rounds to -FLT_MAX (below FLT_MAX + ½ ulp), not -inf
    x[2, 5] = np.inf  # a real inf is not counted as "beyond float32's range"
    rows = analyze_tensor("t", x, schemes=("nvfp4",))
    assert rows[0]["inf_count"] == 2
    assert rows[0]["notes"]["inf_count"].startswith("includes 1 finite float64 elements beyond float32's range")
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    assert "inf_count" not in analyze_tensor("t", x32, schemes=("nvfp4",))[0]["notes"]  # float32 input: real infs


def test_stride_zero_pt_view_is_refused_not_analysed_for_ever(tmp_path):
    """A (2^40, 16) stride-(0, 1) view of 16 stored elements: 2^44 logical elements from a tiny file. Before, analyze
    set out to read all of them; now the tensor is refused with one line naming it, and the rest is analysed."""
    torch = pytest.importorskip("torch")
    p = tmp_path / "v.pt"
    torch.save({"wide": torch.arange(16.0).expand(1 << 40, 16), "ok": torch.randn(8, 16)}, p)
    r = run(p, *FAST)
    assert r.exit_code == 1, r.output  # EXIT_PARTIAL: one tensor unreadable, the rest reported
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "wide" in err[0] and "stride 0" in err[0]
    assert "v.pt:ok" in r.stdout


# --- .pt containers shared or holding themselves ---------------------------------------------------------------

_SHARED_PT = r"""
import sys, torch, collections
kind, out = sys.argv[1], sys.argv[2]
cyc = [torch.arange(4, dtype=torch.float32)]
for _ in range(30):
    cyc.append(cyc)  # a list holding itself 30 times: 30**64 paths for a walk that does not remember
dag = [torch.ones(4)]
for _ in range(40):
    dag = [dag, dag]  # 40 nested pairs of one list: 2**40 paths
obj = {"cyc": cyc, "dag": dag, "w": torch.zeros(8), "tied": None}
obj["tied"] = obj["w"]  # a tensor held twice (tied weights) is read under both names
if kind == "object":  # a pickled object beside them: the reader that never builds objects takes the file
    obj["o"] = collections.Counter(a=1)
torch.save(obj, out)
"""


@pytest.mark.parametrize("kind", ["plain", "object"])
def test_a_pt_file_holding_a_container_twice_or_in_itself_is_read_once_not_forever(tmp_path, kind):
    """A 2 KB .pt whose lists hold themselves (or one list twice, 40 levels deep) kept `fpsim analyze` walking for
    ever (well past a minute at 100 % CPU): both readers' walks entered a container every time they met it."""
    pytest.importorskip("torch", reason="torch not installed")
    p = tmp_path / f"{kind}.pt"
    subprocess.run([sys.executable, "-c", _SHARED_PT, kind, str(p)], check=True, timeout=120)
    code = ("import sys; from fpsim.io.torchfile import torch_members; m, n = torch_members(sys.argv[1]); "
            "print(sorted(x.name for x in m)); print(len(n)); print(n[0] if n else '')")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    names, count, first = r.stdout.splitlines()
    assert names == str(["cyc.0", "dag" + ".0" * 41, "tied", "w"])
    assert int(count) == 30 + 40 + (kind == "object")  # one note per place a container recurs, and the object
    assert "'cyc.1' is the container 'cyc' again (shared, or a reference cycle)" in first
