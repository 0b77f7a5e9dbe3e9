"""fpsim.io against the official formats: safetensors (the `safetensors` package), npz (numpy), row reads along
any axis (against numpy.moveaxis), labels, and the capture's early output check."""

import json
import struct
import tempfile

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stnp
from hypothesis import given
from hypothesis import strategies as st

from fpsim.io import InputError, open_tensors, unique_labels, write_safetensors
from fpsim.io.rows import ArrayStorage, FileStorage, RowSource
from fpsim.io.safetensors import SAFETENSORS_DTYPES, read_entry, read_header

# dtypes numpy (and so safetensors.numpy) can hold, by safetensors code
NUMPY_CODES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
               "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
               "BOOL": np.bool_}


def test_every_numpy_dtype_both_ways_with_the_official_library(tmp_path):
    rng = np.random.default_rng(0)
    t = {c: (rng.standard_normal((3, 5)) * 100).astype(dt) for c, dt in NUMPY_CODES.items()}
    t["scalar"] = np.array(2.5, np.float32)
    t["empty"] = np.zeros((0, 4), np.float32)
    ours = tmp_path / "ours.safetensors"
    write_safetensors(ours, t, {"k": "v"})
    back = stnp.load_file(str(ours))
    assert set(back) == set(t) and all(np.array_equal(back[k], t[k]) and back[k].dtype == t[k].dtype for k in t)
    with safetensors.safe_open(str(ours), "np") as f:
        assert f.metadata() == {"k": "v"}
    theirs = tmp_path / "theirs.safetensors"
    stnp.save_file(t, str(theirs))
    got = {r.name: r.load() for r in open_tensors([str(theirs)])}
    assert set(got) == set(t) and all(np.array_equal(got[k], t[k]) and got[k].dtype == t[k].dtype for k in t)


