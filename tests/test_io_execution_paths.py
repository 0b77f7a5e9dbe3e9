"""Readers against independent writers, the execution paths of `fpsim analyze` against each other, and the
Fortran-order npz path; the references are numpy's own reader (np.load), torch's tensors' bytes and the serial
run.  All inputs are generated here, small and fast.
"""

import numpy as np
import pytest

from fpsim.io import open_tensors
from fpsim.io.rows import ArrayStorage, FileStorage, RowSource
from tests.test_hostile import peak, run

# --- Fortran-order npz members ------------------------------------------------------------------------


@pytest.mark.parametrize("spill", [False, True])
def test_fortran_member_is_reordered_once_not_on_every_read(tmp_path, monkeypatch, spill):
    """A Fortran-ordered member was served through a transposed view: every pass of the analysis (moments, amax,
    each scheme) copied it element by element across 8 KiB strides, 3.5x slower than a C-ordered member (46 s
    against 13 s for 1 GiB).  It is now reordered once while inflated, so what the reader holds is C-ordered —
    a plain array in memory or a file read with contiguous reads.  (The structure, not a time, is checked.)"""
    import fpsim.io.npz as npz

    if spill:
        monkeypatch.setattr(npz, "SPILL_BYTES", 0)
    x = np.asfortranarray(np.random.default_rng(0).standard_normal((40, 24, 8)).astype(np.float32))
    np.savez_compressed(tmp_path / "f.npz", f=x)
    (ref,) = open_tensors([str(tmp_path / "f.npz")])
    st = ref.storage()
    if spill:
        assert isinstance(st, FileStorage)
    else:
        assert isinstance(st, ArrayStorage) and st.arr.flags.c_contiguous, st.arr.flags
    assert np.array_equal(ref.load(), x)


@pytest.mark.parametrize("piece", [4, 12, 4 << 20])  # partial rows, rows split across pieces, whole tiles
@pytest.mark.parametrize("spill", [False, True])
def test_fortran_members_are_numpys_bit_for_bit(tmp_path, monkeypatch, spill, piece):
    """Every shape (1-element, zero-size, 2-D to 6-D, tall, wide), float dtype and NaN payload, stored and
    deflated, read whole and along every axis, equals np.load's array byte for byte."""
    import fpsim.io.npz as npz

    monkeypatch.setattr(npz, "_PIECE_BYTES", piece, raising=False)
    if spill:
        monkeypatch.setattr(npz, "SPILL_BYTES", 0)
    rng = np.random.default_rng(1)
    shapes = [(1, 1), (3, 5), (1, 7), (7, 1), (0, 4), (4, 0, 3), (3, 4, 5), (2, 1, 3, 1, 2, 3), (300, 3), (3, 300)]
    for k, shape in enumerate(shapes):
        for dt in (np.float32, np.float64, np.float16):
            bits = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
            x = np.asfortranarray(bits.view(dt).reshape(shape))  # every bit pattern: NaN payloads, -0, subnormals
            p = tmp_path / f"f{k}{np.dtype(dt).char}.npz"
            (np.savez if k % 2 else np.savez_compressed)(p, f=x)
            want = np.load(p)["f"]
            assert want.flags.f_contiguous or x.ndim < 2 or x.size <= 1
            (ref,) = open_tensors([str(p)])
            assert ref.load().tobytes() == np.ascontiguousarray(want).tobytes(), (shape, dt)
            if not x.size:
                continue
            for ax in range(-x.ndim, x.ndim):
                src = ref.row_source(ax).as_2d()
                got = np.concatenate([src[i : i + 5] for i in range(0, src.rows, 5)])
                assert got.tobytes() == np.moveaxis(want, ax, -1).reshape(-1, x.shape[ax]).tobytes(), (shape, ax)


def test_fortran_member_reordering_keeps_memory_bounded(tmp_path):
    """A 128 MiB Fortran member (deflated), reordered into a temporary file and scanned in 8 MiB chunks: the traced
    peak stays far below the member (one 4 MiB piece while reordering; a chunk and its read while scanning)."""
    x = np.zeros((2048, 16384), np.float32, order="F")
    x[::97, ::89] = np.arange(22 * 185, dtype=np.float32).reshape(22, 185)
    p = tmp_path / "f.npz"
    np.savez_compressed(p, f=x)
    (ref,) = open_tensors([str(p)])
    sums = []

    def scan():
        src = ref.row_source(-1).as_2d()
        for i in range(0, src.rows, 128):
            sums.append(src[i : i + 128].sum(dtype=np.float64))

    assert peak(scan) < 28 << 20
    assert sum(sums) == x.sum(dtype=np.float64)


# --- ml_dtypes views --------------------------------------------------------------------------------


