"""fpsim's readers accept what the reference readers accept and say so where they do not (docs/spec.md §I/O).

Safetensors: every file of a table of malformed files is refused by the ``safetensors`` library (checked here, so the
table cannot drift from the library) and reported by fpsim as malformed with its reason, in one line; every file the
library accepts (hand-made edge cases and hypothesis-generated files) fpsim reads with the library's values.  Under
``--lenient`` only tensors whose bytes are unambiguous are analysed; aliased bytes never are.
"""

from __future__ import annotations

import io
import json
import struct
import time
import warnings
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpsim.io import InputError, open_file, open_tensors
from fpsim.io.errors import MalformedFile
from fpsim_cli.main import main

safetensors = pytest.importorskip("safetensors", reason="the safetensors library is the reference parser")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402


def blob(header: dict | bytes, body: bytes = b"", pad: bool = True) -> bytes:
    """A safetensors file's bytes: header (an object written as JSON, or raw bytes) and body, unchecked."""
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def t(start: int, end: int, shape=(2,), dtype="F32", **extra) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [start, end], **extra}


A = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
D8 = np.arange(2, dtype=np.float32).tobytes()

#: (id, file bytes, words of fpsim's reason): each file is refused by the safetensors library (asserted below)
MALFORMED = [
    ("overlapping_offsets", blob({"a": t(0, 8), "b": t(4, 12)}, bytes(12)), "data offsets of 'b' [4, 12] overlap 'a'"),
    ("aliased_tensors", blob({"a": t(0, 8), "b": t(0, 8)}, D8), "overlap"),
    ("gap_between_tensors", blob({"a": t(0, 8), "b": t(12, 20)}, bytes(20)), "data bytes [8, 12) between 'a' and 'b'"),
    ("data_not_at_offset_0", blob({"a": t(4, 12)}, bytes(12)), "data does not start at offset 0"),
    ("trailing_bytes", blob({"a": t(0, 8)}, bytes(12)), "4 trailing byte(s) after the last tensor"),
    ("trailing_bytes_no_tensor", blob({}, b"xx"), "2 trailing byte(s)"),
    ("data_past_the_end", blob({"a": t(0, 8), "b": t(8, 16)}, bytes(12)), "'b' is truncated: its data offsets end"),
    ("empty_tensor_inside_another", blob({"z": t(4, 4, (0,)), "a": t(0, 8)}, D8), "'z' [4, 4] lie inside 'a'"),
    ("duplicate_key_bad_offsets", blob(b'{"a":' + A + b',"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
                                       bytes(16)), "data does not start at offset 0"),
    ("duplicate_key_earlier_invalid", blob(b'{"a":{"dtype":"X"},"a":' + A + b'}', D8),
     "named more than once and one of its entries is invalid"),
    ("duplicate_field", blob(b'{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', D8),
     "field 'dtype' given twice"),
    ("duplicate_metadata", blob(b'{"__metadata__":{},"__metadata__":{},"a":' + A + b'}', D8), "__metadata__ twice"),
    ("metadata_value_not_string", blob({"__metadata__": {"x": 1}, "a": t(0, 8)}, D8), "value of 'x' is not a string"),
    ("metadata_list", blob({"__metadata__": [1], "a": t(0, 8)}, D8), "__metadata__ is not an object"),
    ("metadata_string", blob({"__metadata__": "s", "a": t(0, 8)}, D8), "__metadata__ is not an object"),
    ("invalid_utf8", blob(b'{"a\xff":' + A + b'}', D8), "header (not UTF-8)"),
    ("lone_surrogate_escape", blob(b'{"a\\ud800":' + A + b'}', D8), "lone UTF-16 surrogate"),
    ("utf8_bom", blob(b'\xef\xbb\xbf{"a":' + A + b'}', D8), "header (not JSON"),
    ("nul_padding", blob(b'{"a":' + A + b'}\0\0\0', D8, pad=False), "header (not JSON"),
    ("nbsp_padding", blob(b'{"a":' + A + b'}\xc2\xa0', D8, pad=False), "header (not JSON"),
    ("shape_does_not_match_size", blob({"a": t(0, 8, (3,))}, D8), "[0, 8] do not hold shape [3] of F32"),
    ("reversed_offsets", blob({"a": t(8, 0)}, D8), "[8, 0] do not hold shape"),
    ("unknown_dtype", blob({"a": t(0, 8, dtype="F99")}, D8), "unsupported dtype 'F99'"),
    ("lowercase_dtype", blob({"a": t(0, 8, dtype="f32")}, D8), "unsupported dtype 'f32'"),
    ("dtype_not_string", blob({"a": t(0, 8, dtype=["F32"])}, D8), "unsupported dtype"),
    ("negative_dimension", blob({"a": t(0, 8, (-2,))}, D8), "a dimension is negative"),
    ("float_dimension", blob({"a": t(0, 8, (2.0,))}, D8), "a dimension is not an integer (2.0)"),
    ("exponent_dimension", blob(b'{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', D8), "not an integer"),
    ("minus_zero_dimension", blob(b'{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'), "not an integer (-0.0)"),
    ("bool_dimension", blob({"a": t(0, 8, (True, 2))}, D8), "a dimension is not an integer (true)"),
    ("float_offset", blob({"a": t(0, 8.0)}, D8), "an offset is not an integer (8.0)"),
    ("dimension_past_64_bits", blob({"a": t(0, 0, (0, 2**64))}), "a dimension does not fit in 64 bits"),
    ("shape_overflows_before_zero", blob({"a": t(0, 0, (2**33, 2**33, 0))}), "overflows 64 bits"),
    ("shape_overflows", blob({"a": t(0, 8, (2**40,) * 3)}, D8), "overflows 64 bits"),
    ("odd_f4_count", blob({"a": t(0, 2, (3,), "F4")}, bytes(2)), "3 elements of 4 bits are not a whole number"),
    ("three_offsets", blob({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, D8), "not a pair"),
    ("missing_offsets", blob({"a": {"dtype": "F32", "shape": [2]}}, D8), "missing field 'data_offsets'"),
    ("shape_null", blob({"a": {"dtype": "F32", "shape": None, "data_offsets": [0, 8]}}, D8), "shape is not a list"),
    ("entry_not_object", blob({"a": "x"}), "entry is not a JSON object"),
    ("extra_field_too_deep", blob(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + b"[" * 126
                                  + b"]" * 126 + b'}}', D8), "nested deeper than 127"),
    ("header_not_an_object", blob(b'[1]'), "header (not a JSON object)"),
    ("header_length_past_the_file", struct.pack("<Q", 1000) + b"{}", "header length 1000 exceeds the file"),
    ("header_length_over_100MB", struct.pack("<Q", 100_000_001) + b"{}", "exceeds the file or 100 MB"),
    ("too_short", b"\0\0\0", "too short for the header length"),
    ("empty_header", struct.pack("<Q", 0), "header (not JSON"),
]

#: (id, file bytes, tensors fpsim reads): files the library accepts, at the edges of its rules
WELL_FORMED = [
    ("no_padding", blob({"a": t(0, 8)}, D8, pad=False), ["a"]),
    ("leading_and_trailing_whitespace", blob(b'\t {"a":' + A + b'}\r\n', D8, pad=False), ["a"]),
    ("extra_field", blob({"a": t(0, 8, foo={"k": [1, 2]})}, D8), ["a"]),
    ("extra_field_127_deep", blob(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + b"[" * 125
                                  + b"]" * 125 + b'}}', D8), ["a"]),
    ("null_metadata", blob({"__metadata__": None, "a": t(0, 8)}, D8), ["a"]),
    ("repeated_metadata_key", blob(b'{"__metadata__":{"x":"1","x":"2"},"a":' + A + b'}', D8), ["a"]),
    ("empty_tensors_share_an_offset", blob({"a": t(0, 0, (0,)), "b": t(0, 0, (0, 3)), "c": t(0, 8)}, D8),
     ["a", "b", "c"]),
    ("empty_tensor_at_the_end", blob({"z": t(8, 8, (0,)), "a": t(0, 8)}, D8), ["z", "a"]),
    ("largest_dimension_times_zero", blob({"a": t(0, 0, (0, 2**64 - 1))}), ["a"]),
    ("no_tensor", blob({}), []),
    ("scalar", blob({"a": t(0, 4, ())}, bytes(4)), ["a"]),
    ("sub_byte_and_e8m0_dtypes", blob({"f4": t(0, 1, (2,), "F4"), "f6": t(1, 4, (4,), "F6_E2M3"),
                                       "e8": t(4, 5, (1,), "F8_E8M0")}, bytes(5)), ["f4", "f6", "e8"]),
    ("repeated_tensor_name", blob(b'{"a":' + A + b',"a":' + A + b'}', D8), ["a"]),
]


def library_keys(path) -> list[str]:
    """The tensor names of ``path`` by the safetensors library's header check (raises on a file it refuses)."""
    with safe_open(str(path), "np") as f:
        return list(f.keys())


@pytest.mark.parametrize("data,why", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_what_the_library_refuses_fpsim_reports_as_malformed(tmp_path, data, why):
    p = tmp_path / "m.safetensors"
    p.write_bytes(data)
    with pytest.raises(Exception, match="Error while deserializing"):
        library_keys(p)
    with pytest.raises(MalformedFile) as e:
        open_file(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: malformed safetensors: ") and why in msg and "\n" not in msg, msg


@pytest.mark.parametrize("data,names", [c[1:] for c in WELL_FORMED], ids=[c[0] for c in WELL_FORMED])
def test_what_the_library_accepts_fpsim_reads(tmp_path, data, names):
    p = tmp_path / "w.safetensors"
    p.write_bytes(data)
    assert sorted(library_keys(p)) == sorted(set(names))
    refs, notes = open_file(p)
    assert [r.name for r in refs] == names and all(r.error is None for r in refs)
    assert all(r.load().shape == r.shape for r in refs if max(r.shape, default=0) < 2**63)  # numpy's largest axis
    assert not [n for n in notes if "malformed" in n]


def test_a_repeated_tensor_name_is_a_note(tmp_path):
    p = tmp_path / "r.safetensors"
    p.write_bytes(blob(b'{"a":' + A + b',"a":' + A + b'}', D8))
    assert open_file(p)[1] == [f"{p}: earlier entries of 1 tensor name(s) given more than once in the header ('a'): "
                               "the last is read, as the safetensors library does"]


_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.bool_]


@st.composite
def tensor_dicts(draw):
    n = draw(st.integers(0, 4))
    out = {}
    for i in range(n):
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        dt = draw(st.sampled_from(_DTYPES))
        seed = draw(st.integers(0, 2**16))
        a = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize,
                                                 dtype=np.uint8)
        out[draw(st.sampled_from(["w", "x.weight", "é", "b"])) + str(i)] = \
            (a > 127).reshape(shape) if dt is np.bool_ else a.view(dt).reshape(shape)
    meta = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)))
    return out, meta


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=tensor_dicts())
def test_files_the_library_writes_read_as_the_library_reads_them(tmp_path, case):
    """Every file the library writes (hence accepts) is read by fpsim with the library's values, tensor by tensor."""
    tensors, meta = case
    p = tmp_path / "h.safetensors"
    save_file(tensors, str(p), metadata=meta)
    want = load_file(str(p))
    refs, notes = open_file(p)
    assert not notes and sorted(r.name for r in refs) == sorted(want)
    for r in refs:
        got = r.load()
        assert got.dtype == want[r.name].dtype and got.shape == want[r.name].shape
        assert got.tobytes() == want[r.name].tobytes(), r.name


