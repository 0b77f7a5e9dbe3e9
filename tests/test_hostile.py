"""`fpsim analyze` under hostile and real-world files (issue 17): every input generated here, small and fast.

Each test builds the reproduction of one reported defect; every one failed before the fix (a traceback,
a hang, silent garbage or a wrong exit code) and now gives one line naming the file and tensor, the rest
of the run reported, and the documented exit code.
"""

import json
import os
import socket
import stat
import struct
import threading
import zipfile

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from fpsim.analysis import analyze_tensor
from fpsim.io import write_safetensors
from fpsim_cli.main import main

FAST = ["--formats", "nvfp4", "--seeds", "0"]


def run(*args):
    r = CliRunner().invoke(main, ["analyze", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def rows_of(r):
    out = r.stdout
    return json.loads(out[out.index("{"):])["rows"]


def raw_safetensors(path, header: str | bytes | dict, body: bytes = b""):
    """A safetensors file with this header (text, bytes, or an object written as JSON) and body, unchecked."""
    h = json.dumps(header).encode() if isinstance(header, dict) else header.encode() if isinstance(header, str) \
        else header
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)
    return path


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.npz"
    np.savez(p, w=np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    return p


# --- 1. every rank in every container --------------------------------------------------------------


def _save(kind, path, tensors):
    if kind == "safetensors":
        write_safetensors(path, tensors)
    elif kind == "npz":
        np.savez(path, **tensors)
    else:
        torch = pytest.importorskip("torch", reason="torch not installed")
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)


@pytest.mark.parametrize("kind", ["safetensors", "npz", "pt"])
def test_every_rank_in_every_container(tmp_path, kind):
    rng = np.random.default_rng(1)
    t = {"fc.bias": rng.standard_normal(48).astype(np.float32),
         "norm.weight": rng.standard_normal(16).astype(np.float32),
         "act": rng.standard_normal((2, 3, 64)).astype(np.float32),
         "conv.weight": rng.standard_normal((2, 2, 2, 32)).astype(np.float32)}
    p = tmp_path / f"m.{kind}"
    _save(kind, p, t)
    r = run(p, *FAST, "--format", "json")
    assert r.exit_code == 0, r.output
    got = {x["tensor"].split(":")[1]: x for x in rows_of(r)}
    assert {k: v["shape"] for k, v in got.items()} == {"fc.bias": [48], "norm.weight": [16], "act": [2, 3, 64],
                                                        "conv.weight": [2, 2, 2, 32]}
    want = analyze_tensor("act", t["act"], schemes=("nvfp4",))[0]
    assert got["act"]["mse"] == pytest.approx(want["mse"], rel=1e-12)


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_any_axis_equals_moving_the_axis_first(tmp_path, axis):
    x = np.random.default_rng(2).standard_normal((32, 3, 48)).astype(np.float32)
    p = write_or(tmp_path / "a.safetensors", {"x": x})
    r = run(p, *FAST, "--format", "json", "--axis", axis)
    assert r.exit_code == 0, r.output
    want = analyze_tensor("x", np.moveaxis(x, axis, -1), schemes=("nvfp4",))[0]
    row = rows_of(r)[0]
    assert row["shape"] == want["shape"] and row["mse"] == pytest.approx(want["mse"], rel=1e-12)


def write_or(p, t):
    write_safetensors(p, t)
    return p


def test_axis_out_of_range_is_one_line_per_tensor(tmp_path):
    p = write_or(tmp_path / "a.safetensors", {"vec": np.ones(32, np.float32), "mat": np.ones((4, 32), np.float32)})
    r = run(p, *FAST, "--axis", "1")
    assert r.exit_code == 1 and "axis 1 is out of range for a 1-d tensor" in r.output
    assert "a.safetensors:mat" in r.output


# --- 2. one bad file or tensor never loses the run ---------------------------------------------------


def test_npz_member_beside_its_npy_twin(tmp_path):
    p = tmp_path / "twin.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("a", b"not an array")
        with z.open("a.npy", "w") as f:
            np.lib.format.write_array(f, np.ones((2, 16), np.float32))
    r = run(p, *FAST)
    assert r.exit_code == 0 and "member 'a' is not a .npy array" in r.output and "twin.npz:a" in r.output


def test_npz_structured_dtype_and_corrupt_deflate(tmp_path, good):
    s = tmp_path / "struct.npz"
    np.savez(s, rec=np.zeros(4, dtype=[("a", "<i2"), ("b", "<i2")]))
    c = tmp_path / "deflate.npz"
    np.savez_compressed(c, w=np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32))
    b = bytearray(c.read_bytes())
    info = zipfile.ZipFile(c).getinfo("w.npy")
    mid = info.header_offset + 30 + len("w.npy") + info.compress_size // 2
    b[mid : mid + 64] = bytes(64)
    c.write_bytes(bytes(b))
    r = run(good, s, c, *FAST)
    assert r.exit_code == 1, r.output
    assert "struct.npz: member 'rec' has a structured dtype" in r.output
    assert "deflate.npz: member 'w' is truncated or corrupt" in r.output and "good.npz:w" in r.output


