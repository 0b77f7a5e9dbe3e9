"""The campaign's arms (issue 20): which recipe each block linear runs, which blocks stay BF16, and the paper's
late switch to BF16.  Every arm converts the same model with :func:`fpsim.torch.convert` (``gemm="blas"``); the
BF16 arm runs the ``"bf16"`` recipe through the same layer (BF16 copies, FP32 accumulation), so arms differ only
by their recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import fpsim.torch as ft
from fpsim.recipe import LayerPolicy, Recipe, get_recipe

__all__ = ["Arm", "ARMS", "bf16_tail", "apply_arm", "COMPONENTS"]

#: The paper keeps the last ~15 % of its blocks in BF16 (8 of 62 with the first 2); scaled to a small model.
TAIL_FRACTION = 0.15
#: The paper's late switch: the last ~18 % of tokens in BF16.
SWITCH_AT = 0.82


@dataclass(frozen=True)
class Arm:
    """``recipe``: a preset name or a function of the preset; ``tail``: keep the last ~15 % of blocks BF16;
    ``switch_at``: fraction of the token budget after which every layer runs BF16 (None: never)."""

    name: str
    label: str
    recipe: str
    change: tuple = ()
    tail: bool = True
    switch_at: float | None = None

    def build(self) -> Recipe:
        rec = get_recipe(self.recipe)
        for kind, arg in self.change:
            if kind == "without":
                rec = rec.without(arg)
            elif kind == "only":
                rec = rec.only(arg)
            elif kind == "variant":
                rec = rec.variant(**dict(arg))
            else:
                raise ValueError(f"unknown change {kind!r}")
        return rec


_A = Arm
ARMS: dict[str, Arm] = {a.name: a for a in (
    _A("bf16", "BF16", "bf16", tail=False),
    _A("nvfp4", "NVFP4 recipe", "nvfp4_paper"),
    _A("nvfp4_no_sr", "NVFP4 − SR", "nvfp4_paper", (("without", "sr"),)),
    _A("nvfp4_no_rht", "NVFP4 − RHT", "nvfp4_paper", (("without", "rht"),)),
    _A("nvfp4_no_2d", "NVFP4 − 2D weights", "nvfp4_paper", (("without", "2d"),)),
    _A("nvfp4_all", "NVFP4 every block", "nvfp4_paper", tail=False),
    _A("nvfp4_fwd", "NVFP4 forward only", "nvfp4_paper", (("only", "forward"),)),
    _A("nvfp4_bwd", "NVFP4 backward only", "nvfp4_paper", (("only", "backward"),)),
    _A("mxfp4", "MXFP4 recipe", "mxfp4"),
    _A("fp8_blockwise", "FP8 blockwise", "fp8_blockwise", tail=False),
    _A("nvfp4_46", "NVFP4 + four-over-six", "nvfp4_paper", (("variant", (("four_over_six", True),)),)),
    _A("nvfp4_late_bf16", "NVFP4, BF16 for the last 18 % of tokens", "nvfp4_paper", switch_at=SWITCH_AT),
)}

#: Each recipe component, the arm without it (or with it), the arm it is compared with, and the paper's claim
#: (``"helps"``: removing it raises the loss; ``"harmless"``: it costs nothing).
COMPONENTS = (
    ("stochastic rounding of gradients", "nvfp4_no_sr", "nvfp4", "helps"),
    ("random Hadamard transform (Wgrad)", "nvfp4_no_rht", "nvfp4", "helps"),
    ("16×16 2-D weight scaling", "nvfp4_no_2d", "nvfp4", "helps"),
    ("last ~15 % of blocks in BF16", "nvfp4_all", "nvfp4", "helps"),
    ("four-over-six block scales", "nvfp4", "nvfp4_46", "helps"),
    ("BF16 for the last 18 % of tokens", "nvfp4", "nvfp4_late_bf16", "helps"),
)


def bf16_tail(layers: int) -> int:
    """Blocks kept BF16 at the end of the model: round(15 % of the blocks), at least one."""
    return max(1, round(TAIL_FRACTION * layers))


def apply_arm(model: torch.nn.Module, arm: Arm, seed: int, layers: int) -> torch.nn.Module:
    """Convert the model's block linears for ``arm`` (in place; returns the model)."""
    keep = LayerPolicy(last=bf16_tail(layers)) if arm.tail else LayerPolicy()
    return ft.convert(model, arm.build(), keep_bf16=keep, seed=seed, gemm="blas")
