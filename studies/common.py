"""Shared plumbing of the studies: arguments, data, deterministic CSVs, figures, Markdown sections.

Every study is a module ``studies/report/<name>.py`` with ``main(argv=None) -> Path``
that writes into ``<out>/<name>/``: ``<name>.csv`` (tidy, written with a fixed
float format so re-runs are byte-identical), ``*.png`` figures (Agg backend,
no timestamps in the metadata) and ``section.md`` (claim from the paper, what
fpsim measured, verdict).  ``studies/run_all.py`` runs them all and assembles
``reports/index.md`` and ``reports/index.html``.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
# Figures are byte-identical for a given matplotlib/FreeType: the bundled DejaVu fonts (never a system font that
# differs between machines), fixed hash salt, no metadata; data rounded to the CSVs' 6 digits (see save_fig).
matplotlib.rcParams.update({"font.family": "DejaVu Sans", "mathtext.fontset": "dejavusans",
                            "svg.hashsalt": "fpsim", "path.simplify": False})
import matplotlib.font_manager as _fm  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

# Only matplotlib's own fonts: a machine with another DejaVu Sans (or an Arial for glyph fallback) installed
# would otherwise draw other pixels.
_BUNDLED = str(Path(matplotlib.get_data_path()) / "fonts")
_fm.fontManager.ttflist = [f for f in _fm.fontManager.ttflist if f.fname.startswith(_BUNDLED)]
_fm.fontManager.afmlist = [f for f in _fm.fontManager.afmlist if f.fname.startswith(_BUNDLED)]
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
CAPTURE = ROOT / "studies" / "data" / "tinylm_capture.safetensors"
DISTRIBUTIONS = ("gaussian", "laplace", "student_t3", "channel_outliers")


def parse_args(name: str, doc: str, argv=None) -> argparse.Namespace:
    """``--quick`` (CI: small sizes), ``--out`` (default reports/), ``--seed``."""
    ap = argparse.ArgumentParser(prog=f"studies/{name}.py", description=(doc or "").strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for CI (< a few seconds per study)")
    ap.add_argument("--out", type=Path, default=REPORTS, help="reports directory (default: reports/)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.dir = args.out / name
    args.dir.mkdir(parents=True, exist_ok=True)
    return args


@contextlib.contextmanager
def numba_threads(n: int):
    """Run fpsim's parallel kernels on ``n`` threads inside a study (restored afterwards).

    The studies quantize many small tensors: on a loaded 2-core machine the thread pool's wake-ups and
    the oversubscription with BLAS threads cost more than the work.  Results do not depend on the count.
    """
    import numba

    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(old)


def progress(msg: str) -> None:
    print(msg, flush=True)


def synthetic(kind: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """float32 data of one of :data:`DISTRIBUTIONS` (unit scale), deterministic in ``seed``.

    ``channel_outliers``: Gaussian with 1 % of the columns (input channels) scaled by 50, the
    activation-outlier pattern of LLMs.
    """
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        x = rng.standard_normal(shape)
    elif kind == "laplace":
        x = rng.laplace(size=shape)
    elif kind == "student_t3":
        x = rng.standard_t(3, size=shape)
    elif kind == "channel_outliers":
        x = rng.standard_normal(shape)
        cols = rng.choice(shape[1], max(1, shape[1] // 100), replace=False)
        x[:, cols] *= 50
    else:
        raise ValueError(f"unknown distribution {kind!r}")
    return x.astype(np.float32)


#: Label prefix of the bundled capture's tensors in the studies' CSVs and tables (``tinylm:fc1.weight``).
TINYLM = "tinylm:"
#: What the bundled capture is, for the sections' text.
TINYLM_TEXT = ("a toy byte-level MLP language model (8-byte context, three linear layers of width 256) after 400 "
               "Adam steps on Python stdlib sources (`studies/capture/example.py`)")


def tinylm_tensors() -> dict[str, np.ndarray]:
    """The bundled capture (studies/data/tinylm_capture.safetensors: weights, layer inputs and output gradients of
    fc1, fc2 and head of :data:`TINYLM_TEXT`'s model) as float32 arrays, in file order."""
    from fpsim.io import open_tensors

    return {r.name: np.asarray(r.load(), dtype=np.float32) for r in open_tensors([str(CAPTURE)])}


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """Tidy CSV with a fixed float format (byte-identical on re-runs), written atomically."""
    from fpsim.io import atomic_write

    atomic_write(path, df.to_csv(index=False, float_format="%.6g", lineterminator="\n"))


def _sig6(a) -> np.ndarray:
    """Values rounded to 6 significant digits by Python's correctly rounded formatting (not by log10/pow, whose
    last bits depend on the CPU's SIMD library)."""
    a = np.asarray(a, dtype=np.float64)
    return np.array([float(f"{v:.6g}") for v in a.reshape(-1)]).reshape(a.shape)


def _round_artists(fig) -> None:
    """Round plotted lines, bars and markers to 6 significant digits, the precision of the CSVs: results that
    differ in the last bits between machines (BLAS, SIMD sums) then draw the same pixels."""
    for ax in fig.axes:
        for ln in ax.get_lines():
            x, y = ln.get_data(orig=True)
            if np.asarray(x).dtype.kind in "fiu" and np.asarray(y).dtype.kind in "fiu":
                ln.set_data(_sig6(x), _sig6(y))
        for p in ax.patches:
            if isinstance(p, matplotlib.patches.Rectangle):
                p.set_bounds(*(float(v) for v in _sig6([p.get_x(), p.get_y(), p.get_width(), p.get_height()])))
        for c in ax.collections:
            off = c.get_offsets()
            if len(off):
                c.set_offsets(_sig6(off))


def save_fig(fig, path: Path) -> None:
    """PNG without timestamps or version metadata, data rounded as :func:`_round_artists`, written atomically;
    closes the figure."""
    from fpsim.io import atomic_write

    _round_artists(fig)
    fig.tight_layout()
    try:  # into a temporary file, renamed when complete: a failed render never leaves a half-written PNG
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, metadata={"Software": None}))
    finally:
        plt.close(fig)


