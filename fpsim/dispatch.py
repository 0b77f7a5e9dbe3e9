"""The public functions that take ``backend=``: one dispatcher over peer backends (docs/spec.md).

:func:`quantize`, :func:`dequantize`, :func:`fake_quantize`, :func:`encode`, :func:`decode`, :func:`rht` and
:func:`gemm` lower their arguments once (:func:`fpsim.plan.lower`), ask :mod:`fpsim.backends` which
backend runs the call, and run it there.  A backend that does not claim the call (its ``unsupported``
gives a reason) is never asked: the Numba reference computes it and the result is returned as usual, so
the bits never depend on the path (``fpsim.backends.route`` shows the choice and the reason).
Results are numpy arrays (or :class:`~fpsim.tensor.QuantizedTensor`) whatever ran them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import backends, codecs, scaling, transforms, validate
from . import gemm as gemm_mod
from ._arrays import as_codes, as_float32, from_torch
from .codecs import Rounding
from .formats import FormatSpec, get_format
from .plan import Plan, lower
from .schemes import BlockScheme, ScaleRule
from .tensor import QuantizedTensor, moved_2d, set_decoder

__all__ = ["quantize", "dequantize", "fake_quantize", "encode", "decode", "rht", "gemm"]


def _torch_backend():
    from .torch import backend

    return backend


def _chosen(op: str, backend: str | None, x, plan=None, **options) -> str | None:
    """The torch backend that runs this call, or None for the reference (cheap when nothing is asked for)."""
    name = backends.pick(backend, x)
    if name is None or backends.unsupported(name, op, plan, **options) is not None:
        return None
    return name


def _fill(out: np.ndarray | None, res: np.ndarray) -> np.ndarray:
    if out is None:
        return res
    if not (isinstance(out, np.ndarray) and out.shape == res.shape and out.dtype == res.dtype
            and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"out must be a C-contiguous writeable array of shape {res.shape} and dtype {res.dtype}")
    out[...] = res
    return out


def encode(x: np.typing.ArrayLike, fmt: str | FormatSpec, rounding: str | Rounding = "rne",
           saturate: bool | None = None, rbits: np.typing.ArrayLike | None = None, seed: int | None = None,
           k: int | None = None, counter: int = 0, out: np.ndarray | None = None,
           backend: str | None = None) -> np.ndarray:
    """:func:`fpsim.codecs.encode` on the chosen backend (same codes everywhere; ``out`` then filled by a copy)."""
    spec = get_format(fmt)
    mode = Rounding.parse(rounding)
    if saturate is None:  # the format's default (SPEC §2): satfinite ≤ 8 bits, IEEE BF16/FP16; SR is satfinite
        saturate = True if mode is Rounding.SR else codecs.default_saturate(spec)
    x32 = as_float32(x)
    name = None
    if not spec.is_passthrough and not (mode is Rounding.SR and (not saturate or (rbits is None) == (seed is None))):
        name = _chosen("encode", backend, x32, rbits=rbits is not None, fmt=spec, sr=mode is Rounding.SR)
    if name is None:
        return codecs.encode(x32, spec, mode, saturate, rbits=rbits, seed=seed, k=k, counter=counter, out=out)
    if mode is not Rounding.SR and seed is not None:
        raise ValueError("rbits/seed apply only to rounding='sr'")
    kbits = spec.sr_bits if k is None else int(k)
    kw = {"seed": seed, "k": kbits, "counter": int(counter)} if mode is Rounding.SR else {}
    res = _torch_backend().encode(backends.to_torch(x32, name), spec, mode.value, bool(saturate), **kw)
    return _fill(out, res.cpu().numpy().astype(spec.code_dtype))


def decode(codes: np.typing.ArrayLike, fmt: str | FormatSpec, out: np.ndarray | None = None,
           backend: str | None = None) -> np.ndarray:
    """:func:`fpsim.codecs.decode` on the chosen backend (same values everywhere)."""
    spec = get_format(fmt)
    c = as_codes(codes, spec)
    name = None if spec.is_passthrough else _chosen("decode", backend, c)
    if name is None:
        return codecs.decode(c, spec, out=out)
    if c.size and (int(c.min()) < 0 or int(c.max()) >= (1 << spec.bits)):
        raise ValueError(f"code(s) outside the {spec.bits}-bit range of {spec.name}")
    return _fill(out, _torch_backend().decode(backends.to_torch(c.astype(np.int64), name), spec).cpu().numpy())


def quantize(x: np.typing.ArrayLike, scheme: str | BlockScheme | Plan = "nvfp4", axis: int = -1,
             block: tuple[int, int] | None = None, rounding: str | Rounding | None = None,
             scale_rule: str | ScaleRule | None = None, seed: int | None = None,
             rbits: np.typing.ArrayLike | None = None, k: int | None = None, counter: int = 0,
             nan_amax: str = "propagate", tensor_amax: float | None = None,
             backend: str | None = None, convention: str | None = None) -> QuantizedTensor:
    """Quantize with a block-scaled scheme (docs/spec.md §4–§6): :func:`fpsim.scaling.quantize`'s arguments and
    bits, on the chosen backend (see :mod:`fpsim.backends`); ``convention``: a producer's NVFP4 arithmetic
    (:mod:`fpsim.conventions`, docs/spec.md §4.1).  ``x``: an array or a torch tensor (read as numpy, like
    :func:`encode`; the result is a :class:`~fpsim.tensor.QuantizedTensor` whatever the input)."""
    x = from_torch(x)
    plan = lower(scheme, block=block, rounding=rounding, scale_rule=scale_rule, k=k, nan_amax=nan_amax,
                 convention=convention)
    # checked here as well as in the reference, so that no backend receives an argument the reference refuses
    kw: dict[str, Any] = dict(seed=seed, rbits=rbits, counter=validate.counter_arg(counter),
                              tensor_amax=validate.amax_arg(tensor_amax))
    name = _chosen("quantize", backend, x, plan, rbits=rbits is not None)
    if name is None:
        return scaling.quantize(x, plan, axis, **kw)
    tkw = {key: v for key, v in kw.items() if v is not None and key != "rbits"}
    if not counter:
        tkw.pop("counter", None)
    if plan.nan.value != "propagate":
        tkw["nan_amax"] = plan.nan.value
    t = backends.to_torch(as_float32(x), name)
    # the reference's check of the counters the call spans
    if plan.is_sr and plan.sr is not None and plan.block is not None and t.dim():
        _, R, C = moved_2d(tuple(t.shape), validate.axis_arg(axis, t.dim()))
        validate.counter_arg(counter, span=R * plan.blocks_per_row(C) * plan.sr.calls_per_block)
    dtype = getattr(x, "dtype", np.asarray(x).dtype).name
    if plan.convention is not lower(plan.scheme).convention:
        tkw["bf16"] = dtype == "bfloat16"
    return _torch_backend().quantize(t, plan, axis, **tkw).to_quantized(dtype)


def dequantize(qt: QuantizedTensor, backend: str | None = None, out: np.ndarray | None = None,
               convention: str | None = None) -> np.ndarray:
    """Decode to float32 in the original shape (:func:`fpsim.scaling.dequantize`'s bits) on the chosen backend;
    ``convention``: decode as that producer does (:mod:`fpsim.conventions`; default the tensor's own)."""
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"dequantize needs a QuantizedTensor (from fpsim.quantize), got {type(qt).__name__}")
    conv = qt.convention if convention is None else convention
    name = _chosen("dequantize", backend, qt, lower(qt.scheme))
    if name is None:
        return scaling.dequantize(qt, out=out, convention=conv)
    tb = _torch_backend()
    res = tb.TorchQuantized.from_quantized(qt, backends.torch_device(name)).dequantize(convention=conv)
    return scaling.into(out, res.cpu().numpy())


def fake_quantize(x: np.typing.ArrayLike, scheme: str | BlockScheme | Plan = "nvfp4", backend: str | None = None,
                  **kwargs) -> np.ndarray:
    """``dequantize(quantize(x, scheme, **kwargs))``: the float32 values the scheme can represent."""
    return dequantize(quantize(x, scheme, backend=backend, **kwargs), backend=backend)


def rht(x: np.typing.ArrayLike, d: int = 16, signs="recipe", axis: int = -1, bf16_in: bool = True,
        bf16_out: bool = True, inverse: bool = False, backend: str | None = None) -> np.ndarray:
    """:func:`fpsim.transforms.rht` on the chosen backend (same bits everywhere)."""
    x32 = as_float32(x)
    name = _chosen("rht", backend, x32)
    if name is None or x32.ndim == 0:
        return transforms.rht(x32, d, signs, axis, bf16_in, bf16_out, inverse)
    d = transforms.check_d(d)
    n = np.moveaxis(x32, axis, -1).shape[-1]
    if n % d:
        raise ValueError(f"axis length {n} is not a multiple of the Hadamard size {d}")
    out = _torch_backend().rht(backends.to_torch(x32, name), d, transforms.sign_vector(d, signs), axis, bf16_in,
                               bf16_out, inverse)
    return np.ascontiguousarray(out.cpu().numpy())


def gemm(qa: QuantizedTensor | np.typing.ArrayLike, qb: QuantizedTensor | np.typing.ArrayLike,
         accumulator: str = "fp32", acc_bits: int = 23, backend: str | None = None) -> np.ndarray:
    """:func:`fpsim.gemm.gemm` (``A · Bᵀ``, docs/spec.md §8) on the chosen backend.

    ``"fp32"`` gives the same bits on every backend; ``"blas"`` on ``torch-cuda`` runs the tensor-core path
    (NVFP4 through exact BF16 values, per-tensor FP8 through FP8 tensor cores), whose FP32 summation order
    is the hardware's.
    """
    name = None
    if isinstance(qa, QuantizedTensor) and isinstance(qb, QuantizedTensor):
        name = _chosen("gemm", backend, qa if qa.size >= qb.size else qb, accumulator=accumulator)
    if name is None:
        return gemm_mod.gemm(qa, qb, accumulator, acc_bits)
    tb = _torch_backend()
    dev = backends.torch_device(name)
    out = tb.gemm(tb.TorchQuantized.from_quantized(qa, dev), tb.TorchQuantized.from_quantized(qb, dev), accumulator)
    return out.cpu().numpy()


set_decoder(dequantize)