@pytest.mark.parametrize("header,msg", [
    ('{"x":{"dtype":"F32","shape":[Infinity],"data_offsets":[0,4]}}', "JSON constant Infinity"),
    ('{"x":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}', "does not fit in 64 bits"),
    ('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,1e400]}}', "an offset is not an integer"),
    ('{"x":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}}', "a dimension is negative"),
    ('{"x":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}}', "overflows 64 bits"),
    ('{"x":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "y": 5}', "'y': entry is not a JSON object"),
], ids=["shape_infinity", "shape_2_64", "offset_1e400", "negative_shape", "shape_overflows_int64", "deep_json",
        "entry_not_object"])
def test_hostile_safetensors_headers(tmp_path, good, header, msg):
    p = raw_safetensors(tmp_path / "bad.safetensors", header, b"\0" * 16)
    r = run(good, p, *FAST)
    assert r.exit_code == 1 and msg in r.output and "bad.safetensors" in r.output and "good.npz:w" in r.output, r.output


def test_lone_surrogate_name_in_table_and_csv(tmp_path):
    body = np.ones(16, np.float32).tobytes()
    p = raw_safetensors(tmp_path / "s.safetensors", '{"w\\ud800":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}',
                        body)
    r = run(p, *FAST)  # the safetensors library refuses a lone surrogate escape: malformed, read only leniently
    assert r.exit_code == 3 and "malformed safetensors: a name or metadata string holds a lone" in r.stderr, r.output
    for fmt in ("table", "csv"):
        r = run(p, *FAST, "--format", fmt, "--lenient")
        assert r.exit_code == 1 and "w\\ud800" in r.stdout, (fmt, r.output)
    assert rows_of(run(p, *FAST, "--format", "json", "--lenient"))[0]["tensor"] == "s.safetensors:w\\ud800"


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_pt_dtypes_numpy_lacks(tmp_path, good):
    torch = pytest.importorskip("torch", reason="torch not installed")
    x = torch.randn(4, 32)
    t = {"fp8": x.to(torch.float8_e4m3fn), "bf16": x.to(torch.bfloat16), "c32": x[:, :16].to(torch.complex32),
         "q8": torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "sp": x.to_sparse()}
    p = tmp_path / "odd.pt"
    torch.save(t, p)
    r = run(good, p, *FAST, "--format", "json")
    assert r.exit_code == 1, r.output
    for name, why in (("c32", "complex32"), ("q8", "quantized tensor"), ("sp", "sparse tensor")):
        assert f"tensor '{name}'" in r.output and why in r.output, (name, r.output)
    names = {x["tensor"] for x in rows_of(r)}
    assert {"good.npz:w", "odd.pt:fp8", "odd.pt:bf16"} <= names
    fp8 = next(x for x in rows_of(r) if x["tensor"] == "odd.pt:fp8")
    want = analyze_tensor("fp8", x.to(torch.float8_e4m3fn).float().numpy(), schemes=("nvfp4",))[0]
    assert fp8["mse"] == pytest.approx(want["mse"], rel=1e-12)


