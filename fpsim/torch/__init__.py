"""fpsim on torch tensors.

* Training (:mod:`fpsim.torch.nn`): :class:`Linear` (a drop-in ``nn.Linear`` whose GEMMs run an emulated
  recipe), :func:`convert`, :func:`set_recipe`, :func:`step`, :func:`set_step`, :func:`step_with`, :func:`summary`;
  :func:`monitor` (:mod:`fpsim.torch.monitoring`: per layer and role statistics of every quantized copy).
* The torch backend (:mod:`fpsim.torch.backend`, Triton kernels in :mod:`fpsim.torch.kernels`), a peer of the
  Numba reference under :mod:`fpsim.backends`.

Importing this package imports neither torch nor the training layer: the names above load on first use, so
the backend modules (which the dispatcher imports) never pull in the recipe layer above them.
"""

from __future__ import annotations

_TRAINING = ("Linear", "convert", "set_recipe", "step", "set_step", "step_with", "summary", "GEMMS")

__all__ = [*_TRAINING, "monitor"]


def __getattr__(name: str):
    if name in _TRAINING:
        from . import nn

        return getattr(nn, name)
    if name == "monitor":
        from .monitoring import monitor

        return monitor
    raise AttributeError(f"module 'fpsim.torch' has no attribute {name!r}")
