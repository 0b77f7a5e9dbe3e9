"""Readers: bounds on memory and work, and the oracle's file loader.  Each defect test failed before its fix.

* rows along a leading axis (``--axis 0`` of a C-ordered tensor) re-read the whole slab for every chunk of rows
  and transposed each chunk in one numpy copy (0.6-1.0 s per scan of 256 MiB against 0.07 s along the last axis);
  values along every axis are checked against numpy's ``moveaxis`` bit for bit, the work by the bytes the process
  reads (``/proc/self/io``) and the memory by tracemalloc's peak — never by a time;
* the oracle's ``load_arrays`` called a directory, ``/dev/null`` or a FIFO "no such file", and one pickled npz
  member made every array of the file unusable;
* legacy (non-zip) ``.pt`` files were read whole by ``torch.load`` (peak resident memory grew by the file's size).
References: numpy's own arrays (``np.moveaxis``, ``np.load``), torch's tensors' bytes (``torch.load``).
"""

import os
import zipfile

import numpy as np
import pytest

import fpsim.io.rows as rows_mod
from fpsim.io import open_tensors, write_safetensors
from fpsim.io.rows import ArrayStorage, FileStorage, RowSource
from tests.test_hostile import peak

# --- rows along a leading axis --------------------------------------------------------------------------------


def _bits(rng, shape, dt) -> np.ndarray:
    """Random bytes viewed as ``dt``: every bit pattern (NaN payloads, -0, subnormals) — compared as bytes."""
    n = int(np.prod(shape)) * np.dtype(dt).itemsize
    return rng.integers(0, 256, size=n, dtype=np.uint8).view(dt).reshape(shape)


def _files(tmp_path, x, tag):
    """x saved as .npz (stored and deflated), .safetensors and .pt (when torch is there): {kind: path}."""
    out = {"npz": tmp_path / f"{tag}.npz", "npzc": tmp_path / f"{tag}c.npz", "st": tmp_path / f"{tag}.safetensors"}
    np.savez(out["npz"], w=x)
    np.savez_compressed(out["npzc"], w=x)
    write_safetensors(out["st"], {"w": x})
    try:
        import torch
    except ImportError:
        return out
    out["pt"] = tmp_path / f"{tag}.pt"
    bf16 = x.dtype.name == "bfloat16"
    t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16) if bf16 else np.ascontiguousarray(x))
    torch.save({"w": t.view(torch.bfloat16) if bf16 else t}, out["pt"])
    return out


# tiles of 1 run (then one step), a few, the default; every run read alone / short strides read in groups; short
# strides read in place (10**12) or from the row-ordered copy (4, which reads whole rows: tiles and runs do not matter)
@pytest.mark.parametrize("tile, run_bytes, copy_after",
                         [(t, r, 10**12) for t in (16, 200, 256 << 10) for r in (0, 16 << 10)]
                         + [(256 << 10, 16 << 10, 4)])
def test_rows_along_every_axis_are_numpys_bit_for_bit(tmp_path, monkeypatch, tile, run_bytes, copy_after):
    """Every axis of 1-D to 4-D tensors (tall, wide, a dimension of 1), float32/float16/bfloat16/float64, every
    storage (a file read in place, an inflated member in memory and spilled to a file), chunks of 1 row, of a few
    rows across slab boundaries, and of everything, equal ``np.moveaxis(x, axis, -1)`` in 2-D byte for byte."""
    import ml_dtypes

    import fpsim.io.npz as npz

    monkeypatch.setattr(rows_mod, "_TILE_BYTES", tile, raising=False)
    monkeypatch.setattr(rows_mod, "_RUN_BYTES", run_bytes, raising=False)
    monkeypatch.setattr(rows_mod, "_COPY_AFTER", copy_after, raising=False)
    rng = np.random.default_rng(7)
    cases = [((37,), np.float32), ((5, 300), np.float16), ((300, 5), np.float32), ((3, 40, 33), ml_dtypes.bfloat16),
             ((2, 1, 17, 50), np.float64), ((64, 48), np.float32), ((1, 70), np.float32), ((70, 1), np.float16)]
    for k, (shape, dt) in enumerate(cases):
        x = _bits(rng, shape, dt)
        for spill in (False, True):
            monkeypatch.setattr(npz, "SPILL_BYTES", 0 if spill else 64 << 20)
            for kind, p in _files(tmp_path, x, f"x{k}{int(spill)}").items():
                (ref,) = open_tensors([str(p)])
                for axis in range(x.ndim):
                    want = np.moveaxis(x, axis, -1).reshape(-1, shape[axis])
                    src = ref.row_source(axis).as_2d()
                    for chunk in (1, 7, src.rows):
                        got = np.concatenate([src[i : i + chunk] for i in range(0, src.rows, chunk)])
                        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (kind, shape, axis, chunk)


