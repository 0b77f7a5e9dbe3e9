"""Gradient-level probes: what each component of a recipe does to each GEMM of each layer of a real model.

``fpsim.torch.probe(model, batches, "nvfp4_paper")`` runs the model's FP32 forward and backward on each batch (the
reference), then the same batch under each *variant* (BF16, the recipe, the recipe without each of its components,
four-over-six, the recipe without its tensor scale, an A/A copy of the recipe with other random draws, and any
variant of yours), and measures, for every linear layer and each of its three GEMMs (docs/spec.md §8: Fprop
``y = x·Wᵀ``, Dgrad ``dx = dy·W``, Wgrad ``dW = dyᵀ·x``), how far the variant's result ``q`` lies from the
reference ``g``.  Two modes:

* **isolated**: the layer's captured FP32 operands (x, W, dy) through the variant's three GEMMs, everything else
  exact; the reference is the float64 product of the same operands.  Attribution: the error is this GEMM's own.
* **end_to_end**: the whole model under the variant; ``y``, ``dx`` and ``dW`` are what each layer computes there
  (every earlier layer's error included, Dgrad's flowing back into earlier layers), against the FP32 model's.

Metrics (per batch, layer, GEMM, variant and mode; ``draws`` random draws of the variant's stochastic-rounding
bits and seeded RHT signs, one for a variant without random bits; norms are Frobenius over the whole tensor):

==============  ==================================================================================================
rel_err         mean over draws of ‖q − g‖ / ‖g‖
cos             mean over draws of ⟨q, g⟩ / (‖q‖·‖g‖)
gain            mean over draws of ⟨q, g⟩ / ‖g‖² (1 when the GEMM keeps the result's scale; a shrinkage, such as a
                clamp at a block's maximum or gradients rounded to zero, shows as gain < 1)
bias            the error the draws share: √max(0, ‖ē‖² − s²/D) / ‖g‖ with ē the mean error over the D draws and s²
                the draws' unbiased variance Σ‖e_d − ē‖²/(D−1) (so the draws' own noise is not counted as bias);
                one draw (a deterministic variant): ‖e‖/‖g‖, the whole error
bias_se         the jackknife standard error of ``bias`` over the draws (0 for a deterministic variant: exact)
noise           √s² / ‖g‖, the error of one draw around the draws' mean (0 for a deterministic variant)
bias_to_noise   bias / noise; null for a deterministic variant (no noise)
==============  ==================================================================================================

Model level (``val_batches`` given): the held-out loss's first-order decrease after one optimizer step with the
variant's gradients, ``progress = ⟨∇L_val, u(q)⟩`` summed over every parameter the model trains (per batch, the mean
over draws), beside the FP32 gradients' ``progress_fp32 = ⟨∇L_val, u(g)⟩``, with ``u`` the SGD step (the gradient)
or AdamW's (``m̂ / (√v̂ + ε)`` from ``adam_state``, or from a fresh state: AdamW's first step, ``g / (|g| + ε)``);
the decrease per unit learning rate is ``η·progress``.  Summaries and component effects report
``step_progress``: progress divided by the mean of ``progress_fp32`` over the batches (one constant per optimizer,
so the paired differences keep their batch-to-batch pairing and no single batch's small FP32 progress can blow a
ratio up); 1 = the FP32 steps' mean first-order progress on held-out data, 0.9 = 10 % of it lost.  Weight decay is
the same for every variant and is left out.  This is first order in the learning rate: it says what one step's
direction is worth, not where a whole run ends.

Summaries: 95 % t-intervals over batches (a batch's value: the mean over draws, for ``layer == "all"`` over the
measured layers too); component effects are paired over batches (the variants of one batch share their draws'
seeds), with two-sided t-test p-values, Holm's correction over every component row of the table, and the smallest
effect the comparison could detect at 80 % power, ``(t₀.₉₇₅ + t₀.₈)·sd/√n`` with n − 1 degrees of freedom.

As-built check: the model's own :class:`fpsim.torch.Linear` layers with a recipe (subclasses too: your kernels) run
isolated with their own code and are compared with fpsim's emulation of their recipe (independent draws); a (layer,
GEMM, metric ∈ rel_err, gain, bias) is flagged when the difference exceeds 5 % of the emulation's rel_err and its
paired t-test over batches is significant after Holm's correction over every tested row at 5 % (docs/probe.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fnmatch
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..recipe import ROLES, LayerPolicy, Recipe, get_recipe
from ..transforms import derive_seed
from . import nn
from .probe_stats import GEMM_NAMES, METRICS, TOLERANCE, components, dot, flags, row_metrics, step_direction, summary

__all__ = ["probe", "ProbeResult", "default_variants", "components_of", "draws_random_bits", "next_token_loss",
           "GEMM_NAMES", "METRICS", "TOLERANCE"]

#: Components :meth:`fpsim.Recipe.without` removes.
ABLATIONS = ("sr", "rht", "2d", "bf16_layers")


def components_of(recipe: str | Recipe) -> list[str]:
    """The components of ``recipe`` that :meth:`~fpsim.Recipe.without` can remove (those it has)."""
    r = get_recipe(recipe)
    have = []
    pols = [r.policy(role) for role in ROLES]
    if any(p.resolved() is not None and p.resolved().rounding.value == "sr" for p in pols):
        have.append("sr")
    if any(p.rht for p in pols):
        have.append("rht")
    if any(p.resolved() is not None and p.resolved().block is not None and p.resolved().block[0] > 1
           for p in (r.fprop_w, r.dgrad_w)):
        have.append("2d")
    if r.layers.first or r.layers.last or r.layers.names:
        have.append("bf16_layers")
    return have


def _two_level_e2m1(r: Recipe) -> bool:
    return any(p.resolved() is not None and p.resolved().kind.value == "two_level"
               and p.resolved().element.name == "float4_e2m1fn" for p in (r.policy(x) for x in ROLES))


@dataclass(frozen=True)
class _Variant:
    name: str
    recipe: Recipe
    stream: str  # the draws' seed stream: one for every variant (paired draws), another for the A/A copy
    compare: str | None  # the variant this one's component effect is measured against (None: none)
    sign: int = 1  # effect = sign · (metric(this) − metric(compare))
    component: str | None = None


def default_variants(recipe: str | Recipe = "nvfp4_paper") -> dict[str, Recipe]:
    """The variants :func:`probe` runs when none are given: ``"bf16"``, ``"recipe"``, ``"without <c>"`` for each
    component the recipe has, and for a two-level E2M1 recipe ``"four-over-six"`` and ``"without tensor scale"``
    (the A/A copy ``"recipe A/A"`` is added by :func:`probe` itself)."""
    r = get_recipe(recipe)
    out = {"bf16": get_recipe("bf16"), "recipe": r}
    for c in components_of(r):
        out[f"without {c}"] = r.without(c)
    if _two_level_e2m1(r):
        out["four-over-six"] = r.variant("four-over-six", four_over_six=True)
        out["without tensor scale"] = r.variant("no-tensor-scale", tensor_scale=False)
    return out


def _variants(recipe, variants: Mapping[str, str | Recipe] | None, aa: bool) -> list[_Variant]:
    given = default_variants(recipe) if variants is None else {k: get_recipe(v) for k, v in variants.items()}
    out = []
    for name, rec in given.items():
        comp, cmp_to, sign = None, None, 1
        if name.startswith("without ") and "recipe" in given:
            comp, cmp_to = name[len("without "):], "recipe"  # effect of c: metric without c − metric with it
        elif name == "four-over-six" and "recipe" in given:
            comp, cmp_to, sign = "four-over-six", "recipe", -1  # an addition: metric(recipe) − metric(with it)
        elif name != "recipe" and "recipe" in given:
            comp, cmp_to = name, "recipe"
        out.append(_Variant(name, rec, "draws", cmp_to, sign, comp))
    if aa and "recipe" in given:
        out.append(_Variant("recipe A/A", given["recipe"], "draws A/A", "recipe", 1, "A/A (none: two draws sets)"))
    return out


def draws_random_bits(rec: Recipe) -> bool:
    """Whether the recipe draws random bits (stochastic rounding, or seeded RHT signs): the probe draws such a
    variant ``draws`` times, any other once."""
    for role in ROLES:
        p = rec.policy(role)
        s = p.resolved()
        if (s is not None and s.rounding.value == "sr") or (p.rht and p.rht_signs in ("per_layer", "per_call")):
            return True
    return False


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 from position t: ``logits`` [B, T, V] (or an object with a
    ``.logits``), ``batch`` the token ids [B, T] the model was given."""
    logits = getattr(logits, "logits", logits)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             batch[:, 1:].reshape(-1))


