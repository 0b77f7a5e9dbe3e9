"""fpsim.io.quantized: QuantizedTensor files written and read through io's one npz reader and safetensors parser;
bit-exact round trips, the existing file formats, and a one-line ValueError naming the path for every edited file."""

import io
import json
import pickle
import struct
import zipfile

import numpy as np
import pytest

import fpsim
from fpsim.io.quantized import FORMAT_TAG, load_quantized, save_quantized

X = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)


@pytest.mark.parametrize("ext", ["npz", "safetensors"])
@pytest.mark.parametrize("scheme", sorted(fpsim.SCHEMES))
def test_round_trip_is_bit_exact(tmp_path, scheme, ext):
    q = fpsim.quantize(X, scheme)
    p = tmp_path / f"q.{ext}"
    save_quantized(q, p)
    assert load_quantized(p).equals(q)


def test_file_layouts_are_the_documented_ones(tmp_path):
    """The members / tensors and the metadata object of the module docstring, read by numpy and by the official
    safetensors library; and a header spelled the way fpsim 0.1 wrote it (json.dumps defaults) still loads."""
    import safetensors
    import safetensors.numpy as stnp

    q = fpsim.quantize(X, "nvfp4", axis=0)
    want = {"format": FORMAT_TAG, "scheme": q.scheme.to_json(), "shape": list(q.shape), "dtype": q.dtype,
            "axis": q.axis}
    z = tmp_path / "q.npz"
    save_quantized(q, z)
    with np.load(z, allow_pickle=False) as f:
        assert set(f.files) == {"meta", "data", "scales", "amax"}
        assert json.loads(f["meta"].tobytes()) == want
        assert f["data"].tobytes() == q.data.tobytes() and f["amax"].dtype == np.float32
    st = tmp_path / "q.safetensors"
    save_quantized(q, st)
    with safetensors.safe_open(str(st), "np") as f:
        assert json.loads(f.metadata()["fpsim"]) == want
    got = stnp.load_file(str(st))
    assert set(got) == {"data", "scales", "amax"} and got["scales"].tobytes() == q.scales.tobytes()
    header = {"__metadata__": {"fpsim": json.dumps(want)}}
    blobs, pos = [], 0
    for name, code in (("data", "U8"), ("scales", "U8"), ("amax", "F32")):
        a = np.asarray(getattr(q, name) if name != "amax" else np.asarray(q.amax, np.float32))
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        blobs.append(a.tobytes())
        pos += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    old = tmp_path / "old.safetensors"
    old.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    assert load_quantized(old).equals(q)


def _npz(path, meta, **arrays):
    buf = io.BytesIO()
    m = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    np.savez(buf, meta=np.frombuffer(m, np.uint8), **arrays)
    path.write_bytes(buf.getvalue())
    return path


def _good_parts():
    q = fpsim.quantize(X, "mxfp8_e4m3")
    meta = {"format": FORMAT_TAG, "scheme": q.scheme.to_json(), "shape": list(q.shape), "dtype": q.dtype,
            "axis": q.axis}
    return meta, {"data": q.data, "scales": q.scales, "amax": np.asarray(q.amax, np.float32)}


def _edit(meta, key, value):
    m = json.loads(json.dumps(meta))
    if value is _DEL:
        del m[key]
    else:
        m[key] = value
    return m


_DEL = object()


