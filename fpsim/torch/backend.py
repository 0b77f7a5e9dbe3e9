"""The torch backend as :mod:`fpsim.dispatch` sees it: which plans it runs (:func:`unsupported`) and the entry
points, each taking a scheme or a :class:`~fpsim.plan.Plan` and torch tensors on any device.

:func:`quantize` / :func:`fake_quantize` run the fused Triton kernels where they take the plan (on CUDA, or
with ``impl="triton"``, e.g. under ``TRITON_INTERPRET=1``), else the eager torch-operation quantizer
(any device); plans neither takes are computed by the Numba reference on the host and moved back, so
the bits never depend on the path (``route(...)`` says which one runs).  Codecs, RHT, GEMM and the
container live in :mod:`fpsim.torch.codecs`, :mod:`~fpsim.torch.rht`, :mod:`~fpsim.torch.gemm` and
:mod:`~fpsim.torch.container`.
"""

from __future__ import annotations

import numpy as np

from ..conventions import decodes_native, is_native
from ..plan import Plan, lower
from ..schemes import BlockScheme, Kind, ScaleRule
from ..tensor import moved_2d
from .codecs import decode, encode
from .container import TorchQuantized
from .conventions import quantize_convention
from .gemm import gemm
from .quantize import absmax, amax_bits, eager_unsupported, quantize_eager, quantize_fused, triton_unsupported
from .rht import (
    rht,
    rht_t_amaxes,
    rht_transposed,
    rht_transposed_amaxes,
    rht_transposed_scaled,
    rht_transposed_scaled_pair,
    scaled_fusable,
)
from .runtime import f32, torch_module, triton_available, use_triton

__all__ = ["unsupported", "route", "quantize", "fake_quantize", "dequantize", "encode", "decode", "rht",
           "rht_transposed", "rht_transposed_amaxes", "rht_transposed_scaled", "rht_transposed_scaled_pair",
           "rht_t_amaxes", "scaled_fusable", "gemm", "TorchQuantized"]


def unsupported(op: str, plan: Plan | None, device: str, **options) -> str | None:
    """Why this backend does not run ``op`` for ``plan`` on ``device`` (``"cpu"``/``"cuda"``), or None.

    The dispatcher (:mod:`fpsim.dispatch`) hands every call this returns a reason for to the Numba
    reference and moves the result, so the bits never depend on the path.
    """
    if op in ("encode", "decode", "rht"):
        if op == "encode" and options.get("rbits"):
            return "explicit rbits= are applied by the reference"
        spec = options.get("fmt")
        # the arithmetic encoders (SR, and > 8-bit formats) start from a subnormal grid with emin_b ≥ 1 (E8M0 has none)
        if (op == "encode" and spec is not None and (options.get("sr") or spec.bits > 8)
                and not (spec.subnormals and spec.traits.emin_b >= 1)):
            return f"{spec.name} has no subnormals, which the torch arithmetic encoders (SR, > 8 bits) need"
        return None
    if op == "gemm":
        acc = options.get("accumulator", "fp32")
        return None if acc in ("fp32", "blas") else f"the {acc!r} accumulator model runs on the reference only"
    if op not in ("quantize", "fake_quantize", "dequantize"):
        raise ValueError(f"unknown op {op!r}")
    if options.get("rbits"):
        return "explicit rbits= are applied by the reference"
    if op == "dequantize":
        return None
    if device == "cuda" and triton_available() and triton_unsupported(plan) is None:
        return None
    return eager_unsupported(plan)


def route(plan: Plan, x, impl: str = "auto") -> str:
    """Which implementation :func:`quantize` runs for this plan and tensor: ``"triton"``, ``"eager"`` or
    ``"reference"``.  ``impl="triton"`` on a plan the kernels do not take raises ``ValueError`` with the reason."""
    if use_triton(x, impl):
        why = triton_unsupported(plan)
        if why is None:
            return "triton"
        if impl == "triton":
            raise ValueError(f"impl='triton': {why}")
    return "eager" if eager_unsupported(plan) is None else "reference"