def _call(model, batch):
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _loss(model, batch, loss_fn):
    out = _call(model, batch)
    if loss_fn is not None:
        return loss_fn(out, batch)
    loss = getattr(out, "loss", out)
    if not (torch.is_tensor(loss) and loss.numel() == 1):
        raise TypeError("probe: the model's output is not a scalar loss; pass loss_fn=(output, batch) -> loss "
                        "(fpsim.torch.probes.next_token_loss for a language model's logits)")
    return loss.reshape(())


# --- the model's layers ----------------------------------------------------------------------------------------

@dataclass
class _Target:
    name: str
    module: torch.nn.Linear  # what the model holds (maybe an fpsim Linear of the user's)
    places: list[tuple[torch.nn.Module, str]] = field(default_factory=list)


def _targets(model, skip) -> list[_Target]:
    """Every linear layer convert would fill, and every fpsim Linear whatever its name (one target per module)."""
    seen: dict[int, _Target] = {}
    for s in nn.assignment(model, "bf16", keep_bf16=[], skip=skip):
        t = seen.setdefault(id(s.module), _Target(s.name, s.module))
        t.places.append((s.parent, s.attr))
    for pname, parent in model.named_modules():
        for attr, child in parent._modules.items():
            if isinstance(child, nn.Linear) and id(child) not in seen:
                full = f"{pname}.{attr}" if pname else attr
                seen[id(child)] = _Target(full, child, [(parent, attr)])
    return list(seen.values())


