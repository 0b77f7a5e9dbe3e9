"""The campaign's arms: which recipe each block linear runs, which blocks stay BF16, and the paper's
late switch to BF16.  Every arm converts the same model with :func:`fpsim.torch.convert` (``gemm="blas"``); the
BF16 arm runs the ``"bf16"`` recipe through the same layer (BF16 copies, FP32 accumulation), so arms differ only
by their recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import fpsim.torch as ft
from fpsim.recipe import LayerPolicy, Recipe, get_recipe

__all__ = ["Arm", "ARMS", "bf16_tail", "apply_arm", "COMPONENTS", "CLAIMED_BY", "MXFP4_FORMAT",
           "MXFP4_OTHER_CHANGES"]

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

#: Each recipe component, the arm without it (or with it), the arm it is compared with, and the published claim
#: (``"helps"``: removing it raises the loss; ``"harmless"``: it costs nothing); who makes each claim is
#: :data:`CLAIMED_BY`.
COMPONENTS = (
    ("stochastic rounding of gradients", "nvfp4_no_sr", "nvfp4", "helps"),
    ("random Hadamard transform (Wgrad)", "nvfp4_no_rht", "nvfp4", "helps"),
    ("16×16 2-D weight scaling", "nvfp4_no_2d", "nvfp4", "helps"),
    ("last ~15 % of blocks in BF16", "nvfp4_all", "nvfp4", "helps"),
    ("four-over-six block scales", "nvfp4", "nvfp4_46", "helps"),
    ("BF16 for the last 18 % of tokens", "nvfp4", "nvfp4_late_bf16", "helps"),
)
#: The NVIDIA paper (Pretraining Large Language Models with NVFP4, arXiv 2509.25149).
NVFP4_PAPER = "NVIDIA's NVFP4 paper"
#: Who claims each component of :data:`COMPONENTS` helps.  Four-over-six is not part of NVIDIA's recipe and its paper
#: makes no claim about it: the claim is Four Over Six's (Cook et al., arXiv 2512.02010: adaptive 4-or-6 block scales
#: bring NVFP4 pre-training loss closer to BF16).
CLAIMED_BY = {
    "stochastic rounding of gradients": NVFP4_PAPER,
    "random Hadamard transform (Wgrad)": NVFP4_PAPER,
    "16×16 2-D weight scaling": NVFP4_PAPER,
    "last ~15 % of blocks in BF16": NVFP4_PAPER,
    "four-over-six block scales": "Cook et al. 2025, Four Over Six; not NVIDIA's paper",
    "BF16 for the last 18 % of tokens": NVFP4_PAPER,
}
#: What the MXFP4 arm (the ``mxfp4`` preset) changes against the NVFP4 recipe (``nvfp4_paper``): first the format
#: itself, then what else its preset does differently; no arm changes the format alone, so MXFP4 − NVFP4 measures
#: all of it together.
MXFP4_FORMAT = ("blocks of 32 with power-of-two E8M0 scales and no FP32 tensor scale, instead of blocks of 16 with "
                "E4M3 scales under one")
MXFP4_OTHER_CHANGES = ("its weights have 1×32 blocks instead of 16×16 tiles, so Fprop and Dgrad quantize them apart",
                       "its Wgrad operands take a 32-point RHT with per-layer seeded signs instead of a 16-point one "
                       "with the recipe's fixed signs")


def bf16_tail(layers: int) -> int:
    """Blocks kept BF16 at the end of the model: round(15 % of the blocks), at least one."""
    return max(1, round(TAIL_FRACTION * layers))


def apply_arm(model: torch.nn.Module, arm: Arm, seed: int, layers: int) -> torch.nn.Module:
    """Convert the model's block linears for ``arm`` (in place; returns the model)."""
    keep = LayerPolicy(last=bf16_tail(layers)) if arm.tail else LayerPolicy()
    return ft.convert(model, arm.build(), keep_bf16=keep, seed=seed, gemm="blas")