def test_storages_in_memory_and_in_a_file_agree_along_every_axis(monkeypatch):
    """The same rows from an in-memory array (contiguous and a strided view) and from a file at an offset."""
    import tempfile

    monkeypatch.setattr(rows_mod, "_TILE_BYTES", 64, raising=False)
    x = _bits(np.random.default_rng(3), (6, 34, 20), np.float32)
    view = np.asfortranarray(x)  # not C-contiguous: ArrayStorage copies only the runs asked for
    with tempfile.TemporaryFile() as f:
        f.write(b"pad" + x.tobytes())
        for st in (ArrayStorage(x), ArrayStorage(view), FileStorage("<tmp>", 3, x.dtype, fileobj=f)):
            for axis in range(3):
                src = RowSource(st, x.shape, axis).as_2d()
                got = np.concatenate([src[i : i + 9] for i in range(0, src.rows, 9)])
                assert got.tobytes() == np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis]).tobytes()


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_rows_along_axis_0_read_each_byte_about_once(tmp_path):
    """--axis 0 of a C-ordered (1024, 8192) float32 tensor in chunks of 1024 rows: each chunk read every K-line of
    the tensor whole (8 KiB strides gathered in 8 MiB reads) to keep a quarter of each — 8 chunks read 256 MiB for
    a 32 MiB tensor, the work growing with the square of the tensor's size.  Now each chunk reads its runs only."""
    x = np.arange(1024 * 8192, dtype=np.float32).reshape(1024, 8192)
    for p in _files(tmp_path, x, "big").values():
        if p.suffix == ".npz" and zipfile.ZipFile(p).infolist()[0].compress_type != zipfile.ZIP_STORED:
            continue  # inflated into memory: no file reads to count
        (ref,) = open_tensors([str(p)])
        src = ref.row_source(0).as_2d()
        before = _bytes_read()
        for i in range(0, src.rows, 1024):
            c = src[i : i + 1024]
            assert c[0, 0] == x[0, i] and c[-1, -1] == x[-1, i + 1023]
        assert _bytes_read() - before < 1.25 * x.nbytes, p  # was 8.0 x


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("room", [True, False])
def test_rows_along_axis_0_with_a_short_stride_read_the_file_once_not_once_a_chunk(tmp_path, monkeypatch, room):
    """--axis 0 of a (8192, 1024) float32 tensor (4 KiB strides) in 8 chunks of 128 rows: a stride that short is
    read whole, so each chunk read the whole tensor (256 MiB for 32 MiB; a 4 GiB [262144, 4096] scan took 195 s,
    against 15 s now).  Now the file is read once into a row-ordered copy in TMPDIR and each chunk is one read of
    it; with no room in TMPDIR the strided reads still give the same rows."""
    if not room:
        monkeypatch.setattr(rows_mod, "temp_file", lambda need, fill: None)
    x = np.arange(8192 * 1024, dtype=np.float32).reshape(8192, 1024)
    p = tmp_path / "short.safetensors"
    write_safetensors(p, {"w": x})
    (ref,) = open_tensors([str(p)])
    src = ref.row_source(0).as_2d()
    before = _bytes_read()
    for i in range(0, src.rows, 128):
        c = src[i : i + 128]
        assert np.array_equal(c, x[:, i : i + 128].T)
    read = _bytes_read() - before
    if room:
        assert read < 2.25 * x.nbytes  # the file once, the copy once (was 8.0 x)
    else:
        assert read > 4 * x.nbytes


def test_rows_along_axis_0_cost_about_one_chunk_of_memory(tmp_path):
    """A 4 MiB chunk of rows along axis 0 held a second copy of itself (the runs before their transpose) and an
    8 MiB gathering buffer (16 MiB traced); now the chunk and a 256 KiB tile."""
    x = np.ones((2048, 2048), np.float32)
    p = tmp_path / "s.safetensors"
    write_safetensors(p, {"w": x})
    (ref,) = open_tensors([str(p)])
    src = ref.row_source(0).as_2d()
    chunk = 512

    def one():
        assert src[0:chunk].all()

    assert peak(one) < 1.5 * chunk * 2048 * 4