# --- read leniently: unambiguous tensors only -------------------------------------------------------------


def _mixed(tmp_path):
    """'a' and 'b' alias bytes [4, 8); 'c' is unambiguous; 4 trailing bytes."""
    body = np.arange(9, dtype=np.float32).tobytes()
    p = tmp_path / "mixed.safetensors"
    p.write_bytes(blob({"a": t(0, 8), "b": t(4, 12), "c": t(12, 32, (5,))}, body[:32] + bytes(4)))
    return p, np.frombuffer(body[12:32], np.float32)


def test_lenient_reads_only_the_tensors_whose_bytes_are_unambiguous(tmp_path):
    p, c = _mixed(tmp_path)
    with pytest.raises(MalformedFile, match="overlap"):
        open_file(p)
    refs, notes = open_file(p, strict=False)
    assert [r.name for r in refs] == ["c"] and np.array_equal(refs[0].load(), c)
    assert notes == [f"{p}: malformed safetensors: data offsets of 'b' [4, 12] overlap 'a' [0, 8]; 4 trailing byte(s) "
                     "after the last tensor's data; read leniently: 1 tensor(s) whose bytes are unambiguous, not 'a', "
                     "'b'"]
    errors = []
    assert [r.name for r in open_tensors([str(p)], on_error=errors.append, strict=False)] == ["c"]
    assert errors == notes
    with pytest.raises(InputError, match="malformed safetensors"):
        open_tensors([str(p)])


