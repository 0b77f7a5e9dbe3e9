"""``fpsim analyze``: what each format and recipe component does to captured tensors.

Exit codes:

* 0 — every selected tensor was analysed (tensors skipped by design — non-float
  dtypes, 0-d, empty — and entries that are not tensors are noted on stderr);
* 1 — some files or tensors could not be read (corrupt, truncated, pickled,
  unsupported dtype, not a regular file); the results for the others are still
  printed / written;
* 2 — usage error: a bad option value, an unknown scheme or recipe, a path that
  names nothing (missing, broken link, link loop, unsearchable directory), an
  ``--output`` that may not or cannot be written (an input of the run, a
  directory, a missing or read-only directory) — all checked before any work;
* 3 — nothing could be analysed;
* 4 — the analysis ran but writing ``--output`` failed (e.g. the disk is full);
  no partial or temporary file is left behind.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import sys
from pathlib import Path

import click

EXIT_PARTIAL, EXIT_USAGE, EXIT_NOTHING, EXIT_OUTPUT = 1, 2, 3, 4
_SERIAL_BYTES = 1 << 20
_SHOW = ("tensor", "role", "scheme", "shape", "sqnr_db", "rel_error", "max_abs_error", "flushed_frac",
         "saturated_frac", "small_scale_block_frac", "block_dyn_range_log2", "kurtosis", "bias_rne", "bias_sr")


def _analyze_ref(ref, label: str, axis: int, kw: dict, role: str | None) -> tuple[list[dict], str | None]:
    """Analyse one tensor; (rows, None) or ([], "skip: …" / "error: …") — one line, never a traceback."""
    from fpsim._jit import get_num_threads, set_num_threads
    from fpsim.analysis import TensorSkipped, analyze_tensor, guess_role
    from fpsim.io import InputError

    key = f"{label}:{ref.name}"
    threads = get_num_threads()
    if ref.nbytes < _SERIAL_BYTES:  # waking a thread pool costs more than a small tensor's work: one thread
        set_num_threads(1)
    try:
        arr = ref.row_source(axis)  # rows along `axis`, read in chunks: bounded memory for every axis
        # the role comes from the tensor's own name, never from the file's (a file dx_*.npz holds weights too)
        return analyze_tensor(key, arr, role=role or guess_role(ref.name), **kw), None
    except TensorSkipped as e:
        return [], f"skip: {e}"
    except InputError as e:
        return [], f"error: {e}"
    except MemoryError:
        return [], f"error: {key}: out of memory"
    except (ValueError, TypeError, OverflowError, ArithmeticError) as e:
        return [], f"error: {key}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    finally:
        set_num_threads(threads)


def _task(source: str, items: list[tuple[str, str, str | None]], axis: int, kw: dict) -> list:
    """Analyse some tensors of one file (in this process, a worker process or on a Dask worker): the file is
    opened once for all of them.  ``items``: (tensor name, label, role override)."""
    from fpsim.io import InputError, open_file

    try:
        refs = {r.name: r for r in open_file(source)[0]}
    except InputError as e:
        return [([], f"error: {e}")] * len(items)
    gone = "the file changed while it was being analysed"
    return [_analyze_ref(refs[name], label, axis, kw, role) if name in refs else ([], f"error: {source}:{name}: {gone}")
            for name, label, role in items]


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


def _finite_fraction(ctx, param, value: float) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise click.BadParameter(f"{value} is not a fraction in [0, 1]")
    return value


def _power_of_two(ctx, param, value: int) -> int:
    if value and value & (value - 1):
        raise click.BadParameter(f"{value}: the Hadamard size must be 0 (off) or a power of two")
    return value


def _scheduler_address(ctx, param, value: str | None) -> str | None:
    """``tcp://host:port`` (or tls://, ucx://): checked here, not by dask, which guesses at anything."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    try:
        u = urlsplit(value)
        port = u.port
    except ValueError:
        port, u = None, None
    if u is not None and u.scheme == "inproc" and u.hostname:  # a scheduler in this process (LocalCluster)
        return value
    if u is None or u.scheme not in ("tcp", "tls", "ucx") or not u.hostname or port is None or u.path not in ("", "/"):
        raise click.BadParameter(f"{value!r} is not a Dask scheduler address (tcp://host:port)")
    return value


