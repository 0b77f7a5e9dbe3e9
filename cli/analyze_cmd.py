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
* 3 — nothing could be analysed (or an internal error: a bug in fpsim, one line);
* 4 — the analysis ran but writing ``--output`` or stdout failed (e.g. the disk is full);
  no partial or temporary file is left behind.

Output (``--format``): ``table`` (default; grouped by tensor, 160 columns), ``markdown``, ``csv``, ``json``.
A value that cannot be computed is "–" in the table and Markdown (the reasons listed below), an empty
CSV cell with the reason in the ``notes`` column, and ``null`` in JSON with the reason in the row's
``notes`` object; JSON numbers are never strings, shapes are lists of ints, ``-0.0`` is written ``0.0``
(:func:`fpsim.io.dumps`).  Errors are ``error: …`` lines on stderr, other messages ``note: …``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import sys
from pathlib import Path

import click

from .analyze_render import render, summarize

EXIT_PARTIAL, EXIT_USAGE, EXIT_NOTHING, EXIT_OUTPUT = 1, 2, 3, 4
_SERIAL_BYTES = 1 << 20



def _analyze_ref(ref, label: str, axis: int, kw: dict, role: str | None) -> tuple[list[dict], str | None]:
    """Analyse one tensor; (rows, None) or ([], "skip: …" / "error: …") — one line, never a traceback."""
    from fpsim._jit import get_num_threads, set_num_threads
    from fpsim.analysis import TensorSkipped, analyze_tensor, check_analyzable
    from fpsim.io import InputError
    from fpsim.ranking import role_guess

    key = f"{label}:{ref.name}"
    threads = get_num_threads()
    if ref.nbytes < _SERIAL_BYTES:  # waking a thread pool costs more than a small tensor's work: one thread
        set_num_threads(1)
    try:
        if ref.error is None:  # an unreadable tensor stays an error; a readable one not analysed by design is
            check_analyzable(key, ref.dtype, ref.shape)  # skipped whatever --axis says
        arr = ref.row_source(axis, label=key)  # rows along `axis`, read in chunks: bounded memory for every axis
        # the role comes from the tensor's own name, never from the file's (a file dx_*.npz holds weights too), except
        # for a Transformer Engine dump, whose one tensor is named by its file (<layer>_<tensor>_iter_N.pt)
        guessed, why = role_guess(ref.name, ref.source) if role is None else (role, "--role")
        rows = analyze_tensor(key, arr, role=guessed, **kw)
        for r in rows:
            r["role_from"] = why
        return rows, None
    except TensorSkipped as e:
        return [], f"note: skipped {e}"
    except InputError as e:
        return [], f"error: {e}"
    except MemoryError:
        return [], f"error: {key}: out of memory"
    except (ValueError, TypeError, OverflowError, ArithmeticError) as e:
        return [], f"error: {key}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - a defect on this tensor: one line naming it, the others still analysed
        return [], f"error: {key}: internal error, please report it ({type(e).__name__}: {_first_line(e)})"
    finally:
        set_num_threads(threads)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:100]


def _collect(futures, tasks, progress=None) -> list:
    """The results of the batches' futures, in order; a batch whose worker died or raised (a killed Dask worker, a
    worker process ended by the OOM killer) gives one error line per tensor, and the other batches are kept."""
    out = []
    for i, (fut, (src, items)) in enumerate(zip(futures, tasks)):
        try:
            out += fut.result()
        except Exception as e:  # noqa: BLE001 - whatever ended the worker: its tensors are reported, not the run
            why = f"not analysed: its worker failed ({type(e).__name__}: {_first_line(e)})"
            out += [([], f"error: {label}:{name}: {why}") for name, label, _ in items]
        if progress is not None:
            progress.advance(len(items))
            if i + 1 == len(tasks) or tasks[i + 1][0] != src:  # a file's batches are consecutive
                progress.step(items[0][1])
    return out


def _worker_threads(threads: int) -> None:
    """A --workers process's Numba threads: its share of the cores (N workers each running a pool of every core
    would oversubscribe them)."""
    from fpsim._jit import set_num_threads

    set_num_threads(threads)