def test_lenient_reads_every_tensor_of_a_gapped_file(tmp_path):
    p = tmp_path / "gap.safetensors"
    p.write_bytes(blob({"a": t(0, 8), "b": t(12, 20)}, D8 + bytes(4) + D8))
    refs, notes = open_file(p, strict=False)
    assert [r.name for r in refs] == ["a", "b"] and all(np.array_equal(r.load(), [0, 1]) for r in refs)
    assert len(notes) == 1 and "belong to no tensor" in notes[0] and "not '" not in notes[0]


def run(*args):
    return CliRunner().invoke(main, ["analyze", "--formats", "bf16", "--seeds", "0", *map(str, args)])


def test_analyze_reports_each_malformed_file_in_one_line_and_the_rest_of_the_run(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for name, data, _ in MALFORMED[:12]:
        (d / f"{name}.safetensors").write_bytes(data)
    (d / "good.safetensors").write_bytes(blob({"w": t(0, 64, (16,))}, np.ones(16, np.float32).tobytes()))
    r = run(d)
    assert r.exit_code == 1, r.output
    lines = r.stderr.splitlines()
    for name, _, why in MALFORMED[:12]:
        (line,) = [ln for ln in lines if f"{name}.safetensors" in ln]
        assert line.startswith("error: ") and "malformed safetensors: " in line and why in line, line
    assert "good.safetensors:w" in r.stdout and "d/overlapping_offsets" not in r.stdout


def test_analyze_lenient_never_analyses_aliased_bytes(tmp_path):
    p, _ = _mixed(tmp_path)
    r = run(p)
    assert r.exit_code == 3 and "error: " + f"{p}: malformed safetensors: data offsets of 'b'" in r.stderr, r.output
    r = run(p, "--lenient")
    assert r.exit_code == 1, r.output
    assert "mixed.safetensors:c" in r.stdout and "mixed.safetensors:a" not in r.stdout
    assert "mixed.safetensors:b" not in r.stdout and "not 'a', 'b'" in r.stderr


def test_a_worker_reads_a_file_the_parent_read_leniently(tmp_path):
    from fpsim_cli.analyze_cmd import _task

    p, _ = _mixed(tmp_path)
    kw = {"schemes": ("bf16",), "rht_d": 0, "seeds": 0, "recipe": None}
    ((rows, msg),) = _task(str(p), [("c", "mixed.safetensors", None)], -1, kw)
    assert msg is None and rows and rows[0]["tensor"] == "mixed.safetensors:c"


# --- npz against numpy.load(allow_pickle=False) -----------------------------------------------------------


def _npz(**arrays) -> bytearray:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return bytearray(buf.getvalue())


def _data_start(data: bytes, name: str) -> int:
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(name)
    n, m = struct.unpack("<2H", data[info.header_offset + 26 : info.header_offset + 30])
    return info.header_offset + 30 + n + m


def _zip(members: list[tuple[str, bytes]], compress=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile: "Duplicate name"
        with zipfile.ZipFile(buf, "w", compress) as z:
            for name, b in members:
                z.writestr(name, b)
    return buf.getvalue()


def _npy(a: np.ndarray, old: bytes = b"", new: bytes = b"") -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue().replace(old, new.ljust(len(old)), 1)


def _flip(data: bytearray, at: int) -> bytes:
    data[at] ^= 0xFF
    return bytes(data)


def _npz_cases():
    big = _npz(a=np.arange(1 << 16, dtype=np.float32))  # larger than zipfile's first read: no CRC check at the header
    deflated = io.BytesIO()
    np.savez_compressed(deflated, a=np.arange(64, dtype=np.float32))
    deflated = bytearray(deflated.getvalue())
    cd = deflated.rfind(b"PK\x01\x02")
    deflated[cd + 16] ^= 1  # the central directory's CRC of a.npy
    two = bytearray(_zip([("a.npy", _npy(np.ones(3, np.float32))), ("b.npy", _npy(np.ones(3, np.float32)))]))
    cd = two.rfind(b"PK\x01\x02")
    two[cd + 42 : cd + 46] = bytes(4)  # b.npy's central entry points at a.npy's local header
    small = _npz(a=np.ones(3, np.float32))
    renamed = bytearray(small)
    renamed[zipfile.ZipFile(io.BytesIO(bytes(small))).getinfo("a.npy").header_offset + 30] = ord("x")
    return [  # (id, file bytes, where fpsim says so: "open" (the file), "member" (its error) or "load")
        ("bytes_before_the_archive", b"JUNK" * 4 + bytes(small), "open", "does not begin with a zip header"),
        ("stored_member_crc_mismatch", _flip(big, _data_start(big, "a.npy") + 200_000), "load", "CRC-32"),
        ("deflated_member_crc_mismatch", bytes(deflated), "member", "Bad CRC-32"),
        ("local_header_name_differs", bytes(renamed), "member", "differ"),
        ("overlapping_members", bytes(two), "member", "differ"),
        ("fortran_order_not_a_bool", _zip([("a.npy", _npy(np.ones((2, 3), np.float32), b"'fortran_order': False",
                                                          b"'fortran_order': 0"))]), "member", "not a valid bool"),
        ("negative_dimension", _zip([("a.npy", _npy(np.ones(1, np.float32), b"(1,)", b"(-1,)"))]), "member",
         "invalid shape"),
        ("float_dimension", _zip([("a.npy", _npy(np.ones(3, np.float32), b"(3,)", b"(3.0,)"))]), "member",
         "shape is not valid"),
    ]


NPZ = _npz_cases()


@pytest.mark.parametrize("data,where,why", [c[1:] for c in NPZ], ids=[c[0] for c in NPZ])
def test_what_numpy_refuses_in_an_npz_fpsim_says(tmp_path, data, where, why):
    p = tmp_path / "m.npz"
    p.write_bytes(data)
    with pytest.raises(Exception):  # noqa: B017 - numpy raises ValueError, BadZipFile, TypeError …
        with np.load(p, allow_pickle=False) as z:
            [z[k] for k in z.files]
    if where == "open":
        with pytest.raises(MalformedFile, match=why):
            open_file(p)
        assert len(open_file(p, strict=False)[0]) == 1  # its member is intact: read leniently
        return
    refs = open_file(p)[0]
    if where == "member":
        assert [r.error for r in refs if r.error and why in r.error and str(p) in r.error], refs
    else:
        (ref,) = refs
        with pytest.raises(InputError, match=why):
            ref.load()


def test_an_npz_member_written_twice_is_read_as_numpy_reads_it(tmp_path):
    p = tmp_path / "dup.npz"
    p.write_bytes(_zip([("a.npy", _npy(np.full(3, 1, np.float32))), ("a.npy", _npy(np.full(3, 2, np.float32)))]))
    with np.load(p, allow_pickle=False) as z:
        want = z["a"]
    refs = {r.name: r for r in open_file(p)[0]}
    assert np.array_equal(refs["a"].load(), want) and "earlier copy is not read" in refs["a#2"].error


# --- .pt / .bin against torch.load(weights_only=True) -----------------------------------------------------


def _pt(torch, legacy=False) -> bytes:
    buf = io.BytesIO()
    torch.save({"a": torch.arange(4.0), "b": torch.ones(3)}, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def _rezip(data: bytes, change) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(data))
    return _zip([(i.filename, change(i.filename, src.read(i))) for i in src.infolist()])


def _torch_load(torch, p):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(p, weights_only=True)


@pytest.mark.parametrize("case", ["storage_record_longer", "storage_record_shorter", "legacy_storage_truncated"])
def test_what_torch_refuses_fpsim_reports_as_malformed(tmp_path, case):
    torch = pytest.importorskip("torch", reason="torch.load is the reference reader")
    p = tmp_path / "m.pt"
    if case == "legacy_storage_truncated":
        p.write_bytes(_pt(torch, legacy=True)[:-4])
        # the storages lie in the order of their keys (ids of the saving process): 'a' (16 bytes) or 'b' (12) is last
        why, left = r"storage '\d+' is truncated \((12 of 16|8 of 12) bytes\)", None
    else:  # the record's sizes in its local header and the central directory changed, its data left in place
        extra = 8 if case == "storage_record_longer" else -8
        data = bytearray(_pt(torch))
        info = next(i for i in zipfile.ZipFile(io.BytesIO(bytes(data))).infolist() if i.filename.endswith("data/0"))
        cd = data.rindex(info.filename.encode()) - 46  # its central directory entry (the name's last occurrence)
        for at in (info.header_offset + 18, cd + 20):
            data[at : at + 8] = struct.pack("<2I", 16 + extra, 16 + extra)
        p.write_bytes(bytes(data))
        why, left = f"the storage record of tensor 'a' holds {16 + extra} bytes, the pickle declares 16", ["b"]
    with pytest.raises(RuntimeError):
        _torch_load(torch, p)
    with pytest.raises(MalformedFile, match=f"{p}: malformed torch file: {why}"):
        open_file(p)
    refs, notes = open_file(p, strict=False)
    assert len(refs) == 1 and [r.name for r in refs] == (left or [refs[0].name]) and "read leniently" in notes[-1]
    assert np.array_equal(refs[0].load(), {"a": np.arange(4.0), "b": np.ones(3)}[refs[0].name])


def test_a_big_endian_torch_file_is_read_as_torch_reads_it(tmp_path):
    """torch 2.13 ends the process with SIGSEGV on a meta-device load of a file whose byteorder record is "big"."""
    torch = pytest.importorskip("torch", reason="torch.load is the reference reader")
    p = tmp_path / "big.pt"
    p.write_bytes(_rezip(_pt(torch), lambda n, d: b"big" if n.endswith("/byteorder") else d))
    want = _torch_load(torch, p)
    refs = {r.name: r for r in open_file(p)[0]}
    assert all(np.array_equal(refs[k].load(), want[k].numpy()) for k in ("a", "b"))


def test_a_header_of_many_repeated_names_is_checked_in_linear_time(tmp_path):
    """20,000 entries of 10,000 names: a quadratic duplicate scan (2·10^8 steps) would take minutes."""
    entry = b'"x%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    p = tmp_path / "dups.safetensors"
    p.write_bytes(blob(b"{" + b",".join(entry % (i % 10_000) for i in range(20_000)) + b"}"))
    start = time.perf_counter()
    refs, notes = open_file(p)
    assert time.perf_counter() - start < 30  # about 0.3 s; the quadratic scan took over a minute
    assert len(refs) == 10_000 and len(notes) == 1 and "10000 tensor name(s) given more than once" in notes[0]


_BITS = {"F32": 32, "F16": 16, "U8": 8, "F4": 4, "F6_E2M3": 6, "BOOL": 8, "I64": 64, "F8_E8M0": 8}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.sampled_from(list(_BITS)), st.lists(st.integers(0, 4), max_size=3)), max_size=4),
       order=st.randoms(use_true_random=False), extra=st.integers(-3, 3),
       edits=st.lists(st.tuples(st.integers(0, 7), st.integers(-9, 9)), max_size=2))