@contextlib.contextmanager
def _swapped(targets: list[_Target], make: Callable[[_Target], torch.nn.Module]):
    """Every target's places hold ``make(target)`` inside the block, the original module after it."""
    try:
        for t in targets:
            new = make(t)
            for parent, attr in t.places:
                setattr(parent, attr, new)
        yield
    finally:
        for t in targets:
            for parent, attr in t.places:
                setattr(parent, attr, t.module)


def _gemm(w: torch.Tensor) -> str:
    """fpsim's fast GEMM path for a tensor's device: ``"host"`` on the CPU (Numba copies), ``"blas"`` on CUDA."""
    return "blas" if w.is_cuda else "host"


def _fresh(t: _Target, recipe: Recipe | None, seed: int, step: int = 0) -> nn.Linear:
    """An fpsim Linear sharing the target's parameters (fpsim's own code, whatever the model held)."""
    lin = nn.Linear.from_linear(t.module, recipe=recipe, name=t.name, seed=seed, gemm=_gemm(t.module.weight))
    lin.step = step
    return lin


def _emulator(name: str, w: torch.Tensor, recipe: Recipe, seed: int, step: int = 0) -> nn.Linear:
    """fpsim's layer for the isolated GEMMs: weight ``w`` (shared, not copied), no bias."""
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, recipe=recipe, name=name, seed=seed, gemm=_gemm(w),
                    device="meta")
    lin.weight = torch.nn.Parameter(w.detach(), requires_grad=True)
    lin.step = step
    return lin


class _Capture:
    """Forward hooks on the measured layers: each call's input, output without bias, and (after backward) the
    gradients of its own input and output (the input goes through a view of its own, so a tensor read by several
    layers gives each its own dx)."""

    def __init__(self, model, names: set[str], keep_operands: bool):
        self.names, self.keep = names, keep_operands
        self.data: dict[str, dict] = {}
        self.calls: dict[str, int] = {}
        self.handles = []
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear) and getattr(mod, "name", None) in names:
                self.handles.append(mod.register_forward_pre_hook(self._pre, with_kwargs=False))
                self.handles.append(mod.register_forward_hook(self._post))

    def _pre(self, mod, args):
        x = args[0]
        if x.requires_grad:
            x = x.view_as(x)
            x.register_hook(lambda g, n=mod.name: self._put(n, "dx", g))
        return (x, *args[1:])

    def _post(self, mod, args, out):
        n = mod.name
        self.calls[n] = self.calls.get(n, 0) + 1
        y = out.detach().float()
        if mod.bias is not None:
            y = y - mod.bias.detach().float()
        d = self.data.setdefault(n, {})
        d["y"] = y.reshape(-1, y.shape[-1])
        if self.keep:
            d["x"] = args[0].detach().float().reshape(-1, args[0].shape[-1])
        if out.requires_grad:
            out.register_hook(lambda g, n=n: self._put(n, "dy", g))
        return out

    def _put(self, name, key, g):
        self.data.setdefault(name, {})[key] = g.detach().float().reshape(-1, g.shape[-1])

    def close(self):
        for h in self.handles:
            h.remove()


