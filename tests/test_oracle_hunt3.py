"""fpsim diff: bounded input loading, the random Hadamard transform (SPEC §7), and a rounding claim on too few blocks.

Before these changes: ``load_arrays`` inflated any npz member and read any .npy / .safetensors array whole before
a size check (a zip bomb or a header claiming a huge shape exhausted memory first); a candidate quantized from the
RHT'd input got "other" for every byte; and a candidate with every scale byte one step up was said to "round
stochastically" from the few blocks whose scales still matched."""

from __future__ import annotations

import io
import json
import struct
import time
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.oracle import diff
from fpsim.oracle.common import MAX_BYTES_ENV, load_arrays
from fpsim.schemes import get_scheme
from fpsim.transforms import rht
from fpsim_cli.main import main

F32 = np.float32


# --- 1. bounded loading -------------------------------------------------------------------------------------------


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


def _safetensors(path, shape, nbytes_data: int, sparse_size: int | None = None):
    h = json.dumps({"x": {"dtype": "F32", "shape": list(shape),
                          "data_offsets": [0, 4 * int(np.prod(shape, dtype=object))]}}).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * nbytes_data)
        if sparse_size is not None:
            f.truncate(sparse_size)  # a sparse file: the offsets fit, the data is never written


def test_safetensors_header_claiming_a_huge_shape_is_refused(tmp_path):
    _safetensors(tmp_path / "h.safetensors", (1 << 20, 1 << 20), 64)
    code, lines, out = _diff_cli(tmp_path, tmp_path / "h.safetensors")
    assert code == 2 and len(lines) == 1, out
    assert "h.safetensors" in lines[0] and "'x'" in lines[0] and "truncated" in lines[0]


def test_safetensors_consistent_but_too_large_is_refused_before_reading(tmp_path, monkeypatch):
    """The offsets fit a (sparse) file, but the tensor needs more than the bound: refused from the header."""
    monkeypatch.setenv(MAX_BYTES_ENV, str(1 << 20))
    _safetensors(tmp_path / "big.safetensors", (1024, 1024), 0, sparse_size=8 + 4 * 1024 * 1024 + 200)
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


# --- 2. the random Hadamard transform (SPEC §7) -------------------------------------------------------------------


def _x(rows=64, cols=256, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


X = _x()


def _quantized(x, scheme="nvfp4"):
    q = fpsim.quantize(x, scheme)
    return q.data, q.scales, (q.amax if scheme == "nvfp4" else None)


def test_rht_option_makes_the_rht_input_the_reference():
    """rht=True: fpsim quantizes rht(x, 16, "recipe") along the quantized axis (BF16 in and out), as the recipe."""
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=True)
    assert rep.identical, rep.format_table()
    with pytest.raises(ValueError, match="multiple of the Hadamard size"):
        diff(codes, scales, X[:, :40], "nvfp4", rht=True)


def test_candidate_quantized_from_the_rht_input_is_named():
    """Before: every byte "other".  Now the toggled reference explains every byte (amax included)."""
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert rep.findings[0].startswith("random Hadamard transform:") and "SPEC §7" in rep.findings[0]
    assert rep.causes == {"random Hadamard transform": rep.n_code_mismatches + rep.n_scale_mismatches + 1}
    assert rep.explained_by and "rht(x)" in rep.explained_by[0]
    assert rep.code_mismatches[0]["cause"] == "random Hadamard transform"


def test_rht_asked_but_candidate_did_not_transform():
    codes, scales, amax = _quantized(X)
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=True)
    assert "not rht(x) as asked" in rep.findings[0]
    assert set(rep.causes) == {"random Hadamard transform"}


@pytest.mark.parametrize("signs,asked", [(1234, False), ("none", True)])
def test_rht_with_other_signs_is_named(signs, asked):
    """Seeded random signs (or none) instead of the recipe's vector: the implied vector is recovered from the codes."""
    codes, scales, amax = _quantized(rht(X, 16, signs))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax, rht=asked)
    assert rep.findings[0].startswith("RHT with other signs:"), rep.findings
    assert set(rep.causes) == {"RHT with other signs"} and rep.explained_by, rep.causes


