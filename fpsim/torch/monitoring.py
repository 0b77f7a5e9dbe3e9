"""A training monitor: per layer and role, every N steps, what quantization did to each operand copy.

``with fpsim.torch.monitor(model, every=100, path="quant.jsonl") as mon: train()`` appends one JSON
line per (step, layer, role) for the steps that are multiples of ``every``, computed on the copy's device:

==========================  ===============================================================================
field                       meaning (x: the copy's source after its RHT, x̂: the decoded copy)
==========================  ===============================================================================
step, layer, role, scheme   where the copy was made (role: fprop_x … wgrad_x, docs/spec.md §8)
numel                       elements of the copy
nan_count, inf_count        non-finite elements of x
amax                        max |x| (NaN if x holds a NaN; the scale the copy was made with)
sqnr_db                     10·log10(Σx² / Σ(x−x̂)²) over the finite elements; null with
                            ``sqnr_note`` "exact" when x̂ = x, "no finite signal" when Σx² = 0
rel_error                   ‖x−x̂‖ / ‖x‖ over the finite elements (null when ‖x‖ = 0)
flushed_frac                non-zero x with x̂ = 0, over the non-zero finite elements
saturated_frac              |x| > |x̂| with x̂'s code the largest magnitude and its block scale finite and
                            non-zero, over all elements (disjoint from flushed)
zero_scale_block_frac       two-level schemes: blocks whose scale byte is 0 (they decode to zeros)
subnormal_scale_block_frac  two-level schemes: blocks whose scale is subnormal; both null elsewhere
==========================  ===============================================================================

``mon.first_nonfinite`` is the first (step, layer, role) whose source held a NaN or inf (also written as a
line with ``"event": "nonfinite"``).  Lines load with ``pandas.read_json(path, lines=True)``; :func:`plot`
draws per-layer SQNR over steps.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import torch

from ..io import atomic_write, dumps
from ..schemes import Kind
from . import nn

__all__ = ["Monitor", "monitor", "copy_stats", "plot"]


def _codes_magnitude(q) -> torch.Tensor:
    """Each element's code with the sign bit cleared, in the copy's padded [rows, cols] layout."""
    el = q.scheme.element
    d = q.data.to(torch.int32)
    if el.bits == 4:
        d = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(*d.shape[:-1], -1)
    return d & el.magnitude_mask


def _block_scale_ok(q, cols: int) -> torch.Tensor | None:
    """Per element: the block's scale is finite and non-zero (None for per-tensor scaling)."""
    sch = q.scheme
    if sch.block is None:
        return None
    s = q.scales
    if sch.kind is Kind.TWO_LEVEL:
        table = torch.from_numpy(sch.scale.decode_table().copy()).to(s.device)
        v = table[s.to(torch.int64)]
    elif sch.kind is Kind.POW2:
        v = torch.where(s == 0xFF, torch.nan, 1.0)
    else:
        v = s.to(torch.float32)
    ok = torch.isfinite(v) & (v != 0)
    return ok.repeat_interleave(sch.block[1], dim=-1)[..., :cols]


def copy_stats(x: torch.Tensor, q) -> dict:
    """The fields of the table above (but step/layer/role) for source ``x`` (2-D, blocks along the last axis)."""
    xh = q.dequantize().to(torch.float32).reshape(x.shape)
    fin = torch.isfinite(x)
    nan_count = int(torch.isnan(x).sum())
    inf_count = int((~fin).sum()) - nan_count
    xf = torch.where(fin, x, 0.0).double()
    err = torch.where(fin, x - xh, 0.0).double()
    sig, noise = float((xf * xf).sum()), float((err * err).sum())
    row = {"scheme": q.scheme.name, "numel": x.numel(), "nan_count": nan_count, "inf_count": inf_count,
           "amax": float(x.abs().max()) if x.numel() else None}
    if sig == 0:
        row.update(sqnr_db=None, sqnr_note="no finite signal", rel_error=None)
    elif noise == 0:
        row.update(sqnr_db=None, sqnr_note="exact", rel_error=0.0)
    else:
        row.update(sqnr_db=10 * math.log10(sig / noise), sqnr_note=None, rel_error=math.sqrt(noise / sig))
    nz = fin & (x != 0)
    n_nz = int(nz.sum())
    row["flushed_frac"] = float((nz & (xh == 0)).sum()) / n_nz if n_nz else None
    cols = x.shape[-1]
    if q.scheme.kind is Kind.CAST:
        row["saturated_frac"] = float((fin & (x.abs() > xh.abs()) & torch.isinf(xh)).sum()) / max(x.numel(), 1)
    else:
        mag = _codes_magnitude(q).reshape(*x.shape[:-1], -1)[..., :cols] if q.scheme.block is not None else \
            _codes_magnitude(q).reshape(x.shape)
        at_max = mag == q.scheme.element.max_code
        ok = _block_scale_ok(q, cols)
        sat = at_max & (x.abs() > xh.abs()) & fin
        if ok is not None:
            sat &= ok.reshape(sat.shape)
        row["saturated_frac"] = float(sat.sum()) / max(x.numel(), 1)
    if q.scheme.kind is Kind.TWO_LEVEL:
        sc = q.scales.to(torch.int32)
        sp = q.scheme.scale
        exp = sc & (sp.magnitude_mask & ~((1 << sp.mbits) - 1))
        n = max(sc.numel(), 1)
        mag = sc & sp.magnitude_mask
        row["zero_scale_block_frac"] = float((mag == 0).sum()) / n
        row["subnormal_scale_block_frac"] = float(((exp == 0) & (mag != 0)).sum()) / n
    else:
        row["zero_scale_block_frac"] = row["subnormal_scale_block_frac"] = None
    return row


