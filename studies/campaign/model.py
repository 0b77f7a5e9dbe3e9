"""The campaign's model: a Llama-style byte-level decoder (RMSNorm, RoPE, SwiGLU, no biases; issue 20's protocol).

The block linears (``attn.qkv``, ``attn.proj``, ``mlp.gate_up``, ``mlp.down``) are the only modules an arm
quantizes (through :func:`fpsim.torch.convert`); the embedding, the LM head (untied), the norms and the attention
products (``scaled_dot_product_attention`` in the autocast dtype) stay high precision in every arm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Config", "SIZES", "Llama", "non_embedding_params"]


@dataclass(frozen=True)
class Config:
    """Model shape: width ``d``, ``layers`` blocks of ``heads`` heads, SwiGLU hidden ``ffn``, context ``ctx``."""

    d: int
    layers: int
    heads: int
    ffn: int
    ctx: int = 512
    vocab: int = 256  # bytes
    rope_base: float = 10000.0


def _ffn(d: int) -> int:
    """SwiGLU's hidden width: 8/3·d rounded up to a multiple of 64 (the parameter count of a 4·d GELU MLP)."""
    return 64 * math.ceil(8 * d / 3 / 64)


#: The campaign's sizes (non-embedding parameters: 12·d²·layers approximately).
SIZES = {
    "s10m": Config(d=384, layers=6, heads=6, ffn=_ffn(384)),
    # the second size: 1.8× the main one's parameters; a 32 M model (25 tokens per parameter = 0.8 B tokens) cannot
    # finish a run within one device session, and nothing persists between sessions (studies.campaign.batch)
    "s20m": Config(d=512, layers=6, heads=8, ffn=_ffn(512)),
    "tiny": Config(d=64, layers=2, heads=2, ffn=_ffn(64), ctx=64),  # CPU tests only
}


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.qkv = torch.nn.Linear(c.d, 3 * c.d, bias=False)
        self.proj = torch.nn.Linear(c.d, c.d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, cos, sin).to(v.dtype), _rope(k, cos, sin).to(v.dtype)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class MLP(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_up = torch.nn.Linear(c.d, 2 * c.ffn, bias=False)
        self.down = torch.nn.Linear(c.ffn, c.d, bias=False)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class Block(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(c.d), torch.nn.RMSNorm(c.d)
        self.attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


class Llama(torch.nn.Module):
    """Byte-level decoder; ``forward(idx)`` returns float32 logits."""

    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = torch.nn.Embedding(c.vocab, c.d)
        self.blocks = torch.nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = torch.nn.RMSNorm(c.d)
        self.lm_head = torch.nn.Linear(c.d, c.vocab, bias=False)
        hd = c.d // c.heads
        inv = 1.0 / (c.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(c.ctx, dtype=torch.float64), inv)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("proj.weight", "down.weight")):
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.lm_head(self.norm(x)).float()


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the embedding and the LM head (the count the tokens-per-parameter budget uses)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("embed.", "lm_head.")))