def _task(source: str, items: list[tuple[str, str, str | None]], axis: int, kw: dict) -> list:
    """Analyse some tensors of one file (in this process, a worker process or on a Dask worker): the file is
    opened once for all of them.  ``items``: (tensor name, label, role override)."""
    from fpsim.io import InputError, open_file

    try:
        # read leniently: the parent already refused the malformed files that --lenient did not allow
        refs = {r.name: r for r in open_file(source, strict=False)[0]}
    except InputError as e:
        return [([], f"error: {e}")] * len(items)
    except MemoryError:
        return [([], f"error: {label}:{name}: out of memory opening the file") for name, label, _ in items]
    except Exception as e:  # noqa: BLE001 - a defect in the reader: the worker is fine, so say what it is (as serially)
        why = f"internal error opening the file, please report it ({type(e).__name__}: {_first_line(e)})"
        return [([], f"error: {label}:{name}: {why}") for name, label, _ in items]
    gone = "the file changed while it was being analysed"
    return [_analyze_ref(refs[name], label, axis, kw, role) if name in refs else ([], f"error: {source}:{name}: {gone}")
            for name, label, role in items]


_OUTPUT_FORMATS = ("table", "csv", "json", "markdown")


def legend_text(width: int = 110) -> str:
    """The column legend (fpsim.analysis.LEGEND) as wrapped "name  meaning" lines, for --help and the README."""
    import textwrap

    from fpsim.analysis import LEGEND

    pad = max(map(len, LEGEND)) + 2
    out = []
    for col, text in LEGEND.items():
        out += textwrap.wrap(text, width, initial_indent=col.ljust(pad), subsequent_indent=" " * pad,
                             break_on_hyphens=False)
    return "\n".join(out)


class _AnalyzeCommand(click.Command):
    """Adds the column legend after the options (imported when --help asks, so `fpsim` starts fast)."""

    def format_epilog(self, ctx, formatter):
        super().format_epilog(ctx, formatter)  # the exit codes
        formatter.write_paragraph()
        formatter.write_text(
            "Output: the table groups rows by tensor (a header line with its statistics and, once, the keep-BF16 "
            "conclusion). A value that cannot be computed is '–' in the table (the reasons are listed below it), "
            "null in JSON and an empty cell in CSV, with the reason in the row's 'notes'; JSON numbers are "
            "numbers or null, shapes lists of ints. Table headers abbreviate: bits = bits_per_element, max_abs_err = "
            "max_abs_error, flushed/saturated = *_frac, small_scale = small_scale_block_frac, dyn_range = "
            "block_dyn_range_log2, ±ci95 = bias_sr_ci95. The measured elements are the finite inputs whose "
            "decoded value is finite (SPEC §10). Columns:")
        formatter.write_paragraph()
        with formatter.indentation():
            for line in legend_text(max(60, formatter.width - formatter.current_indent - 2)).splitlines():
                formatter.write(" " * formatter.current_indent + line + "\n")


