"""Which tensors to keep in BF16 (``fpsim analyze``'s conclusion, SPEC §10): roles, and a ranking a user can act on.

Roles (:mod:`fpsim.roles`).  A tensor's role is guessed from its name (:func:`role_guess` returns the rule with it):
the GEMM operands a linear-layer recipe quantizes (``weight``, ``activation``, ``gradient``) and the tensors it
never quantizes (``norm``, ``bias``, ``rotary``, ``embedding``: normalisation gains, biases, rotary-embedding
tables, embedding lookups).  A Transformer Engine ``DumpTensors`` file ``<layer>_<tensor>_iter_<N>.pt`` holds one
tensor under the key ``high_precision``; its role is read from the ``<tensor>`` part of the file name.

Ranking.  The relative error ‖x − x̂‖/‖x‖ of a tensor with outlier channels is the error of its outliers, which
the scales fit well, so it hides the damage to the other elements (flushed to zero, blocks with subnormal
scales).  The ranking key is therefore ``bulk_rel_error`` (the same ratio over the elements with
|x| ≤ 8·median|x|, the bulk of the distribution; a flushed element counts with its whole value) divided by the
scheme's ``bulk_rel_error`` on a standard Gaussian (:func:`gaussian_bulk_error`): how many times worse the bulk
fares than Gaussian data, whatever the scheme.  A tensor is flagged *keep BF16* when that ratio exceeds a fixed
threshold (:data:`KEEP_ABOVE`), so its flag never depends on which other tensors were analysed; the relative
rank is a second column.  Tensors of roles the recipe never quantizes are reported but not ranked.
"""

from __future__ import annotations

import functools
import math

from .analysis import BULK_MEDIANS, analyze_tensor
from .roles import GEMM_ROLES, ROLES, UNQUANTIZED_ROLES, guess_role, role_guess

__all__ = ["GEMM_ROLES", "UNQUANTIZED_ROLES", "ROLES", "KEEP_ABOVE", "BULK_MEDIANS", "role_guess", "guess_role",
           "gaussian_bulk_error", "rank"]

#: keep BF16 when bulk_rel_error / (the scheme's bulk_rel_error on a standard Gaussian) exceeds this.
KEEP_ABOVE = 1.5


@functools.cache
def gaussian_bulk_error(scheme: str) -> float:
    """``bulk_rel_error`` of ``scheme`` on a standard Gaussian (64 × 256, float32, numpy's PCG64 seed 0): the
    yardstick of the ranking (nvfp4 ≈ 0.10, mxfp8_e4m3 ≈ 0.03)."""
    import numpy as np

    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    return float(analyze_tensor("gaussian", x, schemes=(scheme,), role="activation")[0]["bulk_rel_error"])


def rank(rows: list[dict], keep_above: float = KEEP_ABOVE) -> dict:
    """The keep-BF16 summary of result rows: the first scheme's ``bulk_rel_error`` over its Gaussian yardstick,
    highest first; ``keep_bf16`` when above ``keep_above``.  A tensor whose key cannot be computed, or of a role
    the recipe never quantizes, is listed under ``unranked`` with the reason, never as the best."""
    out = {"ranking_scheme": None, "ranking_key": "bulk_rel_error / gaussian_bulk_rel_error",
           "gaussian_bulk_rel_error": None, "keep_above": keep_above, "ranking": [], "unranked": [],
           "keep_bf16": [], "roles": {}}
    if not rows:
        return out
    first = rows[0]["scheme"]
    out["ranking_scheme"] = first
    ref = gaussian_bulk_error(first)
    out["gaussian_bulk_rel_error"] = ref if math.isfinite(ref) else None
    ranked = []
    for r in rows:
        if r["scheme"] != first:
            continue
        out["roles"][r["tensor"]] = {"role": r["role"], "from": r.get("role_from", "")}
        if r["role"] in UNQUANTIZED_ROLES:
            out["unranked"].append({"tensor": r["tensor"], "reason": UNQUANTIZED_ROLES[r["role"]]})
            continue
        e = r.get("bulk_rel_error")
        ok = isinstance(e, float) and math.isfinite(e) and ref > 0
        if ok:
            ranked.append((r["tensor"], e / ref, e, r.get("rel_error")))
        else:
            why = r["notes"].get("bulk_rel_error") or r["notes"].get("rel_error") or "no value"
            out["unranked"].append({"tensor": r["tensor"], "reason": why})
    ranked.sort(key=lambda t: -t[1])
    out["ranking"] = [{"tensor": t, "rank": i + 1, "of": len(ranked), "bulk_vs_gaussian": k, "bulk_rel_error": e,
                       "rel_error": re_, "keep_bf16": k > keep_above} for i, (t, k, e, re_) in enumerate(ranked)]
    out["keep_bf16"] = [e["tensor"] for e in out["ranking"] if e["keep_bf16"]]
    return out
