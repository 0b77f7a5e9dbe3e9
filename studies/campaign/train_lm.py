"""A small GPT-style LM pretrained with its linear layers under fpsim's emulated recipes: the 400-step runs of
studies/data/training/ that came before the paired-seed campaign (study 8 renders both).

Byte-level decoder (RMSNorm, RoPE, causal attention, GELU MLP, untied LM head) trained on Python's
standard-library sources with AdamW and a warmup-stable-decay (WSD) schedule.  Every linear layer of
the transformer blocks is a :class:`fpsim.torch.Linear`: its six operand copies are quantized exactly as
docs/spec.md §8 assigns them (Fprop X 1×16, W 16×16; Dgrad dY with SR, Wᵀ; Wgrad dYᵀ with RHT16 + SR, Xᵀ with
RHT16), SR bits and RHT signs from (seed, layer, step, role) as in :func:`fpsim.linear`, and multiplied by
``--gemm`` (``blas``: exact BF16/FP32 values on tensor cores; ``fp32``: the bit-defined model).  The runs
committed in studies/data/training/ were made before this API, by an autograd function of this script with
its own seed derivation (same copies, FP32 products of the dequantized values).
Embedding, attention products, norms, LM head and optimizer stay in FP32.  The recipe's BF16 layer set
is scaled to this depth (the paper: first 2 + last 8 of 62 blocks ≈ 16 %; here the last block of 6).

    python -m studies.campaign.train_lm --runs bf16,nvfp4 --steps 400 --out studies/data/training   (on a GPU)
    python -m studies.campaign.train_lm --tiny --runs nvfp4 --steps 3                               (CPU smoke test)

Writes ``<out>/<run>.csv`` (step, tokens, lr, train_loss, val_loss) per run and ``<out>/runs.json``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import fpsim.torch as ft
from fpsim.io import atomic_write, dumps
from fpsim.recipe import LayerPolicy, get_recipe
from studies.capture.example import corpus

GEMM = "blas"  # set from --gemm before the model is built

RUNS = {
    "bf16": ("bf16", ()),
    "fp8_blockwise": ("fp8_blockwise", ()),
    "nvfp4": ("nvfp4_paper", ()),
    "nvfp4_all_layers": ("nvfp4_paper", ("bf16_layers",)),
    "nvfp4_no_sr": ("nvfp4_paper", ("sr",)),
    "nvfp4_no_rht": ("nvfp4_paper", ("rht",)),
    "nvfp4_no_2d": ("nvfp4_paper", ("2d",)),
    "mxfp4": ("mxfp4", ()),
}


def QLinear(d_in: int, d_out: int, name: str) -> ft.Linear:
    """A block linear: :class:`fpsim.torch.Linear` (no bias), N(0, 1/d_in) weights; its recipe is set per run."""
    lin = ft.Linear(d_in, d_out, bias=False, recipe=None, name=name, seed=1234, gemm=GEMM)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(d_out, d_in) / math.sqrt(d_in))
    return lin


def rope(x, base=10000.0):
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Block(torch.nn.Module):
    def __init__(self, d, heads, i):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.qkv = QLinear(d, 3 * d, f"blocks.{i}.qkv")
        self.proj = QLinear(d, d, f"blocks.{i}.proj")
        self.fc1 = QLinear(d, 4 * d, f"blocks.{i}.fc1")
        self.fc2 = QLinear(4 * d, d, f"blocks.{i}.fc2")

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers, d, heads):
        super().__init__()
        self.emb = torch.nn.Embedding(256, d)
        self.blocks = torch.nn.ModuleList([Block(d, heads, i) for i in range(layers)])
        self.norm = torch.nn.RMSNorm(d)
        self.head = torch.nn.Linear(d, 256, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def wsd(step, total, peak, warm=0.05, decay=0.2):
    """Warmup-stable-decay: linear warmup, constant, linear decay to 0 over the last ``decay`` fraction."""
    w, dstart = max(1, int(warm * total)), int((1 - decay) * total)
    if step < w:
        return peak * (step + 1) / w
    if step < dstart:
        return peak
    return peak * max(0.0, (total - step) / max(1, total - dstart))


def train(run, args, data, val, device):
    recipe_name, without = RUNS[run]
    recipe = get_recipe(recipe_name).without(*without) if without else get_recipe(recipe_name)
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.d, args.heads).to(device)
    qlin = [m for m in model.modules() if isinstance(m, ft.Linear)]
    names = [f"blocks.{i}" for i in range(args.layers)]
    # The paper keeps the first 2 and last 8 of its 12B model's 62 blocks in BF16 (16 %); scaled to this depth
    # that is the last ~16 % of the blocks (1 of 6).  "bf16_layers" ablated: every block quantized.
    scaled = LayerPolicy(first=0, last=max(1, round(0.16 * args.layers)))
    policy = (scaled if recipe.layers != LayerPolicy() else LayerPolicy()).precision_map(names)
    for m in qlin:
        block = ".".join(m.name.split(".")[:2])
        m.recipe = get_recipe("bf16") if policy[block] == "bf16" else recipe
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    rows = []
    t0 = time.time()
    for step in range(args.steps):
        for pg in opt.param_groups:
            pg["lr"] = wsd(step, args.steps, args.lr)
        idx = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=g)
        xb = torch.stack([data[i : i + args.seq] for i in idx]).to(device)
        yb = torch.stack([data[i + 1 : i + args.seq + 1] for i in idx]).to(device)
        ft.set_step(model, step)
        loss = F.cross_entropy(model(xb).reshape(-1, 256), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"step": step + 1, "tokens": (step + 1) * args.batch * args.seq, "lr": pg["lr"],
               "train_loss": float(loss.detach())}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model.eval()
            with torch.no_grad():
                vl = []
                for j in range(0, min(val.numel() - args.seq - 1, args.eval_tokens), args.seq * args.batch):
                    starts = torch.arange(j, j + args.seq * args.batch, args.seq)
                    starts = starts[starts < val.numel() - args.seq - 1]
                    xv = torch.stack([val[i : i + args.seq] for i in starts]).to(device)
                    yv = torch.stack([val[i + 1 : i + args.seq + 1] for i in starts]).to(device)
                    vl.append(float(F.cross_entropy(model(xv).reshape(-1, 256), yv.reshape(-1))))
            row["val_loss"] = float(np.mean(vl))
            model.train()
            print(f"[{run}] step {step + 1} train {float(loss.detach()):.4f} val {row['val_loss']:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        rows.append(row)
    return rows, time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="bf16,nvfp4")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-tokens", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: 2 layers, d 64, seq 32, batch 4")
    ap.add_argument("--gemm", choices=ft.GEMMS, default="blas", help="fpsim.torch.Linear's GEMM path")
    ap.add_argument("--out", type=Path, default=Path("reports/training"))
    args = ap.parse_args(argv)
    global GEMM
    GEMM = args.gemm
    if args.tiny:
        args.layers, args.d, args.heads, args.seq, args.batch = 2, 64, 2, 32, 4
        args.eval_every, args.eval_tokens = 1, 512
    device = "cuda" if torch.cuda.is_available() else "cpu"
    raw = torch.from_numpy(corpus(3_000_000, recursive=True).astype(np.int64))
    data, val = raw[: int(0.93 * raw.numel())], raw[int(0.93 * raw.numel()) :]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "runs": {}}
    for run in args.runs.split(","):
        rows, secs = train(run, args, data, val, device)
        import pandas as pd

        atomic_write(args.out / f"{run}.csv", pd.DataFrame(rows).to_csv(index=False, float_format="%.6g"))
        meta["runs"][run] = {"seconds": round(secs, 1), "recipe": RUNS[run][0], "without": list(RUNS[run][1]),
                             "final_val_loss": rows[-1].get("val_loss")}
        atomic_write(args.out / "runs.json", dumps(meta))


if __name__ == "__main__":
    main()