def test_fpsim_accepts_a_file_exactly_when_the_library_does(tmp_path, specs, order, extra, edits):
    """A well-formed layout (entries in any order), then up to two offsets or dimensions moved and the body resized:
    fpsim accepts the file exactly when the library does (3,000 such files agreed, 911 accepted, when written)."""
    header, off = {}, 0
    for i, (code, shape) in enumerate(specs):
        n = -(-int(np.prod(shape)) * _BITS[code] // 8)
        header[f"t{i}"] = t(off, off + n, shape, code)
        off += n
    names = list(header)
    order.shuffle(names)
    header = {k: header[k] for k in names}
    for what, delta in edits if header else ():
        e = header[names[what % len(names)]]
        if what < 6:
            e["data_offsets"][what // 3] += delta
        elif e["shape"]:
            e["shape"][0] = max(0, e["shape"][0] + delta)
    p = tmp_path / "f.safetensors"
    p.write_bytes(blob(header, bytes(max(0, off + extra)), pad=False))
    try:
        library_keys(p)
        accepted = True
    except Exception:  # noqa: BLE001 - safetensors_rust.SafetensorError
        accepted = False
    try:
        open_file(p)
        assert accepted, f"fpsim reads what the library refuses: {p.read_bytes()[8:]!r}"
    except MalformedFile as e:
        assert not accepted, f"fpsim refuses what the library reads: {e}"


def test_a_torch_zip_rewritten_by_another_tool_is_read_as_torch_reads_it(tmp_path):
    """Records not on torch's 64-byte alignment: torch's meta-device offsets point between them, so fpsim lets torch
    map the file (it said "its storage is not a stored record of the file" for every tensor but the first)."""
    torch = pytest.importorskip("torch", reason="torch.load is the reference reader")
    p = tmp_path / "rezipped.pt"
    p.write_bytes(_rezip(_pt(torch), lambda n, d: d))
    want = _torch_load(torch, p)
    refs = {r.name: r for r in open_file(p)[0]}
    assert all(r.error is None for r in refs.values())
    assert all(np.array_equal(refs[k].load(), want[k].numpy()) for k in ("a", "b"))