def test_the_row_ordered_copy_costs_about_two_chunks_of_memory(tmp_path):
    """The copy of a short-stride tensor is made a tile the size of the request at a time (and its transpose)."""
    x = np.ones((8192, 1024), np.float32)  # 32 MiB, 4 KiB strides
    p = tmp_path / "s.safetensors"
    write_safetensors(p, {"w": x})
    (ref,) = open_tensors([str(p)])
    src = ref.row_source(0).as_2d()
    chunk = 128  # 4 MiB of rows: the copy is made on this first request

    def one():
        assert src[0:chunk].all()

    assert peak(one) < 3.5 * chunk * 8192 * 4
    assert isinstance(src._copy, rows_mod.FileStorage)  # the copy was made (and measured) on that request


# --- the oracle's loader (fpsim diff / explain --block): paths that are not files, pickled members --------------


def _cli(*args):
    from click.testing import CliRunner

    from fpsim_cli.main import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r.exit_code, [ln for ln in r.output.splitlines() if ln.startswith("error")], r.output


class _Planted:
    """Unpickled, it would create the file ``path`` (``open(path, "w")``)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture
def oracle_files(tmp_path):
    import fpsim

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    q = fpsim.quantize(x, "nvfp4")
    np.savez(tmp_path / "good.npz", codes=q.data, scales=q.scales, amax=q.amax)
    return tmp_path


def test_oracle_path_that_is_a_directory_device_or_fifo_says_what_it_is(oracle_files):
    """`fpsim diff --input DIR`, a candidate /dev/null, `explain --block FIFO:x:0` said "no such file" for a path
    that exists; now what it is, as `fpsim analyze` says it (diff: exit 2; explain: exit 1, its unusable input)."""
    from fpsim.oracle import load_arrays

    t = oracle_files
    (t / "d.npz").mkdir()
    os.mkfifo(t / "f.npz")
    cases = ((t / "d.npz", "a directory"), (os.devnull, "a character device"), (t / "f.npz", "a FIFO"))
    for path, what in cases:
        want = f"error: {path}: {what}, not a regular file; refusing to read it"
        assert _cli("diff", t / "good.npz", "--input", path)[:2] == (2, [want])
        assert _cli("diff", path, "--input", t / "x.npz")[:2] == (2, [want])
        assert _cli("explain", "--block", f"{path}:x:0")[:2] == (1, [want])
        with pytest.raises(ValueError, match=what):
            load_arrays(path)
    code, lines, _ = _cli("diff", t / "good.npz", "--input", t / "missing.npz")
    assert code == 2 and lines == [f"error: {t / 'missing.npz'}: no such file or directory"]


def test_one_pickled_npz_member_does_not_make_the_others_unusable(oracle_files):
    """An npz with an object array beside the input: the whole file was "refusing to load pickled data", even for
    `--input F:x`.  Now x is read and only the pickled member is refused (by name) when asked for; it is never
    unpickled (the planted object would create a file)."""
    from fpsim.oracle import load_arrays

    t = oracle_files
    with np.load(t / "x.npz") as z:  # closed here: numpy's NpzFile is freed by the cyclic GC, whose finalizers run
        x = z["x"]  # in any order, so its file could warn "unclosed" in a later test (a flaky failure)
    marker = t / "unpickled"
    np.savez(t / "mixed.npz", x=x, meta=np.array([_Planted(str(marker)), None], dtype=object))
    with np.load(t / "good.npz") as g:
        np.savez(t / "cand.npz", codes=g["codes"], scales=g["scales"], amax=g["amax"],
                 note=np.array([_Planted(str(marker))], dtype=object))
    code, lines, out = _cli("diff", t / "good.npz", "--input", f"{t / 'mixed.npz'}:x")
    assert code == 0 and not lines and "IDENTICAL" in out, out
    code, lines, out = _cli("diff", t / "good.npz", "--input", t / "mixed.npz")  # no name: the key x
    assert code == 0 and not lines, out
    code, lines, out = _cli("diff", t / "cand.npz", "--input", t / "x.npz")  # the candidate's extra member
    assert code == 0 and not lines, out
    code, lines, _ = _cli("diff", t / "good.npz", "--input", f"{t / 'mixed.npz'}:meta")
    assert code == 2 and len(lines) == 1 and "mixed.npz" in lines[0] and "'meta'" in lines[0]
    assert "refusing to load pickled data" in lines[0]
    code, lines, _ = _cli("explain", "--block", f"{t / 'mixed.npz'}:x:0")
    assert code == 0 and not lines
    arrays = load_arrays(t / "mixed.npz")
    assert sorted(arrays) == ["meta", "x"] and "meta" in arrays and np.array_equal(arrays["x"], x)
    with pytest.raises(ValueError, match=r"mixed\.npz: refusing to load pickled data .*member 'meta'"):
        arrays["meta"]
    assert not marker.exists()  # the planted object was never built


# --- legacy (non-zip) .pt files ----------------------------------------------------------------------------------

_LEGACY_RSS = """
import sys
import numpy as np
import torch  # noqa: F401 - imported before the baseline, as the reader imports it
from fpsim.io import open_tensors

