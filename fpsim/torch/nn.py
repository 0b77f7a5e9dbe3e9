"""Training a PyTorch model under an emulated recipe (docs/spec.md §8): a drop-in ``nn.Linear`` and ``convert``.

:class:`Linear` computes ``Y = X·Wᵀ (+ b)`` with the recipe's six operand copies, each quantized from the
high-precision tensor with its own amax (the Wgrad copies after their RHT), exactly as
:func:`fpsim.linear` does: with ``gemm="fp32"`` a layer named ``L`` at step ``s`` with seed ``k`` returns the
``y``, ``dx`` and ``dW`` of ``fpsim.linear(x, w, dy, recipe, seed=k, layer="L", step=s)`` bit for bit, under
the recipe's accumulator model (``"exact"``'s float64 rounded to float32 once; ``gemm="blas"`` refuses a
non-FP32 accumulator).
``gemm="blas"`` keeps every quantized copy bit-identical and only changes the GEMMs' summation order (NVFP4
through exact BF16 copies of e·s_b on BF16 tensor cores with FP32 accumulation, per-tensor FP8 through FP8
tensor cores on Hopper; elsewhere an FP32 GEMM of the exact dequantized values).

Determinism: stochastic-rounding bits and per-call RHT signs derive from (seed, layer name, step, role) as in
:func:`fpsim.recipe.operand_steps`.  The step is the layer's ``step`` attribute; :func:`step` advances every
fpsim layer of a model (call it once per optimizer step, or let :func:`step_with` hook it to an optimizer).
It is not in the ``state_dict`` (which stays ``nn.Linear``'s): after resuming, :func:`set_step` restores it.
A layer called more than once in a step (one module reused, weight sharing, and every micro-batch of gradient
accumulation when the step advances per optimizer step) draws the same bits and signs on every call of that
step, so the stochastic roundings of those calls are not independent; a module per use (its own name) gives
each use its own stream.

Parameters stay ordinary ``nn.Parameter``; the layer computes in float32 from inputs of any float dtype and
any leading shape (batch × seq × features; the token count a multiple of the Wgrad RHT size where a Wgrad
runs) and returns the input's dtype (the autocast dtype where autocast is on), so optimizers, clipping, DDP and
FSDP see a plain linear layer.  It is differentiable once (a double backward through it is refused) and
refuses torch.func transforms.
"""

from __future__ import annotations

import fnmatch
import logging
import operator
import re
import warnings
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from ..plan import lower
from ..recipe import ROLES, LayerPolicy, Recipe, get_recipe, operand_steps
from . import backend as tb
from . import fastpath as fp
from . import graphs

__all__ = ["Linear", "convert", "set_recipe", "step", "set_step", "step_with", "summary", "GEMMS"]

log = logging.getLogger("fpsim.torch")

#: GEMM paths: ``"fp32"`` the bit-defined accumulator model of docs/spec.md §8, ``"blas"`` the fast one.
GEMMS = ("fp32", "blas")

#: Module names kept unquantized by :func:`convert` unless ``keep_bf16`` says otherwise (§8: the LM head and
#: embeddings are never quantized).
HEAD_PATTERNS = ("lm_head", "*.lm_head", "output", "*.output", "head", "*.head", "classifier", "*.classifier",
                 "*embed*")


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


