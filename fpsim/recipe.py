"""The low-precision linear-layer training recipe (SPEC §8): Fprop, Dgrad and Wgrad under one policy.

A linear layer ``Y = X · Wᵀ`` (X: tokens × in, W: out × in) runs three GEMMs,
each with two quantized operands.  A :class:`Recipe` says, for each of the six
operands, how it is quantized (:class:`OperandPolicy`: scheme, block shape,
rounding, RHT); :func:`linear` runs the three GEMMs through
:func:`fpsim.gemm.gemm` and returns them with BF16 and float64 references.

Operand layouts (every GEMM is ``A · Bᵀ`` with the reduction axis last):

=======  ==============  =====================  =====================
GEMM     result          A (quantized along K)  B (quantized along K)
=======  ==============  =====================  =====================
Fprop    Y  = X · Wᵀ     X      (K = in)        W      (K = in)
Dgrad    dX = dY · W     dY     (K = out)       Wᵀ     (K = out)
Wgrad    dW = dYᵀ · X    dYᵀ    (K = tokens)    Xᵀ     (K = tokens)
=======  ==============  =====================  =====================

Every copy is quantized from the high-precision tensor with its own amax
(never re-quantized from another copy); an RHT'd copy is rotated (along its
K axis, in tiles of ``rht``) before its amax is taken.  With 16×16 weight
tiles the Dgrad copy of W is exactly the transpose of the Fprop copy.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._arrays import as_float32
from ._hashing import cached_hash
from .codecs import Rounding
from .dispatch import dequantize, gemm, quantize, rht
from .schemes import BlockScheme, get_scheme
from .tensor import QuantizedTensor
from .transforms import derive_seed

__all__ = ["OperandPolicy", "Recipe", "RECIPES", "get_recipe", "LinearResult", "linear", "LayerPolicy", "ROLES"]

#: The six operands of a linear layer's three GEMMs, in (GEMM, operand) order.
ROLES = ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x")
#: Which tensor each role copies: x (activation), w (weight) or dy (output gradient).
ROLE_TENSOR = {"fprop_x": "x", "fprop_w": "w", "dgrad_dy": "dy", "dgrad_w": "w", "wgrad_dy": "dy", "wgrad_x": "x"}


@cached_hash
@dataclass(frozen=True)
class OperandPolicy:
    """How one GEMM operand is quantized.

    ``scheme``: a preset name or :class:`~fpsim.scaling.BlockScheme`; ``None``
    keeps the operand in float32 (quantization off).  ``block`` overrides the
    scheme's block (e.g. ``(16, 16)`` for 2-D weight tiles).  ``rounding``:
    ``"rne"`` or ``"sr"`` (with ``sr_bits`` random bits; default the element's
    hardware width).  ``rht``: Hadamard tile size along K (0 = off), with sign
    policy ``rht_signs``: ``"recipe"`` (the fixed 16-vector), ``"none"``,
    ``"per_layer"`` / ``"per_call"`` (seeded from the run seed), or an int seed.
    """

    scheme: str | BlockScheme | None
    block: tuple[int, int] | None = None
    rounding: str = "rne"
    sr_bits: int | None = None
    rht: int = 0
    rht_signs: str | int = "recipe"

    def __post_init__(self) -> None:
        if self.block is not None:  # a tuple keeps the policy hashable (resolved() is cached on it)
            object.__setattr__(self, "block", tuple(int(b) for b in self.block))

    def resolved(self) -> BlockScheme | None:
        """The block scheme with this policy's overrides applied (None = not quantized); cached, since a training
        step asks for it six times per layer."""
        return _resolve(self)


@functools.lru_cache(maxsize=1024)
def _resolve(policy: OperandPolicy) -> BlockScheme | None:
    if policy.scheme is None:
        return None
    s = get_scheme(policy.scheme)
    changes: dict[str, Any] = {"rounding": Rounding.parse(policy.rounding)}
    if policy.block is not None:
        changes["block"] = tuple(policy.block)
    if policy.sr_bits is not None:
        changes["sr_bits"] = policy.sr_bits
    return dataclasses.replace(s, **changes)


@cached_hash
@dataclass(frozen=True)
class LayerPolicy:
    """Which layers of a model stay in BF16 (SPEC §8 "selective high precision").

    The paper's 12B model keeps the first 2 and last 8 blocks in BF16 (≈ 16 % of
    linear layers).  ``names`` adds explicit layer names.
    """

    first: int = 0
    last: int = 0
    names: tuple[str, ...] = ()

    def high_precision(self, index: int, n_layers: int, name: str | None = None) -> bool:
        """Whether layer ``index`` (0-based, of ``n_layers``) runs in BF16."""
        if not 0 <= index < n_layers:
            raise ValueError(f"layer index {index} outside 0..{n_layers - 1}")
        return index < self.first or index >= n_layers - self.last or (name is not None and name in self.names)

    def precision_map(self, names: list[str]) -> dict[str, str]:
        """``{layer name: "bf16" | "recipe"}`` for an ordered list of layer names."""
        n = len(names)
        return {nm: ("bf16" if self.high_precision(i, n, nm) else "recipe") for i, nm in enumerate(names)}


@cached_hash
@dataclass(frozen=True)
class Recipe:
    """A policy per operand role (see :data:`ROLES`), the accumulator model, and the BF16 layer set."""

    name: str
    fprop_x: OperandPolicy
    fprop_w: OperandPolicy
    dgrad_dy: OperandPolicy
    dgrad_w: OperandPolicy
    wgrad_dy: OperandPolicy
    wgrad_x: OperandPolicy
    accumulator: str = "fp32"
    layers: LayerPolicy = field(default_factory=LayerPolicy)
    #: Dgrad's Wᵀ re-quantized from the dequantized Fprop W (Transformer Engine's option) instead of from W.
    dgrad_w_from_fprop: bool = False

    def policy(self, role: str) -> OperandPolicy:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        return getattr(self, role)

    def replace_roles(self, roles, **changes) -> Recipe:
        """A copy with ``changes`` applied to the policies of ``roles``."""
        upd: dict[str, Any] = {r: dataclasses.replace(self.policy(r), **changes) for r in roles}
        return dataclasses.replace(self, **upd)

    def without(self, *components: str) -> Recipe:
        """Ablation: drop components — ``"rht"``, ``"2d"`` (weights in 1-D blocks), ``"sr"``, ``"bf16_layers"``."""
        r = self
        for comp in components:
            if comp == "rht":
                r = r.replace_roles(ROLES, rht=0)
            elif comp == "sr":
                r = r.replace_roles(ROLES, rounding="rne")
            elif comp == "2d":
                roles = [x for x in ("fprop_w", "dgrad_w") if r.policy(x).scheme is not None]
                for role in roles:
                    sch = r.policy(role).resolved()
                    blk = None if sch is None else sch.block
                    if blk is not None and blk[0] > 1:
                        r = r.replace_roles([role], block=(1, blk[1]))
            elif comp == "bf16_layers":
                r = dataclasses.replace(r, layers=LayerPolicy())
            else:
                raise ValueError(f"unknown component {comp!r}; known: rht, 2d, sr, bf16_layers")
        suffix = "-".join(components)
        return dataclasses.replace(r, name=f"{self.name}-no-{suffix}" if components else self.name)

    def only(self, half: str) -> Recipe:
        """``"forward"``: Fprop quantized, Dgrad and Wgrad copies BF16; ``"backward"``: the reverse (the split of
        the quantization gap the literature reports)."""
        bf16 = OperandPolicy("bf16")
        roles = {"forward": ROLES[2:], "backward": ROLES[:2]}
        if half not in roles:
            raise ValueError("half must be 'forward' or 'backward'")
        upd: dict[str, Any] = {role: bf16 for role in roles[half]}
        r = dataclasses.replace(self, **upd)
        return dataclasses.replace(r, name=f"{self.name}-{half}-only")

    def variant(self, name: str | None = None, **scheme_changes) -> Recipe:
        """The recipe with ``BlockScheme`` fields changed in every two-level (NVFP4-style) role, e.g.
        ``variant(four_over_six=True, four_over_six_metric="mae")``; ``per_row_scale=True`` applies to the
        roles with 1-D blocks only (a 2-D tile spans several rows)."""
        upd: dict[str, Any] = {}
        for role in ROLES:
            pol = self.policy(role)
            sch = pol.resolved()
            if sch is None or pol.scheme is None or sch.kind.value != "two_level":
                continue
            ch = dict(scheme_changes)
            if ch.get("per_row_scale") and sch.block is not None and sch.block[0] > 1:
                ch.pop("per_row_scale")
            upd[role] = dataclasses.replace(pol, scheme=get_scheme(pol.scheme).replace(**ch))
        tag = name or "-".join(f"{k}={v}" for k, v in sorted(scheme_changes.items()))
        return dataclasses.replace(self, name=f"{self.name}-{tag}", **upd)


def _uniform(policy: OperandPolicy, name: str, **kw) -> Recipe:
    roles: dict[str, Any] = dict.fromkeys(ROLES, policy)
    return Recipe(name, **roles, **kw)


_P = OperandPolicy
#: Preset recipes (SPEC §8 and the paper's baselines).
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "nvfp4_paper",
            fprop_x=_P("nvfp4"),
            fprop_w=_P("nvfp4", block=(16, 16)),
            dgrad_dy=_P("nvfp4", rounding="sr"),
            dgrad_w=_P("nvfp4", block=(16, 16)),
            wgrad_dy=_P("nvfp4", rounding="sr", rht=16),
            wgrad_x=_P("nvfp4", rht=16),
            layers=LayerPolicy(first=2, last=8),
        ),
        Recipe(
            "mxfp4",
            fprop_x=_P("mxfp4"),
            fprop_w=_P("mxfp4"),
            dgrad_dy=_P("mxfp4", rounding="sr"),
            dgrad_w=_P("mxfp4"),
            wgrad_dy=_P("mxfp4", rounding="sr", rht=32, rht_signs="per_layer"),
            wgrad_x=_P("mxfp4", rht=32, rht_signs="per_layer"),
            layers=LayerPolicy(first=2, last=8),
        ),
        # Transformer Engine's "hybrid" current scaling: E4M3 forward, E5M2 gradients.
        Recipe(
            "fp8_current",
            fprop_x=_P("fp8_e4m3"),
            fprop_w=_P("fp8_e4m3"),
            dgrad_dy=_P("fp8_e5m2"),
            dgrad_w=_P("fp8_e4m3"),
            wgrad_dy=_P("fp8_e5m2"),
            wgrad_x=_P("fp8_e4m3"),
        ),
        # DeepSeek-V3: 1×128 activations and gradients, 128×128 weights, E4M3, FP32 scales.
        Recipe(
            "fp8_blockwise",
            fprop_x=_P("fp8_block128"),
            fprop_w=_P("fp8_block128", block=(128, 128)),
            dgrad_dy=_P("fp8_block128"),
            dgrad_w=_P("fp8_block128", block=(128, 128)),
            wgrad_dy=_P("fp8_block128"),
            wgrad_x=_P("fp8_block128"),
        ),
        _uniform(_P("bf16"), "bf16"),
        _uniform(_P(None), "fp32"),  # quantization off: every operand stays float32
    )
}


def get_recipe(recipe: str | Recipe) -> Recipe:
    """A preset recipe by name, or the recipe itself."""
    if isinstance(recipe, Recipe):
        return recipe
    try:
        return RECIPES[str(recipe).strip().lower()]
    except KeyError:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}") from None


@dataclass(frozen=True)
class LinearResult:
    """Y, dX, dW under the recipe, under BF16 operands (FP32 accumulation), and in float64.

    ``operands`` maps each role to the quantized copy the GEMM consumed
    (a :class:`~fpsim.scaling.QuantizedTensor`, or the float32 array when the
    role is not quantized), for inspection: amaxes, scales, codes.
    """

    y: np.ndarray
    dx: np.ndarray
    dw: np.ndarray
    y_bf16: np.ndarray
    dx_bf16: np.ndarray
    dw_bf16: np.ndarray
    y_ref: np.ndarray
    dx_ref: np.ndarray
    dw_ref: np.ndarray
    operands: dict

    def relative_errors(self) -> dict[str, float]:
        """‖out − out_fp64‖ / ‖out_fp64‖ for each GEMM, under the recipe and under BF16."""

        def rel(a, b):
            d = np.linalg.norm(b)
            return float(np.linalg.norm(a.astype(np.float64) - b) / d) if d else float("nan")

        return {
            "fprop": rel(self.y, self.y_ref),
            "dgrad": rel(self.dx, self.dx_ref),
            "wgrad": rel(self.dw, self.dw_ref),
            "fprop_bf16": rel(self.y_bf16, self.y_ref),
            "dgrad_bf16": rel(self.dx_bf16, self.dx_ref),
            "wgrad_bf16": rel(self.dw_bf16, self.dw_ref),
        }


def _signs(policy: OperandPolicy, seed: int, layer: str, step: int):
    s = policy.rht_signs
    if s == "per_layer":
        return derive_seed(seed, "rht", layer)
    if s == "per_call":
        return derive_seed(seed, "rht", layer, step)
    return s


@dataclass(frozen=True)
class OperandSteps:
    """What quantizing one operand copy does, resolved for one call (every backend executes the same steps).

    ``rht``: Hadamard tile size along the reduction axis (0 = none) with sign policy ``signs`` (an argument of
    :func:`fpsim.rht`); ``scheme``: the block scheme (None = the copy stays float32); ``seed``: the Philox
    seed of stochastic rounding (None under RNE).
    """

    rht: int
    signs: str | int
    scheme: BlockScheme | None
    seed: int | None


def operand_steps(policy: OperandPolicy, *, seed: int = 0, layer: str = "", step: int = 0,
                  role: str = "") -> OperandSteps:
    """The steps of one operand copy: SR bits from ``derive_seed(seed, "sr", layer, step, role)``; per-layer /
    per-call RHT signs from ``derive_seed(seed, "rht", layer[, step])`` (never from the role: both operands of a
    GEMM must share R)."""
    sch = policy.resolved()
    sr_seed = derive_seed(seed, "sr", layer, step, role) if sch is not None and sch.rounding is Rounding.SR else None
    return OperandSteps(int(policy.rht), _signs(policy, seed, layer, step) if policy.rht else "none", sch, sr_seed)


def quantize_operand(
    t: np.ndarray, policy: OperandPolicy, *, seed: int = 0, layer: str = "", step: int = 0, role: str = ""
) -> QuantizedTensor | np.ndarray:
    """Quantize one operand copy (reduction axis last) under a policy: RHT, then the block scheme."""
    st = operand_steps(policy, seed=seed, layer=layer, step=step, role=role)
    x = t
    if st.rht:
        x = rht(x, st.rht, st.signs, axis=-1)
    if st.scheme is None:
        return np.ascontiguousarray(x, np.float32)
    if st.seed is not None:
        return quantize(x, st.scheme, seed=st.seed)
    return quantize(x, st.scheme)


def linear(
    x: np.typing.ArrayLike,
    w: np.typing.ArrayLike,
    dy: np.typing.ArrayLike,
    recipe: str | Recipe = "nvfp4_paper",
    *,
    seed: int = 0,
    layer: str = "",
    step: int = 0,
) -> LinearResult:
    """Forward and backward GEMMs of ``Y = X · Wᵀ`` under a recipe (SPEC §8).

    ``x``: tokens × in, ``w``: out × in, ``dy``: tokens × out.  Stochastic
    rounding bits and per-layer / per-call RHT signs derive from ``seed``,
    ``layer`` and ``step`` (deterministic).  RHT along tokens needs the token
    count to be a multiple of the Hadamard size.
    """
    rec = get_recipe(recipe)
    x32, w32, dy32 = (as_float32(a) for a in (x, w, dy))
    for nm, a in (("x", x32), ("w", w32), ("dy", dy32)):
        if a.ndim != 2:
            raise ValueError(f"{nm} must be 2-D, got shape {a.shape}")
    t, i = x32.shape
    o = w32.shape[0]
    if w32.shape != (o, i) or dy32.shape != (t, o):
        raise ValueError(f"shapes do not form a linear layer: x {x32.shape}, w {w32.shape}, dy {dy32.shape}")
    for role in ROLES:
        d, k = rec.policy(role).rht, {"fprop": i, "dgrad": o, "wgrad": t}[role.split("_")[0]]
        if d and k % d:
            what = {"fprop": "input features", "dgrad": "output features", "wgrad": "tokens"}[role.split("_")[0]]
            raise ValueError(
                f"linear: {role} rotates along {what} ({k}), which is not a multiple of its Hadamard size {d}; "
                f"pad to a multiple of {d} {what}, or drop the RHT: get_recipe({rec.name!r}).without('rht')")
    # Each role's copy with its reduction axis last.
    copies = {"fprop_x": x32, "fprop_w": w32, "dgrad_dy": dy32, "dgrad_w": w32.T, "wgrad_dy": dy32.T, "wgrad_x": x32.T}
    ops: dict[str, Any] = {}
    for role in ROLES:
        src = copies[role]
        if role == "dgrad_w" and rec.dgrad_w_from_fprop:
            fw = ops["fprop_w"]
            src = (fw if isinstance(fw, np.ndarray) else dequantize(fw)).T
        ops[role] = quantize_operand(np.ascontiguousarray(src), rec.policy(role), seed=seed, layer=layer, step=step,
                                     role=role)
    acc = rec.accumulator
    y = gemm(ops["fprop_x"], ops["fprop_w"], acc)
    dx = gemm(ops["dgrad_dy"], ops["dgrad_w"], acc)
    dw = gemm(ops["wgrad_dy"], ops["wgrad_x"], acc)

    bf = {k: quantize(np.ascontiguousarray(v), "bf16") for k, v in copies.items()}
    y_b = gemm(bf["fprop_x"], bf["fprop_w"], "fp32")
    dx_b = gemm(bf["dgrad_dy"], bf["dgrad_w"], "fp32")
    dw_b = gemm(bf["wgrad_dy"], bf["wgrad_x"], "fp32")
    x64, w64, dy64 = (a.astype(np.float64) for a in (x32, w32, dy32))
    return LinearResult(y, dx, dw, y_b, dx_b, dw_b, x64 @ w64.T, dy64 @ w64, dy64.T @ x64, ops)