def test_rht_and_a_second_bug_are_both_named():
    """The RHT'd input truncated to E2M1 (rtz): the RHT bytes get its cause, the rest the rounding mode's."""
    xr = rht(X, 16, "recipe")
    q = fpsim.quantize(xr, get_scheme("nvfp4").replace(rounding="rtz"))  # the kernel: RHT'd input, truncation
    codes, scales = q.data, q.scales
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=q.amax)
    assert rep.findings[0].startswith("random Hadamard transform:")
    assert rep.causes.get("random Hadamard transform", 0) > 0.5 * rep.n_code_mismatches
    assert rep.causes.get("rounding mode", 0) > 0 and "other" not in rep.causes, rep.causes
    assert rep.explained_by and "rht(x)" in rep.explained_by[0] and "rtz" in rep.explained_by[0].lower()


def test_unrelated_many_code_bug_is_not_called_rht():
    """30 % of the codes scrambled: the toggled reference fixes nothing, so no RHT finding."""
    codes, scales, amax = _quantized(X)
    rng = np.random.default_rng(1)
    hit = rng.random(codes.shape) < 0.4
    codes = codes.copy()
    codes[hit] = rng.integers(0, 256, int(hit.sum()))
    rep = diff(codes, scales, X, "nvfp4", candidate_amax=amax)
    assert not any("Hadamard" in f or "RHT" in f for f in rep.findings)
    assert "random Hadamard transform" not in rep.causes and "RHT with other signs" not in rep.causes


def test_cli_rht_flag(tmp_path):
    codes, scales, amax = _quantized(rht(X, 16, "recipe"))
    np.savez(tmp_path / "c.npz", codes=codes, scales=scales, amax=amax)
    np.save(tmp_path / "x.npy", X)
    args = ["diff", str(tmp_path / "c.npz"), "--input", str(tmp_path / "x.npy")]
    r = CliRunner().invoke(main, args + ["--rht"])
    assert r.exit_code == 0 and "IDENTICAL" in r.output, r.output
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "finding: random Hadamard transform" in r.output, r.output


def test_rht_diagnosis_stays_fast():
    """The toggled reference costs two quantizations at most: 512×512 NVFP4 in well under the old 'other' path."""
    x = _x(512, 512, 3)
    codes, scales, amax = _quantized(rht(x, 16, 99))
    t = time.perf_counter()
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert time.perf_counter() - t < 10 and "RHT with other signs" in rep.causes


# --- 3. no stochastic-rounding claim from too few blocks -----------------------------------------------------------


def _scales_one_up(x):
    """A kernel whose every E4M3 block scale is one step above fpsim's (a bug diff does not model); its codes
    follow from that scale with fpsim's element rule."""
    amax = F32(np.abs(x).max())
    s_enc = F32(2688) / amax
    s_dec = F32(1) / s_enc
    vmax = np.abs(x).reshape(x.shape[0], -1, 16).max(axis=2)
    sb = fpsim.encode(np.minimum((vmax * (s_enc * (F32(1) / F32(6)))).astype(F32), F32(448)), "e4m3")
    sb = np.minimum(sb.astype(np.int32) + 1, 0x7E).astype(np.uint8)  # the bug
    with np.errstate(all="ignore"):
        enc = (F32(1) / (fpsim.decode(sb, "e4m3") * s_dec)).astype(F32)
        y = (x.reshape(x.shape[0], -1, 16) * enc[..., None]).astype(F32).reshape(x.shape)
    return fpsim.pack_fp4(fpsim.encode(y, "e2m1")), sb, amax


@pytest.mark.parametrize("rows,seed", [(64, 0), (256, 1)])
def test_scales_one_step_up_is_not_called_stochastic_rounding(rows, seed):
    """Before: "stochastic rounding" from the 1–4 blocks whose scales still matched (every code there fpsim's)."""
    x = _x(rows, 256, seed)
    codes, scales, amax = _scales_one_up(x)
    rep = diff(codes, scales, x, "nvfp4", candidate_amax=amax)
    assert rep.n_scale_mismatches > 0.99 * rep.n_blocks
    assert "stochastic rounding" not in rep.causes, rep.causes
    assert not any(f.startswith("stochastic rounding") for f in rep.findings), rep.findings
    assert any("too few blocks to judge" in f for f in rep.findings), rep.findings
    assert rep.rounding_check is not None and not rep.rounding_check.judged


def test_a_large_enough_sample_still_names_stochastic_rounding():
    """The power check does not silence a real stochastic-rounding candidate compared under RNE."""
    x = _x(64, 256, 5)
    q = fpsim.quantize(x, get_scheme("nvfp4").replace(rounding="sr"), seed=3)
    rep = diff(q.data, q.scales, x, "nvfp4", candidate_amax=q.amax)
    assert rep.rounding_check.judged and rep.causes == {"stochastic rounding": rep.n_code_mismatches}, rep.causes