def _isolated(layer: torch.nn.Module, x, w, dy, bias) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three GEMMs of ``layer`` (its own forward and backward) on the given operands: y (bias removed), dx, dW."""
    xr = x.detach().clone().requires_grad_(True)
    frozen = not layer.weight.requires_grad
    try:
        if frozen:
            layer.weight.requires_grad_(True)
        with torch.enable_grad():
            y = layer(xr)
            dx, dw = torch.autograd.grad(y, (xr, layer.weight), dy)
    finally:
        if frozen:
            layer.weight.requires_grad_(False)
    y = y.detach().float()
    if bias is not None:
        y = y - bias.detach().float()
    return y, dx.float(), dw.float()


# --- the result ------------------------------------------------------------------------------------------------

@dataclass
class ProbeResult:
    """What :func:`probe` measured.  ``table``: one row per batch × layer × GEMM × variant × mode (columns
    ``batch, layer, gemm, variant, mode, draws`` and :data:`METRICS`, ``note``); ``steps``: one row per batch ×
    variant × optimizer (``progress``, ``progress_fp32``, ``draws``); ``summary``: per layer (and ``"all"``) ×
    GEMM × variant × mode × metric, the mean over batches with its 95 % interval; ``components``: per component ×
    GEMM × mode × metric (and ``gemm == "step"`` for ``step_progress``), the paired effect with interval, p, Holm's
    p and the 80 %-power detectable effect; ``flags``: the as-built check; ``meta``: the probe's settings."""

    table: pd.DataFrame
    steps: pd.DataFrame
    summary: pd.DataFrame
    components: pd.DataFrame
    flags: pd.DataFrame
    meta: dict

    def flagged(self) -> pd.DataFrame:
        """The flagged (layer, GEMM, metric) rows of :attr:`flags`."""
        return self.flags[self.flags["flagged"]] if len(self.flags) else self.flags

    def to_dict(self) -> dict:
        def rows(df):
            return [{k: (None if isinstance(v, float) and not math.isfinite(v) else
                         (v.item() if hasattr(v, "item") else v)) for k, v in r.items()}
                    for r in df.to_dict("records")]

        return {"meta": self.meta, "summary": rows(self.summary), "components": rows(self.components),
                "flags": rows(self.flags), "steps": rows(self.steps), "table": rows(self.table)}


# --- the probe -------------------------------------------------------------------------------------------------

