"""fpsim.torch.models: the three architectures ``fpsim probe`` loads, each from a tiny file written here (a GGUF by
gguf's writer, a BERT checkpoint directory, a campaign checkpoint by the campaign's own ``_save``), against a
reference forward; detection by content; a pickle refused; the batches the CLI cuts from a token stream."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from fpsim.torch import models as M  # noqa: E402
from tests.test_llm_gguf import FF, NH, NKV, NL, TOKENS, write_tiny  # noqa: E402
from tests.test_llm_gguf import D as GD  # noqa: E402

F = torch.nn.functional

# --- tiny files ---------------------------------------------------------------------------------------------------

BERT = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 64, "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "type_vocab_size": 2,
        "hidden_act": "gelu", "position_embedding_type": "absolute"}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "a", "cat"]


def write_bert(folder: Path, *, seed=0, prefix="", cfg=None, skip=None, tokenizer=True) -> dict:
    """A 2-block BERT checkpoint directory (config.json, model.safetensors with a pooler and position_ids as real
    checkpoints have, tokenizer.json: WordPiece over a small vocabulary); returns the float32 weights by name."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    cfg = dict(BERT if cfg is None else cfg)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, *"abcdefghijklmnopqrstuvwxyz.,",
             *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]
    cfg["vocab_size"] = len(vocab)
    rng = np.random.default_rng(seed)
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    w = {"embeddings.word_embeddings.weight": rng.standard_normal((len(vocab), d)),
         "embeddings.position_embeddings.weight": rng.standard_normal((cfg["max_position_embeddings"], d)) * 0.1,
         "embeddings.token_type_embeddings.weight": rng.standard_normal((2, d)) * 0.1,
         "embeddings.LayerNorm.weight": 1 + 0.1 * rng.standard_normal(d),
         "embeddings.LayerNorm.bias": 0.1 * rng.standard_normal(d),
         "pooler.dense.weight": rng.standard_normal((d, d)), "pooler.dense.bias": np.zeros(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n, shp in (("attention.self.query", (d, d)), ("attention.self.key", (d, d)),
                       ("attention.self.value", (d, d)), ("attention.output.dense", (d, d)),
                       ("intermediate.dense", (f, d)), ("output.dense", (d, f))):
            w[p + n + ".weight"] = rng.standard_normal(shp) / math.sqrt(shp[1])
            w[p + n + ".bias"] = 0.1 * rng.standard_normal(shp[0])
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + n + ".weight"] = 1 + 0.1 * rng.standard_normal(d)
            w[p + n + ".bias"] = 0.1 * rng.standard_normal(d)
    w = {k: v.astype(np.float32) for k, v in w.items() if k != skip}
    save_file({prefix + k: v for k, v in w.items()} | {prefix + "embeddings.position_ids":
                                                       np.arange(cfg["max_position_embeddings"])[None]},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        tk = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tk.normalizer = normalizers.BertNormalizer(lowercase=True)
        tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tk.save(str(folder / "tokenizer.json"))
    return w


def write_campaign(out: Path, *, seed=0, record=True, steps=1):
    """A campaign checkpoint of the ``tiny`` size after ``steps`` AdamW steps, written by the campaign's own
    ``_save`` (``<out>/ckpt/<run>/``), and the run's record with its config; returns (model, optimizer, folder)."""
    from studies.campaign.model import SIZES, Llama
    from studies.campaign.run import _optimizer, _save

    torch.manual_seed(seed)
    cfg = SIZES["tiny"]
    model = Llama(cfg)
    opt = _optimizer(model, 1e-3, "cpu")
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        xb = torch.randint(0, 256, (2, 33), generator=g)
        logits = model(xb[:, :-1])
        F.cross_entropy(logits.reshape(-1, 256), xb[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    rid = "tiny-bf16-s0-t1m"
    folder = out / "ckpt" / rid
    _save(folder, model, opt, steps)
    if record:
        (out / f"{rid}.json").write_text(json.dumps({"run": rid, "config": vars(cfg)}))
    return model, opt, folder


# --- reference forwards (float64, written out) --------------------------------------------------------------------

def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _causal_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, -1) @ v


def gguf_reference(cfg, w, ids):
    """The Llama of a GGUF file in float64: adjacent-pair RoPE, grouped-query attention, SwiGLU, tied head."""
    W = {k: torch.from_numpy(np.array(v, np.float64)) for k, v in w.items()}
    b, t = ids.shape
    hd = cfg.d_model // cfg.n_head
    pos = torch.arange(t, dtype=torch.float64)[:, None]
    ang = pos / cfg.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    def rope(x):  # b × h × t × hd; pairs (2i, 2i+1)
        out = x.clone()
        out[..., 0::2] = x[..., 0::2] * ang.cos() - x[..., 1::2] * ang.sin()
        out[..., 1::2] = x[..., 0::2] * ang.sin() + x[..., 1::2] * ang.cos()
        return out

    x = W["token_embd.weight"][ids]
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms(x, W[p + "attn_norm.weight"], cfg.eps)
        q = (h @ W[p + "attn_q.weight"].T).view(b, t, cfg.n_head, hd).transpose(1, 2)
        k = (h @ W[p + "attn_k.weight"].T).view(b, t, cfg.n_kv_head, hd).transpose(1, 2)
        v = (h @ W[p + "attn_v.weight"].T).view(b, t, cfg.n_kv_head, hd).transpose(1, 2)
        g = cfg.n_head // cfg.n_kv_head
        heads = [_causal_attention(rope(q)[:, j:j + 1], rope(k)[:, j // g:j // g + 1], v[:, j // g:j // g + 1])
                 for j in range(cfg.n_head)]
        x = x + torch.cat(heads, 1).transpose(1, 2).reshape(b, t, -1) @ W[p + "attn_output.weight"].T
        h = _rms(x, W[p + "ffn_norm.weight"], cfg.eps)
        x = x + (F.silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return _rms(x, W["output_norm.weight"], cfg.eps) @ W["token_embd.weight"].T


def bert_reference(cfg, w, ids, mask):
    """HF BERT (post-LayerNorm, exact GELU) in float64, mean-pooled over the mask and L2-normalised."""
    W = {k: torch.from_numpy(np.array(v, np.float64)) for k, v in w.items()}
    b, t = ids.shape
    d, nh = cfg["hidden_size"], cfg["num_attention_heads"]

    def ln(x, p):
        return F.layer_norm(x, (d,), W[p + ".weight"], W[p + ".bias"], cfg["layer_norm_eps"])

    def lin(x, p):
        return x @ W[p + ".weight"].T + W[p + ".bias"]

    x = ln(W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][:t]
           + W["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{n}").view(b, t, nh, d // nh).transpose(1, 2)
                   for n in ("query", "key", "value"))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // nh)
        s = s.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, d)
        x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        x = ln(x + lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
    m = mask[..., None].double()
    return F.normalize((x * m).sum(1) / m.sum(1), dim=-1)


# --- the architectures --------------------------------------------------------------------------------------------

def test_gguf_llama_loads_and_matches_the_reference(tmp_path):
    p = tmp_path / "tiny.gguf"
    write_tiny(p)
    assert M.detect(p) == "gguf"
    ld = M.load(p)
    cfg, w, _ = M.read_gguf(p)
    assert (ld.arch, ld.blocks, ld.vocab, ld.max_len) == ("gguf", NL, len(TOKENS), 128)
    assert (cfg.d_model, cfg.d_ff, cfg.n_head, cfg.n_kv_head) == (GD, FF, NH, NKV)
    assert all(p_.dtype == torch.float32 for p_ in ld.model.parameters())
    lin = [n for n, m in ld.model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(lin) == 7 * NL and "layers.1.mlp.down_proj" in lin
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    torch.testing.assert_close(ld.model(ids).double(), gguf_reference(cfg, w, ids), rtol=1e-5, atol=1e-5)
    loss = ld.loss_fn(ld.model(ids), ids)
    assert loss.shape == () and torch.isfinite(loss)
    assert ld.tokenizer("abc") == [TOKENS.index("ab"), TOKENS.index("c")]


def test_bert_loads_and_matches_the_reference(tmp_path):
    w = write_bert(tmp_path / "bert", prefix="bert.")  # a BertForX checkpoint's prefix
    assert M.detect(tmp_path / "bert") == "hf" and M.detect(tmp_path / "bert" / "model.safetensors") == "hf"
    ld = M.load(tmp_path / "bert")
    assert (ld.arch, ld.blocks, ld.max_len, ld.vocab) == ("hf", 2, 64, w["embeddings.word_embeddings.weight"].shape[0])
    assert ld.frame == (2, 3)  # [CLS], [SEP]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, ld.vocab, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ref = bert_reference(BERT, w, ids, mask)
    torch.testing.assert_close(ld.model(ids, mask).double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ld.model(ids).double(), bert_reference(BERT, w, ids, torch.ones_like(ids)),
                               rtol=1e-5, atol=1e-5)
    emb = ld.model(ids)
    n = 2
    want = F.cross_entropy(20.0 * emb[:n] @ emb[n:].T, torch.arange(n))
    torch.testing.assert_close(ld.loss_fn(emb, ids), want)
    assert ld.tokenizer("The quick fox.") == [4, 5, 7, 15 + 26]  # the, quick, fox, "."


def test_campaign_checkpoint_gives_the_campaign_models_logits_and_adam_state(tmp_path):
    ref, opt, folder = write_campaign(tmp_path, steps=2)
    assert M.detect(folder) == "campaign" and M.detect(folder / "state.safetensors") == "campaign"
    ld = M.load(folder)
    assert isinstance(ld.model, M.CampaignLlama) and (ld.blocks, ld.vocab, ld.max_len) == (2, 256, 64)
    assert [n for n, _ in ld.model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    ref.eval()
    with torch.no_grad():
        assert torch.equal(ld.model(x), ref(x))  # the same forward, bit for bit
    named = dict(ref.named_parameters())
    assert set(ld.adam_state) == set(named)
    for n, (m, v, s) in ld.adam_state.items():
        st = opt.state[named[n]]
        assert torch.equal(m, st["exp_avg"]) and torch.equal(v, st["exp_avg_sq"]) and s == 2
    assert ld.info["step"] == 2
    assert ld.tokenizer("é!") == [0xC3, 0xA9, 0x21]


def test_campaign_config_from_config_json_and_missing(tmp_path):
    _, _, folder = write_campaign(tmp_path, record=False)
    with pytest.raises(M.ModelError, match="config not found") as ei:
        M.load(folder)
    assert "\n" not in str(ei.value)
    from studies.campaign.model import SIZES

    (folder / "config.json").write_text(json.dumps(vars(SIZES["tiny"]) | {"heads": 4}))
    assert M.load(folder).model.config.heads == 4
    (folder / "config.json").write_text(json.dumps(vars(SIZES["tiny"]) | {"d": 32}))
    with pytest.raises(M.ModelError, match="do not fit"):
        M.load(folder)


def test_scaled_keep_bf16_is_the_papers_rule():
    assert (M.scaled_keep_bf16(62).first, M.scaled_keep_bf16(62).last) == (2, 8)
    assert (M.scaled_keep_bf16(30).first, M.scaled_keep_bf16(30).last) == (1, 4)
    assert (M.scaled_keep_bf16(6).first, M.scaled_keep_bf16(6).last) == (0, 1)


# --- detection and refusals ---------------------------------------------------------------------------------------

def test_pickles_and_other_files_are_refused_in_one_line(tmp_path):
    pt = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, pt)
    raw = tmp_path / "weights"
    raw.write_bytes(b"\x80\x04\x95" + bytes(20))
    hfdir = tmp_path / "hf"
    hfdir.mkdir()
    (hfdir / "config.json").write_text(json.dumps(BERT))
    torch.save({}, hfdir / "pytorch_model.bin")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    for p, what in ((pt, "pickle"), (raw, "pickle"), (hfdir, "pickle"), (other, "not a GGUF file"),
                    (tmp_path / "missing.gguf", "no such file"), (empty, "neither")):
        with pytest.raises(M.ModelError, match=what) as ei:
            M.detect(p)
        assert "\n" not in str(ei.value)


def test_bad_bert_checkpoints_are_one_line(tmp_path):
    write_bert(tmp_path / "a", skip="encoder.layer.1.output.dense.bias")
    with pytest.raises(M.ModelError, match="encoder.layer.1.output.dense.bias missing"):
        M.load(tmp_path / "a")
    write_bert(tmp_path / "b", cfg=BERT | {"model_type": "gpt2"})
    with pytest.raises(M.ModelError, match="model_type 'gpt2'"):
        M.load(tmp_path / "b")
    write_bert(tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json")
    with pytest.raises(M.ModelError, match="not a readable safetensors"):
        M.load(tmp_path / "c")


# --- batches --------------------------------------------------------------------------------------------------------

def test_batches_of_a_decoder_are_consecutive_windows(tmp_path):
    _, _, folder = write_campaign(tmp_path)
    ld = M.load(folder)
    ids = np.arange(100) % 256
    bs = ld.batches(ids, 2, 3, 8)
    assert [tuple(b.shape) for b in bs] == [(3, 8), (3, 8)] and bs[0].dtype == torch.int64
    assert bs[1][0].tolist() == list(range(24, 32))
    with pytest.raises(ValueError, match="fewer than the 112"):
        ld.batches(ids, 2, 7, 8)
    with pytest.raises(ValueError, match="token id 300 outside"):
        ld.batches(np.array([1, 300]), 1, 1, 1)


def test_bert_batches_are_framed_pairs_of_adjacent_windows(tmp_path):
    write_bert(tmp_path / "bert")
    ld = M.load(tmp_path / "bert")
    ids = np.arange(4, 4 + 40)
    (b,) = ld.batches(ids, 1, 4, 6)  # windows of 4 tokens inside [CLS] … [SEP]
    assert b[:, 0].tolist() == [2] * 4 and b[:, -1].tolist() == [3] * 4
    assert b[0, 1:5].tolist() == [4, 5, 6, 7] and b[2, 1:5].tolist() == [8, 9, 10, 11]  # anchor 0, its positive
    assert b[1, 1:5].tolist() == [12, 13, 14, 15] and b[3, 1:5].tolist() == [16, 17, 18, 19]
    with pytest.raises(ValueError, match="even"):
        ld.batches(ids, 1, 3, 6)
