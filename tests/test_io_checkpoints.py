"""Quantized checkpoints (fpsim.io.checkpoints, issue 47 item 2): compressed-tensors, ModelOpt and torchao NVFP4
files made by the libraries themselves (tests/data/checkpoints/generate.py) are read as one tensor per packed
weight, decoded bit for bit as the producer's own dequantize does, compared with the BF16 original, and their
scale tensors are never analysed or ranked.  Hostile variants give one line naming the file and tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fpsim.io import open_tensors, write_safetensors
from fpsim.io.checkpoints import SCALE_SUFFIXES, decode_quantized, find_quantized, read_codes
from tests.cliutil import run, strict_json

DATA = Path(__file__).resolve().parent / "data" / "checkpoints"
CT, MO, TA, REF = DATA / "ct_nvfp4", DATA / "modelopt_nvfp4", DATA / "torchao_nvfp4", DATA / "reference"
ALL = pytest.mark.parametrize("folder", [CT, MO, TA], ids=["compressed-tensors", "modelopt", "torchao"])
#: Every checkpoint generate.py writes: folder → (producer, format).
EVERY = {"ct_nvfp4": ("compressed-tensors", "nvfp4"), "modelopt_nvfp4": ("modelopt", "nvfp4"),
         "torchao_nvfp4": ("torchao", "nvfp4"), "ct_mxfp4": ("compressed-tensors", "mxfp4"),
         "ct_mxfp8": ("compressed-tensors", "mxfp8"), "ct_fp8": ("compressed-tensors", "fp8"),
         "modelopt_mxfp8": ("modelopt", "mxfp8"), "modelopt_fp8": ("modelopt", "fp8")}
FAST = ["--formats", "nvfp4", "--seeds", "0"]
LINEARS = [f"model.layers.{i}.{m}.weight" for i in (0, 1) for m in
           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")]


def _copy(src, tmp_path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _json(r):
    return strict_json(r.stdout[r.stdout.index("{"):])


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("name", sorted(EVERY))
def test_scale_tensors_are_never_ranked_and_packed_weights_are_read(name):
    """The issue's defect: packed weights skipped as 'not a floating-point tensor', scale tensors analysed as
    weights and ranked for BF16.  Now each quantized weight is one record and no scale tensor is analysed."""
    r = run(DATA / name, *FAST, "--format", "json")
    assert r.exit_code == 0, r.output
    assert "not a floating-point tensor" not in r.output
    d = _json(r)
    analysed = [row["tensor"].split(":", 1)[1] for row in d["rows"]]
    ranked = [e["tensor"].split(":", 1)[1] for e in d["summary"]["ranking"]]
    for tensor in analysed + ranked + d["summary"]["keep_bf16"]:
        leaf = tensor.rpartition(".")[2]
        assert leaf not in SCALE_SUFFIXES and not leaf.endswith("_scale"), tensor
    assert not any(n in analysed for n in LINEARS)  # the packed weights are not re-quantized as floats either
    names = [q["tensor"].split(":", 1)[1] for q in d["quantized"]]
    assert sorted(names) == sorted(LINEARS)  # each quantized tensor exactly once
    assert {(q["producer"], q["format"]) for q in d["quantized"]} == {EVERY[name]}


@pytest.mark.parametrize("name", sorted(EVERY))
def test_decode_equals_the_producers_own_dequantize(name):
    """fpsim's decode of every quantized weight is bit-identical to the library's own (BF16), computed by
    generate.py with compressed-tensors' compressors' decompress (NVFP4, MXFP4, MXFP8, FP8), ModelOpt's
    NVFP4QTensor / MXFP8QTensor / FP8QTensor.dequantize and torchao's NVFP4Tensor.dequantize (its block scales
    swizzled in the file)."""
    groups, rest, aside, notes = find_quantized(open_tensors(DATA / name))
    assert len(groups) == 14 and not aside and not notes and all(g.swizzled == (name == TA.name) for g in groups)
    theirs = {t.name: t for t in open_tensors(DATA / "decoded" / f"{name}.safetensors")}
    for g in groups:
        assert (g.producer, g.fmt) == EVERY[name] and g.dtype == "bfloat16" and g.error is None
        codes, scale, glob_, _ = read_codes(g)
        ours = decode_quantized(g, codes, scale, glob_)
        want = theirs[g.name].load().astype(np.float32)
        bad = np.argwhere(_bits(ours) != _bits(want))
        assert not bad.size, f"{g.name}: first difference at {bad[0]}: {ours[tuple(bad[0])]} vs {want[tuple(bad[0])]}"


def test_what_the_file_shows_without_a_reference():
    d = _json(run(CT, *FAST, "--format", "json"))
    q = {r["tensor"].split(":", 1)[1]: r for r in d["quantized"]}
    down = q["model.layers.0.mlp.down_proj.weight"]
    assert down["shape"] == [32, 64] and down["blocks"] == 128 and sum(down["code_histogram"]) == 32 * 64
    # compressed-tensors stores the encode scale 2688/amax, computed in BF16 (976 = bf16(2688/2.75))
    assert down["global_scale"] == 976.0 and down["global_scale_kind"] == "encode"
    assert down["decoded_amax"] == 2.75 and down["max_scale_blocks"] == 1
    # llm-compressor fuses the global scales of q/k/v and of gate/up
    qkv = q["model.layers.1.self_attn.q_proj.weight"]["shares_global_scale_with"]
    assert sorted(t.split(":", 1)[1] for t in qkv) == ["model.layers.1.self_attn.k_proj.weight",
                                                        "model.layers.1.self_attn.v_proj.weight"]
    assert q["model.layers.0.self_attn.o_proj.weight"]["shares_global_scale_with"] == []
    assert down["rel_error"] is None and down["notes"]["rel_error"] == "no --reference given"
    mo = {r["tensor"].split(":", 1)[1]: r for r in _json(run(MO, *FAST, "--format", "json"))["quantized"]}
    # ModelOpt stores the decode scale amax/2688
    m = mo["model.layers.0.mlp.down_proj.weight"]
    assert m["global_scale_kind"] == "decode" and m["implied_amax"] == pytest.approx(2.75, rel=1e-6)


@ALL
def test_reference_gives_error_and_conformance_per_tensor(folder):
    """With --reference each tensor gets its error against the original and a conformance verdict: every byte of
    the three libraries' checkpoints is what the producer's convention (fpsim.conventions) gives the BF16
    original, the global scales of fused q/k/v and gate/up projections (llm-compressor, ModelOpt; torchao fuses
    none) from the largest amax of the group."""
    r = run(folder, *FAST, "--reference", REF, "--format", "json")
    assert r.exit_code == 0, r.output
    d = _json(r)
    fused = 0
    for q in d["quantized"]:
        assert 0 < q["rel_error"] < 0.2 and q["sqnr_db"] > 10 and abs(q["rel_error"] - q["fpsim_rel_error"]) < 0.01
        assert q["conformant"] and q["blocks_differing"] == 0 and q["first_difference"] is None, q
        assert q["conformance_convention"] == q["producer"]
        module = q["tensor"].split(".")[-2]
        if folder != TA:  # torchao fuses none (two of its tensors share a value by equal amaxes, not by fusion)
            shares = {"q_proj": 2, "k_proj": 2, "v_proj": 2, "gate_proj": 1, "up_proj": 1}
            assert len(q["shares_global_scale_with"]) == shares.get(module, 0), q["tensor"]
        fused += q["global_scale_from"].startswith("the largest amax")  # a member of a group without the group's max
    assert fused >= (4 if folder != TA else 0)  # in each layer at least two of q/k/v and one of gate/up
    assert d["quantized_summary"] == dict(d["quantized_summary"], conformance_checked=14, conformant=14)


@pytest.mark.parametrize("folder,zero_block_scale", [(CT, 0x20), (MO, 0x38), (TA, 0x08)],
                         ids=["compressed-tensors", "modelopt", "torchao"])
def test_convention_option_names_where_fpsim_differs(folder, zero_block_scale):
    """--convention fpsim checks the same bytes against fpsim's own order: the all-zero block generate.py plants
    (layer 1 q_proj row 3, block 0) is one place every producer leaves it: compressed-tensors writes scale 0.125
    (0x20), ModelOpt 1.0 (0x38), torchao 2^-6 (0x08, its lower clamp), fpsim 0."""
    d = _json(run(folder, *FAST, "--reference", REF, "--convention", "fpsim", "--select", "*layers.1.self_attn.q_proj*",
                  "--format", "json"))
    (q,) = d["quantized"]
    fd = q["first_difference"]
    assert not q["conformant"] and q["conformance_convention"] == "fpsim"
    assert (fd["row"], fd["block"], fd["scale_file"], fd["scale_expected"]) == (3, 0, zero_block_scale, 0)
    assert fd["codes_file"] == fd["codes_expected"] == [0] * 16
    table = run(folder, *FAST, "--reference", REF, "--convention", "fpsim", "--select", "*layers.1.self_attn.q_proj*")
    assert "row 3 block 0 (columns 0-15): scale byte" in table.stdout


def _poke(path: Path, tensor: str, index: tuple[int, int], xor: int) -> None:
    """Flip bits of one byte of one tensor of a safetensors file in place."""
    from fpsim.io.safetensors import read_header

    e = next(e for e in read_header(path)[0] if e.name == tensor)
    off = e.offset + index[0] * e.shape[1] + index[1]
    raw = bytearray(path.read_bytes())
    raw[off] ^= xor
    path.write_bytes(bytes(raw))


def test_a_changed_byte_is_named_by_its_block(tmp_path):
    """A defect planted in a copy of the ModelOpt checkpoint: one code nibble (row 5, element 37: block 2) and
    one block scale (row 9, block 3) of layer 0's down_proj; conformance names both blocks, nothing else."""
    ck = _copy(MO, tmp_path)
    _poke(ck / "model.safetensors", "model.layers.0.mlp.down_proj.weight", (5, 18), 0x10)  # element 37: high nibble
    _poke(ck / "model.safetensors", "model.layers.0.mlp.down_proj.weight_scale", (9, 3), 0x01)
    d = _json(run(ck, *FAST, "--reference", REF, "--format", "json"))
    q = {r["tensor"].split(":", 1)[1]: r for r in d["quantized"]}
    down = q.pop("model.layers.0.mlp.down_proj.weight")
    assert not down["conformant"] and down["blocks_differing"] == 2 and down["blocks_scale_differing"] == 1
    fd = down["first_difference"]
    assert (fd["row"], fd["block"], fd["columns"]) == (5, 2, [32, 48]) and fd["scale_file"] == fd["scale_expected"]
    assert [i for i, (a, b) in enumerate(zip(fd["codes_file"], fd["codes_expected"])) if a != b] == [5]
    assert all(r["conformant"] for r in q.values())


