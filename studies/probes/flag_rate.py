"""How often the probe's as-built check flags a correct model, and how often it finds three planted defects.

    python -m studies.probes.flag_rate [--seeds 100] [--plant-seeds 20] [--out studies/data/probes/flag_rate.json]

The model: a small byte-level LM (embedding, two pre-LayerNorm MLP blocks of width 32, head) whose four block
linears are :class:`fpsim.torch.Linear` layers under ``nvfp4_paper`` (no BF16 layers); each seed draws its own
weights, its own 6 batches of 64 tokens and its own random draws (4 per layer and GEMM, as-built and emulated).  The
planted defects replace one operand copy of one layer, each modelled on a bug reported against NVFP4 kernels:

* ``sr-zeroes-small-wgrad``: stochastic rounding that sends small magnitudes to zero: Wgrad's dY copy loses its
  ±0.5 codes (``blocks.0.down``);
* ``wgrad-scales-swizzled``: Wgrad's Xᵀ copy decoded with the neighbouring block's scale (``blocks.1.up``);
* ``dgrad-wrong-axis-scales``: Dgrad's Wᵀ copy decoded with the forward copy's 1×16 scales of W, under the recipe
  without 16×16 tiles (``blocks.0.up``).

A seed's run "flags" when any (layer, GEMM) is flagged; a planted defect is "found" when exactly its layer and GEMM
are flagged and nothing else.  ``tests/test_torch_probe.py`` runs seed 0 of each plant and 20 correct seeds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fpsim.io import atomic_write, dumps
from fpsim.recipe import get_recipe
from fpsim.torch import nn as fnn
from fpsim.torch.probes import next_token_loss, probe
from fpsim.torch.qlinear import QLinearFn, _copy, _Ops, _values, reference_ops

OUT = Path(__file__).resolve().parents[1] / "data" / "probes" / "flag_rate.json"
D, VOCAB = 32, 48


class Block(torch.nn.Module):
    def __init__(self, d=D):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, tok):
        x = self.embed(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batches(n: int, seed: int, tokens: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, tokens // 2), generator=g) for _ in range(n)]


def _block_amax(v: torch.Tensor, block: int = 16) -> torch.Tensor:
    """Per element, the max |v| of its 1×``block`` block along the last axis."""
    r, c = v.shape
    return v.abs().reshape(r, c // block, block).amax(-1).repeat_interleave(block, dim=-1)


def zero_small_wgrad_dy(q, t):
    """SR that rounds small magnitudes to zero: the copy loses its ±0.5 codes (|v| ≤ amax/12 per block)."""
    v = _values(q)
    return torch.where(v.abs() <= _block_amax(v) / 12 * 1.0001, torch.zeros_like(v), v)


def swizzled_wgrad_x_scales(q, t):
    """The copy decoded with the block scales of the neighbouring block: each block's values scaled by (the amax of
    block j+1) / (its own)."""
    v = _values(q)
    a = _block_amax(v)
    r, c = v.shape
    swz = a.reshape(r, c // 16, 16).roll(1, dims=1).reshape(r, c)
    return torch.where(a > 0, v * swz / a, v)


def wrong_axis_dgrad_w(q, t):
    """Dgrad's Wᵀ copy (blocks along out) decoded with the forward copy's 1×16 scales of W (blocks along in):
    element (i, j) of Wᵀ scaled by amax_W[j, i//16] / amax_Wᵀ[i, j//16]."""
    v = _values(q)
    own = _block_amax(v)
    fwd = _block_amax(t.t().contiguous()).t()
    return torch.where(own > 0, v * fwd / own, v)


#: name → (layer, role, bug, recipe)
PLANTS = {
    "sr-zeroes-small-wgrad": ("blocks.0.down", "wgrad_dy", zero_small_wgrad_dy, "nvfp4_paper"),
    "wgrad-scales-swizzled": ("blocks.1.up", "wgrad_x", swizzled_wgrad_x_scales, "nvfp4_paper"),
    "dgrad-wrong-axis-scales": ("blocks.0.up", "dgrad_w", wrong_axis_dgrad_w,
                                get_recipe("nvfp4_paper").without("2d")),
}


class PlantedLinear(fnn.Linear):
    """fpsim's Linear with one role's copy replaced by ``bug(copy, source)`` (a plain float32 tensor)."""

    bug_role, bug = None, None

    def forward(self, x):
        base = reference_ops(self.gemm)

        def copy(t, policy, *, role, **kw):
            q = _copy(t, policy, role=role, **kw)
            return self.bug(q, t.to(torch.float32)) if role == self.bug_role else q

        ops = _Ops(copy, base.mm, base.values, None)
        x2d = x.reshape(-1, x.shape[-1])
        y = QLinearFn.apply(x2d, self.weight, (self.recipe, self.seed, self.name, self.step, ops, torch.float32))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def model(seed: int, recipe, plant: str | None = None) -> TinyLM:
    """The seed's model converted to ``recipe`` (every block linear), with ``plant``'s defect in its layer."""
    torch.manual_seed(seed)
    m = TinyLM()
    fnn.convert(m, recipe, keep_bf16=[], seed=seed)
    if plant is not None:
        layer, role, bug, _ = PLANTS[plant]
        parent, attr = layer.rsplit(".", 1)
        old = m.get_submodule(layer)
        new = PlantedLinear.from_linear(old, recipe=old.recipe, name=old.name, seed=old.seed)
        new.bug_role, new.bug = role, bug
        setattr(m.get_submodule(parent), attr, new)
    return m


def flagged(m, seed: int, recipe):
    """The probe's as-built result for ``m`` (6 batches of 64 tokens, 4 draws) and its flagged (layer, GEMM)s."""
    res = probe(m, batches(6, 100 + seed, tokens=64), recipe, variants={}, aa=False, modes=("isolated",), draws=4,
                loss_fn=next_token_loss, seed=seed)
    return res, {(r.layer, r.gemm) for r in res.flagged().itertuples()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="correct models (seeds 0..N-1)")
    ap.add_argument("--plant-seeds", type=int, default=20, help="seeds per planted defect")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rec = get_recipe("nvfp4_paper")
    false = [s for s in range(a.seeds) if flagged(model(s, rec), s, rec)[1]]
    plants = {}
    for name, (layer, role, _, recipe) in PLANTS.items():
        want = {(layer, role.split("_")[0])}
        got = [flagged(model(s, recipe, name), s, recipe)[1] for s in range(a.plant_seeds)]
        plants[name] = {"layer": layer, "gemm": role.split("_")[0], "seeds": a.plant_seeds,
                        "found_exactly": sum(g == want for g in got), "missed": sum(not (g & want) for g in got),
                        "also_flagged_elsewhere": sum(bool(g - want) for g in got)}
    rec_out = {"correct_seeds": a.seeds, "correct_flagged": len(false), "correct_flagged_seeds": false,
               "false_flag_rate": len(false) / a.seeds, "plants": plants,
               "seconds": round(time.perf_counter() - t0, 1), "threads": 1}
    atomic_write(a.out, dumps(rec_out))
    print(dumps(rec_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