def test_ml_dtypes_round_trip_and_torch_reads_them(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    import safetensors.torch as stt

    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    t = {c: x.astype(SAFETENSORS_DTYPES[c]) for c in ("BF16", "F8_E4M3", "F8_E5M2")}
    p = tmp_path / "ml.safetensors"
    write_safetensors(p, t)
    back = stt.load_file(str(p))
    for c, a in t.items():
        assert np.array_equal(back[c].float().numpy(), a.astype(np.float32)), c
    assert back["BF16"].dtype == torch.bfloat16 and back["F8_E4M3"].dtype == torch.float8_e4m3fn
    got = {r.name: r.load() for r in open_tensors([str(p)])}
    assert all(got[c].tobytes() == t[c].tobytes() for c in t)


def test_f4_is_packed_as_the_official_library_stores_it(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    import safetensors.torch as stt

    codes = np.arange(32, dtype=np.uint8).reshape(2, 16) % 16
    x = codes.view(ml_dtypes.float4_e2m1fn)
    ours = tmp_path / "f4.safetensors"
    write_safetensors(ours, {"w": x})
    n = struct.unpack("<Q", ours.read_bytes()[:8])[0]
    header = json.loads(ours.read_bytes()[8 : 8 + n])
    assert header["w"] == {"dtype": "F4", "shape": [2, 16], "data_offsets": [0, 16]}
    back = stt.load_file(str(ours))["w"]  # official: float4_e2m1fn_x2, one byte per two elements
    assert back.dtype == torch.float4_e2m1fn_x2 and tuple(back.shape) == (2, 8)
    packed = back.view(torch.uint8).numpy()
    assert np.array_equal(packed & 0xF, codes[:, 0::2]) and np.array_equal(packed >> 4, codes[:, 1::2])
    theirs = tmp_path / "theirs.safetensors"
    stt.save_file({"w": torch.from_numpy(packed.copy()).view(torch.float4_e2m1fn_x2)}, str(theirs))
    (ref,) = open_tensors([str(theirs)])
    assert ref.shape == (2, 16) and ref.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    assert np.array_equal(ref.load().view(np.uint8), codes)


def test_f4_odd_count_is_refused_on_write_and_read(tmp_path):
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        write_safetensors(tmp_path / "x.safetensors", {"w": np.zeros(3, ml_dtypes.float4_e2m1fn)})
    h = b'{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}'
    p = tmp_path / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0\0")
    with pytest.raises(InputError, match="malformed safetensors: tensor 'w': 3 elements of 4 bits are not a whole"):
        open_tensors([str(p)])


@pytest.mark.parametrize("code", ["F6_E2M3", "F6_E3M2"])
def test_f6_is_packed_four_per_three_bytes_and_accepted_by_the_official_parser(tmp_path, code):
    dt = SAFETENSORS_DTYPES[code]
    codes = (np.arange(24, dtype=np.uint8) * 5) % 64
    p = tmp_path / "f6.safetensors"
    write_safetensors(p, {"w": codes.reshape(3, 8).view(dt)})
    (name, info), = safetensors.deserialize(p.read_bytes())  # the official header and size validation
    assert name == "w" and info["dtype"] == code and info["shape"] == [3, 8] and len(info["data"]) == 18
    bits = int.from_bytes(bytes(info["data"]), "little")
    assert [(bits >> (6 * i)) & 63 for i in range(24)] == codes.tolist()
    (ref,) = open_tensors([str(p)])
    assert np.array_equal(ref.load().view(np.uint8).reshape(-1), codes)


def test_one_header_parser_for_everything(tmp_path):
    p = tmp_path / "a.safetensors"
    write_safetensors(p, {"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int16)}, {"m": 1})
    entries, meta = read_header(p)
    assert meta == {"m": "1"} and [e.name for e in entries] == ["a", "b"]
    assert np.array_equal(read_entry(p, entries[1]), np.arange(4, dtype=np.int16))


def test_write_safetensors_refuses_to_overwrite_an_input(tmp_path):
    from fpsim.io import OutputError

    p = tmp_path / "a.safetensors"
    write_safetensors(p, {"a": np.ones(4, np.float32)})
    with pytest.raises(OutputError, match="refusing to overwrite an input"):
        write_safetensors(p, {"a": np.zeros(4, np.float32)}, inputs=[p])
    assert np.array_equal(open_tensors([str(p)])[0].load(), np.ones(4, np.float32))


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_row_source_along_any_axis_equals_moveaxis(shape, data):
    """For every shape, axis, chunk size and storage (memory, file), the rows read equal moveaxis(x, axis, -1) in
    2-D."""
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    chunk = data.draw(st.integers(1, 7))
    want = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    with tempfile.TemporaryFile() as f:
        f.write(b"head" + x.tobytes())
        for storage in (ArrayStorage(x), FileStorage("<tmp>", 4, x.dtype, fileobj=f)):
            src = RowSource(storage, x.shape, axis).as_2d()
            got = np.concatenate([src[i : i + chunk] for i in range(0, src.rows, chunk)])
            assert np.array_equal(got, want)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_any_axis_and_fortran_order(tmp_path, save):
    x = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    p = tmp_path / "f.npz"
    save(p, c=x, f=np.asfortranarray(x))
    refs = {r.name: r for r in open_tensors([str(p)])}
    for name in ("c", "f"):
        assert np.array_equal(refs[name].load(), x)
        for ax in range(3):
            assert np.array_equal(np.asarray(refs[name].row_source(ax).as_2d()),
                                  np.moveaxis(x, ax, -1).reshape(-1, x.shape[ax]))


def test_unique_labels_are_the_shortest_distinguishing_paths(tmp_path):
    a, b, c = tmp_path / "r1" / "x" / "m.npz", tmp_path / "r2" / "x" / "m.npz", tmp_path / "n.npz"
    labels = unique_labels([str(a), str(b), str(c)])
    assert labels == {str(a): "r1/x/m.npz", str(b): "r2/x/m.npz", str(c): "n.npz"}


def test_capture_checks_its_output_before_the_model_runs(tmp_path):
    pytest.importorskip("torch", reason="torch not installed")
    import torch

    from fpsim.capture import capture
    from fpsim.io import OutputError

    with pytest.raises(OutputError, match="does not exist"):
        capture(torch.nn.Linear(4, 4), tmp_path / "no" / "c.safetensors")


def test_strided_pt_tensors_along_any_axis(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed")
    x = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    p = tmp_path / "strided.pt"
    torch.save({"t": x.T, "s": x[:, ::2]}, p)
    want = {"t": x.T.numpy(), "s": x[:, ::2].numpy()}
    for r in open_tensors([str(p)]):
        for ax in (0, 1):
            src = r.row_source(ax).as_2d()
            got = np.concatenate([src[i : i + 3] for i in range(0, src.rows, 3)])
            assert np.array_equal(got, np.moveaxis(want[r.name], ax, -1).reshape(-1, want[r.name].shape[ax]))
