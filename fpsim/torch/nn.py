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
each use its own stream.  So do layers of one name: :func:`convert` names every layer (one converted before too)
by its module path, and where two layers built with the default ``name=""`` and one seed draw SR bits or seeded
RHT signs, the first call that shows it warns (once per process) naming the remedy.

Parameters stay ordinary ``nn.Parameter``; the layer computes in float32 from inputs of any float dtype and
any leading shape (batch × seq × features; the token count a multiple of the Wgrad RHT size where a Wgrad
runs) and returns the input's dtype (the autocast dtype where autocast is on), so optimizers, clipping, DDP and
FSDP see a plain linear layer.  It is differentiable once (a double backward through it is refused) and
refuses torch.func transforms.

``torch.compile``: in a compiled model each fpsim layer with a recipe runs eagerly, as above, behind a graph break
(its copies, Philox streams and host GEMMs are no graph code: ``forward`` hands itself to a
``torch.compiler.disable``'d call when ``torch.compiler.is_compiling()``, the eager path's only cost), and
everything between the layers compiles (embeddings, norms, activations, residuals, the head, the loss), with any
backend and mode; a new step compiles nothing anew.  The outputs and gradients are the uncompiled model's bit for
bit wherever the compiled parts keep ATen's arithmetic (the ``eager`` and ``aot_eager`` backends always;
inductor where it does not reorder a reduction, as it does in LayerNorm's backward).  ``fullgraph=True`` admits
no graph break and stops with one error saying so.  Capturing a whole step as a CUDA graph is
:mod:`fpsim.torch.graphs`, apart from this.
"""

from __future__ import annotations

import fnmatch
import logging
import operator
import re
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from ..recipe import ROLES, LayerPolicy, Recipe, get_recipe
from . import fastpath as fp
from . import graphs
from .qlinear import FAST, HOST, OBSERVERS, QLinearFn, recording, reference_ops
from .qlinear import fast_copy as _fast_copy  # noqa: F401  (kept under its old name: tests and studies use it)
from .qlinear import reuse_fprop_w as _reuse_fprop_w  # noqa: F401

__all__ = ["Linear", "Slot", "assignment", "convert", "set_recipe", "step", "set_step", "step_with", "summary", "GEMMS"]

log = logging.getLogger("fpsim.torch")

#: GEMM paths: ``"fp32"`` the bit-defined accumulator model of docs/spec.md §8, ``"blas"`` the fast one, ``"host"``
#: the fast one on the CPU (copies by the Numba backend, FP32 products by torch's matmul of their values).
GEMMS = ("fp32", "blas", "host")

#: Module names kept unquantized by :func:`convert` unless ``keep_bf16`` says otherwise (§8: the LM head and
#: embeddings are never quantized).
HEAD_PATTERNS = ("lm_head", "*.lm_head", "output", "*.output", "head", "*.head", "classifier", "*.classifier",
                 "*embed*")




class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose GEMMs run under an emulated recipe (same parameters, same ``state_dict``).

    ``in_features``, ``out_features``, ``bias``, ``device``, ``dtype``: as ``torch.nn.Linear``.  ``recipe``: a
    preset name of :data:`fpsim.RECIPES`, a :class:`~fpsim.Recipe` (e.g. ``get_recipe("nvfp4_paper")
    .without("sr")``), or ``None`` for the plain high-precision layer.  ``name``: the layer's name in the seed
    derivation (:func:`convert` sets the module path; layers of one name draw the same bits, and two unnamed
    ones that draw random bits are warned of).  ``seed``: the run
    seed of stochastic rounding and seeded RHT signs.  ``gemm``: ``"fp32"`` (bit-defined, equal to
    :func:`fpsim.linear`), ``"blas"`` (fast; see the module docstring) or ``"host"`` (fast on the CPU: the same
    copies made by the Numba backend, FP32 products by torch's matmul; a monitor's steps take the ``"blas"`` path).
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
        if torch.compiler.is_compiling():  # under torch.compile: a graph break, the layer runs eagerly
            return _run_eagerly(self, x)
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
        if self.gemm in ("blas", "host") and acc not in ("fp32", "blas"):
            # the fast path's sums are FP32 in the hardware's order; running it would silently drop the model
            raise ValueError(f"layer {self.name or '<unnamed>'}: recipe {self.recipe.name} asks for the {acc!r} "
                             f"accumulator, which gemm='fp32' runs (gemm={self.gemm!r} accumulates in FP32)")
        if not self.name and not _unnamed_warned:
            _note_unnamed(self, torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        with torch.autocast(dev, enabled=False):
            if self.gemm == "blas" and fp.enabled(x2d) and not (OBSERVERS and recording(self.step)):
                # The GEMM writes the output dtype itself unless a bias is added in float32 first.
                ops, ydt = FAST, torch.float32 if self.bias is not None else out_dtype
            elif self.gemm == "host" and not OBSERVERS and graphs.active() is None:
                ops, ydt = HOST, torch.float32
            else:
                if graphs.active() is not None:
                    raise ValueError(f"layer {self.name or '<unnamed>'}: CUDA graphs (fpsim.torch.GraphKeys) need "
                                     f"the fused path: gemm='blas' on CUDA and no observer recording this step")
                ops, ydt = reference_ops("blas" if self.gemm == "host" else self.gemm, acc), torch.float32
            y = QLinearFn.apply(x, self.weight, (self.recipe, self.seed, self.name, self.step, ops, ydt))
            if self.bias is not None:
                y = y + self.bias.to(torch.float32)
        return y.to(out_dtype)


#: Per run seed, the unnamed layer seen first drawing name-derived random bits; a second one is warned of, once.
_UNNAMED: dict[int, weakref.ref] = {}
_unnamed_warned = False


def _random_roles(rec: Recipe, grad: bool) -> tuple[list[str], list[str]]:
    """The roles of a call (the forward's two, with ``grad`` all six) whose random bits derive from the layer's
    name: those with stochastic rounding, and those with per-layer / per-call seeded RHT signs."""
    sr, signs = [], []
    for role in ROLES if grad else ROLES[:2]:
        pol = rec.policy(role)
        sch = pol.resolved()
        if sch is not None and sch.rounding.value == "sr":
            sr.append(role)
        if pol.rht and pol.rht_signs in ("per_layer", "per_call"):
            signs.append(role)
    return sr, signs


def _note_unnamed(layer: Linear, grad: bool) -> None:
    """Warn (once per process) when a second unnamed layer of one run seed draws name-derived random bits: the
    two draw the same SR bits and RHT signs, so their rounding errors are correlated."""
    global _unnamed_warned
    sr, signs = _random_roles(layer.recipe, grad)
    if not (sr or signs):
        return
    ref = _UNNAMED.get(layer.seed)
    first = None if ref is None else ref()
    if first is None or first.name or first.recipe is None:  # none alive, or it has been named since
        _UNNAMED[layer.seed] = weakref.ref(layer)
        return
    if first is layer:
        return
    _unnamed_warned = True
    what = " and ".join(f"{kind} ({', '.join(roles)})" for kind, roles in
                        (("stochastic-rounding bits", sr), ("seeded RHT signs", signs)) if roles)
    warnings.warn(f"fpsim.torch.Linear: two or more layers have no name (name='') and seed {layer.seed}, so they "
                  f"draw the same {what} and their rounding errors are correlated; give each layer its own name= "
                  f"(its module path, say), or run fpsim.torch.convert(model, recipe), which names every fpsim "
                  f"layer by its module path (and sets its recipe). Warned once per process", UserWarning,
                  stacklevel=3)


def _eager_forward(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    return layer.forward(x)


#: What a compiled model calls for an fpsim layer: the layer's forward run eagerly, outside the graph (its copies,
#: Philox streams and host GEMMs are no graph code), with the graph broken before and after it.
_run_eagerly = torch.compiler.disable(_eager_forward, reason=(
    "fpsim.torch.Linear runs eagerly between the compiled parts of a model (a graph break around each layer); "
    "torch.compile(fullgraph=True) allows no graph break: compile without fullgraph=True"))


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


class Slot(NamedTuple):
    """One place of a model that :func:`convert` fills: the module path ``name``, the ``module`` found there (an
    ``nn.Linear``, maybe already an fpsim :class:`Linear`), the ``parent`` module and its attribute ``attr`` that
    hold it, and the ``recipe`` convert gives it (the ``"bf16"`` recipe for a layer kept in BF16)."""

    name: str
    module: torch.nn.Linear
    parent: torch.nn.Module
    attr: str
    recipe: Recipe


def assignment(model: torch.nn.Module, recipe: str | Recipe = "nvfp4_paper", *,
               keep_bf16: LayerPolicy | str | Iterable[str] | Callable | None = None,
               skip: Iterable[str] = HEAD_PATTERNS) -> list[Slot]:
    """What :func:`convert` would do to ``model`` with these arguments, without doing it: a :class:`Slot` per place
    it fills, in module order (a module held in several places has a slot for each, the recipe of its first).
    The arguments are :func:`convert`'s; an unswappable layer is refused here as there."""
    rec = get_recipe(recipe)
    if isinstance(model, torch.nn.Linear):
        raise TypeError("convert swaps the nn.Linear modules inside a model and cannot replace the model itself; "
                        "use fpsim.torch.Linear.from_linear(layer, recipe=...)")
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
    first: dict[int, Recipe] = {}
    slots = []
    for name, child, parent, attr in found:
        if id(child) not in first:
            first[id(child)] = bf16 if keep(name, child, rank.get(_block_index(name)), len(blocks)) else rec
        slots.append(Slot(name, child, parent, attr, first[id(child)]))
    return slots


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
    The assignment (:func:`assignment` tells it beforehand) is logged on the ``fpsim.torch`` logger and returned
    by :func:`summary`.
    """
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    made: dict[int, Linear] = {}  # one fpsim layer per nn.Linear however many places hold it (named by the first)
    for name, child, parent, attr, rec in assignment(model, recipe, keep_bf16=keep_bf16, skip=skip):
        new = made.get(id(child))
        if new is None:
            kw = {"recipe": rec, "name": name, "seed": seed, "gemm": gemm}
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