def _fast_copy(t: torch.Tensor | None, policy, *, seed: int, layer: str, step: int, role: str, amax=None,
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
    shared (``plain``/``trans`` None: each copy is made by :func:`_fast_copy` with its amax)."""

    amax_plain: object
    amax_trans: object
    plain: fp.Copy | None = None
    trans: fp.Copy | None = None
    stored: torch.Tensor | None = None  # "shared": the RHT'd transpose, written with both amax values


def _fast_pair(t: torch.Tensor, plain, trans, *, seed: int, layer: str, step: int, roles: tuple[str, str]):
    """A :class:`_Pair` of the 2-D ``t`` (policies ``plain`` and ``trans`` of roles[0] and roles[1]) where both are
    scaled copies, the first without an RHT and the second one :func:`_fast_copy` fuses; else None (each copy
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


def _reuse_fprop_w(rec: Recipe) -> bool:
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


def _reference_ops(gemm: str, accumulator: str = "fp32") -> _Ops:
    return _Ops(_copy, lambda a, b, dt: _mm(a, b, gemm, accumulator).to(dt), _values, None)


_FAST = _Ops(_fast_copy, fp.mm, fp.values, fp.transposed, _fast_pair)


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


class _QLinearFn(torch.autograd.Function):
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
        ctx.qw = ops.transposed(qw) if ops.transposed is not None and _reuse_fprop_w(rec) else None
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


def _recording(step: int) -> bool:
    """Whether an observer records this step (it then needs the full copies with codes and scales)."""
    return any(getattr(ob, "due", lambda s: True)(step) for ob in OBSERVERS)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose GEMMs run under an emulated recipe (same parameters, same ``state_dict``).

    ``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``: as ``torch.nn.Linear``.  ``recipe``: a
    preset name of :data:`fpsim.RECIPES`, a :class:`~fpsim.Recipe` (e.g. ``get_recipe("nvfp4_paper")
    .without("sr")``), or ``None`` for the plain high-precision layer.  ``name``: the layer's name in the seed
    derivation (:func:`convert` sets the module path; layers of one name draw the same bits).  ``seed``: the run
    seed of stochastic rounding and seeded RHT signs.  ``gemm``: ``"fp32"`` (bit-defined, equal to
    :func:`fpsim.linear`) or ``"blas"`` (fast; see the module docstring).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str | Recipe | None =
                 "nvfp4_paper", name: str = "", seed: int = 0, gemm: str = "blas", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        self.recipe = None if recipe is None else get_recipe(recipe)
        self.name, self.seed, self.gemm, self.step = str(name), int(seed), gemm, 0

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, **kwargs) -> Linear:
        """A fpsim :class:`Linear` sharing ``module``'s parameters (no copy), with ``kwargs`` as in the constructor."""
        new = cls(module.in_features, module.out_features, module.bias is not None, device="meta", **kwargs)
        new.weight = module.weight
        new.bias = module.bias
        return new

    FPSIM_LAYER = True  # what fpsim.torch.graphs.GraphKeys looks for

    def extra_repr(self) -> str:
        rec = "none" if self.recipe is None else self.recipe.name
        return f"{super().extra_repr()}, recipe={rec}, name={self.name!r}, gemm={self.gemm}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe is None:
            return super().forward(x)
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        if not x.is_floating_point():
            raise TypeError(f"{self.name or 'Linear'}: input must be a float tensor, got {x.dtype}")
        if torch._C._are_functorch_transforms_active():
            raise TypeError(f"layer {self.name!r}: torch.func transforms (grad, vmap, jacrev, ...) cannot run "
                            f"fpsim.torch.Linear; use torch.autograd (loss.backward, torch.autograd.grad)")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"layer {self.name or '<unnamed>'}: input {tuple(x.shape)} has {x.shape[-1]} features "
                             f"in its last dimension, the layer takes {self.in_features}")
        x2d = x.reshape(-1, x.shape[-1])
        d = max(self.recipe.wgrad_dy.rht, self.recipe.wgrad_x.rht)  # Wgrad's RHT along tokens, where a Wgrad runs
        if d and x2d.shape[0] % d and torch.is_grad_enabled() and self.weight.requires_grad:
            raise ValueError(
                f"layer {self.name or '<unnamed>'}: {x2d.shape[0]} tokens (all leading dimensions of the input "
                f"{tuple(x.shape)}) is not a multiple of the Wgrad RHT size {d} of recipe {self.recipe.name}; "
                f"pad the token dimension to a multiple of {d}, or keep this layer in BF16")
        # A custom recipe's Fprop / Dgrad RHT along the features: refused here, not in backward after the forward
        for role in ROLES[:4]:
            r, what = self.recipe.policy(role).rht, ("in" if role.startswith("fprop") else "out")
            k = self.in_features if what == "in" else self.out_features
            if r and k % r:
                raise ValueError(f"layer {self.name or '<unnamed>'}: {role} rotates along the {k} {what}_features, "
                                 f"not a multiple of its Hadamard size {r} (recipe {self.recipe.name})")
        acc = self.recipe.accumulator
        if self.gemm == "blas" and acc not in ("fp32", "blas"):
            # the fast path's sums are FP32 in the hardware's order; running it would silently drop the model
            raise ValueError(f"layer {self.name or '<unnamed>'}: recipe {self.recipe.name} asks for the {acc!r} "
                             f"accumulator, which gemm='fp32' runs (gemm='blas' accumulates in FP32)")
        with torch.autocast(dev, enabled=False):
            if self.gemm == "blas" and fp.enabled(x2d) and not (OBSERVERS and _recording(self.step)):
                # The GEMM writes the output dtype itself unless a bias is added in float32 first.
                ops, ydt = _FAST, torch.float32 if self.bias is not None else out_dtype
            else:
                if graphs.active() is not None:
                    raise ValueError(f"layer {self.name or '<unnamed>'}: CUDA graphs (fpsim.torch.GraphKeys) need "
                                     f"the fused path: gemm='blas' on CUDA and no observer recording this step")
                ops, ydt = _reference_ops(self.gemm, acc), torch.float32
            y = _QLinearFn.apply(x, self.weight, (self.recipe, self.seed, self.name, self.step, ops, ydt))
            if self.bias is not None:
                y = y + self.bias.to(torch.float32)
        return y.to(out_dtype)


