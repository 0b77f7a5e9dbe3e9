"""The quantized linear layer's machinery (docs/spec.md §8), beneath :class:`fpsim.torch.nn.Linear`: the operand
copies (each quantized from the high-precision tensor with its own amax, after its RHT), the two GEMM paths
(:data:`FAST` for ``gemm="blas"``, :func:`reference_ops` for the bit-defined ``gemm="fp32"``) and the autograd
Function :class:`QLinearFn` that runs the three GEMMs with their six copies.  :mod:`fpsim.torch.nn` holds the
module, :func:`~fpsim.torch.nn.convert` and the step helpers; it is the public face of these names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..plan import lower
from ..recipe import Recipe, operand_steps
from . import backend as tb
from . import fastpath as fp
from . import graphs

#: Callables ``(layer, role, step, source, copy)`` told of every quantized copy (the training monitor registers
#: here: it sits above this module, so this module never imports it).
OBSERVERS: list[Callable] = []


def _copy(t: torch.Tensor, policy, *, seed: int, layer: str, step: int, role: str):
    """One operand copy (reduction axis last): RHT, then the block scheme; the same steps as the reference."""
    st = operand_steps(policy, seed=seed, layer=layer, step=step, role=role)
    x = t.to(torch.float32).contiguous()
    if st.rht:
        x = tb.rht(x, st.rht, st.signs)
    if st.scheme is None:
        return x
    sch = st.scheme
    if sch.kind.value == "cast" and sch.element.name in _TORCH_CASTS and sch.rounding.value == "rne":
        # torch's float32 → BF16/FP16 conversion is RNE with IEEE overflow, the reference cast's convention:
        # the copy is the cast tensor itself (no codes to keep), on any device, at copy speed.
        return x.to(_TORCH_CASTS[sch.element.name])
    q = tb.quantize(x, sch, **({"seed": st.seed} if st.seed is not None else {}))
    for ob in OBSERVERS:
        ob(layer, role, step, x, q)
    return q


_TORCH_CASTS = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _values(q) -> torch.Tensor:
    """The float32 values a copy stands for (a plain or cast tensor is its own value)."""
    return q.to(torch.float32) if isinstance(q, torch.Tensor) else q.dequantize()


def _host(q):
    """A copy as :func:`fpsim.gemm.gemm` takes it: a plain or cast tensor as its float32 values, a quantized copy as
    its :class:`~fpsim.QuantizedTensor` (codes, block scales and amax, so the chunking and alpha are the
    reference's)."""
    return q.to(torch.float32).cpu().numpy() if isinstance(q, torch.Tensor) else q.to_quantized()


def _mm(qa, qb, gemm: str, accumulator: str = "fp32") -> torch.Tensor:
    """``A · Bᵀ`` of two copies, float32; ``gemm="fp32"`` runs the recipe's ``accumulator`` model."""
    plain = isinstance(qa, torch.Tensor) or isinstance(qb, torch.Tensor)
    if gemm == "fp32" and (plain or accumulator != "fp32"):
        # The reference GEMM on the host: a plain or cast operand beside a block-scaled one takes that operand's
        # chunks, scales and alpha (dequantizing it first would sum other chunks and round alpha in), and the
        # "exact" / "truncated" accumulators exist only there; "exact"'s float64 result is rounded to float32.
        from ..gemm import gemm as ref_gemm

        dev = qa.device if isinstance(qa, torch.Tensor) else qa.data.device
        return torch.from_numpy(ref_gemm(_host(qa), _host(qb), accumulator)).to(device=dev, dtype=torch.float32)
    if plain:
        if isinstance(qa, torch.Tensor) and isinstance(qb, torch.Tensor) and qa.dtype == qb.dtype != torch.float32 \
                and qa.is_cuda:
            return (qa @ qb.T).to(torch.float32)  # BF16/FP16 tensor cores, FP32 accumulation
        return _values(qa) @ _values(qb).T
    return tb.gemm(qa, qb, gemm)


def fast_copy(t: torch.Tensor | None, policy, *, seed: int, layer: str, step: int, role: str, amax=None,
               stored=None) -> fp.Copy:
    """:func:`_copy` on the fast path: the same steps, written as a :class:`fpsim.torch.fastpath.Copy`.
    ``amax``: the copy's tensor amax from :func:`_fast_pair` (its own amax pass is then skipped); ``stored``: the
    RHT'd transpose of a Wgrad copy, already written by :func:`_fast_pair` (``t`` is then unused)."""
    st = operand_steps(policy, seed=seed, layer=layer, step=step, role=role)
    if stored is not None:
        x = stored
    else:
        x = t if t.dtype in (torch.float32, torch.bfloat16) else t.to(torch.float32)
    plan = None if st.scheme is None else lower(st.scheme)
    given, amax = amax, None
    wgrad_t = (stored is None and st.rht and x.dim() == 2 and x.stride(0) == 1 and x.shape[1] > 1
               and fp.enabled(x))
    need = wgrad_t and plan is not None and fp.copy_kind(plan) == "scaled"
    if (need and fp.wgrad_path() in ("registers", "paired") and tb.scaled_fusable(plan, st.rht)
            and not (OBSERVERS and plan.ignore_nan)):
        # Wgrad's scaled dYᵀ and Xᵀ copies in two passes over the untransposed tensor (an amax pass, then the RHT
        # and the quantization in registers): the transposed BF16 tensor is never written.  An observer's "all
        # finite" flag of an ignore-NaN copy needs that tensor, so such a copy takes the path below.
        sr = _graph_key(policy, plan, st.seed, seed=seed, layer=layer, step=step, role=role)
        v, amax = tb.rht_transposed_scaled(x.t(), plan, st.rht, st.signs, amax=given,
                                           **({} if sr is None else {"seed": sr}))
        c = fp.Copy(v, "scaled", amax, float(plan.two_level.num), plan)
        _note(layer, role, step, None, c)  # the flag is the copy's NaN-propagating amax
        return c
    if stored is not None:
        x, amax = stored, given
    elif wgrad_t:
        # Wgrad's dYᵀ and Xᵀ: one pass reads the untransposed tensor, writes the RHT'd transpose as BF16 (exact:
        # the reference's RHT rounds its output to BF16) and takes the amax a scaled copy needs
        x, amax = tb.rht_transposed(x.t(), st.rht, st.signs, out_dtype=torch.bfloat16, amax=need,
                                    ignore_nan=need and plan.ignore_nan, impl=fp.IMPL)
    elif st.rht:  # BF16 in, BF16-rounded out, stored as BF16: exact, half the bytes
        x = tb.rht(x.contiguous(), st.rht, st.signs, out_dtype=torch.bfloat16, impl=fp.IMPL)
    else:
        amax = given  # a copy of the tensor itself: its amax is the plain one
        if plan is None or fp.copy_kind(plan) != "cast":  # a BF16 cast keeps the view: the GEMM takes strides
            x = x.contiguous()
    sr = _graph_key(policy, plan, st.seed, seed=seed, layer=layer, step=step, role=role)
    if plan is None:
        c = fp.Copy(x.to(torch.float32), "f32")
    else:
        c = fp.make_copy(x, plan, sr, amax=amax)
    _note(layer, role, step, x, c)  # steps an observer records take the full path (see Linear.forward)
    return c


def _note(layer: str, role: str, step: int, x, c: fp.Copy) -> None:
    """Tell the observers of a fast-path copy (``x``: its source; None: the amax flags a non-finite source)."""
    for ob in OBSERVERS:
        note = getattr(ob, "note", None)
        if note is not None:
            note(layer, role, step, x, c)


class _Pair(NamedTuple):
    """Two copies of one tensor from one read: ``plain`` quantizes it, ``trans`` its RHT'd transpose (Fprop's X and
    Wgrad's Xᵀ, or Dgrad's dY and Wgrad's dYᵀ); where the two plans differ only their tensor amax values are
    shared (``plain``/``trans`` None: each copy is made by :func:`fast_copy` with its amax)."""

    amax_plain: object
    amax_trans: object
    plain: fp.Copy | None = None
    trans: fp.Copy | None = None
    stored: torch.Tensor | None = None  # "shared": the RHT'd transpose, written with both amax values


def _fast_pair(t: torch.Tensor, plain, trans, *, seed: int, layer: str, step: int, roles: tuple[str, str]):
    """A :class:`_Pair` of the 2-D ``t`` (policies ``plain`` and ``trans`` of roles[0] and roles[1]) where both are
    scaled copies, the first without an RHT and the second one :func:`fast_copy` fuses; else None (each copy
    then takes its own passes), on the ``"shared"`` and ``"paired"`` :data:`fpsim.torch.fastpath.WGRAD` paths.
    Shared: the pass that writes the RHT'd transpose takes both amax values
    (:func:`fpsim.torch.rht.rht_transposed_amaxes`).  Paired: one read takes both amax values
    (:func:`fpsim.torch.rht.rht_t_amaxes`), and with one plan one more read writes both copies
    (:func:`fpsim.torch.rht.rht_transposed_scaled_pair`)."""
    mode = fp.wgrad_path()
    if mode not in ("shared", "paired") or not (t.dim() == 2 and t.is_contiguous() and t.shape[1] > 1
                                               and t.dtype in (torch.float32, torch.bfloat16) and fp.enabled(t)):
        return None
    sp = operand_steps(plain, seed=seed, layer=layer, step=step, role=roles[0])
    st = operand_steps(trans, seed=seed, layer=layer, step=step, role=roles[1])
    if sp.rht or not st.rht or sp.scheme is None or st.scheme is None or t.shape[0] % st.rht:
        return None
    pp, pt = lower(sp.scheme), lower(st.scheme)
    if mode == "shared":
        if fp.copy_kind(pp) != "scaled":  # a plain copy without a tensor amax gains nothing
            return None
        need = fp.copy_kind(pt) == "scaled"
        stored, am_t, am_p = tb.rht_transposed_amaxes(t, st.rht, st.signs, out_dtype=torch.bfloat16, amax=need,
                                                       ignore_nan=need and pt.ignore_nan,
                                                       plain_ignore_nan=pp.ignore_nan, impl=fp.IMPL)
        return _Pair(am_p, am_t, stored=stored)
    if (fp.copy_kind(pp) != "scaled" or fp.copy_kind(pt) != "scaled" or not tb.scaled_fusable(pt, st.rht)
            or (OBSERVERS and (pt.ignore_nan or pp.ignore_nan))):
        return None
    am_p, am_t = tb.rht_t_amaxes(t, st.rht, st.signs, ignore_nan=pt.ignore_nan, plain_ignore_nan=pp.ignore_nan)
    if pp != pt:
        return _Pair(am_p, am_t)
    s_p = _graph_key(plain, pp, sp.seed, seed=seed, layer=layer, step=step, role=roles[0])
    s_t = _graph_key(trans, pt, st.seed, seed=seed, layer=layer, step=step, role=roles[1])
    vp, vt = tb.rht_transposed_scaled_pair(t, pp, st.rht, st.signs, amax=am_t, plain_amax=am_p, seed=s_t,
                                           plain_seed=s_p)
    num = float(pp.two_level.num)
    pair = _Pair(am_p, am_t, fp.Copy(vp, "scaled", am_p, num, pp), fp.Copy(vt, "scaled", am_t, num, pt))
    _note(layer, roles[0], step, None, pair.plain)  # NaN-propagating amax values (an ignore-NaN copy: above)
    _note(layer, roles[1], step, None, pair.trans)
    return pair


def _graph_key(policy, plan, sr, *, seed: int, layer: str, step: int, role: str):
    """The SR seed of a fast-path copy: ``sr`` itself, or under CUDA-graph capture the device words the kernels
    read from the key table (:mod:`fpsim.torch.graphs`); a copy a graph cannot follow is one clear error."""
    keys = graphs.active()
    if keys is None:
        return sr
    if policy.rht and policy.rht_signs == "per_call":
        raise ValueError(f"layer {layer!r}, copy {role}: per-call RHT signs change every step, which a CUDA "
                         f"graph cannot follow; use per-layer or fixed signs, or run without graphs")
    if sr is None:
        return None
    if fp.copy_kind(plan) not in ("scaled", "exact"):
        raise ValueError(f"layer {layer!r}, copy {role}: stochastic rounding of {plan.element.name} "
                         f"({plan.kind.value} scaling) runs outside the fused kernels, which a CUDA graph "
                         f"cannot re-key; run without graphs")
    return keys.key(layer, role, seed, step)


def reuse_fprop_w(rec: Recipe) -> bool:
    """Whether Dgrad's Wᵀ copy is exactly the transpose of Fprop's W copy: the same policy under RNE without RHT,
    and either an elementwise cast or square tiles without four-over-six (whose tile error sums run in a
    layout-dependent order)."""
    a, b = rec.fprop_w, rec.dgrad_w
    if a != b or a.rht or rec.dgrad_w_from_fprop:
        return False
    sch = a.resolved()
    if sch is None or sch.rounding.value != "rne":
        return False
    return sch.kind.value == "cast" or (sch.block is not None and sch.block[0] == sch.block[1] > 1
                                        and not sch.four_over_six)


class _Ops(NamedTuple):
    """One GEMM path: how a copy is made, how two copies are multiplied (``(a, b, out_dtype)``), what a copy's
    float32 values are, how the Fprop copy of W becomes Dgrad's (None: Dgrad quantizes Wᵀ itself), and how two
    copies of one tensor share its read for their amax values (None: each copy takes its own)."""

    copy: Callable
    mm: Callable
    values: Callable
    transposed: Callable | None
    pair: Callable | None = None


def reference_ops(gemm: str, accumulator: str = "fp32") -> _Ops:
    return _Ops(_copy, lambda a, b, dt: _mm(a, b, gemm, accumulator).to(dt), _values, None)


def host_copy(t: torch.Tensor, policy, *, seed: int, layer: str, step: int, role: str) -> torch.Tensor:
    """:func:`_copy` by the Numba backend on the host (the same steps, bit-identical copies), as the float32 tensor
    of the copy's values on ``t``'s device."""
    from ..dispatch import dequantize
    from ..recipe import quantize_operand

    x = t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    q = quantize_operand(x, policy, seed=seed, layer=layer, step=step, role=role)
    v = q if isinstance(q, np.ndarray) else dequantize(q)
    return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(t.device)


#: ``gemm="host"``: copies by the Numba backend, products of their float32 values by torch's matmul (FP32 sums in
#: the library's order): the fast path on the CPU, where the torch backend's codecs run as eager torch ops.
HOST = _Ops(host_copy, lambda a, b, dt: (a @ b.T).to(dt), _values, None)

FAST = _Ops(fast_copy, fp.mm, fp.values, fp.transposed, _fast_pair)


def _pair_copy(pair, side: str, ops: _Ops, t, policy, role: str, kw: dict):
    """The ``side`` ("plain" or "trans") copy of a :class:`_Pair`, or the copy made with the pair's amax, or
    without a pair the copy made on its own."""
    c = None if pair is None else getattr(pair, side)
    if c is not None:
        return c
    extra = {} if pair is None else {"amax": getattr(pair, "amax_" + side)}
    if pair is not None and side == "trans" and pair.stored is not None:
        extra["stored"] = pair.stored
    return ops.copy(t, policy, role=role, **kw, **extra)


class QLinearFn(torch.autograd.Function):
    """The three GEMMs of SPEC §8 with their six copies on one path (:class:`_Ops`); saves W and the high-precision
    X for backward (or, where the fast path wrote Wgrad's copy of X or its RHT'd transpose beside Fprop's copy,
    that instead), and the Fprop copy of W where it is Dgrad's (transposed) or its source."""

    @staticmethod
    def forward(ctx, x, weight, cfg):
        rec, seed, name, stp, ops, out_dtype = cfg
        kw = {"seed": seed, "layer": name, "step": stp}
        x2d = x.reshape(-1, x.shape[-1])
        qw = ops.copy(weight, rec.fprop_w, role="fprop_w", **kw)
        # Fprop's X copy and Wgrad's RHT'd Xᵀ (or their amax values) from shared reads; Wgrad's is kept for
        # backward, which then needs X itself no more
        pair = ops.pair(x2d, rec.fprop_x, rec.wgrad_x, roles=("fprop_x", "wgrad_x"), **kw) \
            if ops.pair is not None and ctx.needs_input_grad[1] else None
        y = ops.mm(_pair_copy(pair, "plain", ops, x2d, rec.fprop_x, "fprop_x", kw), qw, out_dtype)
        ctx.wgrad_x = None if pair is None else pair._replace(plain=None)  # Fprop's copy is not backward's
        ctx.x_dtype = x2d.dtype
        ctx.save_for_backward(None if pair is not None and (pair.trans is not None or pair.stored is not None)
                              else x2d, weight)
        ctx.cfg = cfg
        ctx.qw = ops.transposed(qw) if ops.transposed is not None and reuse_fprop_w(rec) else None
        ctx.w_fprop = ops.values(qw) if rec.dgrad_w_from_fprop else None
        ctx.x_shape = x.shape
        # the output in the input's leading shape, made inside the Function so that it is not a view of an
        # intermediate (FSDP warns about module outputs that are views, as in-place ops on them skip its hooks)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2d, weight = ctx.saved_tensors
        rec, seed, name, stp, ops, _ = ctx.cfg
        dy = dy.reshape(-1, dy.shape[-1])
        kw = {"seed": seed, "layer": name, "step": stp}
        dx = dw = None
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        pair = ops.pair(dy, rec.dgrad_dy, rec.wgrad_dy, roles=("dgrad_dy", "wgrad_dy"), **kw) \
            if ops.pair is not None and need_dx and need_dw else None
        if need_dx:
            qwt = ctx.qw
            if qwt is None:
                w = ctx.w_fprop if ctx.w_fprop is not None else weight
                qwt = ops.copy(w.t(), rec.dgrad_w, role="dgrad_w", **kw)
            dx = ops.mm(_pair_copy(pair, "plain", ops, dy, rec.dgrad_dy, "dgrad_dy", kw), qwt,
                        ctx.x_dtype).reshape(ctx.x_shape)
        if need_dw:
            dw = ops.mm(_pair_copy(pair, "trans", ops, dy.t(), rec.wgrad_dy, "wgrad_dy", kw),
                        _pair_copy(ctx.wgrad_x, "trans", ops, None if x2d is None else x2d.t(), rec.wgrad_x,
                                   "wgrad_x", kw), weight.dtype)
        if torch.is_grad_enabled():  # create_graph: a later backward through dx / dW is refused, not dropped
            dx, dw = (g if g is None else _Once.apply(g, name, *(t for t in (dy, weight, x2d) if t is not None))
                      for g in (dx, dw))
        return dx, dw, None


class _Once(torch.autograd.Function):
    """A gradient made under ``create_graph``: its GEMMs ran outside autograd, so its backward is an error."""

    @staticmethod
    def forward(ctx, g, name, *anchors):  # anchors: what g depends on, so that it requires grad where they do
        ctx.name = name
        return g.clone()

    @staticmethod
    def backward(ctx, *_):
        raise TypeError(f"layer {ctx.name!r}: fpsim.torch.Linear's gradients can be differentiated once only "
                        f"(no double backward, gradient penalty or Hessian through the layer)")


def recording(step: int) -> bool:
    """Whether an observer records this step (it then needs the full copies with codes and scales)."""
    return any(getattr(ob, "due", lambda s: True)(step) for ob in OBSERVERS)