def probe(model: torch.nn.Module, batches: Iterable, recipe: str | Recipe = "nvfp4_paper", *,
          variants: Mapping[str, str | Recipe] | None = None, draws: int = 16, loss_fn: Callable | None = None,
          val_batches: Iterable | None = None, layers: str | Iterable[str] = "*",
          modes: Iterable[str] = ("isolated", "end_to_end"), aa: bool = True, as_built: bool = True,
          end_to_end_draws: int | None = None, end_to_end_variants: Iterable[str] | None = None,
          adam_state: Mapping | None = None,
          adam_betas: tuple[float, float] = (0.9, 0.95), adam_eps: float = 1e-8, seed: int = 0,
          keep_bf16: LayerPolicy | None = None, skip: Iterable[str] = nn.HEAD_PATTERNS,
          progress: bool | Callable[[str], None] = False) -> ProbeResult:
    """Measure ``recipe``'s components on ``model`` (see the module docstring); returns a :class:`ProbeResult`.

    ``batches``: model inputs (a tensor, a tuple of positional arguments or a dict of keyword arguments each);
    every linear layer's token count must be a multiple of the Wgrad RHT size (16 for NVFP4) where a variant
    rotates.  ``loss_fn(output, batch)``: the loss (default: the output itself, or its ``.loss``).
    ``variants``: name → recipe (default :func:`default_variants`); a variant named ``"without <c>"`` or other than
    ``"recipe"`` is compared with ``"recipe"``.  ``draws``: random draws per random variant in isolated mode
    (``end_to_end_draws``, default ``min(draws, 4)``, in end-to-end mode: a whole model's pass each).
    ``keep_bf16``: a :class:`~fpsim.recipe.LayerPolicy` that replaces the layer policy of the recipe and of every
    variant that has one (the paper's first 2 and last 8 blocks suit its 62-block model, not a 6-block one; the
    ``"without bf16_layers"`` variant and BF16 have none and keep none).
    ``layers``: glob patterns of the layers measured (the others still run, under the variant in end-to-end
    mode).  ``aa``: add the A/A copy of the recipe.  ``as_built``: check the model's own fpsim layers against
    fpsim's emulation of their recipe.  ``adam_state``: ``{parameter name: (exp_avg, exp_avg_sq, step)}`` for the
    AdamW step ratio (default: a fresh state).  The model runs in float32 (a copy when its parameters are not),
    in eval mode (no dropout) and without autocast; its modules and parameters are as before afterwards.
    """
    modes = tuple(modes)
    bad = [m for m in modes if m not in ("isolated", "end_to_end")]
    if bad or not modes:
        raise ValueError(f"modes must be 'isolated' and/or 'end_to_end', got {modes}")
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    e2e_draws = min(draws, 4) if end_to_end_draws is None else int(end_to_end_draws)
    rec = get_recipe(recipe)
    if keep_bf16 is not None:
        if not isinstance(keep_bf16, LayerPolicy):
            raise TypeError(f"keep_bf16 must be a fpsim.recipe.LayerPolicy, got {type(keep_bf16).__name__}")
        rec = dataclasses.replace(rec, layers=keep_bf16)
    vs = _variants(rec, variants, aa)
    if keep_bf16 is not None:  # every variant with a layer policy takes this one (an ablation without one keeps none)
        vs = [dataclasses.replace(v, recipe=dataclasses.replace(v.recipe, layers=keep_bf16))
              if v.recipe.layers != LayerPolicy() else v for v in vs]
    e2e_names = None if end_to_end_variants is None else set(end_to_end_variants)
    if e2e_names is not None and e2e_names - {v.name for v in vs}:
        raise ValueError(f"end_to_end_variants names no variant: {sorted(e2e_names - {v.name for v in vs})}")
    e2e_vs = [v for v in vs if e2e_names is None or v.name in e2e_names]
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model = copy.deepcopy(model).float()
    pats = (layers,) if isinstance(layers, str) else tuple(layers)
    targets = _targets(model, skip)
    if not targets:
        raise ValueError("probe: the model has no linear layer to measure (every nn.Linear is skipped: "
                         f"skip={tuple(skip)})")
    measured = {t.name for t in targets if any(fnmatch.fnmatchcase(t.name, p) for p in pats)}
    if not measured:
        raise ValueError(f"probe: no layer matches {pats}; layers: {', '.join(t.name for t in targets[:12])}"
                         f"{' …' if len(targets) > 12 else ''}")
    built = [t for t in targets if isinstance(t.module, nn.Linear) and t.module.recipe is not None
             and t.name in measured] if as_built else []
    assign = {v.name: {s.name: s.recipe for s in nn.assignment(model, v.recipe, skip=skip)} for v in vs}
    say = _progress(progress)
    was_training = model.training
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rows, step_rows, flag_rows = [], [], []
    batches = list(batches)
    try:
        model.eval()
        g_val = _val_gradient(model, targets, val_batches, loss_fn, trainable) if val_batches is not None else None
        for b, batch in enumerate(batches):
            say(f"batch {b + 1}/{len(batches)}: FP32 reference")
            ref, g_ref = _reference(model, targets, batch, loss_fn, measured, trainable)
            if "isolated" in modes:
                rows += _isolated_rows(b, targets, measured, ref, vs, assign, draws, seed, say)
            if built:
                flag_rows += _as_built_rows(b, built, ref, draws, seed)
            if "end_to_end" in modes or g_val is not None:
                r2, s2 = _end_to_end_rows(b, model, targets, measured, batch, loss_fn, ref, e2e_vs, assign, e2e_draws,
                                          seed, trainable, g_ref, g_val, adam_state, adam_betas, adam_eps, say,
                                          "end_to_end" in modes)
                rows += r2
                step_rows += s2
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    table = pd.DataFrame(rows, columns=["batch", "layer", "gemm", "variant", "mode", "draws", *METRICS, "note"])
    steps = pd.DataFrame(step_rows, columns=["batch", "variant", "optimizer", "draws", "progress", "progress_fp32"])
    meta = {"recipe": rec.name, "variants": {v.name: v.recipe.name for v in vs}, "draws": draws,
            "end_to_end_draws": e2e_draws, "end_to_end_variants": [v.name for v in e2e_vs], "batches": len(batches),
            "layers_measured": sorted(measured),
            "modes": list(modes), "seed": seed, "val_batches": None if val_batches is None else "given",
            "adam_state": "given" if adam_state is not None else "fresh", "tolerance": TOLERANCE}
    return ProbeResult(table, steps, summary(table, steps), components(table, steps, vs), flags(flag_rows), meta)