def hwm():  # this process's peak resident memory (ru_maxrss would include the parent's, kept across exec)
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024

base = hwm()
(ref,) = open_tensors([sys.argv[1]])
for axis in (-1, 0):
    src = ref.row_source(axis).as_2d()
    step = max(1, (1 << 20) // (4 * src.shape[1]))
    total = 0.0
    for i in range(0, src.rows, step):
        total += float(src[i : i + step].sum(dtype=np.float64))
    assert total == float(src.rows * src.shape[1]), total
print(hwm() - base)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc/self/status")
def test_legacy_pt_is_read_in_bounded_memory(tmp_path):
    """A legacy-format file (torch.save(..., _use_new_zipfile_serialization=False), every file of torch < 1.6) was
    read whole by torch.load (it cannot memory-map that format): 96 MiB of peak memory for a 96 MiB tensor read in
    1 MiB chunks, unbounded for a larger file.  Its storages are now found in the file and read in place."""
    import subprocess
    import sys

    torch = pytest.importorskip("torch", reason="torch not installed")
    p = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3072, 8192)}, p, _use_new_zipfile_serialization=False)  # 96 MiB
    assert p.read_bytes()[:2] != b"PK"
    r = subprocess.run([sys.executable, "-c", _LEGACY_RSS, str(p)], capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-800:]
    assert int(r.stdout.split()[-1]) < 24 << 20, r.stdout  # was 100 MiB


def _legacy_and_zip(tmp_path, obj, name):
    import torch

    out = []
    for legacy in (True, False):
        p = tmp_path / f"{name}{'_legacy' if legacy else ''}.pt"
        torch.save(obj, p, _use_new_zipfile_serialization=not legacy)
        out.append(p)
    return out