def test_float8_e5m2_in_memory_read_along_a_leading_axis():
    """numpy describes ml_dtypes.float8_e5m2 as '<f1', a type string it cannot read back: a tensor held in memory
    (a .pt file with a strided view, F4/F6 safetensors) read along a leading axis in chunks shorter than a slab
    was 'error: data type '<f1' not understood' instead of its values."""
    import ml_dtypes

    rng = np.random.default_rng(2)
    for dt in (ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, np.float16):
        x = rng.standard_normal((6, 40)).astype(dt)
        src = RowSource(ArrayStorage(x), x.shape, axis=0).as_2d()
        got = np.concatenate([src[i : i + 3] for i in range(0, src.rows, 3)])
        assert got.dtype == x.dtype and got.tobytes() == np.ascontiguousarray(x.T).tobytes(), np.dtype(dt)


def test_float8_e5m2_pt_tensor_along_axis_0(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    w = torch.randn(16, 300).to(torch.float8_e5m2)
    p = tmp_path / "e5.pt"
    torch.save({"w": w, "view": torch.randn(8, 16).t()}, p)  # the view makes the file load memory-mapped
    ref = next(r for r in open_tensors([str(p)]) if r.name == "w")
    src = ref.row_source(0).as_2d()
    got = np.concatenate([src[i : i + 7] for i in range(0, src.rows, 7)])
    assert got.view(np.uint8).tobytes() == w.t().contiguous().view(torch.uint8).numpy().tobytes()


# --- execution paths: serial, worker processes, Dask ---------------------------------------------------


FAST = ["--formats", "nvfp4,fp8_e4m3", "--seeds", "0", "--format", "csv"]


def _three_files(tmp_path):
    rng = np.random.default_rng(3)
    for n in "abc":
        np.savez(tmp_path / f"{n}.npz", w=rng.standard_normal((4, 32)).astype(np.float32),
                 bad=rng.standard_normal((4, 32)).astype(np.float32))
    return [tmp_path / f"{n}.npz" for n in "abc"]


def _fail_on_bad(orig):
    def analyze_tensor(name, arr, **kw):
        if name.endswith(":bad"):
            raise RuntimeError("simulated defect\nsecond line")
        return orig(name, arr, **kw)

    return analyze_tensor


def test_a_tensor_failing_unexpectedly_is_one_line_on_every_path(tmp_path, monkeypatch):
    """An exception the analysis does not expect (a defect) on one tensor was a traceback that lost every result,
    serially and on a Dask worker (where the client re-raised it); it is now one error line naming the tensor,
    the same on every path, and the other tensors are reported (exit 1)."""
    import fpsim.analysis


    files = _three_files(tmp_path)
    monkeypatch.setattr(fpsim.analysis, "analyze_tensor", _fail_on_bad(fpsim.analysis.analyze_tensor))
    r = run(*files, *FAST)
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {n}.npz:bad: internal error, please report it (RuntimeError: simulated defect)"
                      for n in "abc"], r.stderr
    assert [ln.split(",")[0] for ln in r.stdout.splitlines()[1:]] == [f"{n}.npz:w" for n in "abc" for _ in (0, 1)]
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        d = run(*files, *FAST, "--scheduler", c.scheduler_address)
    assert (d.exit_code, d.stdout, d.stderr) == (r.exit_code, r.stdout, r.stderr)


def _task_of_a_dying_worker(source, items, axis, kw):
    import os

    if source.endswith("b.npz"):
        os._exit(7)  # what the OOM killer or a segfault does to a worker process
    return _real_task(source, items, axis, kw)


def _real_task(source, items, axis, kw):
    from fpsim.io import open_file
    from fpsim_cli.analyze_cmd import _analyze_ref

    refs = {r.name: r for r in open_file(source)[0]}
    return [_analyze_ref(refs[name], label, axis, kw, role) for name, label, role in items]


class WorkerLost(Exception):
    """What the Dask client raises for a batch whose worker died (KilledWorker) or raised."""


def _every_tensor_once(r, names):
    """Each tensor has its rows or one error line, never both, never neither."""
    rows = {ln.split(",")[0] for ln in r.stdout.splitlines()[1:]}
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    for n in names:
        mine = [e for e in errs if e.startswith(f"error: {n}: ")]
        assert (n in rows) != bool(mine) and len(mine) <= 1, (n, r.output)
    return rows, errs


