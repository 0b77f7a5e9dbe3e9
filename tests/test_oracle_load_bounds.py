"""fpsim diff's input loading is bounded: a zip bomb, an npz member, .npy or .safetensors header claiming a huge
shape, or a truncated file is refused with one line from its header, before anything is inflated or read whole
(the candidate file too); valid files still load."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import numpy as np
from click.testing import CliRunner

from fpsim.oracle.common import MAX_BYTES_ENV, load_arrays
from fpsim_cli.main import main

F32 = np.float32


def _diff_cli(tmp_path, input_path):
    """``fpsim diff`` of a valid candidate against ``input_path``: (exit code, stderr lines, output)."""
    np.savez(tmp_path / "cand.npz", codes=np.zeros((4, 8), np.uint8), scales=np.zeros((4, 1), np.uint8))
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "cand.npz"), "--input", str(input_path)])
    assert "Traceback" not in r.output and "MemoryError" not in r.output, r.output
    return r.exit_code, [ln for ln in r.output.splitlines() if ln.strip()], r.output


def _npy_bytes(arr=None, header_shape=None, dtype="<f4") -> bytes:
    """A .npy file: ``arr``'s data under a header declaring ``header_shape`` (default arr's)."""
    arr = np.zeros(0, dtype) if arr is None else arr
    shape = arr.shape if header_shape is None else header_shape
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                "shape": tuple(shape)})
    return buf.getvalue() + arr.tobytes()


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_zip_bomb_npz_is_refused_before_inflating(tmp_path, monkeypatch):
    """8 MB of zeros deflate to ~8 kB: a member that would need more than the bound is refused from its header."""
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 20))
    _zip(tmp_path / "bomb.npz", {"x.npy": _npy_bytes(np.zeros(2 << 20, F32))})
    assert (tmp_path / "bomb.npz").stat().st_size < 100_000
    code, lines, out = _diff_cli(tmp_path, tmp_path / "bomb.npz")
    assert code == 2 and len(lines) == 1, out
    assert "bomb.npz" in lines[0] and "'x'" in lines[0] and "8388608 bytes" in lines[0] and MAX_BYTES_ENV in lines[0]


def test_npz_member_whose_header_claims_a_huge_shape_is_refused(tmp_path):
    """A few MB of zeros under a header declaring 2^40 floats: the member is smaller than its header says."""
    _zip(tmp_path / "lie.npz", {"x.npy": _npy_bytes(np.zeros(1 << 20, F32), header_shape=(1 << 40,))})
    code, lines, out = _diff_cli(tmp_path, tmp_path / "lie.npz")
    assert code == 2 and len(lines) == 1 and "lie.npz" in lines[0] and "'x'" in lines[0], out
    assert "truncated or corrupt" in lines[0]


def test_npz_whose_directory_claims_more_than_deflate_can_give_is_refused(tmp_path):
    """The central directory's uncompressed size patched to 2^40: more than deflate's 1032:1, never inflated."""
    data = _npy_bytes(np.zeros(1 << 20, F32), header_shape=(1 << 38,))
    _zip(tmp_path / "cd.npz", {"x.npy": data})
    raw = bytearray((tmp_path / "cd.npz").read_bytes())
    cd = raw.rfind(b"PK\x01\x02")  # the central directory entry: uncompressed size at offset 24 (APPNOTE 4.3.12)
    raw[cd + 24: cd + 28] = struct.pack("<I", 0xFFFFFFF0)
    (tmp_path / "cd.npz").write_bytes(bytes(raw))
    code, lines, out = _diff_cli(tmp_path, tmp_path / "cd.npz")
    assert code == 2 and len(lines) == 1 and "cd.npz" in lines[0], out


def test_truncated_npy_is_refused(tmp_path):
    x = np.ones((64, 64), F32)
    np.save(tmp_path / "t.npy", x)
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-100])
    code, lines, out = _diff_cli(tmp_path, tmp_path / "t.npy")
    assert code == 2 and len(lines) == 1, out
    assert "t.npy" in lines[0] and "truncated" in lines[0] and "[64, 64]" in lines[0]


def test_npy_header_claiming_a_huge_shape_is_refused(tmp_path):
    (tmp_path / "h.npy").write_bytes(_npy_bytes(np.zeros(16, F32), header_shape=(1 << 30, 1 << 30)))
    code, lines, out = _diff_cli(tmp_path, tmp_path / "h.npy")
    assert code == 2 and len(lines) == 1 and "h.npy" in lines[0] and "truncated" in lines[0], out


def _safetensors(path, shape, nbytes_data: int, sparse_data: int | None = None):
    h = json.dumps({"x": {"dtype": "F32", "shape": list(shape),
                          "data_offsets": [0, 4 * int(np.prod(shape, dtype=object))]}}).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * nbytes_data)
        if sparse_data is not None:
            f.truncate(8 + len(h) + sparse_data)  # a sparse file: the offsets fit, the data is never written


def test_safetensors_header_claiming_a_huge_shape_is_refused(tmp_path):
    _safetensors(tmp_path / "h.safetensors", (1 << 20, 1 << 20), 64)
    code, lines, out = _diff_cli(tmp_path, tmp_path / "h.safetensors")
    assert code == 2 and len(lines) == 1, out
    assert "h.safetensors" in lines[0] and "'x'" in lines[0] and "truncated" in lines[0]


def test_safetensors_consistent_but_too_large_is_refused_before_reading(tmp_path, monkeypatch):
    """The offsets fit a (sparse) file, but the tensor needs more than the bound: refused from the header."""
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 20))
    _safetensors(tmp_path / "big.safetensors", (1024, 1024), 0, sparse_data=4 * 1024 * 1024)
    code, lines, out = _diff_cli(tmp_path, tmp_path / "big.safetensors")
    assert code == 2 and len(lines) == 1 and "big.safetensors" in lines[0] and "'x'" in lines[0], out
    assert "4194304 bytes" in lines[0]


def test_candidate_file_is_bounded_too(tmp_path, monkeypatch):
    """The candidate goes through the same reader: its codes array too large is refused by name."""
    x = np.ones((4, 16), F32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "cand.npz", codes=np.zeros((4, 1 << 18), np.uint8), scales=np.zeros((4, 1), np.uint8))
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 19))
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "cand.npz"), "--input", str(tmp_path / "x.npy")])
    assert r.exit_code == 2 and "'codes'" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_valid_files_still_load(tmp_path):
    x = np.arange(32, dtype=F32).reshape(2, 16)
    np.save(tmp_path / "a.npy", np.asfortranarray(x))
    np.savez_compressed(tmp_path / "a.npz", x=x, y=x[:1])
    assert np.array_equal(load_arrays(tmp_path / "a.npy")[""], x)
    got = load_arrays(tmp_path / "a.npz")
    assert np.array_equal(got["x"], x) and np.array_equal(got["y"], x[:1])
