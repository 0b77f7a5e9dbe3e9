"""Tensor roles guessed from names (``fpsim analyze``; the keep-BF16 ranking is :mod:`fpsim.ranking`).

The GEMM operands a linear-layer recipe quantizes (``weight``, ``activation``, ``gradient``) and the tensors it
never quantizes (``norm``, ``bias``, ``rotary``, ``embedding``: normalisation gains, biases, rotary-embedding tables,
embedding lookups).  A Transformer Engine ``DumpTensors`` file ``<layer>_<tensor>_iter_<N>.pt`` holds one tensor
under the key ``high_precision``; its role is read from the ``<tensor>`` part of the file name.
"""

from __future__ import annotations

import re

__all__ = ["GEMM_ROLES", "UNQUANTIZED_ROLES", "ROLES", "role_guess", "guess_role"]

#: Roles of the linear-layer GEMM operands (what a recipe quantizes).
GEMM_ROLES = ("weight", "activation", "gradient")
#: Roles a linear-layer recipe never quantizes, each with the reason the ranking gives.
UNQUANTIZED_ROLES = {
    "norm": "a normalisation gain: the recipe never quantizes norms",
    "bias": "a bias: added in high precision, never a GEMM operand",
    "rotary": "a rotary-embedding table: computed in high precision, never a GEMM operand",
    "embedding": "an embedding table: a lookup, kept in BF16 by the recipe",
}
ROLES = GEMM_ROLES + tuple(UNQUANTIZED_ROLES)

# (pattern on the lower-cased name's last component, on its module (the component before), role, rule text)
_RULES = (
    (r"inv_freq|rotary|rope|(cos|sin)_cached", None, "rotary", "rotary/inv_freq/rope in the name"),
    (None, r"rotary|rope", "rotary", "module named rotary/rope"),
    (r"norm", None, "norm", "'norm' in the last name component"),
    (None, r"norm\d*$|^ln(_?\w+)?$|^norm", "norm", "module named *norm/ln_*"),
    (r"^bias$|_bias$", None, "bias", "last name component is a bias"),
    (None, r"embed|^wte$|^wpe$|^tok_embeddings$", "embedding", "module named *embed*/wte/wpe"),
)
_TE_DUMP = re.compile(r"(?:^|/)([^/]*)_iter_\d+\.pt$")
_TE_TENSORS = {"activation": "activation", "output": "activation", "weight": "weight", "gradient": "gradient",
               "wgrad": "gradient", "dgrad": "gradient"}


def role_guess(name: str, source: str | None = None) -> tuple[str, str]:
    """(role, the rule that gave it) for a tensor ``name`` of the file ``source``.

    >>> role_guess("model.layers.0.input_layernorm.weight")
    ('norm', "module named *norm/ln_*")
    >>> role_guess("high_precision", "rank_0/layers_0_mlp_fc1_gradient_iter_000002.pt")[0]
    'gradient'
    """
    if source is not None and name in ("high_precision", "quantized"):
        m = _TE_DUMP.search(str(source).replace("\\", "/"))
        if m:
            tail = m.group(1).rsplit("_", 1)[-1].lower()
            if tail in _TE_TENSORS:
                return _TE_TENSORS[tail], f"Transformer Engine dump file name (…_{tail}_iter_N.pt)"
    parts = [p for p in re.split(r"[./]", name.lower()) if p and not p.startswith("#")]
    last = parts[-1] if parts else ""
    module = parts[-2] if len(parts) > 1 else ""
    if last in ("weight", "bias") and len(parts) == 1:
        module = ""
    for pat_last, pat_mod, role, why in _RULES:
        if pat_last and re.search(pat_last, last) or pat_mod and module and re.search(pat_mod, module):
            return role, why
    return _gemm_role(name.lower())


def _gemm_role(n: str) -> tuple[str, str]:
    if "grad" in n or n.startswith("d") and n[1:2] in ("y", "x", "w", "_") or ".dy" in n:
        return "gradient", "'grad', dx/dy/dw in the name"
    if "weight" in n or n.endswith(".w") or n.endswith("_w") or n == "w":
        return "weight", "'weight' in the name"
    return "activation", "no other rule matched (default)"


def guess_role(name: str, source: str | None = None) -> str:
    """The role alone of :func:`role_guess` (override with ``fpsim analyze --role``)."""
    return role_guess(name, source)[0]