@pytest.mark.parametrize("name", ["ct_mxfp4", "ct_mxfp8", "ct_fp8", "modelopt_mxfp8", "modelopt_fp8"])
def test_other_formats_give_error_not_conformance(name):
    """MXFP4, MXFP8 and FP8 tensors: their scales' range and the error against the original (close to fpsim's own
    quantization of it), conformance null with its reason (fpsim.conventions covers NVFP4 only)."""
    d = _json(run(DATA / name, *FAST, "--reference", REF, "--format", "json"))
    for q in d["quantized"]:
        # within 25 % of fpsim's own (per-tensor FP8 against compressed-tensors' per-row scales: ~10 % more)
        assert 0 < q["rel_error"] < 0.2 and abs(q["rel_error"] / q["fpsim_rel_error"] - 1) < 0.25, q["tensor"]
        assert 0 < q["scale_min"] <= q["scale_max"] and q["global_scale"] is None
        assert q["conformant"] is None and q["notes"]["conformant"].startswith("checked for NVFP4 only")
        assert (q["blocks"] is None) == (q["format"] == "fp8")


def test_a_missing_reference_tensor_is_a_reason_not_a_failure(tmp_path):
    ref = tmp_path / "ref.safetensors"
    write_safetensors(ref, {"model.layers.0.mlp.down_proj.weight": np.zeros((32, 64), np.float32)})
    d = _json(run(MO, *FAST, "--reference", ref, "--format", "json"))
    q = {r["tensor"].split(":", 1)[1]: r for r in d["quantized"]}
    assert q["model.layers.0.mlp.up_proj.weight"]["notes"]["rel_error"].startswith("no tensor model.layers.0")
    assert q["model.layers.0.mlp.down_proj.weight"]["rel_error"] is None  # an all-zero original: no relative error
    assert "the original is zero" in q["model.layers.0.mlp.down_proj.weight"]["notes"]["rel_error"]