def _schemes(ctx, param, value: str) -> tuple[str, ...]:
    from fpsim.scaling import get_scheme

    names = tuple(s.strip() for s in value.split(",") if s.strip())
    if not names:
        raise click.BadParameter("no scheme given")
    for s in names:
        try:
            get_scheme(s)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return names


_HELP = __doc__[__doc__.index("Exit codes:"):].replace("\n\n", "\n\n\b\n", 1)


@click.command(epilog=_HELP)
@click.argument("paths", nargs=-1, required=True)
@click.option("--formats", "schemes", default="nvfp4,mxfp4,mxfp8_e4m3,fp8_e4m3,bf16", show_default=True,
              callback=_schemes, help="Comma-separated schemes (see fpsim.scaling.SCHEMES).")
@click.option("--recipe", default=None,
              help="Also quantize each tensor as the recipe's GEMM copies (e.g. nvfp4_paper).")
@click.option("--select", "select", multiple=True, help="Only tensors whose name matches this glob (repeatable).")
@click.option("--role", "roles", multiple=True, metavar="GLOB=ROLE",
              help="Override the role guessed from tensor names: weight, activation or gradient (repeatable).")
@click.option("--axis", default=-1, show_default=True, type=int,
              help="Axis the blocks run along (any rank; negative counts from the last).")
@click.option("--rht", "rht_d", default=0, show_default=True, type=click.IntRange(0, 1 << 16), callback=_power_of_two,
              help="Also analyse after a Hadamard transform of this size (a power of two).")
@click.option("--seeds", default=4, show_default=True, type=click.IntRange(0, 1000),
              help="SR draws for the gradient bias estimate (0 = off).")
@click.option("--keep-frac", default=0.16, show_default=True, type=float, callback=_finite_fraction,
              help="Fraction in [0, 1] of highest-error tensors flagged to keep in BF16 (the paper keeps ≈ 16 %).")
@click.option("--format", "out_format", type=click.Choice(["table", "csv", "json", "markdown"]), default=None,
              help="Output format (default: table on stdout; from the --output extension otherwise).")
@click.option("--output", default=None, metavar="FILE",
              help="Write the results to FILE atomically (never an input; a device or FIFO is written through).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 512),
              help="Processes analysing tensors in parallel.")