def _plan(scheme, block, rounding, scale_rule, k, nan_amax, seed) -> Plan:
    plan = lower(scheme, block=block, rounding=rounding, scale_rule=scale_rule, k=k, nan_amax=nan_amax)
    if plan.is_sr and seed is None:
        raise ValueError("rounding='sr' needs a seed (explicit rbits= are fpsim.quantize's)")
    if not plan.is_sr and seed is not None:
        raise ValueError("seed applies only to rounding='sr'")
    return plan


def _amax(X, plan: Plan, tensor_amax, fused: bool):
    """The amax the second level (or the per-tensor FP32 scale) needs: per row, given, or measured."""
    torch = torch_module()
    dev = X.device
    tl_ = plan.two_level
    if tl_ is not None and not tl_.tensor_scale:
        return f32(float("nan"), dev)
    if tl_ is not None and tl_.per_row:
        return amax_bits(X, plan.ignore_nan, dim=-1)
    if plan.kind is Kind.POW2 or (plan.kind is Kind.FP32 and plan.block is not None):
        return f32(float("nan"), dev)
    if torch.is_tensor(tensor_amax):
        return tensor_amax.to(device=dev, dtype=torch.float32).reshape(())
    if tensor_amax is not None:
        return f32(float(np.float32(tensor_amax)), dev)
    return absmax(X, plan.ignore_nan) if fused else amax_bits(X, plan.ignore_nan)


def _check_tensor_amax(plan: Plan, tensor_amax) -> None:
    per_tensor = plan.block is None or (plan.two_level is not None and plan.two_level.tensor_scale
                                        and not plan.two_level.per_row)
    if tensor_amax is not None and not per_tensor:
        raise ValueError(f"tensor_amax applies to schemes with a per-tensor scale, not {plan.scheme.name}")


def _rows(x, plan: Plan, axis: int):
    """(2-D contiguous rows with the quantized axis last, moved shape, axis) of a block plan's input."""
    nd = x.dim()
    if not -nd <= axis < nd:
        raise ValueError(f"axis {axis} out of range for a {nd}-d tensor")
    ax = axis % nd
    moved, R, C = moved_2d(tuple(x.shape), ax)
    if plan.block[0] > 1 and len(moved) != 2:
        raise ValueError(f"2-D blocks {plan.block} need a 2-D tensor, got shape {tuple(x.shape)}")
    torch = torch_module()
    return torch.movedim(x, ax, -1).reshape(R, C).contiguous(), moved, ax