class _OutputFormat(click.Choice):
    """--format's choices, with a hint when a scheme is given (``--format nvfp4`` meant ``--formats``)."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            from fpsim.schemes import SCHEME_ALIASES

            if any(v.strip().lower() in SCHEME_ALIASES for v in str(value).split(",")):
                self.fail(f"{value!r} is a scheme, not an output format: did you mean --formats {value}? "
                          f"(--format chooses the output: {', '.join(_OUTPUT_FORMATS)})", param, ctx)
            raise


def _finite_ratio(ctx, param, value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise click.BadParameter(f"{value} is not a finite ratio ≥ 0")
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


def _convention(ctx, param, value: str | None) -> str | None:
    if value is None:
        return None
    from fpsim.conventions import names

    if value not in names():
        raise click.BadParameter(f"{value!r}: not a producer convention (one of {', '.join(names())})")
    return value


def _schemes(ctx, param, value: str) -> tuple[str, ...]:
    from fpsim.schemes import get_scheme

    names = tuple(s.strip() for s in value.split(",") if s.strip())
    if not names:
        raise click.BadParameter("no scheme given")
    out: list[str] = []
    for s in names:
        if s in _OUTPUT_FORMATS:
            raise click.BadParameter(f"{s!r} is an output format, not a scheme: did you mean --format {s}? "
                                     "(--formats takes schemes such as nvfp4,mxfp4)")
        try:
            name = get_scheme(s).name  # the scheme's own name: NVFP4 is nvfp4, in the rows and the ranking
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        if name not in out:  # named twice: analysed once (twice would rank every tensor twice)
            out.append(name)
    return tuple(out)


_HELP = __doc__[__doc__.index("Exit codes:"):__doc__.index("Output (``--format``)")].rstrip().replace(
    "\n\n", "\n\n\b\n", 1)


@click.command(cls=_AnalyzeCommand, epilog=_HELP)
@click.argument("paths", nargs=-1, required=True)
@click.option("--formats", "schemes", default="nvfp4,mxfp4,mxfp8_e4m3,fp8_e4m3,bf16", show_default=True,
              callback=_schemes, help="Comma-separated schemes to quantize with (see fpsim.schemes.SCHEMES); "
                                      "not the output format, which is --format.")
@click.option("--recipe", default=None,
              help="Also quantize each tensor as the recipe's GEMM copies (e.g. nvfp4_paper).")
@click.option("--select", "select", multiple=True, help="Only tensors whose name matches this glob (repeatable).")
@click.option("--role", "roles", multiple=True, metavar="GLOB=ROLE",
              help="Override the role guessed from tensor names: weight, activation, gradient (GEMM operands, "
                   "ranked) or norm, bias, rotary, embedding (never quantized by the recipe; repeatable).")
@click.option("--axis", default=-1, show_default=True, type=int,
              help="Axis the blocks run along (any rank; negative counts from the last).")
@click.option("--rht", "rht_d", default=0, show_default=True, type=click.IntRange(0, 1 << 16), callback=_power_of_two,
              help="Also analyse after a Hadamard transform of this size (a power of two).")
@click.option("--seeds", default=4, show_default=True, type=click.IntRange(0, 1000),
              help="SR draws for the gradient bias estimate (0 = off).")
@click.option("--keep-above", default=1.5, show_default=True, type=float, callback=_finite_ratio,
              help="Flag a tensor keep-BF16 when its bulk_rel_error under the first scheme exceeds this multiple of "
                   "the scheme's bulk_rel_error on a standard Gaussian (a fixed threshold: the flag does not depend "
                   "on the other tensors; fpsim.ranking).")
@click.option("--format", "out_format", type=_OutputFormat(_OUTPUT_FORMATS), default=None,
              help="Output format (default: table on stdout; from the --output extension otherwise); "
                   "the schemes are --formats.")
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Write the results to FILE atomically (never an input; a device or FIFO is written through).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 512),
              help="Processes analysing tensors in parallel.  The kernels of one process already use every core, "
                   "so workers share the cores: faster only where the work is serial (many small tensors).")
@click.option("--scheduler", default=None, callback=_scheduler_address,
              help="Address of a Dask distributed scheduler (tcp://host:port).")
@click.option("--reference", "reference", multiple=True, metavar="ORIGINAL",
              help="The unquantized checkpoint (file or folder) a quantized checkpoint was made from: adds each "
                   "quantized tensor's error against it and a conformance check (repeatable).")
@click.option("--convention", default=None, callback=_convention,
              help="With --reference: check an NVFP4 checkpoint's blocks against this producer convention "
                   "(fpsim.conventions, e.g. fpsim or te-cuda) instead of its producer's own.")
@click.option("--html", "html_page", default=None, metavar="REPORT.html",
              help="Also write one self-contained HTML page: the sortable table with its legend, and per tensor a "
                   "histogram of log2|x| with each format's representable window and its errors.")
@click.option("--lenient", is_flag=True,
              help="Read the tensors of a malformed file (one its format's reference reader refuses) whose bytes are "
                   "still unambiguous; the file's error line names the others. Aliased bytes are never analysed.")
@click.option("-q", "--quiet", is_flag=True, help="No notes or progress on stderr (error lines are still written).")
@click.option("-v", "--verbose", is_flag=True, help="A line per tensor on stderr.")
def analyze(paths, schemes, recipe, select, roles, axis, rht_d, seeds, keep_above, out_format, output, workers,
            scheduler, reference, convention, lenient, quiet, verbose, html_page):
    """Quantize every tensor of PATHS (.npz, .npy, .safetensors, .pt/.pth/.bin; files, directories, globs) under each
    format."""
    from fpsim.io import InputError, OutputError, atomic_write, check_writable, open_tensors, unique_labels
    from fpsim.io.errors import printable
    def note(msg: str) -> None:
        """stderr: "error: …" lines always, other notes unless --quiet; one line each, whatever the file and
        tensor names in them hold (a newline, a terminal escape, undecodable bytes)."""
        if not quiet or msg.startswith("error:"):
            click.echo(printable(msg), err=True)

    role_map = _check_options(recipe, roles, output, scheduler, workers)

    errors: list[str] = []
    files: list[str] = []
    try:
        refs = open_tensors(list(paths), on_error=errors.append, on_note=lambda n: note(f"note: skipped {n}"),
                            on_file=files.append, strict=not lenient)
    except InputError as e:
        note(f"error: {e}")
        sys.exit(EXIT_USAGE)
    originals = _originals(reference, note, files)
    inputs = sorted(set(files) | {p for p in paths if os.path.isfile(p)})  # unreadable inputs are inputs too
    if output:
        try:  # before any work: a bad --output fails in the first second, not after the analysis
            check_writable(output, inputs)
        except OutputError as e:
            note(f"error: --output {e}")
            sys.exit(EXIT_USAGE)
    from .analyze_html import check_html_path, write_report

    if html_page and (why := check_html_path(html_page, inputs, output)):
        note(f"error: --html {why}")
        sys.exit(EXIT_USAGE)
    if out_format is None:
        out_format = _format_from_suffix(output)
    for msg in errors:
        note(f"error: {msg}")
    failed = len(errors)

    all_groups, refs, aside = _split_quantized(refs, note)
    groups = [g for g in all_groups if not select or any(fnmatch.fnmatch(g.name, s) for s in select)]
    if groups:
        producers = sorted({f"{g.producer} {g.fmt.upper()}" for g in groups})
        note(f"note: {len(groups)} quantized tensor(s) ({', '.join(producers)}): each packed weight is read with its "
             f"scales and reported once below, not analysed as float tensors")
    seen = set()
    chosen = []
    for ref in refs:
        if select and not any(fnmatch.fnmatch(ref.name, g) for g in select):
            continue
        key = (os.path.realpath(ref.source), ref.name)
        if key in seen:
            note(f"note: skipped {ref.key}: duplicate (the same file and tensor given twice)")
            continue
        seen.add(key)
        if ref.note:
            note(f"note: {ref.note}")
        chosen.append(ref)
    labels = unique_labels([r.source for r in chosen] + [g.parts["codes"].source for g in all_groups])
    kw = {"schemes": schemes, "rht_d": rht_d, "seeds": seeds, "recipe": recipe}

    def role_of(ref):
        return next((r for g, r in role_map if fnmatch.fnmatch(ref.name, g)), None)

    _check_axis(chosen, axis)
    results = _run(chosen, labels, axis, kw, role_of, workers, scheduler, verbose, note, quiet)
    rows = []
    for (r, msg) in results:
        if msg:
            note(msg)
            failed += msg.startswith("error")
        rows += r
    from .analyze_checkpoint import quantized_records, quantized_summary, render_quantized

    if (reference or convention) and not groups:
        note("note: --reference/--convention: no quantized checkpoint tensor in the inputs, so they are not used")
    recs, qfailed = quantized_records(all_groups, groups, labels, originals, note, convention)
    failed += qfailed
    summary = summarize(rows, keep_above)
    extra = {"quantized": recs, "quantized_summary": dict(quantized_summary(recs), set_aside=aside,
                                                          reference=list(reference))} if groups else None
    # nothing analysed: the table says nothing on stdout (the error line on stderr says why); JSON and CSV stay
    # parseable
    text = render(rows, out_format, summary, extra) if rows or out_format in ("json", "csv") else ""
    section = render_quantized(recs, lead="\n" if rows else "") if out_format in ("table", "markdown") else ""
    text += f"\n```text\n{section.lstrip()}```\n" if section and out_format == "markdown" else section
    if groups and out_format == "csv":
        note("note: the quantized-tensor report is not in CSV (one row per tensor and scheme): use --format json "
             "or table")
    if output:
        try:
            atomic_write(output, text, inputs=inputs)
        except OutputError as e:
            note(f"error: --output {e}")
            sys.exit(EXIT_OUTPUT)
        note(f"wrote {len(rows)} rows{f' and {len(recs)} quantized tensors' if recs else ''} to {output}")
    else:
        click.echo(text, nl=False)
    if html_page and rows and not write_report(html_page, rows, chosen, labels, schemes, inputs, summary, note):
        sys.exit(EXIT_OUTPUT)
    if not rows and not recs:
        found = refs or groups or aside
        from fpsim.io import SUFFIXES

        why = ("no tensor in " + ", ".join(paths) + f" (supported files: {', '.join(SUFFIXES)})"
               if not found else f"no tensor matches --select {' '.join(select)}" if not chosen and not groups else
               "every tensor was skipped or unreadable (see above)")
        note(f"error: nothing could be analysed: {why}")
        sys.exit(EXIT_NOTHING)
    if failed:
        sys.exit(EXIT_PARTIAL)


def _check_options(recipe, roles, output, scheduler, workers) -> list[tuple[str, str]]:
    """Usage errors found before any work; the --role (glob, role) pairs."""
    from fpsim.ranking import ROLES
    from fpsim.recipe import get_recipe

    try:
        if recipe:
            get_recipe(recipe)
        role_map = []
        for spec in roles:
            glob_, _, role = spec.partition("=")
            if role not in ROLES:
                raise ValueError(f"--role {spec!r}: role must be one of {', '.join(ROLES)}")
            role_map.append((glob_, role))
        if output == "":
            raise ValueError("--output '': give a file name")
        if scheduler is not None and workers != 1:
            raise ValueError("give --workers or --scheduler, not both")
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    return role_map


#: --output's suffix → output format (no suffix, e.g. /dev/stdout: the table); any other suffix is refused
_SUFFIX_FORMATS = {"": "table", "txt": "table", "text": "table", "csv": "csv", "json": "json", "md": "markdown",
                   "markdown": "markdown"}


def _format_from_suffix(output: str | None) -> str:
    """The output format --output's suffix names; a suffix that names none (``out.xlsx``) is a usage error, never a
    text table written under a spreadsheet's name."""
    ext = Path(output).suffix.lower().lstrip(".") if output else ""
    if ext not in _SUFFIX_FORMATS:
        raise click.UsageError(f"--output {output}: cannot write a .{ext} file: fpsim analyze writes a text table "
                               "(.txt), CSV (.csv), JSON (.json) or Markdown (.md); give one of those or --format")
    return _SUFFIX_FORMATS[ext]


