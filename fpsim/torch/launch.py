"""Triton launches with the JIT's dispatch done once per configuration (the training layer's hot kernels).

``kernel[grid](...)`` binds every argument, builds a specialisation key and looks the compiled kernel up on
every call: 40–90 µs of host time per launch on the H200 machine, the largest cost of a training step that
issues hundreds of launches.  :func:`launch` does that once per (kernel, constexpr values, argument
specialisation) and afterwards calls the compiled kernel's launcher with the same argument list the JIT would
pass.  The compiled kernel is the JIT's own, so the bits cannot differ; where the launcher's interface is not
the expected one (another Triton version) the first failure switches this off for the process, and
``FPSIM_TRITON_DIRECT=0`` turns it off.  Under ``TRITON_INTERPRET=1`` every launch goes through the JIT.
"""

from __future__ import annotations

import inspect
import logging
import operator
import os

from .runtime import hw_cvt, torch_module

__all__ = ["launch", "direct_enabled"]

log = logging.getLogger("fpsim.torch")

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")
_state = {"broken": os.environ.get("FPSIM_TRITON_DIRECT", "1") == "0"}
_cache: dict = {}
_meta: dict = {}
_kwmeta: dict = {}


def direct_enabled() -> bool:
    """Whether launches bypass the JIT's per-call dispatch (after each configuration's first launch)."""
    return not _state["broken"] and hw_cvt()


_TENSOR: list = []  # torch.Tensor, looked up once (this module imports no torch at import time)


def _spec(a):
    """What the JIT specialises a runtime argument on: a tensor's dtype and 16-byte alignment, an integer's
    divisibility by 16, being 1 and its width."""
    if not _TENSOR:
        _TENSOR.append(torch_module().Tensor)
    if isinstance(a, _TENSOR[0]):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return ("i", a % 16 == 0, a == 1, -(1 << 31) <= a < (1 << 31), a >= (1 << 63))
    return (type(a).__name__,)


def _kernel_meta(fn):
    m = _meta.get(fn)
    if m is None:
        names = list(inspect.signature(fn.fn).parameters)
        const = frozenset(p.name for p in fn.params if p.is_constexpr)
        m = _meta[fn] = (names, const)
    return m


def _keyword_meta(fn, keys: tuple):
    """For one kernel and one set of keyword names: the runtime keywords, and getters of the constexpr and
    runtime values (computed once: the hot path then does no per-keyword Python work)."""
    m = _kwmeta.get((fn, keys))
    if m is None:
        _, const = _kernel_meta(fn)
        rt = tuple(k for k in keys if k not in const and k not in _LAUNCH_OPTIONS)
        fixed = tuple(k for k in keys if k not in rt)
        get_fixed = operator.itemgetter(*fixed) if fixed else (lambda d: ())
        get_rt = (lambda d: ()) if not rt else (lambda d, g=operator.itemgetter(*rt): (g(d),)) if len(rt) == 1 \
            else operator.itemgetter(*rt)
        m = _kwmeta[(fn, keys)] = (rt, get_fixed, get_rt)
    return m


def launch(fn, grid: tuple, args: tuple, kwargs: dict) -> None:
    """``fn[grid](*args, **kwargs)`` with the JIT's dispatch cached (see the module docstring)."""
    if not direct_enabled() or not getattr(args[0], "is_cuda", False):
        fn[grid](*args, **kwargs)
        return
    keys = tuple(kwargs)
    rt_kw, get_fixed, get_rt = _keyword_meta(fn, keys)
    rt_vals = get_rt(kwargs)
    key = (fn, keys, args[0].device.index, len(args), get_fixed(kwargs), tuple(map(_spec, args)),
           tuple(map(_spec, rt_vals)))
    hit = _cache.get(key)
    if hit is None:
        kernel = fn[grid](*args, **kwargs)  # compiles (or finds) and launches through the JIT
        names, _ = _kernel_meta(fn)
        params = {k: v for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS}
        bound = inspect.signature(fn.fn).bind(*args, **params)
        bound.apply_defaults()
        slots = tuple(names.index(k) for k in rt_kw)
        runtime = set(range(len(args))) | set(slots)
        # the template keeps the constexpr values and defaults only: holding the first call's tensors would keep
        # them alive for the life of the process
        template = [None if i in runtime else v for i, v in enumerate(bound.arguments.values())]
        if kernel is not None and hasattr(kernel, "run"):
            _cache[key] = (kernel, template, slots)
        return
    kernel, template, slots = hit
    vals = list(template)
    vals[: len(args)] = args
    for i, v in zip(slots, rt_vals):
        vals[i] = v
    g = tuple(grid) + (1,) * (3 - len(grid))
    torch = torch_module()
    stream = torch._C._cuda_getCurrentRawStream(args[0].device.index)  # what the JIT itself reads
    try:
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None, *vals)
    except Exception as e:  # another Triton's launcher: use the JIT from now on
        _state["broken"] = True
        log.warning("fpsim.torch: direct Triton launches disabled (%s: %s)", type(e).__name__, e)
        fn[grid](*args, **kwargs)
