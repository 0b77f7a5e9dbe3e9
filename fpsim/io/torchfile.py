"""Tensors of a ``.pt`` / ``.pth`` file: loaded once, ``weights_only=True`` always, memory-mapped where torch can.

``torch.load(..., weights_only=True, mmap=True)`` maps the storages of a zip-format checkpoint (what
``torch.save`` writes since torch 1.6) instead of reading them; a legacy (non-zip) file is read whole.
Nested containers are walked: ``{"state_dict": {"fc.weight": t}}`` gives ``state_dict.fc.weight``, list
items get their index.  dtypes numpy lacks are viewed bit for bit as their ml_dtypes twin (bfloat16,
float8 E4M3/E5M2/E8M0 and the FNUZ variants; packed ``float4_e2m1fn_x2`` unpacked to two elements per
byte, low nibble first); complex32, quantized (qint8 …) and sparse tensors are reported, not guessed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from .errors import InputError
from .rows import ArrayStorage, Member

__all__ = ["torch_members"]


def _ml_views():
    import ml_dtypes
    import torch

    views = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for tname, mname in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
                         ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float8_e5m2fnuz", "float8_e5m2fnuz"),
                         ("float8_e8m0fnu", "float8_e8m0fnu")):
        if hasattr(torch, tname):
            views[getattr(torch, tname)] = (torch.uint8, getattr(ml_dtypes, mname))
    return views


def _to_numpy(t, views) -> np.ndarray:
    """A numpy view (no copy where torch allows) of a dense CPU tensor; ValueError with the reason otherwise."""
    import torch

    if t.layout != torch.strided:
        raise ValueError(f"is a sparse tensor ({t.layout}); save it dense (t.to_dense()) to analyse it")
    if t.is_quantized:
        raise ValueError(f"is a quantized tensor ({t.dtype}); fpsim reads float tensors (save t.dequantize())")
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in views:
        bits, ml = views[t.dtype]
        return t.view(bits).numpy().view(ml)
    if getattr(torch, "float4_e2m1fn_x2", None) is not None and t.dtype == torch.float4_e2m1fn_x2:
        import ml_dtypes

        b = t.view(torch.uint8).numpy()
        out = np.empty(b.shape[:-1] + (2 * b.shape[-1],) if b.ndim else (2,), np.uint8)
        out[..., 0::2] = b & 0xF
        out[..., 1::2] = b >> 4
        return out.view(ml_dtypes.float4_e2m1fn)
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        raise ValueError(f"has dtype {t.dtype}, which numpy cannot hold") from None


def _load(path: Path):
    import torch

    # torch's own deprecation notices while rebuilding storages (TypedStorage, ComplexHalf, quantized
    # tensors) are about torch internals, not about the user's file: keep them off the user's stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
        return torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format: no mmap


def torch_members(path: str | os.PathLike) -> tuple[list[Member], list[str]]:
    """Every tensor of a torch file (loaded once) and notes on the values that are not tensors."""
    p = Path(path)
    try:
        import torch
    except ImportError:
        raise InputError(f"{p}: reading .pt/.pth needs torch (pip install 'fpsim[torch]')") from None
    try:
        obj = _load(p)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise InputError(f"{p}: cannot read as a weights-only torch file ({first})") from None
    views = _ml_views()
    members: list[Member] = []
    notes: list[str] = []

    def walk(name: str, v, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            try:
                a = _to_numpy(v, views)
            except ValueError as e:
                members.append(Member(name, tuple(v.shape), np.dtype("u1"), error=f"{p}: tensor {name!r} {e}"))
                return
            members.append(Member(name, tuple(a.shape), a.dtype, lambda a=a: ArrayStorage(a)))
        elif isinstance(v, dict) and depth < 64:
            for k, x in v.items():
                walk(f"{name}.{k}" if name else str(k), x, depth + 1)
        elif isinstance(v, (list, tuple)) and depth < 64:
            for i, x in enumerate(v):
                walk(f"{name}.{i}" if name else str(i), x, depth + 1)
        else:
            notes.append(f"{p}: {name or '(top level)'!r} is not a tensor ({type(v).__name__})")

    walk("" if not isinstance(obj, torch.Tensor) else "tensor", obj, 0)
    return members, notes