@click.option("--scheduler", default=None, callback=_scheduler_address,
              help="Address of a Dask distributed scheduler (tcp://host:port).")
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="A line per tensor on stderr.")
def analyze(paths, schemes, recipe, select, roles, axis, rht_d, seeds, keep_frac, out_format, output, workers,
            scheduler, quiet, verbose):
    """Quantize every tensor of PATHS (.npz, .safetensors, .pt; files, directories, globs) under each format."""
    from fpsim.io import InputError, OutputError, atomic_write, check_writable, open_tensors, unique_labels
    from fpsim.recipe import get_recipe

    def note(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    try:
        if recipe:
            get_recipe(recipe)
        role_map = []
        for spec in roles:
            glob_, _, role = spec.partition("=")
            if role not in ("weight", "activation", "gradient"):
                raise ValueError(f"--role {spec!r}: role must be weight, activation or gradient")
            role_map.append((glob_, role))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if out_format is None:
        ext = Path(output).suffix.lower().lstrip(".") if output else ""
        out_format = {"csv": "csv", "json": "json", "md": "markdown"}.get(ext, "table")

    errors: list[str] = []
    files: list[str] = []
    try:
        refs = open_tensors(list(paths), on_error=errors.append, on_note=note, on_file=files.append)
    except InputError as e:
        click.echo(f"fpsim analyze: {e}", err=True)
        sys.exit(EXIT_USAGE)
    inputs = sorted(set(files) | {p for p in paths if os.path.isfile(p)})  # unreadable inputs are inputs too
    if output:
        try:  # before any work: a bad --output fails in the first second, not after the analysis
            check_writable(output, inputs)
        except OutputError as e:
            click.echo(f"fpsim analyze: --output {e}", err=True)
            sys.exit(EXIT_USAGE)
    for msg in errors:
        note(f"error: {msg}")
    failed = len(errors)

    seen = set()
    chosen = []
    for ref in refs:
        if select and not any(fnmatch.fnmatch(ref.name, g) for g in select):
            continue
        key = (os.path.realpath(ref.source), ref.name)
        if key in seen:
            note(f"skip: {ref.key}: duplicate (the same file and tensor given twice)")
            continue
        seen.add(key)
        if ref.note:
            note(f"note: {ref.note}")
        chosen.append(ref)
    labels = unique_labels(r.source for r in chosen)
    kw = {"schemes": schemes, "rht_d": rht_d, "seeds": seeds, "recipe": recipe}

    def role_of(ref):
        return next((r for g, r in role_map if fnmatch.fnmatch(ref.name, g)), None)

    results = _run(chosen, labels, axis, kw, role_of, workers, scheduler, verbose, note)
    rows = []
    for (r, msg) in results:
        if msg:
            note(msg)
            failed += msg.startswith("error")
        rows += r
    summary = _summarize(rows, keep_frac)
    text = render(rows, out_format, summary)
    if output:
        try:
            atomic_write(output, text, inputs=inputs)
        except OutputError as e:
            click.echo(f"fpsim analyze: --output {e}", err=True)
            sys.exit(EXIT_OUTPUT)
        note(f"wrote {len(rows)} rows to {output}")
    else:
        click.echo(text, nl=False)
    if not rows:
        note("fpsim analyze: nothing could be analysed")
        sys.exit(EXIT_NOTHING)
    if failed:
        sys.exit(EXIT_PARTIAL)


def _batches(refs, labels, role_of, n_batches: int) -> list[tuple[str, list]]:
    """(file, [(name, label, role)]) batches: each file's tensors in up to ``n_batches`` runs (one open each)."""
    by_file: dict[str, list] = {}
    for r in refs:
        by_file.setdefault(r.source, []).append((r.name, labels[r.source], role_of(r)))
    out = []
    for src, items in by_file.items():
        k = max(1, min(n_batches, len(items)))
        step = -(-len(items) // k)
        out += [(src, items[i : i + step]) for i in range(0, len(items), step)]
    return out


def _probe(address: str) -> None:
    """Refuse a service that is not a Dask scheduler before dask reads its bytes as frame lengths (it would
    try to allocate exabytes): one that refuses the connection or speaks first (a banner) is not one."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(address)
    if u.scheme != "tcp":
        return
    try:
        with socket.create_connection((u.hostname, u.port), timeout=5) as s:
            s.settimeout(0.3)
            try:
                banner = s.recv(1)
            except TimeoutError:
                return  # silent until spoken to, as a Dask scheduler is
    except OSError as e:
        raise click.UsageError(f"cannot reach the Dask scheduler at {address}: {e.strerror or e}") from None
    if banner:
        raise click.UsageError(f"{address} is not a Dask scheduler (it sent data before the handshake)")


def _run(refs, labels, axis, kw, role_of, workers, scheduler, verbose, note):
    """Analyse tensors serially, on local processes, or on a Dask cluster; one result per tensor, in order."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise click.UsageError("--scheduler needs dask.distributed (pip install 'fpsim[dask]')") from None
        _probe(scheduler)
        tasks = _batches(refs, labels, role_of, 8)
        try:
            with Client(scheduler, timeout=10) as client:
                futures = [client.submit(_task, src, items, axis, kw, pure=False) for src, items in tasks]
                return [x for batch in client.gather(futures) for x in batch]
        except (OSError, MemoryError, ValueError, TypeError) as e:
            raise click.UsageError(f"cannot use the Dask scheduler at {scheduler}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:100] if str(e) else ''}") from None
    if workers > 1 and len(refs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        tasks = _batches(refs, labels, role_of, 2 * workers)
        # spawn, not fork: a forked child inherits Numba's thread pool in an unusable state
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            done = ex.map(_task, *zip(*[(src, items, axis, kw) for src, items in tasks]))
            return [x for batch in done for x in batch]
    out = []
    show = verbose or (sys.stderr.isatty() and len(refs) > 1)
    for i, ref in enumerate(refs):  # in this process: the refs opened above are used directly (one open per file)
        if show:
            note(f"[{i + 1}/{len(refs)}] {labels[ref.source]}:{ref.name}")
        out.append(_analyze_ref(ref, labels[ref.source], axis, kw, role_of(ref)))
    return out
