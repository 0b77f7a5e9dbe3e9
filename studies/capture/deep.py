"""Make the deep capture for the layer-sensitivity study: a 12-linear-layer residual MLP LM on stdlib bytes.

Plain NumPy, float32, deterministic (seeded; no threads-dependent reductions
beyond BLAS matmuls).  The model reads the previous 8 bytes of Python source,
like :mod:`studies.capture.example`, but is deep enough to ask "which layers
are most sensitive?" across depth::

    emb 8×32 → in_proj 256→256
    5 × residual block:  h += blocks.i.fc2( GELU( blocks.i.fc1( rmsnorm(h) ) ) )   (256→256→256)
    rmsnorm → head 256→256 logits

i.e. 12 linear layers (in_proj, blocks.0.fc1 … blocks.4.fc2, head), trained
with Adam on the standard library's ``.py`` files.  After the last step it
records, for each linear layer in depth order, ``<layer>.weight``,
``<layer>.input`` and ``<layer>.grad_output`` (the gradient of the loss with
respect to the layer's output) for one batch of 128 tokens.  To keep the
committed file under 4 MB every tensor is stored as BF16 (the weights too:
the BF16 copy a mixed-precision run would quantize from).

    python -m studies.capture.deep [--out studies/data/deep_capture.safetensors]

:func:`load` reads the cache and regenerates it only when it is missing.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from fpsim.io import write_safetensors
from studies.capture.example import corpus, gelu, gelu_grad

CTX, EMB, D, VOCAB, BLOCKS = 8, 32, 256, 256, 5
CACHE = Path(__file__).resolve().parents[1] / "data" / "deep_capture.safetensors"
EPS = 1e-6


def layer_names() -> list[str]:
    """The 12 linear layers in depth order."""
    return ["in_proj"] + [f"blocks.{i}.fc{j}" for i in range(BLOCKS) for j in (1, 2)] + ["head"]


def _rms(x):
    r = np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    return x / r, r


def _rms_grad(dy, y, r):
    return (dy - y * (dy * y).mean(axis=1, keepdims=True)) / r


def train(steps: int = 150, batch: int = 128, seed: int = 0, log=print):
    """Train the model; return (capture dict in depth order, metadata)."""
    data = corpus(2_000_000)
    rng = np.random.default_rng(seed)
    f32 = np.float32
    p = {"emb": (rng.standard_normal((VOCAB, EMB)) * 0.1).astype(f32),
         "in_proj.weight": (rng.standard_normal((D, CTX * EMB)) / math.sqrt(CTX * EMB)).astype(f32)}
    for i in range(BLOCKS):
        p[f"blocks.{i}.fc1.weight"] = (rng.standard_normal((D, D)) / math.sqrt(D)).astype(f32)
        # residual branches start small (GPT-2 style 1/sqrt(2·blocks) scaling)
        p[f"blocks.{i}.fc2.weight"] = (rng.standard_normal((D, D)) / math.sqrt(D * 2 * BLOCKS)).astype(f32)
    p["head.weight"] = (rng.standard_normal((VOCAB, D)) / math.sqrt(D)).astype(f32)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    lr, b1, b2, eps = 2e-3, 0.9, 0.98, 1e-8
    losses, capture = [], {}
    for step in range(1, steps + 1):
        idx = rng.integers(0, data.size - CTX - 1, batch)
        ctx = data[idx[:, None] + np.arange(CTX)]
        tgt = data[idx + CTX]
        x0 = p["emb"][ctx].reshape(batch, CTX * EMB)
        h = x0 @ p["in_proj.weight"].T
        cache = []
        for i in range(BLOCKS):
            u, r = _rms(h)
            z = u @ p[f"blocks.{i}.fc1.weight"].T
            a = gelu(z)
            h = h + a @ p[f"blocks.{i}.fc2.weight"].T
            cache.append((u, r, z, a))
        hf, rf = _rms(h)
        logits = hf @ p["head.weight"].T
        zl = logits - logits.max(axis=1, keepdims=True)
        pr = np.exp(zl)
        pr /= pr.sum(axis=1, keepdims=True)
        losses.append(float(-np.log(pr[np.arange(batch), tgt] + 1e-12).mean()))
        dlog = pr
        dlog[np.arange(batch), tgt] -= 1
        dlog /= batch
        g = {"head.weight": dlog.T @ hf}
        rec = {"head": (p["head.weight"], hf, dlog)}
        dh = _rms_grad(dlog @ p["head.weight"], hf, rf)
        for i in reversed(range(BLOCKS)):
            u, r, z, a = cache[i]
            w1, w2 = p[f"blocks.{i}.fc1.weight"], p[f"blocks.{i}.fc2.weight"]
            g[f"blocks.{i}.fc2.weight"] = dh.T @ a
            rec[f"blocks.{i}.fc2"] = (w2, a, dh)
            dz = (dh @ w2) * gelu_grad(z)
            g[f"blocks.{i}.fc1.weight"] = dz.T @ u
            rec[f"blocks.{i}.fc1"] = (w1, u, dz)
            dh = dh + _rms_grad(dz @ w1, u, r)
        g["in_proj.weight"] = dh.T @ x0
        rec["in_proj"] = (p["in_proj.weight"], x0, dh)
        dx0 = (dh @ p["in_proj.weight"]).reshape(batch, CTX, EMB)
        g_emb = np.zeros_like(p["emb"])
        np.add.at(g_emb, ctx, dx0)
        g["emb"] = g_emb
        if step == steps:
            for name in layer_names():
                w, x, dy = rec[name]
                capture[f"{name}.weight"] = w.copy()
                capture[f"{name}.input"] = x.copy()
                capture[f"{name}.grad_output"] = dy.copy()
        for k in p:
            gk = g[k].astype(f32)
            m[k] = b1 * m[k] + (1 - b1) * gk
            v2[k] = b2 * v2[k] + (1 - b2) * gk * gk
            mh = m[k] / (1 - b1**step)
            vh = v2[k] / (1 - b2**step)
            p[k] = (p[k] - lr * mh / (np.sqrt(vh) + eps)).astype(f32)
        if step % 25 == 0:
            log(f"step {step}: loss {np.mean(losses[-50:]):.3f} nats/byte")
    meta = {"model": f"byte-level residual MLP LM (ctx {CTX}, emb {EMB}, width {D}, {BLOCKS} blocks, "
                     f"{len(layer_names())} linear layers, RMSNorm)",
            "corpus": "Python stdlib *.py", "steps": steps, "batch": batch, "seed": seed,
            "loss_first_50": f"{np.mean(losses[:50]):.4f}", "loss_last_50": f"{np.mean(losses[-50:]):.4f}",
            "layers": ",".join(layer_names())}
    return capture, meta


def write(path: Path = CACHE, **kw) -> Path:
    capture, meta = train(**kw)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in capture.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, tensors, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): {len(tensors)} tensors", flush=True)
    return path


def load(path: Path = CACHE) -> dict[str, np.ndarray]:
    """The cached deep capture as float32 arrays (regenerated with the defaults if missing)."""
    from fpsim.io import open_tensors

    if not path.exists():
        write(path)
    return {r.name: np.asarray(r.load(), dtype=np.float32) for r in open_tensors([str(path)])}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CACHE)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.out, steps=a.steps, batch=a.batch, seed=a.seed)


if __name__ == "__main__":
    main()