def test_a_dask_worker_failing_is_one_line_per_tensor_and_the_rest_reported(tmp_path, monkeypatch):
    """A batch whose Dask worker failed (here: the task raises, as the client does with KilledWorker) made the
    client re-raise: a traceback, no results.  Now each of its tensors gets one error line naming the cause and
    the other batches are printed (exit 1)."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    import fpsim_cli.analyze_cmd as cmd


    files = _three_files(tmp_path)

    def task(source, items, axis, kw):
        if source.endswith("b.npz"):
            raise WorkerLost("worker tcp://10.0.0.7:40111 lost")
        return _real_task(source, items, axis, kw)

    monkeypatch.setattr(cmd, "_task", task)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        r = run(*files, *FAST, "--scheduler", c.scheduler_address)
    assert r.exit_code == 1, r.output
    rows, errs = _every_tensor_once(r, [f"{n}.npz:{t}" for n in "abc" for t in ("w", "bad")])
    assert rows == {"a.npz:w", "a.npz:bad", "c.npz:w", "c.npz:bad"}, r.output
    assert errs == [f"error: b.npz:{t}: not analysed: its worker failed (WorkerLost: worker tcp://10.0.0.7:40111 "
                    "lost)" for t in ("w", "bad")], errs


def test_a_worker_process_dying_is_one_line_per_tensor_not_a_traceback(tmp_path, monkeypatch):
    """--workers: a worker process killed (OOM killer, segfault) raised BrokenProcessPool out of the run: a
    traceback, every result lost.  Now each tensor not analysed gets one error line (exit 1); those done are kept."""
    import fpsim_cli.analyze_cmd as cmd


    files = _three_files(tmp_path)
    monkeypatch.setattr(cmd, "_task", _task_of_a_dying_worker)
    r = run(*files, *FAST, "--workers", "2")
    assert r.exit_code == 1, r.output
    rows, errs = _every_tensor_once(r, [f"{n}.npz:{t}" for n in "abc" for t in ("w", "bad")])
    assert not {"b.npz:w", "b.npz:bad"} & rows
    assert all("its worker failed (BrokenProcessPool" in e for e in errs) and len(errs) >= 2, errs


# --- Transformer Engine DumpTensors files: a pickled QuantizedTensor beside the tensor ---------------------


class FakeFloat8Tensor:
    """Pickled as TE's QuantizedTensors are (a class with state: data, scale_inv, dtype); building it would run
    this module's code, which the reader must never do."""

    built = []

    def __init__(self, data, scale_inv):
        self._data, self._scale_inv, self._fp8_dtype = data, scale_inv, "E4M3"

    def __setstate__(self, state):
        FakeFloat8Tensor.built.append(state)
        self.__dict__.update(state)


class Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_te_dump_with_a_pickled_quantized_tensor_keeps_its_high_precision_tensor(tmp_path):
    """TE's DumpTensors (its documented example dumps both) writes {"high_precision": t, "quantized": <pickled
    QuantizedTensor>}: torch's weights-only loader refuses the object, and the whole file was an error, so every
    activation dump of such a run was lost.  The tensors are now read (bit for bit torch's), the object is noted by
    its class name and never built, and a planted reducer never runs."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    g = torch.Generator().manual_seed(5)
    hp = (torch.randn(32, 64, generator=g) * 3).to(torch.bfloat16)
    w = torch.randn(16, 48, generator=g)
    marker = tmp_path / "PWNED"
    p = tmp_path / "decoder_layers_0_mlp_linear_fc1_activation_iter_000007.pt"
    torch.save({"high_precision": hp, "quantized": FakeFloat8Tensor(hp.float().to(torch.float8_e4m3fn),
                                                                    torch.tensor(0.5)),
                "extra": [w.t(), w[2:5], {"planted": Planted(marker)}]}, p)
    FakeFloat8Tensor.built.clear()
    notes, errors = [], []
    refs = {r.name: r for r in open_tensors([str(p)], on_note=notes.append, on_error=errors.append)}
    assert not errors and not marker.exists() and not FakeFloat8Tensor.built
    assert set(refs) == {"high_precision", "extra.0", "extra.1"}
    assert refs["high_precision"].dtype.name == "bfloat16"
    for name, t in (("high_precision", hp), ("extra.0", w.t()), ("extra.1", w[2:5])):
        want = t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().tobytes()
        assert refs[name].load().tobytes() == want, name
        src = refs[name].row_source(0).as_2d()  # along a leading axis, in short chunks
        got = np.concatenate([src[i : i + 5] for i in range(0, src.rows, 5)])
        assert got.tobytes() == t.t().contiguous().view(torch.int16 if t.dtype == torch.bfloat16
                                                        else torch.int32).numpy().tobytes(), name
    assert any("'quantized' is a pickled tests.test_io_execution_paths.FakeFloat8Tensor object, not a tensor" in n
               for n in notes), notes
    assert any("'extra.2.planted' is a pickled" in n and "open object" in n for n in notes), notes
    r = run(p, "--formats", "nvfp4", "--seeds", "0", "--format", "csv")
    assert r.exit_code == 0 and not marker.exists(), r.output
    assert "_iter_000007.pt:high_precision,activation,nvfp4,32x64," in r.stdout


class _CorruptRecord:
    """A tensor-rebuild call whose shape holds a string and a negative dimension: data, not a tensor."""

    def __init__(self, storage, size):
        self.storage, self.size = storage, size

    def __reduce__(self):
        import collections

        import torch

        return (torch._utils._rebuild_tensor_v2, (self.storage, 0, self.size, (2, 1), False, collections.OrderedDict()))


def test_pickle_free_reader_refuses_corrupt_tensor_records(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        st = torch.ones(8).storage()
    p = tmp_path / "c.pt"
    # the object first: torch's loader refuses it (the reader takes over) before it meets the corrupt records
    torch.save({"obj": Planted(tmp_path / "PWNED"), "ok": torch.ones(2, 4), "s": _CorruptRecord(st, ("x", 4)),
                "n": _CorruptRecord(st, (-2, 4))}, p)
    refs = {r.name: r for r in open_tensors([str(p)], on_note=lambda n: None)}
    assert refs["ok"].error is None and refs["ok"].load().tolist() == [[1.0] * 4] * 2
    for k in ("s", "n"):
        assert refs[k].error == f"{p}: tensor {k!r} has a corrupt record (shape, strides or offset)", refs[k].error
    assert not (tmp_path / "PWNED").exists()


def _mixed_corpus(d):
    """NaN/inf, a renamed duplicate (NAME#2), an unreadable tensor between readable ones, skipped tensors (int, 0-d,
    empty), a .pt file with a pickled object beside its tensors, and nested .pt names."""
    import json
    import struct
    import warnings
    import zipfile

    torch = pytest.importorskip("torch", reason="torch not installed")
    rng = np.random.default_rng(9)
    d.mkdir()
    b = rng.standard_normal((4, 48)).astype(np.float32)
    b[0, 3], b[2, 5], b[3, 0] = np.nan, np.inf, -np.inf
    np.savez(d / "a.npz", w=rng.standard_normal((8, 32)).astype(np.float32), grad_x=b, ints=np.arange(32),
             s=np.float32(3), e=np.zeros((0, 16), np.float32))
    h = json.dumps({"first": {"dtype": "F32", "shape": [2, 16], "data_offsets": [0, 128]},
                    "broken": {"dtype": "F32", "shape": [4, 16], "data_offsets": [0, 64]},
                    "last": {"dtype": "F32", "shape": [2, 16], "data_offsets": [128, 256]}}).encode()
    (d / "b.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + rng.standard_normal(64).astype("<f4").tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
        with zipfile.ZipFile(d / "dup.npz", "w") as z:
            for _ in range(2):
                with z.open("a.npy", "w") as f:
                    np.lib.format.write_array(f, rng.standard_normal((4, 32)).astype(np.float32))
    g = torch.Generator().manual_seed(9)
    torch.save({5: torch.randn(16, generator=g), "5": torch.randn(16, generator=g),
                "allnan": torch.full((2, 16), np.nan),
                "sd": {"fc.weight": torch.randn(3, 32, generator=g).to(torch.bfloat16)}}, d / "c.pt")
    torch.save({"high_precision": torch.randn(8, 32, generator=g), "quantized": FakeFloat8Tensor(None, None)},
               d / "l_activation_iter_000003.pt")


def test_serial_workers_and_dask_print_the_same_bytes(tmp_path):
    """The same JSON and CSV, notes, error lines and exit code serially, with --workers 2 and on a Dask cluster."""
    _mixed_corpus(tmp_path / "in")
    args = [tmp_path / "in", "--formats", "nvfp4,mxfp8_e4m3,fp8_e4m3", "--seeds", "2", "--rht", "16"]
    serial = {f: run(*args, "--format", f) for f in ("json", "csv")}
    assert serial["json"].exit_code == 1, serial["json"].output  # the broken tensor and the duplicate member
    assert "error: " in serial["json"].stderr and "#2: renamed" in serial["json"].stderr
    assert "'quantized' is a pickled tests.test_io_execution_paths.FakeFloat8Tensor object" in serial["json"].stderr
    w = run(*args, "--format", "json", "--workers", "2")
    # --workers adds one note of its own (why workers help only where the work is serial); the rest is the same
    stderr = [line for line in w.stderr.splitlines(True) if not line.startswith("note: --workers 2")]
    assert len(w.stderr.splitlines()) == len(stderr) + 1
    assert (w.exit_code, w.stdout, "".join(stderr)) == (1, serial["json"].stdout, serial["json"].stderr)
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        for f, s in serial.items():
            r = run(*args, "--format", f, "--scheduler", c.scheduler_address)
            assert (r.exit_code, r.stdout, r.stderr) == (s.exit_code, s.stdout, s.stderr), f