def quantize(x, scheme: str | BlockScheme | Plan = "nvfp4", axis: int = -1, *, block=None, rounding=None,
             scale_rule: str | ScaleRule | None = None, k: int | None = None, nan_amax: str = "propagate",
             seed: int | None = None, counter: int = 0, tensor_amax=None, impl: str = "auto",
             convention: str | None = None, bf16: bool | None = None) -> TorchQuantized:
    """:func:`fpsim.quantize` for a torch tensor, result on the tensor's device (same bits, same layouts).

    Arguments as :func:`fpsim.quantize` (``rbits=`` excepted: explicit random bits go through it); ``impl``
    ``"auto"`` (Triton on CUDA where the kernels take the plan, else torch operations), ``"triton"`` or
    ``"eager"``.  Stochastic rounding reads the Philox stream of the CPU quantizer in the same block order.
    ``convention``: a producer's NVFP4 arithmetic (:mod:`fpsim.conventions`), run as torch operations; ``bf16``:
    the values were bfloat16 (default: x's dtype says; compressed-tensors then forms its global scale in bfloat16).
    """
    torch = torch_module()
    plan = lower(_plan(scheme, block, rounding, scale_rule, k, nan_amax, seed), convention=convention)
    _check_tensor_amax(plan, tensor_amax)
    if bf16 is None:
        bf16 = x.dtype == torch.bfloat16
    x = x.to(torch.float32)
    if x.dim() == 0:
        raise ValueError("quantize needs at least one axis")
    shape = tuple(x.shape)
    path = route(plan, x, impl)
    if path == "reference":
        from ..scaling import quantize as reference

        q = reference(x.detach().cpu().numpy(), plan, axis, seed=seed, counter=counter, tensor_amax=tensor_amax)
        return TorchQuantized.from_quantized(q, x.device)
    fused = path == "triton"
    if plan.kind is Kind.CAST or plan.block is None:
        amax = None if plan.kind is Kind.CAST else _amax(x.contiguous(), plan, tensor_amax, fused)
        if fused:
            q, s = quantize_fused(x.contiguous(), plan, amax)
        else:
            q, s, amax = quantize_eager(x, plan, amax, seed=seed, counter=counter)
        return TorchQuantized(q, s, amax.reshape(()), plan.scheme, shape, axis % x.dim())
    X, moved, ax = _rows(x, plan, axis)
    if not is_native(plan.convention):
        q, s, amax = quantize_convention(X, plan, bf16, tensor_amax)
        lead = moved[:-1]
        return TorchQuantized(q.reshape(*lead, q.shape[-1]), s.reshape(*lead, s.shape[-1]), amax, plan.scheme, shape,
                              ax, plan.convention.name, bf16)
    amax = _amax(X, plan, tensor_amax, fused)
    if fused:
        q, s = quantize_fused(X, plan, amax, seed=seed, counter=counter)
    else:
        q, s, amax = quantize_eager(X, plan, amax, seed=seed, counter=counter)
    lead = moved[:-1]
    amax = amax.reshape(lead) if plan.two_level is not None and plan.two_level.per_row else amax.reshape(())
    return TorchQuantized(q.reshape(*lead, q.shape[-1]), s.reshape(*lead, s.shape[-1]), amax, plan.scheme, shape,
                          ax, plan.convention.name, bf16)


def fake_quantize(x, scheme: str | BlockScheme | Plan = "nvfp4", axis: int = -1, *, block=None, rounding=None,
                  scale_rule: str | ScaleRule | None = None, k: int | None = None, nan_amax: str = "propagate",
                  seed: int | None = None, counter: int = 0, tensor_amax=None, impl: str = "auto"):
    """``quantize(x, ...).dequantize()`` — the float32 values the plan represents, on x's device — with
    :func:`fpsim.fake_quantize`'s bits.  Where the Triton kernels take the plan this is one fused pass (after
    the amax pass) that writes no codes."""
    torch = torch_module()
    kw = dict(block=block, rounding=rounding, scale_rule=scale_rule, k=k, nan_amax=nan_amax, seed=seed,
              counter=counter, tensor_amax=tensor_amax, impl=impl)
    plan = _plan(scheme, block, rounding, scale_rule, k, nan_amax, seed)
    x = x.to(torch.float32)
    if x.dim() == 0 or route(plan, x, impl) != "triton" or not decodes_native(plan.convention):
        return quantize(x, plan, axis, **{**kw, "block": None, "rounding": None, "scale_rule": None, "k": None}
                        ).dequantize(impl=impl)
    _check_tensor_amax(plan, tensor_amax)
    if plan.block is None:
        X = x.contiguous()
        return quantize_fused(X, plan, _amax(X, plan, tensor_amax, True), fake=True)
    X, moved, ax = _rows(x, plan, axis)
    out = quantize_fused(X, plan, _amax(X, plan, tensor_amax, True), fake=True, seed=seed, counter=counter)
    return torch.movedim(out.reshape(moved), -1, ax)


def dequantize(q: TorchQuantized, dtype=None, impl: str = "auto"):
    """Decode a :class:`TorchQuantized` to float32 (or ``dtype``) in its original shape (the reference's bits)."""
    return q.dequantize(dtype, impl)
