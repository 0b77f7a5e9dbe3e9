"""The campaign's model: a Llama-style byte-level decoder (RMSNorm, RoPE, SwiGLU, no biases; the campaign's protocol).

The block linears (``attn.qkv``, ``attn.proj``, ``mlp.gate_up``, ``mlp.down``) are the only modules an arm
quantizes (through :func:`fpsim.torch.convert`); the embedding, the LM head (untied), the norms and the attention
products (``scaled_dot_product_attention`` in the autocast dtype) stay high precision in every arm.
"""

from __future__ import annotations

import math

import torch

from fpsim.torch.models import CampaignConfig, CampaignLlama

__all__ = ["Config", "SIZES", "Llama", "non_embedding_params"]


#: Model shape: width ``d``, ``layers`` blocks of ``heads`` heads, SwiGLU hidden ``ffn``, context ``ctx`` (the
#: library's definition, which ``fpsim probe`` loads campaign checkpoints with).
Config = CampaignConfig


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


class Llama(CampaignLlama):
    """Byte-level decoder (:class:`fpsim.torch.models.CampaignLlama`'s modules and forward) with the campaign's
    initialisation: N(0, 0.02) for every linear and the embedding, GPT-2's N(0, 0.02/√(2·layers)) for the residual
    projections; ``forward(idx)`` returns float32 logits."""

    def __init__(self, c: Config):
        super().__init__(c)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("proj.weight", "down.weight")):
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(m.weight, 0.0, 0.02)


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the embedding and the LM head (the count the tokens-per-parameter budget uses)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("embed.", "lm_head.")))