def _check_axis(chosen, axis: int) -> None:
    """One usage error when no selected tensor has ``--axis`` (not one error line per tensor)."""
    from fpsim.analysis import TensorSkipped, check_analyzable

    ranks = set()
    for r in chosen:
        try:
            if r.error is None:
                check_analyzable(r.key, r.dtype, r.shape)
                ranks.add(len(r.shape))
        except TensorSkipped:
            continue
    if ranks and not any(-n <= axis < n for n in ranks):
        have = ", ".join(map(str, sorted(ranks)))
        raise click.UsageError(f"--axis {axis}: no selected tensor has that axis (their ranks: {have}; axes run "
                               f"from -rank to rank - 1)")


def _originals(reference, note, files: list[str]) -> dict | None:
    """The --reference tensors by name (None without --reference); a path that names nothing exits 2."""
    if not reference:
        return None
    from fpsim.io import InputError

    from .analyze_checkpoint import reference_tensors

    try:
        return reference_tensors(reference, note, files.append)
    except InputError as e:
        note(f"error: --reference {e}")
        sys.exit(EXIT_USAGE)


def _split_quantized(chosen, note):
    """(quantized groups, the float tensors left to analyse, scale tensors set aside): the packed weights and
    scale tensors of compressed-tensors / ModelOpt checkpoints are reported once each, never analysed as floats."""
    from fpsim.io.checkpoints import find_quantized

    groups, rest, aside, notes = find_quantized(chosen)
    for n in notes:
        note(f"note: {n}")
    if aside:
        note(f"note: {len(aside)} other scale tensor(s) of the quantized checkpoint set aside (not weights), "
             f"e.g. {aside[0]}")
    return groups, rest, aside


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