def _block_index(name: str) -> int | None:
    """The transformer block a module belongs to: the first integer component of its dotted name."""
    m = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(m.group(1)) if m else None


def _keep_rule(keep_bf16, rec: Recipe, names: list[str]) -> Callable[[str, torch.nn.Module, int | None, int], bool]:
    """Whether a layer stays BF16; warns of names or patterns that match none of ``names`` (a typo, say)."""
    if keep_bf16 is None:
        keep_bf16 = rec.layers
    if isinstance(keep_bf16, LayerPolicy):
        pol = keep_bf16
        _unmatched([p for p in pol.names if p not in names])

        def by_block(name, mod, b, n):
            # a named layer stays BF16 inside or outside the blocks (high_precision needs a block index)
            return name in pol.names or (b is not None and n > 0 and pol.high_precision(b, n, name))

        return by_block
    if callable(keep_bf16):
        return lambda name, mod, b, n: bool(keep_bf16(name, mod))
    pats = (keep_bf16,) if isinstance(keep_bf16, str) else tuple(keep_bf16)
    _unmatched([p for p in pats if not any(fnmatch.fnmatchcase(n, p) for n in names)])
    return lambda name, mod, b, n: any(fnmatch.fnmatchcase(name, p) for p in pats)


def _unmatched(miss: list[str]) -> None:
    if miss:
        warnings.warn(f"convert: keep_bf16 {', '.join(map(repr, miss))} match no nn.Linear of the model, so no "
                      f"layer is kept in BF16 by them", stacklevel=4)


def _named_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, torch.nn.Module, str]]:
    out = []
    for parent_name, parent in model.named_modules():
        # _modules, not named_children() (which skips a module seen before): a Linear held twice is swapped twice
        for child_name, child in parent._modules.items():
            if isinstance(child, torch.nn.Linear):
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                out.append((full, child, parent, child_name))
    return out


def _check_swappable(name: str, child: torch.nn.Linear) -> None:
    """Refuse an ``nn.Linear`` whose weight or forward :func:`convert` would not carry over."""
    if not isinstance(child._parameters.get("weight"), torch.nn.Parameter) or hasattr(child, "parametrizations"):
        raise TypeError(f"layer {name!r}: its weight is parametrized (parametrize, weight_norm), which convert "
                        f"cannot carry over; remove the parametrization first or leave the layer out: skip=[{name!r}]")
    if "forward" in vars(child) or type(child).forward is not torch.nn.Linear.forward:
        raise TypeError(f"layer {name!r}: {type(child).__name__} has its own forward, which fpsim.torch.Linear "
                        f"would replace; leave the layer out with skip=[{name!r}]")


