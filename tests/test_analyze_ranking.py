"""Issue 48 item 1: a keep-BF16 ranking a user can act on (fpsim.ranking).

An LLM-shaped file (RMSNorm gains, biases, a rotary table, linear weights, an activation with outlier channels, a
Gaussian gradient) gets the ranking fpsim/ranking.py documents: the outlier-channel activation — least damaged by
the plain relative error, which its outliers dominate — is first and flagged; norms, biases and the rotary table
are reported but not ranked; Gaussian tensors are not flagged, whichever others are selected.
"""

import math

import numpy as np
import pytest

from fpsim.analysis import analyze_tensor
from fpsim.io import write_safetensors
from fpsim.ranking import KEEP_ABOVE, gaussian_bulk_error, role_guess
from tests.cliutil import run, strict_json

ACT = "model.layers.1.mlp.down_proj.input"
GRAD = "model.layers.0.mlp.down_proj.grad_output"
UNRANKED = {"model.layers.0.input_layernorm.weight": "norms", "model.layers.1.input_layernorm.weight": "norms",
            "model.norm.weight": "norms", "model.layers.0.self_attn.q_proj.bias": "bias",
            "model.layers.1.self_attn.q_proj.bias": "bias", "model.rotary_emb.inv_freq": "rotary"}


def llm_file(path):
    """A small checkpoint-plus-capture shaped like an LLM's (0.9 MB)."""
    rng = np.random.default_rng(0)
    t = {}
    for i in range(2):
        t[f"model.layers.{i}.input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(128)).astype(np.float32)
        t[f"model.layers.{i}.self_attn.q_proj.weight"] = (0.02 * rng.standard_normal((128, 128))).astype(np.float32)
        t[f"model.layers.{i}.self_attn.q_proj.bias"] = (0.01 * rng.standard_normal(128)).astype(np.float32)
        t[f"model.layers.{i}.mlp.down_proj.weight"] = (0.02 * rng.standard_t(5, (128, 256))).astype(np.float32)
    t["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(128)).astype(np.float32)
    t["model.rotary_emb.inv_freq"] = (10000.0 ** (-np.arange(0, 64, 2) / 64)).astype(np.float32)
    act = rng.standard_normal((128, 256)).astype(np.float32)
    act[:, [7, 100, 201]] *= 3000.0  # outlier channels: kurtosis ~1e3, their energy dwarfs the rest
    t[ACT] = act
    t[GRAD] = (1e-4 * rng.standard_normal((128, 256))).astype(np.float32)
    t["model.layers.0.self_attn.o_proj.input"] = rng.standard_normal((128, 256)).astype(np.float32)
    write_safetensors(path, t)
    return path


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return llm_file(tmp_path_factory.mktemp("llm") / "llm.safetensors")


def summary_of(path, *args):
    r = run(path, "--formats", "nvfp4", "--seeds", "0", "--format", "json", *args)
    assert r.exit_code == 0, r.output
    d = strict_json(r.output)
    return d["summary"], {x["tensor"].split(":", 1)[1]: x for x in d["rows"]}


def test_llm_file_gets_the_documented_ranking(llm):
    s, rows = summary_of(llm)
    ranked = [e["tensor"].split(":", 1)[1] for e in s["ranking"]]
    # what the old key (rel_error) said: the outlier activation is the least damaged ranked tensor
    assert min(ranked, key=lambda t: rows[t]["rel_error"]) == ACT
    # the documented key puts it first, flagged; nothing Gaussian-like is flagged
    assert ranked[0] == ACT and [e["tensor"].split(":", 1)[1] for e in s["ranking"] if e["keep_bf16"]] == [ACT]
    top = s["ranking"][0]
    assert top["bulk_vs_gaussian"] > 3 and top["rank"] == 1 and top["of"] == 7
    assert all(e["bulk_vs_gaussian"] < 1.2 for e in s["ranking"][1:])
    assert s["keep_above"] == KEEP_ABOVE and s["gaussian_bulk_rel_error"] == gaussian_bulk_error("nvfp4")
    # reported but not ranked, each with its reason
    un = {u["tensor"].split(":", 1)[1]: u["reason"] for u in s["unranked"]}
    assert set(un) == set(UNRANKED) and all(UNRANKED[t] in un[t] for t in un)
    assert {rows[t]["role"] for t in UNRANKED} == {"norm", "bias", "rotary"}
    assert rows["model.rotary_emb.inv_freq"]["rel_error"] is not None  # still measured and reported
    assert s["roles"][f"llm.safetensors:{ACT}"]["role"] == "activation"


def test_flag_does_not_depend_on_the_selection(llm):
    full, _ = summary_of(llm)
    ratio = {e["tensor"]: (e["bulk_vs_gaussian"], e["keep_bf16"]) for e in full["ranking"]}
    for sel in ([GRAD, "model.layers.0.self_attn.q_proj.weight"], [GRAD], [ACT, GRAD]):
        s, _ = summary_of(llm, *[a for t in sel for a in ("--select", t)])
        assert {e["tensor"]: (e["bulk_vs_gaussian"], e["keep_bf16"]) for e in s["ranking"]} == \
            {t: ratio[t] for t in (f"llm.safetensors:{n}" for n in sel)}
    s, _ = summary_of(llm, "--select", GRAD, "--select", "model.layers.0.self_attn.q_proj.weight")
    assert s["keep_bf16"] == []  # a plain Gaussian gradient is never flagged because of what else was chosen


def test_table_shows_threshold_rank_and_roles(llm):
    r = run(llm, "--formats", "nvfp4", "--seeds", "0")
    assert r.exit_code == 0
    assert "keep BF16 when bulk_rel_error under nvfp4 > 1.5 × its value on a standard Gaussian" in r.output
    assert "  1/7  " in r.output and "not ranked:" in r.output and "rotary (rotary/inv_freq/rope" in r.output
    assert f"llm.safetensors:{ACT}  (activation" in r.output and max(map(len, r.output.splitlines())) <= 160
    md = run(llm, "--formats", "nvfp4", "--seeds", "0", "--format", "markdown").output
    assert "* llm.safetensors:model.rotary_emb.inv_freq: rotary (rotary/inv_freq/rope in the name)" in md


def test_bulk_rel_error_equals_a_direct_computation():
    import fpsim

    x = np.random.default_rng(4).standard_normal((64, 96)).astype(np.float32)
    x[:, 3] *= 500
    x[0, :5] = 0
    row = analyze_tensor("a", x, schemes=("nvfp4",))[0]
    xq = fpsim.quantize(x, "nvfp4").dequantize()
    med = np.median(np.abs(x[x != 0]))
    bulk = np.abs(x) <= 8 * med * (1 + 2**-7)  # the median is taken to bfloat16 precision, rounded up
    assert bulk.sum() < x.size - 60  # the outlier column is out
    d = (x - xq).astype(np.float64)[bulk]
    want = math.sqrt(np.sum(d * d) / np.sum(x.astype(np.float64)[bulk] ** 2))
    assert math.isclose(row["bulk_rel_error"], want, rel_tol=1e-3)
    assert row["bulk_rel_error"] > 5 * row["rel_error"]


@pytest.mark.parametrize("name,source,role", [
    ("high_precision", "/d/tensor_dumps/rank_0/decoder_layers_0_self_attention_linear_qkv_activation_iter_000001.pt",
     "activation"),
    ("high_precision", "/d/rank_0/decoder_layers_1_mlp_linear_fc2_gradient_iter_000002.pt", "gradient"),
    ("high_precision", "/d/rank_0/decoder_layers_1_mlp_linear_fc2_weight_iter_000002.pt", "weight"),
    ("model.layers.3.self_attn.q_proj.bias", None, "bias"),
    ("model.rotary_emb.inv_freq", None, "rotary"),
    ("model.layers.0.post_attention_layernorm.weight", None, "norm"),
    ("transformer.ln_f.weight", None, "norm"),
    ("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", None, "norm"),
    ("decoder.layers.0.self_attention.layernorm_qkv.weight", None, "weight"),  # TE's fused LayerNormLinear
    ("model.embed_tokens.weight", None, "embedding"),
    ("fc1.grad_output", None, "gradient"),
    ("fc1.input", None, "activation"),
])
def test_roles_from_the_name_and_te_dump_file_name(name, source, role):
    assert role_guess(name, source)[0] == role


def test_te_dump_roles_end_to_end(tmp_path):
    torch = pytest.importorskip("torch", reason="Transformer Engine dumps are torch files")
    g = torch.Generator().manual_seed(0)
    for t in ("activation", "gradient", "weight"):
        torch.save({"high_precision": torch.randn(16, 32, generator=g)},
                   tmp_path / f"decoder_layers_0_mlp_linear_fc1_{t}_iter_000003.pt")
    r = run(tmp_path, "--formats", "nvfp4", "--seeds", "0", "--format", "json")
    assert r.exit_code == 0, r.output
    d = strict_json(r.output)
    got = {x["tensor"].split("_fc1_")[1].split("_iter")[0]: x["role"] for x in d["rows"]}
    assert got == {"activation": "activation", "gradient": "gradient", "weight": "weight"}
    assert all("file name" in v["from"] for v in d["summary"]["roles"].values())
