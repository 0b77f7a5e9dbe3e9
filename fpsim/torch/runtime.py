"""What every module of the torch backend shares: the lazy torch import, whether the Triton kernels run, and
their launch constants (no kernel and no format rule lives here)."""

from __future__ import annotations

import functools
import os

__all__ = ["torch_module", "triton_available", "use_triton", "hw_cvt", "layout", "dummy", "f32", "fdiv", "BB", "WARPS",
           "FLT_MAX"]

#: Elements per Triton program: 128 blocks of 16 (2048 values; blocks of W take 2048 // W per program): H200 sweep.
BB = 128
WARPS = 4
FLT_MAX = 3.4028234663852886e38


_TORCH: list = []


def torch_module():
    """``torch``, imported on first use (``import fpsim.torch`` itself imports nothing heavy)."""
    if _TORCH:  # the hot path: a list lookup, not the import machinery (called several times per operand copy)
        return _TORCH[0]
    import torch

    _TORCH.append(torch)
    return torch


_KERNELS: dict = {}


def kernels(name: str = "kernels"):
    """The Triton source module ``fpsim.torch.kernels`` (or ``"kernels_quant"``), imported on first use and then
    looked up in a dict (an import statement per launch cost ~1 µs of import machinery on the hot path)."""
    m = _KERNELS.get(name)
    if m is None:
        import importlib

        m = _KERNELS[name] = importlib.import_module(f"{__package__}.{name}")
    return m


@functools.cache
def triton_available() -> bool:
    """Whether the fused Triton kernels can be imported here (they run on CUDA, or on CPU under TRITON_INTERPRET=1)."""
    try:
        from . import kernels_quant  # noqa: F401
    except Exception:  # ImportError, or a Triton that cannot initialise its backend
        return False
    return True


def use_triton(x, impl: str) -> bool:
    """True when the Triton kernels should run on ``x`` (``impl``: "auto" = on CUDA tensors, "triton", "eager")."""
    if impl not in ("auto", "triton", "eager"):
        raise ValueError("impl must be 'auto', 'triton' or 'eager'")
    if impl == "eager":
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' needs Triton (pip install triton)")
        return True
    return x.is_cuda and triton_available()


def hw_cvt() -> bool:
    """Compiled kernels may use the GPU's float conversions; the interpreter's truncate, so it gets integer code."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


def layout(R: int, C: int, w: int) -> dict:
    """Kernel switches: EVEN (no ragged tail: contiguous blocks), IDX64 (offsets past 2^31)."""
    return {"EVEN": C % w == 0, "IDX64": R * (-(-C // w) * w) >= (1 << 31) - 4096, "num_warps": WARPS}


@functools.cache
def dummy(device: str, dtype_name: str):
    """A one-element placeholder for a kernel pointer argument the chosen variant never reads."""
    torch = torch_module()
    return torch.zeros(1, dtype=getattr(torch, dtype_name), device=device)


def f32(v, device):
    """A 0-d float32 tensor on ``device``, filled on the device: ``torch.tensor(v, device="cuda")`` copies from
    pageable host memory, which synchronises the host with the GPU (and exposes the launch overheads)."""
    torch = torch_module()
    return torch.full((), float(v), dtype=torch.float32, device=device)


def fdiv(a, b):
    """a / b as one IEEE float32 division per element, with Python numbers broadcast to full tensors first:
    torch turns ``tensor / number`` into a multiplication by the reciprocal on CUDA, and ``number / tensor``
    into ``reciprocal(tensor) · number`` everywhere (two roundings)."""
    torch = torch_module()
    if not torch.is_tensor(a):
        a = torch.full_like(b, float(a))
    if not torch.is_tensor(b):
        b = torch.full_like(a, float(b))
    return torch.div(a, b)