# --- 3. --output never replaces what it must not -----------------------------------------------------


def test_output_refuses_an_input(tmp_path, good):
    before = good.read_bytes()
    r = run(good, *FAST, "--output", good)
    assert r.exit_code == 2 and "refusing to overwrite an input" in r.output and good.read_bytes() == before


def test_output_checked_before_the_analysis(tmp_path, good):
    r = run(good, *FAST, "--output", tmp_path / "no" / "dir" / "r.json")
    assert r.exit_code == 2 and "does not exist" in r.output and "good.npz:w" not in r.output
    r = run(good, *FAST, "--output", tmp_path)
    assert r.exit_code == 2 and "is a directory" in r.output


def test_output_keeps_the_mode_of_the_file_it_replaces(tmp_path, good):
    out = tmp_path / "r.csv"
    out.write_text("old")
    out.chmod(0o640)
    assert run(good, *FAST, "--output", out).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text().startswith("tensor,")
    assert not [q for q in tmp_path.iterdir() if q.name.endswith(".tmp")]


def test_output_writes_through_a_fifo(tmp_path, good):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    got = []
    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    th = threading.Thread(target=read)
    th.start()
    r = run(good, *FAST, "--output", fifo)
    th.join(30)
    assert r.exit_code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode) and got and got[0].startswith(b"tensor,")


def test_full_device_is_exit_4_and_still_a_device(tmp_path, good):
    # a private node of /dev/full's device (1, 7): a regression replaces this one, never the system's
    full = tmp_path / "full"
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot create a device node here ({e.strerror})")
    r = run(good, *FAST, "--output", full)
    assert r.exit_code == 4 and "full: cannot write (No space left on device)" in r.output
    assert stat.S_ISCHR(os.stat(full).st_mode) and not [q for q in tmp_path.iterdir() if q.name.endswith(".tmp")]


def test_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    from fpsim.io import OutputError, atomic_write

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match="r.csv: cannot write \\(No space left on device\\)"):
        atomic_write(tmp_path / "r.csv", "x" * 100)
    assert list(tmp_path.iterdir()) == []


# --- 4. nothing hangs, nothing grows without bound --------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_fifo_and_device_inputs_are_refused_without_opening(tmp_path, good, suffix):
    fifo = tmp_path / f"pipe{suffix}"
    os.mkfifo(fifo)  # opening it for reading would block forever
    zero = tmp_path / f"zero{suffix}"
    zero.symlink_to("/dev/zero")
    r = run(good, fifo, zero, *FAST)
    assert r.exit_code == 1 and "a FIFO, not a regular file" in r.output
    assert "a character device, not a regular file" in r.output and "good.npz:w" in r.output


def test_npz_member_declaring_more_than_deflate_can_inflate(tmp_path, good):
    p = tmp_path / "bomb.npz"
    np.savez_compressed(p, w=np.zeros((64, 64), np.float32))
    b = bytearray(p.read_bytes())
    cd = b.rindex(b"PK\x01\x02")
    struct.pack_into("<L", b, cd + 24, 0xFFFFFF00)  # central directory: uncompressed size ≈ 4 GB
    p.write_bytes(bytes(b))
    r = run(good, p, *FAST)
    assert r.exit_code == 1 and "more than deflate can produce" in r.output