def test_hostile_parts_give_one_line_naming_file_and_tensor(tmp_path):
    """A scale tensor of the wrong shape: one error line naming the tensor, exit 1, the others still reported."""
    bad = tmp_path / "bad"
    bad.mkdir()
    rng = np.random.default_rng(0)
    write_safetensors(bad / "model.safetensors", {
        "a.weight_packed": rng.integers(0, 256, (4, 8), dtype=np.uint8),
        "a.weight_scale": np.ones((4, 1), np.float32),
        "a.weight_global_scale": np.ones(1, np.float32),
        "b.weight": rng.integers(0, 256, (4, 8), dtype=np.uint8),
        "b.weight_scale": np.full((4, 1), 0x38, np.uint8),
        "b.weight_scale_2": np.float32(1.0).reshape(()),
    })
    r = run(bad, *FAST)
    assert r.exit_code == 3, r.output  # nothing could be read
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert any("a.weight_scale" in ln and "dtype" in ln for ln in lines), r.stderr
    assert any("b.weight_scale" in ln for ln in lines), r.stderr
    assert all(len(ln) < 300 for ln in lines)


def test_corrupt_metadata_is_a_note_and_the_tensors_still_read(tmp_path):
    ck = _copy(MO, tmp_path)
    (ck / "config.json").write_text('{"quantization_config": ')
    (ck / "hf_quant_config.json").write_bytes(b"\xff\xfe")
    r = run(ck, *FAST, "--format", "json")
    assert r.exit_code == 0, r.output
    assert "corrupt JSON" in r.stderr
    d = _json(r)
    assert len(d["quantized"]) == 14
    # without config.json's torch_dtype the decode is left in float32 (no BF16 cast), and says so in the record
    assert {q["decoded_dtype"] for q in d["quantized"]} == {"float32"}