@pytest.mark.parametrize("case", [
    "no_scheme",  # KeyError before
    "scheme_element_missing",  # KeyError inside from_json
    "scheme_is_a_list",  # AttributeError / TypeError inside from_json
    "scheme_is_a_string",
    "bad_scale_rule",  # ValueError of an enum
    "shape_of_strings",
    "data_reshaped",  # shape that does not fit the arrays
    "axis_float",
    "deep_json",  # RecursionError
    "not_utf8",  # UnicodeDecodeError
    "not_json",
    "wrong_tag",
    "no_meta",
    "meta_float",
    "data_float64",
])
def test_edited_npz_is_one_line_value_error_naming_the_path(tmp_path, case):
    meta, arr = _good_parts()
    p = tmp_path / "q.npz"
    m: object = meta
    if case == "no_scheme":
        m = _edit(meta, "scheme", _DEL)
    elif case == "scheme_element_missing":
        m = _edit(meta, "scheme", {k: v for k, v in meta["scheme"].items() if k != "element"})
    elif case == "scheme_is_a_list":
        m = _edit(meta, "scheme", [1, 2])
    elif case == "scheme_is_a_string":
        m = _edit(meta, "scheme", "nvfp4")
    elif case == "bad_scale_rule":
        m = _edit(meta, "scheme", dict(meta["scheme"], scale_rule="sideways"))
    elif case == "shape_of_strings":
        m = _edit(meta, "shape", ["4", "64"])
    elif case == "data_reshaped":
        m = _edit(meta, "shape", [8, 64])
    elif case == "axis_float":
        m = _edit(meta, "axis", 1.0)
    elif case == "deep_json":
        m = b'{"format": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    elif case == "not_utf8":
        m = b'{"format": "\xff\xfe"}'
    elif case == "not_json":
        m = b"{format: fpsim"
    elif case == "wrong_tag":
        m = _edit(meta, "format", "something/else")
    if case == "no_meta":
        buf = io.BytesIO()
        np.savez(buf, **arr)
        p.write_bytes(buf.getvalue())
    elif case == "meta_float":
        buf = io.BytesIO()
        np.savez(buf, meta=np.zeros(3), **arr)
        p.write_bytes(buf.getvalue())
    elif case == "data_float64":
        _npz(p, meta, **dict(arr, data=arr["data"].astype(np.float64)))
    else:
        _npz(p, m, **arr)
    with pytest.raises(ValueError) as e:
        load_quantized(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg, msg


def test_truncated_and_corrupt_zip(tmp_path):
    q = fpsim.quantize(X, "nvfp4")
    p = tmp_path / "q.npz"
    save_quantized(q, p)
    raw = p.read_bytes()
    for i, blob in enumerate([raw[: len(raw) // 2], raw[:10], raw[:-30]]):
        c = tmp_path / f"c{i}.npz"
        c.write_bytes(blob)
        with pytest.raises(ValueError, match=str(c)):
            load_quantized(c)


def test_pickles_are_refused_never_run(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickle ran')",))

    p = tmp_path / "q.safetensors"
    p.write_bytes(pickle.dumps(Boom(), protocol=4))
    with pytest.raises(ValueError, match="refusing to load pickled content"):
        load_quantized(p)
    z = tmp_path / "q.npz"
    meta, arr = _good_parts()
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), data=np.array([Boom()], object),
             scales=arr["scales"], amax=arr["amax"])
    z.write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="refusing to load pickled content"):
        load_quantized(z)


@pytest.mark.parametrize("edit", ["no_fpsim", "bad_dtype", "offsets", "shape_inf", "meta_not_json"])
def test_edited_safetensors(tmp_path, edit):
    q = fpsim.quantize(X, "nvfp4")
    p = tmp_path / "q.safetensors"
    save_quantized(q, p)
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8 : 8 + n])
    if edit == "no_fpsim":
        h["__metadata__"] = {}
    elif edit == "bad_dtype":
        h["data"]["dtype"] = "F64"
    elif edit == "offsets":
        h["data"]["data_offsets"] = [0, 10**9]
    elif edit == "meta_not_json":
        h["__metadata__"]["fpsim"] = "{oops"
    text = json.dumps(h)
    if edit == "shape_inf":
        text = text.replace('"shape": [4, 32]', '"shape": [Infinity]')
    hb = text.encode()
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n :])
    with pytest.raises(ValueError) as e:
        load_quantized(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_save_is_atomic_and_refuses_other_extensions(tmp_path):
    q = fpsim.quantize(X, "nvfp4")
    with pytest.raises(ValueError, match="use a .npz or .safetensors extension"):
        save_quantized(q, tmp_path / "q.bin")
    p = tmp_path / "q.npz"
    save_quantized(q, p)
    assert zipfile.is_zipfile(p) and [x.name for x in tmp_path.iterdir()] == ["q.npz"]
