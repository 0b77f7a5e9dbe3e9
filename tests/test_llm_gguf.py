"""SmolLM2 loader (studies/llm/smollm2.py): a tiny llama GGUF written by gguf's own writer; bad files get one line,
and files that would load as a different model without a word (big-endian, an untied output head, impossible
metadata) are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from studies.llm.smollm2 import GGUFError, LlamaModel, Tokenizer, read_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
D, FF, NH, NKV, NL = 64, 96, 4, 2, 2
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["ab"]


def write_tiny(path: Path, *, q_type=gguf.GGMLQuantizationType.Q4_1, k_shape=None, skip=None, seed=0) -> dict:
    """A 2-layer llama GGUF (d 64, 4 q / 2 kv heads) with Q4_1 linears, Q8_0 embedding, F32 norms."""
    rng = np.random.default_rng(seed)
    kv = NKV * D // NH
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(NL)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    floats = {}

    def add(name, arr, qt):
        if name == skip:
            return
        arr = arr.astype(np.float32)
        if qt in (gguf.GGMLQuantizationType.F32,):
            w.add_tensor(name, arr)
            floats[name] = arr
        else:
            q = gguf.quants.quantize(arr, qt)
            w.add_tensor(name, q, raw_dtype=qt)
            floats[name] = gguf.quants.dequantize(q, qt).reshape(arr.shape)

    f32, q8 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
    add("token_embd.weight", rng.standard_normal((len(TOKENS), D)) * 0.5, q8)
    for i in range(NL):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(D), f32)
        add(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(D), f32)
        for nm, shp in (("attn_q", (D, D)), ("attn_k", k_shape or (kv, D)), ("attn_v", (kv, D)),
                        ("attn_output", (D, D)), ("ffn_gate", (FF, D)), ("ffn_up", (FF, D)),
                        ("ffn_down", (D, FF))):
            add(p + nm + ".weight", rng.standard_normal(shp) / np.sqrt(shp[1]), q_type)
    add("output_norm.weight", np.ones(D), f32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


def test_read_and_forward(tmp_path):
    p = tmp_path / "tiny.gguf"
    floats = write_tiny(p)
    cfg, weights, meta = read_gguf(p)
    assert (cfg.n_layer, cfg.d_model, cfg.d_ff, cfg.n_head, cfg.n_kv_head, cfg.vocab) == (NL, D, FF, NH, NKV,
                                                                                           len(TOKENS))
    assert cfg.rope_base == 10000.0
    for k, v in floats.items():  # gguf's own dequantization, out x in
        np.testing.assert_array_equal(weights[k], v)
    assert weights["blk.0.ffn_down.weight"].shape == (D, FF)
    model = LlamaModel(cfg, weights)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    logits = model(ids)
    assert logits.shape == (1, 6, len(TOKENS)) and torch.isfinite(logits).all()
    # causal: the first positions do not depend on later tokens
    ids2 = ids.clone()
    ids2[0, -1] = 9
    torch.testing.assert_close(model(ids2)[0, :5], logits[0, :5])
    # tied head: logits of a zero final norm weight vanish
    tok = Tokenizer(meta)
    assert tok.encode("ab") == [len(TOKENS) - 1] and tok.decode(tok.encode("abc")) == "abc"


def test_rope_layouts_differ_and_match_reference(tmp_path):
    """Interleaved RoPE rotates pairs (2i, 2i+1): q·k after rotation depends only on the position difference."""
    p = tmp_path / "tiny.gguf"
    write_tiny(p)
    cfg, weights, _ = read_gguf(p)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10]])
    a, b = LlamaModel(cfg, weights, "interleaved")(ids), LlamaModel(cfg, weights, "half")(ids)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a[:, 0], b[:, 0])  # position 0 is not rotated in either layout


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "studies.llm.capture_llm", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case", ["truncated", "unknown_type", "unsupported_type", "shape", "missing", "not_gguf"])
def test_bad_gguf_one_line(tmp_path, case):
    p = tmp_path / "bad.gguf"
    if case == "shape":
        write_tiny(p, k_shape=(D, D))
    elif case == "unsupported_type":
        write_tiny(p, q_type=gguf.GGMLQuantizationType.Q5_0)
    elif case == "missing":
        write_tiny(p, skip="blk.1.ffn_up.weight")
    elif case == "not_gguf":
        p.write_bytes(b"PK\x03\x04 not a gguf file at all" * 10)
    else:
        write_tiny(p)
        data = bytearray(p.read_bytes())
        if case == "truncated":
            data = data[: len(data) - 1000]
        else:  # tensor info of the first tensor: name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
            name = b"token_embd.weight"
            at = data.index(name) + len(name)
            n_dims = int.from_bytes(data[at:at + 4], "little")
            t_at = at + 4 + 8 * n_dims
            data[t_at:t_at + 4] = (977).to_bytes(4, "little")
        p.write_bytes(bytes(data))
    with pytest.raises(GGUFError) as ei:
        read_gguf(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    if case in ("shape", "unsupported_type", "missing"):
        assert "blk." in msg
    r = _cli("--gguf", str(p), "--out", str(tmp_path / "out"), "--check-only")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def _refused(p: Path) -> str:
    with pytest.raises(GGUFError) as ei:
        read_gguf(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_big_endian_file_refused_not_loaded_as_garbage(tmp_path):
    """gguf.quants.dequantize reads little-endian bytes: a big-endian file would load as NaN / 1e37 weights."""
    p = tmp_path / "be.gguf"
    write_tiny(p, q_type=gguf.GGMLQuantizationType.Q4_0)  # Q4_0 / Q8_0 / F32: types the converter swaps
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_convert_endian", str(p), "big"], input="YES\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert gguf.GGUFReader(str(p)).endianess == gguf.GGUFEndian.BIG
    assert "big-endian" in _refused(p)


def test_untied_output_head_refused_not_ignored(tmp_path, monkeypatch):
    """A llama GGUF with its own ``output.weight`` head is refused, not loaded with the head tied to the embedding."""
    add = gguf.GGUFWriter.add_tensor

    def with_head(self, name, arr, *a, **k):
        add(self, name, arr, *a, **k)
        if name == "output_norm.weight":
            add(self, "output.weight", np.zeros((len(TOKENS), D), np.float32))

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", with_head)
    p = tmp_path / "untied.gguf"
    write_tiny(p)
    monkeypatch.undo()
    assert "tensor output.weight" in _refused(p)


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("llama.attention.head_count", 0, "uint32"),  # a division by zero
    ("llama.block_count", -1, "int32"),  # a model of no layers, every blk.* tensor ignored
    ("llama.block_count", "two", "string"),  # a bare ValueError (a traceback in capture_llm)
])
def test_bad_metadata_one_line(tmp_path, monkeypatch, key, value, kind):
    setters = {"llama.attention.head_count": "add_head_count", "llama.block_count": "add_block_count",
               "llama.attention.head_count_kv": "add_head_count_kv"}
    monkeypatch.setattr(gguf.GGUFWriter, setters[key],
                        lambda self, _n: getattr(self, f"add_{kind}")(key, value))
    p = tmp_path / "bad.gguf"
    write_tiny(p)
    monkeypatch.undo()
    assert key in _refused(p)
