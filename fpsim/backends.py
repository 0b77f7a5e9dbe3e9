"""Backend registry: which implementations of fpsim's kernels this machine can run, and which plans each claims.

* ``numba-cpu`` — the reference kernels (always available; every plan);
* ``torch-cpu`` / ``torch-cuda`` — :mod:`fpsim.torch.backend` on torch tensors
  (torch is optional and imported only when a torch backend is asked for or
  could be picked); on CUDA, NVFP4/MX block quantization runs fused Triton kernels;
* ``blackwell-native`` — listed when a GPU of compute capability 10.x is
  present: ``torch-cuda`` plus native block-scaled tensor-core GEMMs (written
  and unit-tested for layout on CPU, never run on Blackwell hardware).

Selecting one: ``backend="torch-cuda"`` on :func:`fpsim.quantize`,
:func:`fpsim.dequantize`, :func:`fpsim.fake_quantize`, :func:`fpsim.gemm`,
:func:`fpsim.encode`, :func:`fpsim.decode` and :func:`fpsim.rht`, or a
``with fpsim.backends.use("torch-cuda"):`` block.  With neither, numpy inputs of
at least :data:`AUTO_GPU_MIN` elements go to ``torch-cuda`` when a GPU is present
(the transfer is cheaper than the CPU kernels from that size on), all others to
``numba-cpu``.  Results are numpy arrays either way.

Backends are peers under one dispatcher (:mod:`fpsim.dispatch`, behind :func:`fpsim.quantize` and the
other public functions).  Each backend states which plans it runs (:func:`unsupported` returns the reason
it does not, or ``None``); the dispatcher hands a call it cannot run to the ``numba-cpu`` reference,
explicitly, and moves the result (:func:`route` says in advance which backend will run a call and why).
Every backend gives the same bits as ``numba-cpu`` (tested over generated plans on torch-cpu and under
Triton's interpreter in CI, and on CUDA on the device machine).  The one exception is GEMM's ``"blas"``
model, whose FP32 summation order is the hardware's by definition.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys

__all__ = ["available", "default", "use", "current", "resolve", "unsupported", "route", "AUTO_GPU_MIN"]

#: numpy inputs with at least this many elements go to the GPU when no backend is named.
AUTO_GPU_MIN = 1 << 22

_CURRENT: list[str] = []


def _torch():
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def available() -> list[str]:
    """Names of the backends usable here, fastest last (probed once per process)."""
    return list(_probe())


@functools.cache
def _probe() -> tuple[str, ...]:
    names = ["numba-cpu"]
    torch = _torch()
    if torch is not None:
        names.append("torch-cpu")
        if torch.cuda.is_available():
            names.append("torch-cuda")
            if torch.cuda.get_device_capability(0)[0] == 10:
                names.append("blackwell-native")
    return tuple(names)


def _gpu_possible() -> bool:
    """False on Linux when no NVIDIA driver device exists: then the default needs no torch import (2–3 s) to
    learn that there is no GPU.  Elsewhere (no /dev to look at) torch is asked."""
    return not sys.platform.startswith("linux") or os.path.exists("/dev/nvidiactl")


def default() -> str:
    """The backend fpsim picks: the GPU when there is one, else the Numba reference."""
    if not _gpu_possible():
        return "numba-cpu"
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


def resolve(backend: str | None = None, size: int = 0) -> str:
    """The backend for one call: ``backend`` if given, else the innermost :func:`use` block, else by size.

    Touches torch only when the answer could be a torch backend.
    """
    if backend is None:
        if _CURRENT:
            return _CURRENT[-1]
        if size < AUTO_GPU_MIN:
            return "numba-cpu"
        return default()
    if backend == "numba-cpu":
        return backend
    if backend not in available():
        raise ValueError(f"backend {backend!r} is not available here; available: {', '.join(available())}")
    return backend


def torch_device(name: str) -> str:
    """The torch device of a torch backend name."""
    return "cpu" if name == "torch-cpu" else "cuda"


def pick(backend: str | None, x) -> str | None:
    """A torch backend name for this call, or None for the Numba reference (cheap when nothing is asked for)."""
    if backend is None and not _CURRENT:
        try:
            n = int(getattr(x, "size", 0) or 0)
        except TypeError:
            n = 0
        if n < AUTO_GPU_MIN:
            return None
    name = resolve(backend, int(getattr(x, "size", 0) or 0))
    return None if name == "numba-cpu" else name


def to_torch(x, name: str, dtype=None):
    """numpy (or array-like) → torch tensor on the backend's device."""
    import numpy as np
    import torch

    a = np.ascontiguousarray(x if dtype is None else np.asarray(x, dtype))
    return torch.from_numpy(a).to(torch_device(name))


def unsupported(name: str, op: str, plan=None, **options) -> str | None:
    """Why backend ``name`` does not run ``op`` (``"quantize"``, ``"fake_quantize"``, ``"dequantize"``,
    ``"encode"``, ``"decode"``, ``"gemm"``, ``"rht"``) for this plan and these options, or ``None`` if it does.

    ``numba-cpu`` runs everything; a torch backend answers through :func:`fpsim.torch.backend.unsupported`.
    """
    if name == "numba-cpu":
        return None
    from .torch import backend as tb

    return tb.unsupported(op, plan, torch_device(name), **options)


def route(op: str, plan=None, backend: str | None = None, size: int = 0, **options) -> tuple[str, str | None]:
    """(backend that runs the call, reason it is not the one asked for or chosen, or None)."""
    name = resolve(backend, size)
    why = unsupported(name, op, plan, **options)
    return ("numba-cpu", f"{name}: {why}; computed by numba-cpu and moved") if why else (name, None)
