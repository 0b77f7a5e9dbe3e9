"""fpsim as a reference oracle: explain one conversion, diff another kernel's output, export golden vectors.

The commonest bug report in this field is "implementations X and Y give different
bytes for the same input".  This module answers it with fpsim's conventions
(SPEC.md: NVIDIA's rules, Transformer Engine's NVFP4 operation order, MX ``rceil``):

* :func:`explain_value` — one float32 → element code, step by step: the input
  bits, the two neighbouring grid points and their codes, the rule that decided
  (exact, tie to even, sticky bits, subnormal range, saturation, overflow, NaN policy);
* :func:`explain_block` — one block of a block-scaled scheme: the block amax and
  every FP32 intermediate of SPEC §4 (NVFP4) or §5 (MX) in hex and decimal, and
  each element's code;
* :func:`diff` — someone else's codes and scales against fpsim's: every hypothesis of
  :mod:`~fpsim.oracle.hypotheses` (another scale rule, FP32 order, encode multiplier, tie rule, NaN / inf
  policy, tensor scale, block shape, amax, clamp, …) is computed over the whole tensor by the vectorised
  convention model :mod:`~fpsim.oracle.model`; those that explain every byte are reported, ranked
  (:data:`CAUSES`);
* :func:`write_vectors` / :func:`read_vectors` — golden test vectors of named edge cases (or of an
  element codec, :func:`element_cases`) in ``.npz`` and as raw little-endian ``.bin`` files + a JSON manifest.

Values are float32 throughout (inputs are converted by RNE first, SPEC §9).
Results are plain dicts / dataclasses; write them as JSON with :func:`fpsim.io.dumps` (NaN and ±inf
become ``null``; a float's ``hex`` or ``class`` field beside it says which it was).
"""

from .common import DiagnosisError, load_arrays
from .diff import CAUSES, DiffReport, diff
from .explain import explain_block, explain_value
from .vectors import element_cases, read_vectors, vector_cases, write_vectors

__all__ = [
    "CAUSES",
    "DiagnosisError",
    "DiffReport",
    "diff",
    "explain_block",
    "element_cases",
    "explain_value",
    "load_arrays",
    "read_vectors",
    "vector_cases",
    "write_vectors",
]
