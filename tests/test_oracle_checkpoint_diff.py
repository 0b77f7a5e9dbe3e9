"""``fpsim diff CKPT --reference ORIGINAL [--tensor NAME]`` (issue 47 item 3) on the producers' own checkpoints
(tests/data/checkpoints: compressed-tensors, ModelOpt and torchao NVFP4, made by those libraries from the BF16
original), and bfloat16 inputs to ``diff --input`` and ``explain --block``."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import fpsim
from fpsim.io import write_safetensors
from fpsim_cli.main import main

CK = Path(__file__).resolve().parent / "data" / "checkpoints"
REF = str(CK / "reference" / "model.safetensors")


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


def run(*args):
    r = CliRunner().invoke(main, ["diff", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def test_compressed_tensors_checkpoint_causes_are_its_parts():
    r = run(CK / "ct_nvfp4", "--reference", REF, "--tensor", "model.layers.0.mlp.down_proj.weight", "--show", "1")
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert out.startswith("== model.layers.0.mlp.down_proj.weight (compressed-tensors,")
    assert "producer convention: every differing byte and value is compressed-tensors's" in out
    assert "global differing by cause: stores the encode scale G (compressed-tensors) ×1" in out
    assert "likely causes (all mismatches): global scale ×15, global scale + scale operation order ×3, stored " \
           "global scale ×1" in out
    assert "rounding:" not in out  # no stochastic-rounding test where the parts explain every byte


def test_fused_layers_shared_global_scale_is_named():
    r = run(CK / "ct_nvfp4", "--reference", REF, "--tensor", "model.layers.0.mlp.gate_proj", "--format", "json")
    (t,) = json.loads(r.stdout)
    assert t["producer"] == "compressed-tensors" and not t["identical"]
    causes = t["conventions"]["causes"]
    assert set(causes["global"]) == {next(iter(causes["global"]))}
    g = next(iter(causes["global"]))
    assert g.startswith("shared global scale: the stored global scale is that of amax") and "encode scale G" in g
    assert NOT not in json.dumps(causes)
    assert set(t["causes"]) <= {"tensor amax", "scale operation order + tensor amax"}


NOT = "not explained"


@pytest.mark.parametrize("ckpt,producer", [("modelopt_nvfp4", "modelopt"), ("torchao_nvfp4", "torchao")])
def test_every_tensor_of_a_checkpoint_is_diagnosed(ckpt, producer):
    """Every differing byte is named with the producer's own parts (or a shared global scale), or not explained
    (torchao: one code that CT's encode fl(x/fl(s/G)) reproduces as well as torchao's arithmetic)."""
    r = run(CK / ckpt, "--reference", REF, "--format", "json")
    assert r.exit_code == 1
    res = json.loads(r.stdout)
    assert len(res) >= 7 and {t["producer"] for t in res} == {producer}
    not_explained = 0
    for t in res:
        causes = t["conventions"]["causes"]
        for what in ("codes", "scales", "global"):
            for cause, n in causes.get(what, {}).items():
                for alt in cause.split(" or "):
                    assert alt == NOT or all(producer in part or part.startswith("shared global scale")
                                             for part in alt.split(" + ")), (t["tensor"], cause)
                not_explained += n if cause == NOT else 0
    assert not_explained <= 1


@pytest.mark.parametrize("args,msg", [
    ((CK / "ct_nvfp4", "--reference", CK / "ct_fp8" / "model.safetensors"), "need a 2-D floating-point tensor"),
    ((CK / "ct_fp8", "--reference", REF), "no NVFP4 tensor of a compressed-tensors, ModelOpt or torchao"),
    ((CK / "ct_nvfp4", "--reference", REF, "--tensor", "nope"), "no NVFP4 tensor 'nope'"),
    ((CK / "ct_nvfp4", "--reference", CK / "missing.safetensors"), "missing.safetensors"),
    ((CK / "ct_nvfp4", "--tensor", "x"), "CANDIDATE --reference ORIGINAL"),
])
def test_bad_checkpoint_input_is_one_line_exit_2(args, msg):
    r = run(*args)
    assert r.exit_code == 2 and msg in r.stderr and r.stderr.count("\n") == 1, r.output


def test_a_reference_without_the_tensor_is_one_line(tmp_path):
    write_safetensors(tmp_path / "o.safetensors", {"other": np.ones((2, 16), np.float32)})
    r = run(CK / "ct_nvfp4", "--reference", tmp_path / "o.safetensors", "--tensor", "model.layers.0.mlp.up_proj")
    assert r.exit_code == 2 and "no tensor 'model.layers.0.mlp.up_proj.weight' (the original of" in r.stderr


def test_a_checkpoint_without_reference_says_how(tmp_path):
    r = run(CK / "ct_nvfp4" / "model-00001-of-00002.safetensors", "--input", f"{REF}:model.norm.weight")
    assert r.exit_code == 2 and "a quantized checkpoint is given as CANDIDATE --reference ORIGINAL" in r.stderr


def test_bfloat16_inputs_to_diff_and_explain_block(tmp_path):
    x = (np.random.default_rng(5).standard_normal((2, 32)) * 0.1).astype(ml_dtypes.bfloat16)
    write_safetensors(tmp_path / "x.safetensors", {"x": x})
    q = fpsim.quantize(x, "nvfp4", convention="compressed-tensors")
    np.savez(tmp_path / "cand.npz", codes=q.data, scales=q.scales)
    r = run(tmp_path / "cand.npz", "--input", f"{tmp_path / 'x.safetensors'}:x")
    assert r.exit_code in (0, 1) and "scheme nvfp4" in r.stdout, r.output
    if r.exit_code == 1:  # a bfloat16 input is quantized as one: compressed-tensors' parts explain the bytes
        assert "producer parts that explain every differing byte" in r.stdout
    e = CliRunner().invoke(main, ["explain", "--block", f"{tmp_path / 'x.safetensors'}:x:0"])
    assert e.exit_code == 0 and "Traceback" not in e.output, e.output
