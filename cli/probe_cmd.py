"""``fpsim probe``: what each component of a recipe does to each GEMM of a model on disk (:func:`fpsim.torch.probe`).

Exit codes:

* 0 — the probe ran; its summary is on stdout (and in ``--output``, the figures in ``--plot``);
* 2 — usage error or bad input, one line and nothing run: a MODEL that is missing, a pickle, or no model fpsim
  knows; a text or token file that is missing, not UTF-8, not a ``.npy`` integer array (never unpickled) or too
  short; a token count per linear call (``--batch-size`` × ``--seq-len``) that is not a multiple of 16; an unknown
  recipe or ``--without`` component; a ``--layers`` glob that matches no layer; an ``--output`` that is not .json or
  .csv or cannot be written; a ``--plot`` that is not a writable directory;
* 3 — an internal error (a bug in fpsim: one line);
* 4 — ``--output`` or a figure could not be written after the run (e.g. a full disk).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
import time
from pathlib import Path

import click

from .probe_render import plot_components, summary_csv, summary_text

EXIT_USAGE, EXIT_OUTPUT = 2, 4
#: The token count of every linear call must be a multiple of this (NVFP4's 16-point Wgrad RHT and 16×16 tiles).
TOKEN_MULTIPLE = 16


class ProbeInputError(Exception):
    """Bad input: one line, exit 2."""


def _fail(msg: str, code: int = EXIT_USAGE):
    from fpsim.io.errors import printable

    click.echo(f"error: {printable(msg)}", err=True)
    sys.exit(code)


def _check_outputs(output: str | None, plot_dir: str | None, inputs: list[str]) -> None:
    from fpsim.io import OutputError, check_writable

    if output is not None:
        if Path(output).suffix.lower() not in (".json", ".csv"):
            raise ProbeInputError(f"--output {output}: give a .json (everything) or .csv (the summary table) file")
        try:
            check_writable(output, inputs)
        except OutputError as e:
            raise ProbeInputError(f"--output {e}") from None
    if plot_dir is not None:
        p = Path(plot_dir)
        if p.exists() and not p.is_dir():
            raise ProbeInputError(f"--plot {p}: not a directory")
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ProbeInputError(f"--plot {p}: cannot create it ({e.strerror or type(e).__name__})") from None
        if not os.access(p, os.W_OK | os.X_OK):
            raise ProbeInputError(f"--plot {p}: not writable")


def _keep_rule(spec: str | None, blocks: int):
    from fpsim.recipe import LayerPolicy
    from fpsim.torch.models import scaled_keep_bf16

    if spec is None:
        return scaled_keep_bf16(blocks)
    parts = [s.strip() for s in spec.split(",")]
    if len(parts) != 2 or not all(s.isdigit() for s in parts):
        raise ProbeInputError(f"--keep-bf16 {spec!r}: give FIRST,LAST (the blocks kept in BF16 at each end, e.g. 1,4)")
    return LayerPolicy(first=int(parts[0]), last=int(parts[1]))


def _variants(recipe: str, keep, without: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, dict]:
    """(the recipe's name, the probe's variants): BF16, the recipe, its ablations (``--without``: those named, or
    ``none``; default every one it has), four-over-six for a two-level E2M1 recipe, and ``--variant`` ones."""
    from fpsim.recipe import get_recipe
    from fpsim.torch.probes import default_variants

    try:
        rec = get_recipe(recipe)
        extras = {}
        for spec in extra:
            name, sep, r = spec.partition("=")
            if not sep or not name.strip() or not r.strip():
                raise ValueError(f"--variant {spec!r}: give NAME=RECIPE (e.g. mxfp4=mxfp4)")
            extras[name.strip()] = get_recipe(r.strip())
    except ValueError as e:
        raise ProbeInputError(str(e).splitlines()[0]) from None
    dv = default_variants(dataclasses.replace(rec, layers=keep))
    have = {k[len("without "):].replace(" ", "_"): k for k in dv if k.startswith("without ")}
    names = [c for spec in without for c in spec.split(",") if c.strip()]
    if names == ["none"]:
        chosen = set()
    elif names:
        bad = [c for c in names if c not in have]
        if bad:
            why = " (--keep-bf16 keeps no block)" if bad[0] == "bf16_layers" else ""
            raise ProbeInputError(f"--without {bad[0]}: recipe {rec.name} has no such component{why}; it has: "
                                  f"{', '.join(have) or 'none'} (or --without none)")
        chosen = {have[c] for c in names}
    else:
        chosen = set(have.values())
    out = {k: v for k, v in dv.items() if not k.startswith("without ") or k in chosen}
    clash = [k for k in extras if k in out or k == "recipe A/A"]
    if clash:
        raise ProbeInputError(f"--variant {clash[0]}: the name of a variant the probe runs already")
    return rec.name, out | extras


def _token_stream(loaded, text_file: str | None, tokens_file: str | None):
    import numpy as np

    if (text_file is None) == (tokens_file is None):
        raise ProbeInputError("give the batches' source: --text FILE (UTF-8 text) or --tokens FILE.npy (token ids)")
    if text_file is not None:
        p = Path(text_file)
        if loaded.tokenizer is None:
            raise ProbeInputError(f"{loaded.path}: no tokenizer (tokenizer.json) beside the model: give --tokens")
        try:
            text = p.read_bytes().decode("utf-8")
        except OSError as e:
            raise ProbeInputError(f"--text {p}: cannot read ({e.strerror or type(e).__name__})") from None
        except UnicodeDecodeError as e:
            raise ProbeInputError(f"--text {p}: not UTF-8 text (byte {e.start})") from None
        return np.asarray(loaded.tokenizer(text), dtype=np.int64), f"{p} (UTF-8 text)"
    p = Path(tokens_file)
    try:
        arr = np.load(p, allow_pickle=False)
    except OSError as e:
        raise ProbeInputError(f"--tokens {p}: cannot read ({e.strerror or type(e).__name__})") from None
    except (ValueError, EOFError) as e:  # a pickle, an object array, a truncated or foreign file
        raise ProbeInputError(f"--tokens {p}: not a .npy array of token ids ({str(e).splitlines()[0]})") from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise ProbeInputError(f"--tokens {p}: an .npz archive; give one .npy array of token ids")
    if arr.dtype.kind not in "iu":
        raise ProbeInputError(f"--tokens {p}: holds {arr.dtype} values, not integer token ids")
    return arr.reshape(-1).astype(np.int64), f"{p} (token ids)"


def _measured(model, layers: tuple[str, ...]) -> list[str]:
    from fpsim.torch.nn import HEAD_PATTERNS, assignment

    names = list(dict.fromkeys(s.name for s in assignment(model, "bf16", keep_bf16=[], skip=HEAD_PATTERNS)))
    got = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in layers)]
    if not got:
        raise ProbeInputError(f"--layers {' '.join(layers)}: no layer matches; layers: {', '.join(names[:8])}"
                              f"{' …' if len(names) > 8 else ''}")
    return got


class ProbeProgress:
    """The probe's progress messages on stderr (:mod:`fpsim_cli.progress`): a tqdm bar on a terminal (or with
    --progress), a line per pass on a file or pipe, nothing with -q; one unit per FP32 reference, isolated layer and
    end-to-end pass (the messages announce each unit as it starts)."""

    def __init__(self, total: int, force: bool, quiet: bool):
        from .progress import Progress

        self.prog = Progress(total, desc="fpsim probe", unit="pass", steps=total, step_units="passes", quiet=quiet,
                             mode="bar" if force and not quiet else None)
        self.last: str | None = None

    def __call__(self, msg: str) -> None:
        if self.last is not None:
            self._done()
        self.last = msg
        bar = self.prog.bar
        if bar is not None and bar.n >= bar.total:
            bar.total = bar.n + 1
        self.prog.show(msg)

    def _done(self) -> None:
        if self.prog.done >= self.prog.total:  # the unit count is an estimate: never past 100 %
            self.prog.total = self.prog.steps = self.prog.done + 1
        self.prog.advance(1)
        self.prog.step(self.last)

    def close(self) -> None:
        if self.last is not None:
            self._done()
        self.prog.close()


def probe_progress(model, layers: tuple[str, ...], n_batches: int, variants: dict, modes: tuple[str, ...],
                   draws: int, val: bool, quiet: bool = False) -> ProbeProgress:
    """The progress of :func:`fpsim.torch.probes.probe` on ``model`` (pass it as ``progress=``; close it after),
    for scripts that call the probe themselves (studies/probes/measure.py)."""
    return ProbeProgress(_units(n_batches, len(_measured(model, layers)), variants, modes, draws, val), False, quiet)


def _units(n_batches: int, n_layers: int, variants: dict, modes: tuple[str, ...], draws: int, val: bool) -> int:
    from fpsim.torch.probes import draws_random_bits

    e2e = min(draws, 4)
    passes = sum(e2e if draws_random_bits(r) else 1 for r in variants.values()) \
        + (e2e if draws_random_bits(variants["recipe"]) else 1)
    return n_batches * (1 + (n_layers if "isolated" in modes else 0) + (passes if "end_to_end" in modes or val else 0))


_HELP = __doc__[__doc__.index("Exit codes:"):].rstrip().replace("\n\n", "\n\n\b\n", 1)


@click.command(epilog=_HELP)
@click.argument("model_path", metavar="MODEL")
@click.option("--arch", type=click.Choice(["auto", "gguf", "hf", "campaign"]), default="auto", show_default=True,
              help="The model's kind (auto: from the file's content).")
@click.option("--text", "text_file", metavar="FILE", help="UTF-8 text, tokenized by the model's own tokenizer.")
@click.option("--tokens", "tokens_file", metavar="FILE.npy", help="Token ids: an integer .npy array (never a pickle).")
@click.option("--batches", "n_batches", default=4, show_default=True, type=click.IntRange(1, 100_000),
              help="Probe batches (the intervals are over batches: give at least 2).")
@click.option("--seq-len", default=128, show_default=True, type=click.IntRange(1, 1 << 20), help="Tokens a sequence.")
@click.option("--batch-size", default=4, show_default=True, type=click.IntRange(1, 1 << 20),
              help="Sequences a batch (BERT: pairs, so even and at least 4).")
@click.option("--val-batches", default=2, show_default=True, type=click.IntRange(0, 100_000),
              help="Held-out batches after the probe batches, for the one-step loss change (0: none).")
@click.option("--recipe", default="nvfp4_paper", show_default=True, help="The recipe whose components are probed.")
@click.option("--without", multiple=True, metavar="C",
              help="An ablation to run (repeatable; sr, rht, 2d, bf16_layers, tensor_scale, or none); "
                   "default every component the recipe has.")
@click.option("--variant", "extra", multiple=True, metavar="NAME=RECIPE",
              help="Another variant, compared with the recipe (repeatable; e.g. mxfp4=mxfp4).")
@click.option("--draws", default=8, show_default=True, type=click.IntRange(1, 10_000),
              help="Random draws (SR bits, RHT signs) per batch in isolated mode; end to end min(draws, 4).")
@click.option("--layers", multiple=True, metavar="GLOB", help="Layers measured (repeatable glob; default all).")
@click.option("--keep-bf16", metavar="FIRST,LAST",
              help="Blocks kept in BF16 at each end (default: the paper's 2 and 8 of 62 scaled to the model).")
@click.option("--mode", type=click.Choice(["isolated", "end_to_end", "both"]), default="both", show_default=True,
              help="isolated: each GEMM alone on the FP32 pass's operands; end_to_end: the whole model under the "
                   "variant.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the draws.")
@click.option("-o", "--output", metavar="FILE", help="Write the results: .json (everything), .csv (the summary).")
@click.option("--plot", "plot_dir", metavar="DIR", help="Write a figure per component (PNG) into DIR.")
@click.option("--progress", is_flag=True, help="A progress bar on stderr even when it is not a terminal.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no notes on stderr (error lines are still written).")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="Threads of torch and of fpsim's Numba kernels (default: theirs; on a small model 1 can be "
                   "many times faster: the two thread pools contend).")
def probe(model_path, arch, text_file, tokens_file, n_batches, seq_len, batch_size, val_batches, recipe, without,
          extra, draws, layers, keep_bf16, mode, seed, output, plot_dir, progress, threads, quiet):
    """Probe each component of a recipe on each GEMM of each linear layer of MODEL.

    MODEL: a GGUF file (a Llama, e.g. SmolLM2-135M's), a Hugging Face BERT checkpoint directory (config.json,
    model.safetensors, tokenizer.json), or a checkpoint folder of studies/campaign (<out>/ckpt/<run>). Batches are
    consecutive windows of --text (tokenized by the model's tokenizer; the campaign's model reads bytes) or
    --tokens; --val-batches held-out batches follow them. Against the model's FP32 pass it measures, per layer and
    GEMM (Fprop, Dgrad, Wgrad), the error of BF16, the recipe, the recipe without each component, four-over-six and
    an A/A copy of the recipe: isolated (that GEMM alone) and end to end (the whole model under the variant), and the
    one-step change of the held-out loss (SGD, AdamW). Stdout: each component's paired effect with its 95 % CI,
    Holm's p and the effect detectable at 80 % power, then the flags.
    """
    try:
        _run(**locals())
    except ProbeInputError as e:
        _fail(str(e))


def _run(model_path, arch, text_file, tokens_file, n_batches, seq_len, batch_size, val_batches, recipe, without,
         extra, draws, layers, keep_bf16, mode, seed, output, plot_dir, progress, threads, quiet):
    inputs = [p for p in (model_path, text_file, tokens_file) if p]
    _check_outputs(output, plot_dir, inputs)
    if batch_size * seq_len % TOKEN_MULTIPLE:
        raise ProbeInputError(f"--batch-size {batch_size} × --seq-len {seq_len} = {batch_size * seq_len} tokens per "
                              f"linear call: must be a multiple of {TOKEN_MULTIPLE} (the Wgrad GEMM quantizes "
                              f"along the tokens, in NVFP4's blocks of 16 after a 16-point RHT)")
    for opt, f in (("--text", text_file), ("--tokens", tokens_file)):
        if f is not None and not Path(f).is_file():
            raise ProbeInputError(f"{opt} {f}: no such file")
    try:
        import torch

        from fpsim.torch import models as M
    except ImportError as e:
        raise ProbeInputError(f"fpsim probe needs torch (pip install 'fpsim[torch]'): {e}") from None
    try:
        loaded = M.load(model_path, None if arch == "auto" else arch)
    except M.ModelError as e:
        raise ProbeInputError(str(e).splitlines()[0]) from None
    except ImportError as e:
        raise ProbeInputError(f"{model_path}: reading it needs {e.name} (pip install 'fpsim[llm]')") from None
    if loaded.max_len is not None and seq_len > loaded.max_len:
        raise ProbeInputError(f"--seq-len {seq_len}: longer than the model's context of {loaded.max_len} tokens")
    keep = _keep_rule(keep_bf16, loaded.blocks)
    rec_name, variants = _variants(recipe, keep, without, extra)
    ids, source = _token_stream(loaded, text_file, tokens_file)
    try:
        all_batches = loaded.batches(ids, n_batches + val_batches, batch_size, seq_len)
    except ValueError as e:
        why = f" (--batches {n_batches} + --val-batches {val_batches})" if "fewer than" in str(e) else ""
        raise ProbeInputError(f"{source.split(' (')[0]}: {e}{why}") from None
    pats = tuple(p.strip() for spec in layers for p in spec.split(",") if p.strip()) or ("*",)
    measured = _measured(loaded.model, pats)
    from fpsim._jit import get_num_threads, set_num_threads

    saved = (torch.get_num_threads(), get_num_threads())
    modes = ("isolated", "end_to_end") if mode == "both" else (mode,)
    bar = ProbeProgress(_units(n_batches, len(measured), variants, modes, draws, val_batches > 0), progress, quiet)
    t0 = time.perf_counter()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
            set_num_threads(threads)
        res = _probe(loaded, all_batches, n_batches, variants, rec_name, keep, draws, pats, modes, seed, bar)
    finally:
        bar.close()
        torch.set_num_threads(saved[0])
        set_num_threads(saved[1])
    wall = time.perf_counter() - t0
    res.meta.update(model={"path": str(loaded.path), "arch": loaded.arch, "blocks": loaded.blocks,
                           "linear_layers": len(_measured(loaded.model, ("*",))), **loaded.info},
                    data={"source": source, "tokens_available": int(ids.size), "batch_size": batch_size,
                          "seq_len": seq_len, "val_batches": val_batches,
                          "framing": "[CLS] window [SEP], pairs of adjacent windows" if loaded.frame else None},
                    keep_bf16={"first": keep.first, "last": keep.last}, layer_globs=list(pats))
    _write(res, output, plot_dir, inputs, quiet)
    click.echo(summary_text(res, wall), nl=False)


def _probe(loaded, all_batches, n_batches, variants, rec_name, keep, draws, pats, modes, seed, bar):
    from fpsim.torch.probes import probe as run_probe

    try:
        return run_probe(loaded.model, all_batches[:n_batches], rec_name, variants=variants, draws=draws,
                         loss_fn=loaded.loss_fn, val_batches=all_batches[n_batches:] or None, layers=pats,
                         modes=modes, seed=seed, keep_bf16=keep, adam_state=loaded.adam_state, progress=bar)
    except (ValueError, TypeError) as e:  # the probe's refusals of its input (a layer called twice, …)
        raise ProbeInputError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def _write(res, output, plot_dir, inputs, quiet: bool = False) -> None:
    from fpsim.io import OutputError, atomic_write, dumps

    try:
        if output is not None:
            text = dumps(res.to_dict()) if Path(output).suffix.lower() == ".json" else summary_csv(res)
            atomic_write(output, text, inputs=inputs)
            if not quiet:
                click.echo(f"note: wrote {output}", err=True)
        if plot_dir is not None:
            files = plot_components(res.components, Path(plot_dir))
            if not quiet:
                click.echo(f"note: wrote {len(files)} figures to {plot_dir}", err=True)
    except OutputError as e:
        _fail(str(e), EXIT_OUTPUT)