def _progress(progress):
    if callable(progress) or not progress:
        return progress if callable(progress) else (lambda msg: None)
    return lambda msg: print(f"fpsim probe: {msg}", file=sys.stderr, flush=True)


def _draw_seed(seed: int, stream: str, b: int, d: int) -> int:
    return derive_seed(seed, "probe", stream, b, d) & 0x7FFFFFFF


def _reference(model, targets, batch, loss_fn, measured, trainable):
    """The FP32 pass: every measured layer's x, y, dx, dy and dW, and every trained parameter's gradient."""
    cap = None
    with _swapped(targets, lambda t: _fresh(t, None, 0)):
        cap = _Capture(model, measured, keep_operands=True)
        try:
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", enabled=False), torch.enable_grad():
                loss = _loss(model, batch, loss_fn)
                loss.backward()
        finally:
            cap.close()
    g_ref = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in trainable}
    ref = {}
    for t in targets:
        if t.name not in measured:
            continue
        d = cap.data.get(t.name, {})
        if cap.calls.get(t.name, 0) != 1 or not {"x", "y", "dy"} <= d.keys():
            ref[t.name] = {"skip": "called more than once per pass" if cap.calls.get(t.name, 0) > 1
                           else "not called, or no gradient reached it"}
            continue
        w = t.module.weight.detach().float()
        d["w"] = w
        d["dw"] = t.module.weight.grad.detach().float().clone() if t.module.weight.grad is not None else None
        d["bias"] = t.module.bias
        x64, w64, dy64 = d["x"].double(), w.double(), d["dy"].double()
        d["exact"] = {"fprop": x64 @ w64.T, "dgrad": dy64 @ w64, "wgrad": dy64.T @ x64}
        ref[t.name] = d
    model.zero_grad(set_to_none=True)
    return ref, g_ref


def _isolated_rows(b, targets, measured, ref, vs, assign, draws, seed, say):
    rows, cache = [], {}
    for t in targets:
        if t.name not in measured:
            continue
        d = ref[t.name]
        if "skip" in d:
            for v in vs:
                for g in GEMM_NAMES:
                    rows.append({"batch": b, "layer": t.name, "gemm": g, "variant": v.name, "mode": "isolated",
                                 "draws": 0, "note": d["skip"]})
            continue
        say(f"batch {b + 1}: isolated {t.name}")
        for v in vs:
            r = assign[v.name].get(t.name, get_recipe("bf16"))
            n = draws if draws_random_bits(r) else 1
            key = (tuple(r.policy(role) for role in ROLES), r.accumulator, r.dgrad_w_from_fprop, v.stream, n)
            if key not in cache:
                outs = [_isolated(_emulator(t.name, d["w"], r, _draw_seed(seed, v.stream, b, i)), d["x"], d["w"],
                                  d["dy"], None)
                        for i in range(n)]
                cache[key] = {g: row_metrics(d["exact"][g], [o[k] for o in outs])
                              for k, g in enumerate(GEMM_NAMES)}
            for g in GEMM_NAMES:
                rows.append({"batch": b, "layer": t.name, "gemm": g, "variant": v.name, "mode": "isolated",
                             "draws": n, "note": None, **cache[key][g]})
        cache.clear()
    return rows