class Monitor:
    """Records :func:`copy_stats` of every quantized copy at steps that are multiples of ``every``."""

    def __init__(self, every: int = 100, path: str | Path | None = None):
        if int(every) < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.path = int(every), None if path is None else Path(path)
        self.rows: list[dict] = []
        self.first_nonfinite: tuple[int, str, str] | None = None
        self._fh = None
        # Every copy's "all finite" flag stays on the device until a recorded step (or the exit) reads them: a
        # host read per copy would synchronise the GPU on every layer of every step.
        self._pending: list[tuple[int, str, str, torch.Tensor]] = []

    def __call__(self, layer: str, role: str, step: int, x: torch.Tensor, q) -> None:
        if self.first_nonfinite is None:
            self._pending.append((step, layer, role, torch.isfinite(x).all()))
        if step % self.every:
            return
        self._resolve()
        with torch.no_grad():
            self._emit({"step": step, "layer": layer, "role": role, **copy_stats(x, q)})

    def due(self, step: int) -> bool:
        """Whether this step is recorded (the training layer then makes full copies with codes and scales)."""
        return step % self.every == 0

    def note(self, layer: str, role: str, step: int, x: torch.Tensor, copy) -> None:
        """A copy of a step that is not recorded: only its "all finite" flag, kept on the device.  A copy with a
        NaN-propagating tensor amax gives the flag for free (amax < inf)."""
        if self.first_nonfinite is not None:
            return
        plan = getattr(copy, "plan", None)
        if getattr(copy, "amax", None) is not None and plan is not None and not plan.ignore_nan:
            flag = copy.amax  # kept as it is (no launch): finite exactly when the source is; compared at _resolve
        else:
            flag = torch.isfinite(x).all()
        self._pending.append((step, layer, role, flag))

    def _resolve(self) -> None:
        pend, self._pending = self._pending, []
        if self.first_nonfinite is not None or not pend:
            return
        # a flag is a bool, or an amax that propagates NaN and inf (finite exactly when its source is)
        ok = torch.stack([torch.isfinite(p[3]).reshape(()) if p[3].is_floating_point() else p[3].reshape(())
                          for p in pend]).cpu()
        if not bool(ok.all()):
            step, layer, role, _ = pend[int((~ok).nonzero()[0, 0])]
            self.first_nonfinite = (step, layer, role)
            self._emit({"event": "nonfinite", "step": step, "layer": layer, "role": role})

    def _emit(self, row: dict) -> None:
        self.rows.append(row)
        if self._fh is not None:
            self._fh.write(dumps(row, indent=None))
            self._fh.flush()

    def __enter__(self) -> Monitor:
        if self.path is not None:
            self._fh = open(self.path, "a", encoding="utf-8")  # appended line by line: a crash keeps what was seen
        nn.OBSERVERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self._resolve()
        with contextlib.suppress(ValueError):
            nn.OBSERVERS.remove(self)
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def monitor(model: torch.nn.Module | None = None, every: int = 100, path: str | Path | None = None) -> Monitor:
    """A :class:`Monitor` to use as a context manager (``model`` is accepted for symmetry; every fpsim layer that
    runs inside the block is recorded)."""
    del model
    return Monitor(every, path)


def plot(path: str | Path, out: str | Path, role: str = "fprop_x") -> None:
    """Per-layer SQNR (dB) over steps for one role, from a monitor's JSON lines, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_json(path, lines=True)
    df = df[(df.get("event").isna() if "event" in df else True) & (df["role"] == role)]
    fig, ax = plt.subplots(figsize=(7, 4))
    for layer, g in df.groupby("layer", sort=True):
        ax.plot(g["step"], g["sqnr_db"], label=layer, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(f"SQNR of {role} (dB)")
    if df["layer"].nunique() <= 12:
        ax.legend(fontsize=6)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
    atomic_write(out, buf.getvalue())