def test_legacy_pt_tensors_equal_torchs_bit_for_bit(tmp_path):
    """Nested dicts and lists, tied weights, a slice and a transposed view of a storage, a Parameter, a scalar, an
    empty tensor, float32/64/16, bfloat16, ints and bool, read from the legacy file, equal torch.load's tensors
    (and the zip file's names and notes); float8, which torch writes in the legacy format but cannot read back, is
    read from its bytes."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 40, generator=g)
    obj = {"model": {"fc": {"weight": base, "tied": base, "slice": base[2:5], "t": base.t()},
                     "p": torch.nn.Parameter(torch.randn(3, 7, generator=g))},
           "opt": [torch.randn(5, generator=g).double(), torch.randn(4, 16, generator=g).half(),
                   torch.randn(8, 3, generator=g).bfloat16(), torch.arange(-5, 7, dtype=torch.int32).reshape(3, 4),
                   torch.tensor([True, False, True])],
           "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "step": 7}
    legacy, zipped = _legacy_and_zip(tmp_path, obj, "ckpt")
    want = torch.load(legacy, weights_only=True)
    notes_l, notes_z = [], []
    refs = {r.name: r for r in open_tensors([str(legacy)], on_note=notes_l.append)}
    zrefs = {r.name: r for r in open_tensors([str(zipped)], on_note=notes_z.append)}
    assert sorted(refs) == sorted(zrefs) and len(refs) == 12
    assert [n.replace("ckpt_legacy", "ckpt") for n in notes_l] == notes_z == [f"{zipped}: 'step' is not a tensor (int)"]

    def get(o, dotted):
        for k in dotted.split("."):
            o = o[int(k)] if isinstance(o, list) else o[k]
        return o

    for name, ref in refs.items():
        t = get(want, name).detach()
        raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
        assert ref.error is None and ref.shape == tuple(t.shape), name
        assert ref.load().tobytes() == raw.numpy().tobytes(), name
        if t.ndim:
            for axis in range(t.ndim):
                src = ref.row_source(axis).as_2d()
                got = np.concatenate([src[i : i + 2] for i in range(0, src.rows, 2)]) if src.rows else src[0:0]
                mv = raw.movedim(axis, -1).reshape(-1, t.shape[axis]).numpy() if t.numel() else got
                assert got.tobytes() == mv.tobytes(), (name, axis)
    x8 = torch.randn(4, 32, generator=g).to(torch.float8_e4m3fn)
    (p8,) = _legacy_and_zip(tmp_path, {"x": x8}, "f8")[:1]
    (ref,) = open_tensors([str(p8)])
    assert ref.load().tobytes() == x8.view(torch.uint8).numpy().tobytes()


class _Obj:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_legacy_pt_objects_are_named_never_built_and_damage_is_one_line(tmp_path):
    """A pickled object beside the tensors (here one that would create a file) is noted by its class, never
    built; a legacy file cut short is malformed (torch.load refuses it), and read leniently it names the tensor whose
    bytes are missing and reads the others; a file that is neither format is one line."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    marker = tmp_path / "built"
    p = tmp_path / "obj.pt"
    a, b = torch.arange(64.0).reshape(4, 16), torch.full((4, 16), 3.0)
    torch.save({"a": a, "hook": _Obj(str(marker)), "b": b}, p, _use_new_zipfile_serialization=False)
    notes = []
    refs = {r.name: r for r in open_tensors([str(p)], on_note=notes.append)}
    assert not marker.exists() and sorted(refs) == ["a", "b"]
    assert notes == [f"{p}: 'hook' is a pickled io.open object, not a tensor; fpsim does not unpickle objects"]
    assert np.array_equal(refs["a"].load(), a.numpy()) and np.array_equal(refs["b"].load(), b.numpy())
    raw = p.read_bytes()
    p.write_bytes(raw[:-100])  # the last storage (b, in key order or a) loses its tail
    from fpsim.io import InputError

    with pytest.raises(InputError, match=r"malformed torch file: storage '\d+' is truncated \(156 of 256 bytes\)"):
        open_tensors([str(p)])
    errors = []
    refs = {r.name: r for r in open_tensors([str(p)], on_error=errors.append, strict=False)}
    (good,) = refs
    (bad,) = {"a", "b"} - {good}
    assert len(errors) == 1 and errors[0].endswith(f"1 tensor(s) whose bytes are unambiguous, not {bad!r}")
    assert np.array_equal(refs[good].load(), {"a": a, "b": b}[good].numpy())
    q = tmp_path / "junk.pt"
    q.write_bytes(b"not a torch file at all\n" * 10)
    with pytest.raises(InputError) as e:
        open_tensors([str(q)])
    assert str(e.value).startswith(f"{q}: cannot read as a torch file") and "\n" not in str(e.value)


def test_a_temp_disk_that_fills_while_a_member_inflates_is_not_called_a_corrupt_member(tmp_path, monkeypatch):
    # a deflated member larger than SPILL_BYTES is inflated into an unnamed file in TMPDIR; when that disk filled
    # part-way (ENOSPC from write) the OSError was caught as a bad archive: "member 'w' is truncated or corrupt"
    import errno
    import tempfile

    import fpsim.io.npz as npz_mod

    p = tmp_path / "big.npz"
    np.savez_compressed(p, w=np.arange(4096, dtype=np.float32))
    monkeypatch.setattr(npz_mod, "SPILL_BYTES", 1024)
    real = tempfile.TemporaryFile

    class Full:
        def __init__(self, **kw):
            self.f = real(**kw)

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(tempfile, "TemporaryFile", Full)
    (m,) = open_tensors(str(p))
    from fpsim.io import InputError

    with pytest.raises(InputError, match=r"has not that much free space") as e:
        np.asarray(m.row_source(-1))
    assert "corrupt" not in str(e.value)


@pytest.mark.parametrize("step_elems", [1, 64, 4096])
def test_the_transposing_copy_is_numpys_for_short_and_long_lines(monkeypatch, step_elems):
    """fpsim.io.rows._transpose_into, the one transposing copy of the strided reads and of the row-ordered copy:
    16 lines a step, more where lines are short (at least _STEP_ELEMS elements a step), ragged last steps,
    leading axes, lines of 1; equal numpy's swapaxes byte for byte."""
    monkeypatch.setattr(rows_mod, "_STEP_ELEMS", step_elems)
    rng = np.random.default_rng(3)
    for shape in [(1000, 3), (300, 16), (17, 257), (2, 33, 40), (3, 1, 50), (50, 1), (4, 2, 5, 7)]:
        src = rng.standard_normal(shape).astype(np.float32)
        dst = np.full(shape[:-2] + (shape[-1], shape[-2]), np.nan, np.float32)
        rows_mod._transpose_into(dst, src)
        assert dst.tobytes() == np.ascontiguousarray(src.swapaxes(-1, -2)).tobytes(), shape