def peak(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_compressed_member_is_read_in_bounded_memory(tmp_path):
    from fpsim.io import open_tensors

    p = tmp_path / "z.npz"
    np.savez_compressed(p, z=np.zeros((2048, 16384), np.float32))  # 128 MiB inflated, ~130 KB on disk
    (ref,) = open_tensors([str(p)])

    def scan():
        src = ref.row_source(-1).as_2d()
        for i in range(0, src.rows, 128):
            assert not src[i : i + 128].any()

    assert peak(scan) < 24 << 20


def test_axis_0_is_read_in_bounded_memory(tmp_path):
    from fpsim.io import open_tensors

    x = np.arange(2048 * 8192, dtype=np.float32).reshape(2048, 8192)  # 64 MiB
    p = write_or(tmp_path / "a.safetensors", {"x": x})
    (ref,) = open_tensors([str(p)])
    src = ref.row_source(0).as_2d()
    assert src.shape == (8192, 2048)
    assert np.array_equal(src[100:103], x[:, 100:103].T)

    def scan():
        for i in range(0, src.rows, 512):
            src[i : i + 512]

    assert peak(scan) < 24 << 20  # 4 MiB chunks (out, runs, transpose) + an 8 MiB read buffer; never 64 MiB


def test_each_file_is_opened_once(tmp_path, monkeypatch):
    import fpsim.io.readers as readers

    n = 200
    t = {f"l{i}.weight": np.full((2, 16), i + 1, np.float32) for i in range(n)}
    st = write_or(tmp_path / "m.safetensors", t)
    npz = tmp_path / "m.npz"
    np.savez(npz, **t)
    calls = {"h": 0, "z": 0}
    real_h, real_z = readers.read_raw_header, readers.npz_members
    monkeypatch.setattr(readers, "read_raw_header", lambda p: (calls.__setitem__("h", calls["h"] + 1), real_h(p))[1])
    monkeypatch.setattr(readers, "npz_members", lambda p: (calls.__setitem__("z", calls["z"] + 1), real_z(p))[1])
    r = run(st, npz, "--formats", "bf16", "--seeds", "0", "--format", "csv")
    assert r.exit_code == 0 and r.stdout.count("\n") == 2 * n + 1
    assert calls == {"h": 1, "z": 1}


def test_pt_is_loaded_once_weights_only_and_its_data_read_in_place(tmp_path, monkeypatch):
    """Dense contiguous tensors: one weights-only load on the meta device (no data), then plain reads of each
    tensor's bytes.  A strided view needs torch to rebuild it: a second, memory-mapped load (still weights-only)."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    from fpsim.io import open_tensors

    seen = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: (seen.append(k), real(*a, **k))[1])
    p = tmp_path / "m.pt"
    torch.save({f"t{i}": torch.ones(2, 16) * i for i in range(20)}, p)
    refs = open_tensors([str(p)])
    assert len(refs) == 20 and all(r.load().sum() == 32 * int(r.name[1:]) for r in refs)
    assert [(k["weights_only"], k["map_location"], k["mmap"]) for k in seen] == [(True, "meta", True)]
    seen.clear()
    q = tmp_path / "v.pt"
    torch.save({"t": torch.arange(32.0).reshape(2, 16).t()}, q)  # a transposed view of its storage
    (ref,) = open_tensors([str(q)])
    np.testing.assert_array_equal(ref.load(), np.arange(32.0, dtype=np.float32).reshape(2, 16).T)
    assert [(k["weights_only"], k["map_location"], k["mmap"]) for k in seen] == [(True, "meta", True),
                                                                                 (True, "cpu", True)]


# --- 6. no silent garbage -------------------------------------------------------------------------


def test_nested_pt_dicts_get_dotted_names_and_non_tensors_a_note(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    p = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {"fc": {"weight": torch.randn(4, 32)}}, "epoch": 3, "opt": [torch.randn(16)]}, p)
    r = run(p, *FAST, "--format", "json")
    assert r.exit_code == 0, r.output
    assert {x["tensor"] for x in rows_of(r)} == {"ckpt.pt:state_dict.fc.weight", "ckpt.pt:opt.0"}
    assert "'epoch' is not a tensor (int)" in r.output


def test_same_basename_in_two_directories_gets_distinct_labels(tmp_path):
    rng = np.random.default_rng(4)
    for d, scale in (("a", 1.0), ("b", 1e-30)):
        (tmp_path / d).mkdir()
        x = rng.standard_t(2, (8, 64)).astype(np.float32) * scale  # b: deep in the subnormal-scale range
        np.savez(tmp_path / d / "x.npz", w=x)
    r = run(tmp_path / "a" / "x.npz", tmp_path / "b" / "x.npz", *FAST, "--format", "json")
    rows = rows_of(r)
    assert {x["tensor"] for x in rows} == {"a/x.npz:w", "b/x.npz:w"}
    ranked = json.loads(r.stdout[r.stdout.index("{"):])["summary"]["ranking"]
    assert {e["tensor"] for e in ranked} == {"a/x.npz:w", "b/x.npz:w"}


def test_roles_come_from_the_tensor_name_not_the_file(tmp_path):
    p = tmp_path / "dx_layer0.npz"
    np.savez(p, weight=np.ones((2, 32), np.float32), dy=np.ones((2, 32), np.float32))
    rows = rows_of(run(p, *FAST, "--format", "json"))
    assert {x["tensor"]: x["role"] for x in rows} == {"dx_layer0.npz:weight": "weight", "dx_layer0.npz:dy": "gradient"}


def test_other_files_in_a_directory_are_counted(tmp_path, good):
    (tmp_path / "README.txt").write_text("hi")
    r = run(tmp_path, *FAST)
    assert r.exit_code == 0 and "1 file(s) whose suffix is not" in r.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can list any directory")
def test_unreadable_directory_is_reported(tmp_path, good):
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        r = run(tmp_path, *FAST)
    finally:
        d.chmod(0o755)
    assert r.exit_code == 1 and "cannot list this directory" in r.output


# --- 7. options are checked up front -------------------------------------------------------------


@pytest.mark.parametrize("opt", [
    ["--keep-above", "nan"], ["--keep-above", "inf"], ["--keep-above", "-0.5"], ["--seeds", "-1"],
    ["--seeds", str(10**9)], ["--workers", "0"], ["--formats", ""], ["--formats", " , "], ["--rht", "12"],
    ["--scheduler", "not a url"], ["--scheduler", "http://localhost:8786"], ["--scheduler", "tcp://host"],
])
def test_bad_options_are_usage_errors(good, opt):
    r = run(good, *opt)
    assert r.exit_code == 2 and "good.npz:w" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.lower().startswith("error")]) == 1


def _server(reply_first: bytes | None, reply_after: bytes | None):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            with c:
                if reply_first:
                    c.sendall(reply_first)
                c.settimeout(2)
                try:
                    c.recv(65536)
                    if reply_after:
                        c.sendall(reply_after)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return s


@pytest.mark.parametrize("first,after", [(b"SSH-2.0-OpenSSH_9.6\r\n", None),
                                         (None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")])
def test_scheduler_that_is_not_dask(good, first, after):
    pytest.importorskip("distributed", reason="dask.distributed not installed")
    s = _server(first, after)
    try:
        r = run(good, *FAST, "--scheduler", f"tcp://127.0.0.1:{s.getsockname()[1]}")
    finally:
        s.close()
    assert r.exit_code == 2 and "Dask scheduler" in r.output, r.output


# --- 8. messages name the file and say why ----------------------------------------------------------


def test_bfloat16_saved_by_numpy_is_read_as_bfloat16(tmp_path):
    x = np.random.default_rng(5).standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    p = tmp_path / "bf.npz"
    np.savez(p, w=x, e=np.zeros(8, ml_dtypes.float8_e4m3fn))
    r = run(p, *FAST, "--format", "json")
    assert r.exit_code == 1 and "bf.npz:w: dtype |V2 read as bfloat16" in r.output
    assert "bf.npz: member 'e'" in r.output and "unnamed 1-byte dtype" in r.output
    want = analyze_tensor("w", x.astype(np.float32), schemes=("nvfp4",))[0]
    assert rows_of(r)[0]["mse"] == pytest.approx(want["mse"], rel=1e-12)


def test_flt_max_under_mxfp4_reports_an_infinite_error(tmp_path):
    p = tmp_path / "big.npz"
    np.savez(p, w=np.full((2, 64), np.finfo(np.float32).max, np.float32))
    r = run(p, "--formats", "mxfp4", "--seeds", "0", "--format", "json")
    assert r.exit_code == 0 and "math domain error" not in r.output
    (row,) = rows_of(r)
    assert row["nonfinite_out_count"] == 128 and row["sqnr_db"] is None and row["notes"]["sqnr_db"]


# --- 9. paths ------------------------------------------------------------------------------------


def test_existing_path_with_glob_characters_is_literal(tmp_path):
    p = tmp_path / "w[1]*?.npz"
    np.savez(p, w=np.ones((2, 16), np.float32))
    r = run(p, *FAST)
    assert r.exit_code == 0 and "w[1]*?.npz:w" in r.output


def test_symlink_loop_and_broken_link_say_what_they_are(tmp_path):
    loop = tmp_path / "loop.npz"
    loop.symlink_to(loop)
    r = run(loop)
    assert r.exit_code == 2 and "symbolic link loop" in r.output
    broken = tmp_path / "gone.npz"
    broken.symlink_to(tmp_path / "nowhere.npz")
    r = run(broken)
    assert r.exit_code == 2 and "broken symbolic link" in r.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can search any directory")
def test_untraversable_directory_is_not_no_such_file(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    np.savez(d / "x.npz", w=np.ones((2, 16), np.float32))
    d.chmod(0o600)
    try:
        r = run(d / "x.npz")
    finally:
        d.chmod(0o755)
    assert r.exit_code == 2 and "permission denied" in r.output


# --- 10. read-only installs -------------------------------------------------------------------------


def test_no_numba_cache_location_compiles_uncached_with_one_warning(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="ZipCacheLocator", PYTHONPATH=str(root))
    env.pop("NUMBA_CACHE_DIR", None)
    code = ("import numpy as np, fpsim; print(fpsim.decode(fpsim.encode(np.float32([1.5, 3.0]), 'e2m1'), 'e2m1'))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "[1.5 3. ]" in p.stdout
    assert p.stderr.count("compiling without a cache") == 1, p.stderr


def test_output_through_a_symlink_keeps_the_link(tmp_path, good):
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert run(good, *FAST, "--output", link).exit_code == 0
    assert link.is_symlink() and target.read_text().startswith("tensor,")


def test_dev_stdout_redirected_to_a_file_is_written_through_not_replaced(tmp_path, good):
    import subprocess
    import sys

    out = tmp_path / "out.csv"
    with open(out, "wb") as f:
        p = subprocess.run([sys.executable, "-m", "fpsim", "analyze", str(good), *FAST, "--output", "/dev/stdout"],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert os.path.islink("/dev/stdout") and "ranking: keep BF16 when" in out.read_text()


def test_no_new_file_under_dev(tmp_path, good):
    target = "/dev/fpsim-test-output.csv"
    try:
        r = run(good, *FAST, "--output", target)
        assert r.exit_code == 2 and "refusing to create a file under /dev" in r.output
        assert not os.path.exists(target)
    finally:
        if os.path.isfile(target):  # a regression must not leave its file in /dev
            os.unlink(target)


def test_help_documents_every_exit_code():
    r = CliRunner().invoke(main, ["analyze", "--help"])
    assert r.exit_code == 0 and all(f"* {c} —" in r.output for c in range(5))


def test_output_refuses_a_corrupt_input_found_in_a_directory(tmp_path, good):
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(b"not a zip at all")
    r = run(tmp_path, *FAST, "--output", bad)
    assert r.exit_code == 2 and "refusing to overwrite an input" in r.output and bad.read_bytes() == b"not a zip at all"
