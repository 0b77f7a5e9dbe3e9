"""fpsim's reference bytes for :func:`fpsim.oracle.diff`: the 2-D view, codes, scales and amax of an input, from
:func:`fpsim.quantize` or (for conventions only the model has) :mod:`fpsim.oracle.model`; and scale comparison.
"""

from __future__ import annotations

import numpy as np

from ..dispatch import quantize
from ..packing import unpack_fp4
from ..schemes import BlockScheme
from .model import Convention, TensorView, model_bytes

__all__ = ["reference", "same_scales"]


def reference(x32: np.ndarray, sch: BlockScheme, ax: int, ref: Convention,
              seed: int | None = None) -> tuple[TensorView, np.ndarray, np.ndarray, np.ndarray]:
    """fpsim's bytes: the 2-D view, codes [R, nb·BC], scales [R, nb], amax (fpsim.quantize unless the
    reference uses a convention only the model has, e.g. a scale clamp); ``seed``: stochastic rounding's."""
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(-1, x32.shape[ax])
    view = TensorView(X, sch.block)
    model_only = {k for k in ref.changes() if k != "nan_amax"}
    if not model_only:
        q = quantize(x32, sch, axis=ax, nan_amax=ref.nan_amax, seed=seed)
        c = (unpack_fp4(q.data) if sch.element.bits == 4 else q.data).reshape(view.R, -1)
        codes = np.zeros((view.R, view.nb * view.BC), np.uint8)
        codes[:, : view.C] = c[:, : view.C]
        return view, codes, np.ascontiguousarray(q.scales).reshape(view.R, view.nb), np.asarray(q.amax, np.float32)
    if sch.four_over_six:
        raise ValueError(f"{', '.join(sorted(model_only))} cannot be combined with four-over-six")
    codes, scales = model_bytes(view, sch, ref)
    amax = np.asarray(np.nan, np.float32)
    if sch.tensor_scale:
        rows = view.amax_rows(ref.nan_amax, ref.inf_amax, bool(sch.per_row_scale))
        amax = np.asarray(ref.amax if ref.amax is not None else (rows if sch.per_row_scale else
                                                                  (rows[0] if rows.size else 0.0)), np.float32)
    return view, codes, scales, amax


def same_scales(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where scales ``a`` and ``b`` hold the same bytes (float32 scales compared by their bits: NaN equals NaN)."""
    if a.dtype == np.float32:
        return a.view(np.uint32) == b.view(np.uint32)
    return a == b
