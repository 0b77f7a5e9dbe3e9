"""``fpsim analyze``: what each format and recipe component does to captured tensors.

Exit codes:

* 0 — every selected tensor was analysed (tensors skipped by design — non-float
  dtypes, 0-d, empty — are noted on stderr and do not count as failures);
* 1 — some files or tensors could not be read (corrupt, truncated, pickled);
  the results for the others are still printed / written;
* 2 — usage error (bad option, unknown scheme or recipe, missing path);
* 3 — nothing could be analysed.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import sys
from pathlib import Path

import click

EXIT_PARTIAL, EXIT_USAGE, EXIT_NOTHING = 1, 2, 3
_SHOW = ("tensor", "role", "scheme", "shape", "sqnr_db", "rel_error", "max_abs_error", "flushed_frac",
         "saturated_frac", "small_scale_block_frac", "block_dyn_range_log2", "kurtosis", "bias_rne", "bias_sr")


def _task(source: str, name: str, axis: int, kw: dict) -> tuple[list[dict], str | None]:
    """Analyse one tensor (runs in this process, a worker process, or on a Dask worker)."""
    import numpy as np

    from fpsim.analysis import TensorSkipped, analyze_tensor
    from fpsim.io import InputError, open_tensors

    try:
        ref = next(r for r in open_tensors([source]) if r.name == name)
        if axis in (-1, len(ref.shape) - 1):
            arr = ref.row_source()  # read in row chunks where the format allows: bounded memory
        else:
            arr = np.moveaxis(ref.load(), axis, -1)
        return analyze_tensor(f"{Path(source).name}:{name}", arr, **kw), None
    except TensorSkipped as e:
        return [], f"skip: {e}"
    except (InputError, ValueError) as e:
        return [], f"error: {e}"
    except MemoryError:
        return [], f"error: {source}:{name}: out of memory"


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.4g}"
    return str(v)


def _jsonable(v):
    # JSON has no NaN/Infinity: they are written as null (nan) and as strings ("inf"/"-inf").
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def render(rows: list[dict], fmt: str, summary: dict) -> str:
    """rows as table | csv | json | markdown."""
    import pandas as pd

    from fpsim.analysis import METRIC_COLUMNS

    df = pd.DataFrame(rows, columns=list(METRIC_COLUMNS) + ["keep_bf16"])
    if fmt == "csv":
        return df.to_csv(index=False, na_rep="nan")
    if fmt == "json":
        recs = [{k: _jsonable(v) for k, v in r.items()} for r in df.to_dict(orient="records")]
        summ = dict(summary, ranking=[[t, _jsonable(e)] for t, e in summary["ranking"]])
        return json.dumps({"rows": recs, "summary": summ}, indent=1, allow_nan=False) + "\n"
    cols = [c for c in _SHOW] + ["keep_bf16"]
    view = df[cols].map(_fmt) if len(df) else df[cols]
    if fmt == "markdown":
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in view.itertuples(index=False)]
        lines += ["", "**Ranking by relative error** (" + summary["ranking_scheme"] + "): "
                  + ", ".join(f"{t} ({_fmt(e)})" for t, e in summary["ranking"])]
        return "\n".join(lines) + "\n"
    text = view.to_string(index=False) if len(df) else "(no rows)"
    text += "\n\nranking by relative error under " + summary["ranking_scheme"] + ":\n"
    text += "\n".join(f"  {i + 1:>3}. {t}  {_fmt(e)}{'  [keep BF16]' if t in summary['keep_bf16'] else ''}"
                      for i, (t, e) in enumerate(summary["ranking"]))
    return text + "\n"


def _summarize(rows: list[dict], keep_frac: float) -> dict:
    """Rank tensors by relative error under the first scheme; flag the worst ``keep_frac`` (recipe: ≈ 16 %)."""
    if not rows:
        return {"ranking_scheme": "", "ranking": [], "keep_bf16": []}
    first = rows[0]["scheme"]
    errs = [(r["tensor"], r["rel_error"]) for r in rows if r["scheme"] == first]
    errs.sort(key=lambda te: -te[1] if not math.isnan(te[1]) else math.inf)
    n_keep = math.ceil(keep_frac * len(errs)) if errs else 0
    keep = [t for t, _ in errs[:n_keep]]
    for r in rows:
        r["keep_bf16"] = r["tensor"] in keep
    return {"ranking_scheme": first, "ranking": errs, "keep_bf16": keep}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--formats", "schemes", default="nvfp4,mxfp4,mxfp8_e4m3,fp8_e4m3,bf16", show_default=True,
              help="Comma-separated schemes (see fpsim.schemes.SCHEMES).")
@click.option("--recipe", default=None,
              help="Also quantize each tensor as the recipe's GEMM copies (e.g. nvfp4_paper).")
@click.option("--select", "select", multiple=True, help="Only tensors whose name matches this glob (repeatable).")
@click.option("--role", "roles", multiple=True, metavar="GLOB=ROLE",
              help="Override the role guessed from names: weight, activation or gradient (repeatable).")
@click.option("--axis", default=-1, show_default=True, help="Axis the blocks run along.")
@click.option("--rht", "rht_d", default=0, show_default=True,
              help="Also analyse after a Hadamard transform of this size.")
@click.option("--seeds", default=4, show_default=True, help="SR draws for the gradient bias estimate (0 = off).")
@click.option("--keep-frac", default=0.16, show_default=True,
              help="Fraction of highest-error tensors flagged to keep in BF16 (the paper keeps ≈ 16 %).")
@click.option("--format", "out_format", type=click.Choice(["table", "csv", "json", "markdown"]), default=None,
              help="Output format (default: table on stdout; from the --output extension otherwise).")
@click.option("--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the results to this file (atomically) instead of stdout.")
@click.option("--workers", default=1, show_default=True, help="Processes analysing tensors in parallel.")
@click.option("--scheduler", default=None, help="Address of a Dask distributed scheduler (tcp://host:port).")
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="A line per tensor on stderr.")
def analyze(paths, schemes, recipe, select, roles, axis, rht_d, seeds, keep_frac, out_format, output, workers,
            scheduler, quiet, verbose):
    """Quantize every tensor of PATHS (.npz, .safetensors, .pt; files, directories, globs) under each format."""
    from fpsim.io import InputError, open_tensors
    from fpsim.recipe import get_recipe
    from fpsim.schemes import get_scheme

    def note(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    try:
        scheme_list = tuple(s.strip() for s in schemes.split(",") if s.strip())
        for s in scheme_list:
            get_scheme(s)
        if recipe:
            get_recipe(recipe)
        role_map = []
        for spec in roles:
            glob_, _, role = spec.partition("=")
            if role not in ("weight", "activation", "gradient"):
                raise ValueError(f"--role {spec!r}: role must be weight, activation or gradient")
            role_map.append((glob_, role))
        if rht_d and (rht_d < 1 or rht_d & (rht_d - 1)):
            raise ValueError(f"--rht {rht_d}: the Hadamard size must be a power of two")
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if out_format is None:
        ext = Path(output).suffix.lower().lstrip(".") if output else ""
        out_format = {"csv": "csv", "json": "json", "md": "markdown"}.get(ext, "table")

    failed = 0
    errors: list[str] = []
    try:
        refs = open_tensors(list(paths), on_error=errors.append)
    except InputError as e:
        click.echo(f"fpsim analyze: {e}", err=True)
        sys.exit(EXIT_USAGE)
    for msg in errors:
        note(f"error: {msg}")
    failed += len(errors)

    seen = set()
    tasks = []
    for ref in refs:
        if select and not any(fnmatch.fnmatch(ref.name, g) for g in select):
            continue
        key = (os.path.realpath(ref.source), ref.name)
        if key in seen:
            note(f"skip: {ref.key}: duplicate (the same file and tensor given twice)")
            continue
        seen.add(key)
        role = next((r for g, r in role_map if fnmatch.fnmatch(ref.name, g)), None)
        kw = {"schemes": scheme_list, "role": role, "rht_d": rht_d, "seeds": seeds, "recipe": recipe}
        tasks.append((ref.source, ref.name, axis, kw))

    results = _run(tasks, workers, scheduler, verbose, note)
    rows = []
    for (r, msg) in results:
        if msg:
            note(msg)
            failed += msg.startswith("error")
        rows += r
    summary = _summarize(rows, keep_frac)
    text = render(rows, out_format, summary)
    if output:
        _atomic_write(Path(output), text)
        note(f"wrote {len(rows)} rows to {output}")
    else:
        click.echo(text, nl=False)
    if not rows:
        note("fpsim analyze: nothing could be analysed")
        sys.exit(EXIT_NOTHING)
    if failed:
        sys.exit(EXIT_PARTIAL)


def _run(tasks, workers, scheduler, verbose, note):
    """Analyse tasks serially, on local processes, or on a Dask cluster; results in task order."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise click.UsageError("--scheduler needs dask.distributed (pip install 'fpsim[dask]')") from None
        try:
            with Client(scheduler, timeout=10) as client:
                futures = client.map(_task, *zip(*tasks), pure=False) if tasks else []
                return client.gather(futures)
        except OSError as e:
            raise click.UsageError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    if workers > 1 and len(tasks) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: a forked child inherits Numba's thread pool in an unusable state
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            return list(ex.map(_task, *zip(*tasks)))
    out = []
    show = verbose or (sys.stderr.isatty() and len(tasks) > 1)
    for i, t in enumerate(tasks):
        if show:
            note(f"[{i + 1}/{len(tasks)}] {Path(t[0]).name}:{t[1]}")
        out.append(_task(*t))
    return out
