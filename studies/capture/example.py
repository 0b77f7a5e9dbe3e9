"""Make the bundled example capture: a tiny byte-level language model trained on Python's stdlib sources.

A real (small) training run in plain NumPy, float32, deterministic: an MLP
language model reads the previous 8 bytes of Python source (embedding 8×32 →
fc1 256→256 → GELU → fc2 256→256 → GELU → head 256→256 logits), trained with
Adam on the standard library's ``.py`` files for a few hundred steps.  After
the last step it records, for each of its three linear layers, the weight,
the layer input and the gradient of the layer output — what ``fpsim capture``
records from a PyTorch model — into a safetensors file that ``fpsim analyze``
reads (weights float32, activations and gradients BF16, as a real capture).

    python -m studies.capture.example --out studies/data/tinylm_capture.safetensors
"""

from __future__ import annotations

import argparse
import math
import sysconfig
from pathlib import Path

import ml_dtypes
import numpy as np

from fpsim.io import write_safetensors

CTX, EMB, HID, VOCAB = 8, 32, 256, 256


def corpus(max_bytes: int, recursive: bool = False) -> np.ndarray:
    """Bytes of the stdlib's .py files (top level, or every package with ``recursive``), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for p in sorted(root.rglob("*.py") if recursive else root.glob("*.py")):
        b = p.read_bytes()
        chunks.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def gelu_grad(x):
    t = np.tanh(0.7978845608 * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * x * x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("studies/data/tinylm_capture.safetensors"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    data = corpus(2_000_000)
    rng = np.random.default_rng(args.seed)
    f32 = np.float32
    params = {
        "emb": (rng.standard_normal((VOCAB, EMB)) * 0.1).astype(f32),
        "fc1.weight": (rng.standard_normal((HID, CTX * EMB)) / math.sqrt(CTX * EMB)).astype(f32),
        "fc2.weight": (rng.standard_normal((HID, HID)) / math.sqrt(HID)).astype(f32),
        "head.weight": (rng.standard_normal((VOCAB, HID)) / math.sqrt(HID)).astype(f32),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    lr, b1, b2, eps = 2e-3, 0.9, 0.98, 1e-8
    losses = []
    for step in range(1, args.steps + 1):
        idx = rng.integers(0, data.size - CTX - 1, args.batch)
        ctx = data[idx[:, None] + np.arange(CTX)]
        tgt = data[idx + CTX]
        x1 = params["emb"][ctx].reshape(args.batch, CTX * EMB)
        h1 = x1 @ params["fc1.weight"].T
        a1 = gelu(h1)
        h2 = a1 @ params["fc2.weight"].T
        a2 = gelu(h2)
        logits = a2 @ params["head.weight"].T
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(args.batch), tgt] + 1e-12).mean())
        losses.append(loss)
        dlogits = p
        dlogits[np.arange(args.batch), tgt] -= 1
        dlogits /= args.batch
        grads = {"head.weight": dlogits.T @ a2}
        da2 = dlogits @ params["head.weight"]
        dh2 = da2 * gelu_grad(h2)
        grads["fc2.weight"] = dh2.T @ a1
        da1 = dh2 @ params["fc2.weight"]
        dh1 = da1 * gelu_grad(h1)
        grads["fc1.weight"] = dh1.T @ x1
        dx1 = (dh1 @ params["fc1.weight"]).reshape(args.batch, CTX, EMB)
        g_emb = np.zeros_like(params["emb"])
        np.add.at(g_emb, ctx, dx1)
        grads["emb"] = g_emb
        if step == args.steps:  # the capture: what each linear layer's three GEMMs consume
            capture = {
                "fc1.weight": params["fc1.weight"], "fc1.input": x1, "fc1.grad_output": dh1,
                "fc2.weight": params["fc2.weight"], "fc2.input": a1, "fc2.grad_output": dh2,
                "head.weight": params["head.weight"], "head.input": a2, "head.grad_output": dlogits,
            }
        for k in params:
            g = grads[k].astype(f32)
            m[k] = b1 * m[k] + (1 - b1) * g
            v2[k] = b2 * v2[k] + (1 - b2) * g * g
            mh = m[k] / (1 - b1**step)
            vh = v2[k] / (1 - b2**step)
            params[k] = (params[k] - lr * mh / (np.sqrt(vh) + eps)).astype(f32)
        if step % 100 == 0:
            print(f"step {step}: loss {np.mean(losses[-100:]):.3f} nats/byte")

    tensors = {k: (v.astype(f32) if k.endswith(".weight") else v.astype(ml_dtypes.bfloat16))
               for k, v in capture.items()}
    meta = {"model": "byte-level MLP LM (ctx 8, emb 32, hidden 256)", "corpus": "Python stdlib *.py",
            "steps": args.steps, "batch": args.batch, "seed": args.seed,
            "loss_first_100": f"{np.mean(losses[:100]):.4f}", "loss_last_100": f"{np.mean(losses[-100:]):.4f}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(args.out, tensors, meta)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {', '.join(tensors)}")


if __name__ == "__main__":
    main()