def _as_built_rows(b, built, ref, draws, seed):
    """The model's own fpsim layers and fpsim's emulation of their recipes, on the same operands (draws from two
    independent streams)."""
    rows = []
    for t in built:
        d = ref[t.name]
        if "skip" in d:
            continue
        lay = t.module
        n = draws if draws_random_bits(lay.recipe) else 1
        own, emu = [], []
        saved = lay.seed
        try:
            for i in range(n):
                lay.seed = _draw_seed(seed, "as built", b, i)
                own.append(_isolated(lay, d["x"], d["w"], d["dy"], d["bias"]))
                emu.append(_isolated(_emulator(t.name, d["w"], lay.recipe, _draw_seed(seed, "emulation", b, i),
                                               lay.step), d["x"], d["w"], d["dy"], None))
        finally:
            lay.seed = saved
        for k, g in enumerate(GEMM_NAMES):
            rows.append({"batch": b, "layer": t.name, "gemm": g, "recipe": lay.recipe.name,
                         "as_built": row_metrics(d["exact"][g], [o[k] for o in own]),
                         "emulated": row_metrics(d["exact"][g], [o[k] for o in emu])})
    return rows


def _val_gradient(model, targets, val_batches, loss_fn, trainable):
    """∇L_val: the FP32 model's gradient of the mean held-out loss over ``val_batches``."""
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in trainable}
    k = 0
    with _swapped(targets, lambda t: _fresh(t, None, 0)):
        for batch in val_batches:
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", enabled=False), torch.enable_grad():
                _loss(model, batch, loss_fn).backward()
            for n, p in trainable:
                if p.grad is not None:
                    total[n] += p.grad.double()
            k += 1
    model.zero_grad(set_to_none=True)
    if k == 0:
        raise ValueError("probe: val_batches is empty")
    return {n: v / k for n, v in total.items()}


def _end_to_end_rows(b, model, targets, measured, batch, loss_fn, ref, vs, assign, draws, seed, trainable, g_ref,
                     g_val, adam_state, betas, eps, say, record_rows):
    rows, steps = [], []
    ref_dir = {o: step_direction(g_ref, o, adam_state, betas, eps) for o in ("sgd", "adamw")} if g_val else None
    ref_prog = {o: dot(ref_dir[o], g_val) for o in ref_dir} if g_val else None
    for v in vs:
        n = draws if draws_random_bits(v.recipe) else 1
        caps, ratios = [], {"sgd": [], "adamw": []}
        for i in range(n):
            say(f"batch {b + 1}: end to end, {v.name}, draw {i + 1}/{n}")
            s, lay = _draw_seed(seed, v.stream, b, i), assign[v.name]
            with _swapped(targets, lambda t, lay=lay, s=s: _fresh(t, lay.get(t.name, get_recipe("bf16")), s)):
                cap = _Capture(model, measured, keep_operands=False)
                try:
                    model.zero_grad(set_to_none=True)
                    with torch.autocast("cpu", enabled=False), torch.enable_grad():
                        _loss(model, batch, loss_fn).backward()
                finally:
                    cap.close()
            dws = {t.name: t.module.weight.grad.detach().float().clone()
                   for t in targets if t.name in measured and t.module.weight.grad is not None}
            caps.append((cap.data, dws))
            if g_val is not None:
                g = {nm: (p.grad.detach() if p.grad is not None else torch.zeros_like(p)) for nm, p in trainable}
                for o in ("sgd", "adamw"):
                    prog = dot(step_direction(g, o, adam_state, betas, eps), g_val)
                    ratios[o].append(prog)
            model.zero_grad(set_to_none=True)
        if g_val is not None:
            for o in ("sgd", "adamw"):
                steps.append({"batch": b, "variant": v.name, "optimizer": o, "draws": n,
                              "progress": float(np.mean(ratios[o])), "progress_fp32": ref_prog[o]})
        if not record_rows:
            continue
        for t in targets:
            if t.name not in measured or "skip" in ref[t.name]:
                continue
            d = ref[t.name]
            refs = {"fprop": d["y"], "dgrad": d.get("dx"), "wgrad": d.get("dw")}
            for g in GEMM_NAMES:
                got = [(c[0].get(t.name, {}).get({"fprop": "y", "dgrad": "dx"}[g]) if g != "wgrad"
                        else c[1].get(t.name)) for c in caps]
                if refs[g] is None or any(x is None for x in got):
                    rows.append({"batch": b, "layer": t.name, "gemm": g, "variant": v.name, "mode": "end_to_end",
                                 "draws": n, "note": "no gradient reached this tensor"})
                    continue
                rows.append({"batch": b, "layer": t.name, "gemm": g, "variant": v.name, "mode": "end_to_end",
                             "draws": n, "note": None, **row_metrics(refs[g].double(), got)})
    return rows, steps