def write_section(args, title: str, claim: str, measured: str, verdict: str, figures: list[str],
                  tables: list[str] | None = None) -> Path:
    """``section.md``: the paper's claim, fpsim's numbers, the verdict, figures (paths relative to reports/)."""
    lines = [f"## {title}", "", f"**Paper's claim.** {claim}", "", f"**Measured by fpsim.** {measured}", "",
             f"**Verdict.** {verdict}", ""]
    for t in tables or []:
        lines += [t, ""]
    for f in figures:
        lines += [f"![{title}]({args.dir.name}/{f})", ""]
    from fpsim.io import atomic_write

    path = args.dir / "section.md"
    atomic_write(path, "\n".join(lines))
    return path


def md_table(df: pd.DataFrame, floatfmt: str = ".3g", formats: dict[str, str] | None = None) -> str:
    """A small DataFrame as a Markdown table (no extra dependency).

    Floats use ``floatfmt``, or ``formats[column]`` where given.  A missing value (NaN, None) is an empty cell,
    never the text "nan": the table's caption says why it is missing.
    """
    cols = list(df.columns)
    fmts = [(formats or {}).get(c, floatfmt) for c in cols]
    out = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_cell(v, f) for v, f in zip(row, fmts)) + " |")
    return "\n".join(out)


def _cell(v, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    return format(v, floatfmt) if isinstance(v, float) else str(v)


def sqnr_db(x: np.ndarray, xq: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    err = float(np.sum((x64 - xq) ** 2))
    return 10 * np.log10(float(np.sum(x64 * x64)) / err) if err > 0 else float("inf")


def rel_error(x: np.ndarray, xq: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(np.linalg.norm(x64 - xq) / np.linalg.norm(x64))
