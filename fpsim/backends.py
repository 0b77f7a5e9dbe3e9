"""Backend registry: which implementations of fpsim's kernels this machine can run (issue 8, first step).

* ``numba-cpu`` — the reference kernels (always available);
* ``torch-cpu`` / ``torch-cuda`` — :mod:`fpsim.torch_backend` on torch tensors
  (torch is optional and imported only here, lazily);
* ``blackwell-native`` — listed when a GPU of compute capability 10.x is
  present (its tensor-core dispatch is not written yet).

Every backend must give the same bits as ``numba-cpu``; the torch backend is
tested against it on CPU in CI and on CUDA on the device machine.
"""

from __future__ import annotations

import contextlib
import importlib.util

__all__ = ["available", "default", "use", "current"]

_CURRENT: list[str] = []


def _torch():
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def available() -> list[str]:
    """Names of the backends usable here, fastest last."""
    names = ["numba-cpu"]
    torch = _torch()
    if torch is not None:
        names.append("torch-cpu")
        if torch.cuda.is_available():
            names.append("torch-cuda")
            if torch.cuda.get_device_capability(0)[0] == 10:
                names.append("blackwell-native")
    return names


def default() -> str:
    """The backend fpsim picks: the GPU when there is one, else the Numba reference."""
    av = available()
    return "torch-cuda" if "torch-cuda" in av else "numba-cpu"


def current() -> str:
    """The backend selected by the innermost :func:`use` block, else :func:`default`."""
    return _CURRENT[-1] if _CURRENT else default()


@contextlib.contextmanager
def use(name: str):
    """Select a backend for the block (``with fpsim.backends.use("torch-cpu"): ...``)."""
    if name not in available():
        raise ValueError(f"backend {name!r} is not available here; available: {', '.join(available())}")
    _CURRENT.append(name)
    try:
        yield name
    finally:
        _CURRENT.pop()