def test_sharded_index_and_selection(tmp_path):
    """The two shards of the compressed-tensors checkpoint are one checkpoint (module parts may sit in either);
    --select picks quantized tensors by their logical name."""
    d = _json(run(CT, *FAST, "--select", "*down_proj*", "--format", "json"))
    assert sorted(q["tensor"].split(":", 1)[1] for q in d["quantized"]) == [
        "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    assert json.loads((CT / "model.safetensors.index.json").read_text())["weight_map"]


def test_every_null_has_a_reason():
    """Every JSON value of a quantized record is a number, string, list or bool, or null with its reason."""
    for args in ((CT,), (MO, "--reference", REF), (TA, "--reference", REF), (DATA / "ct_mxfp4", "--reference", REF),
                 (DATA / "modelopt_fp8",)):
        for q in _json(run(*args, *FAST, "--format", "json"))["quantized"]:
            missing = [k for k, v in q.items() if v is None and k not in q["notes"]]
            assert not missing, (q["tensor"], missing)


def test_reference_that_names_nothing_is_a_usage_error(tmp_path):
    r = run(MO, *FAST, "--reference", tmp_path / "missing")
    assert r.exit_code == 2 and r.stderr.count("error:") == 1 and "--reference" in r.stderr and "missing" in r.stderr
    plain = tmp_path / "w.safetensors"
    write_safetensors(plain, {"w": np.ones((4, 16), np.float32)})
    r = run(plain, *FAST, "--reference", REF)
    assert r.exit_code == 0 and "no quantized checkpoint tensor in the inputs" in r.stderr


def test_torchao_metadata_missing_or_corrupt_is_a_note(tmp_path):
    """torchao's per-tensor JSON says the scales are swizzled; without it (or unreadable) the scales are read as
    swizzled, torchao's default, and the record says why — still decoded right, as the conformance shows."""
    import struct

    raw = (TA / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["model.layers.0.mlp.down_proj.weight"] = "{not json"
    del header["__metadata__"]["model.layers.0.mlp.up_proj.weight"]
    new = json.dumps(header).encode()
    ck = tmp_path / "torchao"
    ck.mkdir()
    (ck / "config.json").write_bytes((TA / "config.json").read_bytes())
    (ck / "model.safetensors").write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])  # same tensor bytes
    d = _json(run(ck, *FAST, "--reference", REF, "--format", "json"))
    q = {r["tensor"].split(":", 1)[1]: r for r in d["quantized"]}
    assert "torchao metadata" in q["model.layers.0.mlp.down_proj.weight"]["notes"]["layout"]
    assert "read as swizzled" in q["model.layers.0.mlp.up_proj.weight"]["notes"]["layout"]
    assert all(r["conformant"] for r in q.values())
    md = run(ck, *FAST, "--format", "markdown").stdout
    assert "```text\nQuantized tensors" in md


@pytest.mark.parametrize("name", ["ct_nvfp4", "modelopt_fp8", "ct_fp8"])
def test_row_chunks_give_the_whole_tensor_record(name, monkeypatch):
    """Records are made chunk by chunk of rows (bounded memory); 5-row chunks give the one-chunk record,
    differences found under another convention and their first block included (per-tensor and per-row FP8
    scales sliced right)."""
    from fpsim.io import checkpoint_check as cc

    keep = ("layers.1.self_attn.q_proj", "layers.0.mlp.gate_proj")
    groups = [g for g in find_quantized(open_tensors(DATA / name))[0] if g.name.startswith(tuple(
        f"model.{k}" for k in keep))]
    assert len(groups) == 2
    originals = {t.name: t for t in open_tensors(REF)}

    def records():
        return [cc.inspect_group(g, g.name, originals[g.name], True, convention="fpsim" if g.fmt == "nvfp4" else None)
                for g in groups]

    whole = records()
    monkeypatch.setattr(cc, "_chunks", lambda rows, cols: [(r, min(r + 5, rows)) for r in range(0, rows, 5)])
    for a, b in zip(records(), whole):
        assert a.keys() == b.keys()
        for k in a:  # sums of squares add in another order: equal to rounding
            assert a[k] == (pytest.approx(b[k], rel=1e-12) if isinstance(b[k], float) else b[k]), (a["tensor"], k)
    assert name != "ct_nvfp4" or any(r["blocks_differing"] for r in whole)
