"""fpsim on torch tensors: the training layer on top, the torch backend below it.

* Training (:mod:`fpsim.torch.nn`): :class:`Linear` (a drop-in ``nn.Linear`` whose GEMMs run an emulated
  recipe), :func:`convert`, :func:`set_recipe`, :func:`step`, :func:`set_step`, :func:`step_with`, :func:`summary`;
  :func:`monitor` (:mod:`fpsim.torch.monitoring`: per layer and role statistics of every quantized copy);
  :func:`probe` (:mod:`fpsim.torch.probes`: what each component of a recipe does to each GEMM of a model's layers,
  with confidence intervals, and a check of the model's own quantized layers against fpsim's emulation; the
  models ``fpsim probe`` loads from files are :mod:`fpsim.torch.models`);
  :class:`GraphStep` and :class:`GraphKeys` (:mod:`fpsim.torch.graphs`: a training step captured as one CUDA
  graph, with step-indexed stochastic-rounding keys).
* The backend, a peer of the Numba reference under :mod:`fpsim.backends`; modules, lowest first:
  :mod:`~fpsim.torch.runtime` (the lazy torch import, Triton switches), :mod:`~fpsim.torch.codecs` (element
  codecs, the Philox stream), :mod:`~fpsim.torch.container` (:class:`~fpsim.torch.container.TorchQuantized` and
  its decoders), :mod:`~fpsim.torch.quantize` (the fused Triton launchers and the eager quantizer, both reading a
  :class:`~fpsim.plan.Plan`), :mod:`~fpsim.torch.rht`, :mod:`~fpsim.torch.gemm`, and :mod:`~fpsim.torch.backend`
  (what the dispatcher calls: ``unsupported`` and the entry points).  The Triton sources are
  :mod:`~fpsim.torch.kernels` (device functions, small kernels) and :mod:`~fpsim.torch.kernels_quant` (block
  quantizers and decoders).

Importing this package imports neither torch nor the training layer: the names above load on first use, so
the backend modules (which the dispatcher imports) never pull in the recipe layer above them.
"""

from __future__ import annotations

_TRAINING = ("Linear", "convert", "assignment", "set_recipe", "step", "set_step", "step_with", "summary", "GEMMS")

__all__ = [*_TRAINING, "monitor", "probe", "GraphKeys", "GraphStep"]


def __getattr__(name: str):
    if name in _TRAINING:
        from . import nn

        return getattr(nn, name)
    if name == "monitor":
        from .monitoring import monitor

        return monitor
    if name == "probe":
        from .probes import probe

        return probe
    if name in ("GraphKeys", "GraphStep"):
        from . import graphs

        return getattr(graphs, name)
    raise AttributeError(f"module 'fpsim.torch' has no attribute {name!r}")