def _stop_pool(ex) -> None:
    """End a process pool at once: its workers survive their own Ctrl-C (the pool hands the KeyboardInterrupt back as
    a result and runs the next queued batch), so they are terminated and the batches not started are cancelled."""
    for proc in list((getattr(ex, "_processes", None) or {}).values()):  # ProcessPoolExecutor's own map
        proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def _run(refs, labels, axis, kw, role_of, workers, scheduler, verbose, note, quiet=False):
    """Analyse tensors serially, on local processes, or on a Dask cluster; one result per tensor, in order, with
    a progress bar or a line per file on stderr (:mod:`fpsim_cli.progress`)."""
    from .progress import Progress, announce_compile

    announce_compile("about 30 s on 2 cores", quiet)
    prog = Progress(len(refs), desc="fpsim analyze", unit="tensor", steps=len({r.source for r in refs}), quiet=quiet)
    with prog:
        return _run_on(refs, labels, axis, kw, role_of, workers, scheduler, verbose, note, prog)


def _run_on(refs, labels, axis, kw, role_of, workers, scheduler, verbose, note, prog):
    """:func:`_run`'s work, reporting to ``prog`` (a :class:`~fpsim_cli.progress.Progress`)."""
    from fpsim.io.errors import printable

    if scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise click.UsageError("--scheduler needs dask.distributed (pip install 'fpsim[dask]')") from None
        _probe(scheduler)
        tasks = _batches(refs, labels, role_of, 8)
        try:
            with Client(scheduler, timeout=10) as client:
                return _collect([client.submit(_task, src, items, axis, kw, pure=False) for src, items in tasks], tasks,
                                prog)
        except (OSError, MemoryError, ValueError, TypeError) as e:
            raise click.UsageError(f"cannot use the Dask scheduler at {scheduler}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:100] if str(e) else ''}") from None
    if workers > 1 and len(refs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if workers > cores:
            note(f"note: --workers {workers} on {cores} CPU core(s): at most {cores} run at once, so more workers "
                 "only add processes to start (each imports fpsim and loads its compiled kernels)")
        else:
            note(f"note: --workers {workers}: one process's kernels already run on all {cores} CPU cores, so the "
                 f"workers share them ({max(1, cores // workers)} thread(s) each) and are faster only where the work "
                 "is serial (many small tensors, reading); each worker adds its start-up (reports/bench_analyze.md)")
        tasks = _batches(refs, labels, role_of, 2 * workers)
        threads = max(1, cores // workers)
        # spawn, not fork: a forked child inherits Numba's thread pool in an unusable state
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_threads, initargs=(threads,)) as ex:
            try:
                return _collect([ex.submit(_task, src, items, axis, kw) for src, items in tasks], tasks, prog)
            except KeyboardInterrupt:  # Ctrl-C: stop now (the pool's exit would run every queued batch first)
                _stop_pool(ex)
                raise
    out = []
    for i, ref in enumerate(refs):  # in this process: the refs opened above are used directly (one open per file)
        key = f"{labels[ref.source]}:{ref.name}"
        if verbose:  # through the bar where there is one, so the bar is drawn again below the line
            line = f"[{i + 1}/{len(refs)}] {key}"
            note(line) if prog.bar is None else prog.write(printable(line))
        prog.show(key)
        out.append(_analyze_ref(ref, labels[ref.source], axis, kw, role_of(ref)))
        prog.advance(1)
        if i + 1 == len(refs) or refs[i + 1].source != ref.source:
            prog.step(labels[ref.source])
    return out