def convert(model: torch.nn.Module, recipe: str | Recipe = "nvfp4_paper", *,
            keep_bf16: LayerPolicy | str | Iterable[str] | Callable | None = None,
            skip: Iterable[str] = HEAD_PATTERNS, seed: int = 0, gemm: str = "blas") -> torch.nn.Module:
    """Replace the ``nn.Linear`` modules of ``model`` in place by fpsim :class:`Linear` layers; returns ``model``.

    ``skip`` (glob patterns on module names; default: LM-head- and embedding-like names) stay untouched
    ``nn.Linear``.  Of the rest, the layers ``keep_bf16`` selects run the ``"bf16"`` recipe (BF16 copies, FP32
    accumulation) and all others ``recipe``.  ``keep_bf16``: ``None`` = the recipe's own layer policy (the
    paper's first-2 / last-8 blocks, counted over the model's blocks = the first integer in a module's
    name), a :class:`~fpsim.recipe.LayerPolicy`, glob patterns, or a callable ``(name, module) -> bool``.
    So do a Linear tied to an ``nn.Embedding``'s weight (an LM head of any name) and ``nn.MultiheadAttention``'s
    ``out_proj`` (run as ``F.linear`` on its weight, never called).  A converted layer keeps the module's hooks;
    a subclass's or instance's own ``forward`` or a parametrized weight (``weight_norm``) is refused (TypeError).
    The assignment is logged on the ``fpsim.torch`` logger and returned by :func:`summary`.
    """
    rec = get_recipe(recipe)
    if isinstance(model, torch.nn.Linear):
        raise TypeError("convert swaps the nn.Linear modules inside a model and cannot replace the model itself; "
                        "use fpsim.torch.Linear.from_linear(layer, recipe=...)")
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    every, skip = _named_linears(model), tuple(skip)
    found = [t for t in every if not any(fnmatch.fnmatchcase(t[0], p) for p in skip)
             and id(t[1]._parameters.get("weight")) not in tied and not isinstance(t[2], torch.nn.MultiheadAttention)]
    for name, child, *_ in (t for t in found if not isinstance(t[1], Linear)):
        _check_swappable(name, child)
    blocks = sorted({b for b in (_block_index(n) for n, *_ in found) if b is not None})
    rank = {b: i for i, b in enumerate(blocks)}
    keep = _keep_rule(keep_bf16, rec, [n for n, *_ in every])
    bf16 = get_recipe("bf16")
    made: dict[int, Linear] = {}  # one fpsim layer per nn.Linear however many places hold it (named by the first)
    for name, child, parent, attr in found:
        new = made.get(id(child))
        if new is None:
            b = _block_index(name)
            hp = keep(name, child, rank.get(b), len(blocks))
            kw = {"recipe": bf16 if hp else rec, "name": name, "seed": seed, "gemm": gemm}
            new = child if isinstance(child, Linear) else Linear.from_linear(child, **kw)
            if isinstance(child, Linear):
                new.recipe, new.name, new.seed, new.gemm = kw["recipe"], name, seed, gemm
            else:  # the hook dicts themselves, so that the handles the user holds still remove them
                new.__dict__.update({k: v for k, v in vars(child).items() if "hook" in k})
            made[id(child)] = new
        setattr(parent, attr, new)
    for row in summary(model):
        log.info("%s: %s (gemm=%s)", *row)
    return model


def _layers(model: torch.nn.Module) -> list[tuple[str, Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]


def summary(model: torch.nn.Module) -> list[tuple[str, str, str]]:
    """``(layer name, recipe name or "none", gemm)`` for every fpsim layer, in module order."""
    return [(m.name or n, "none" if m.recipe is None else m.recipe.name, m.gemm) for n, m in _layers(model)]


def set_recipe(model: torch.nn.Module, recipe: str | Recipe | None, layers: str | Iterable[str] = "*") -> int:
    """Switch the fpsim layers whose names match ``layers`` (glob patterns) to ``recipe``; returns their count
    (the paper switches to BF16 for the final part of training: ``set_recipe(model, "bf16")``)."""
    pats = (layers,) if isinstance(layers, str) else tuple(layers)
    new = None if recipe is None else get_recipe(recipe)
    hit = [m for name, m in _layers(model) if any(fnmatch.fnmatchcase(m.name or name, p) for p in pats)]
    for m in hit:
        m.recipe = new
    return len(hit)


def step(model: torch.nn.Module, n: int = 1) -> int:
    """Advance the step of every fpsim layer by ``n`` ≥ 0 (once per optimizer step); returns the new step.
    (A step picks the SR bits and RHT signs: rewinding goes through :func:`set_step`, which refuses < 0.)"""
    n = _integer(n)
    if n < 0:
        raise ValueError(f"step advances by n >= 0, got {n}; use set_step(model, value) to rewind")
    last = 0
    for _, m in _layers(model):
        m.step += n
        last = m.step
    return last


def set_step(model: torch.nn.Module, value: int) -> None:
    """Set the step of every fpsim layer (after loading a checkpoint)."""
    value = _integer(value)
    if value < 0:
        raise ValueError(f"step must be non-negative, got {value}")
    for _, m in _layers(model):
        m.step = value


def _integer(value) -> int:
    """A step as an int: an integer of any kind (Python, NumPy, a one-element integer tensor), not a bool."""
    try:
        return int(operator.index(None if isinstance(value, bool) else value))
    except TypeError:
        raise TypeError(f"a step must be an integer, got {value!r}") from None


def step_with(optimizer: torch.optim.Optimizer, model: torch.nn.Module):
    """Advance the model's fpsim steps after every ``optimizer.step()``; returns the hook handle."""
    return optimizer.register_step_post_hook(lambda *_: step(model))
