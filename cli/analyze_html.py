"""``fpsim analyze --html REPORT.html``: one self-contained page per run (no network: inline CSS, JS and PNG figures).

The page holds the sortable result table (click a header; again to reverse) with the column legend
(:data:`fpsim.analysis.LEGEND`), and per tensor a histogram of log2|x| by binade with, for every plain scheme
analysed, its representable window from :mod:`fpsim.formats` — smallest subnormal, smallest normal, largest finite
— the flush threshold and the saturation point marked, followed by the error of each format on that tensor.

Where each window sits: a cast (BF16) is absolute; a scaled scheme is drawn for the block holding the tensor's
largest magnitude A, with A mapped onto the element format's largest finite value (the ideal scale; a
power-of-two or E4M3 scale rounds it up by less than a binade).  Every other block's window slides down with its own
maximum.  The flush threshold is half the smallest positive value (below it round-to-nearest gives 0); the
saturation point is the largest finite value (a cast clips or overflows above it; a scaled block maps its own
maximum there, so nothing above it exists).  Two-level schemes (NVFP4) also mark the block floor: blocks whose
maximum is below A · (scale format's smallest subnormal / its largest value) get a zero scale and flush whole.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math

import numpy as np

__all__ = ["check_html_path", "binade_histogram", "scheme_window", "render_page", "write_page", "write_report"]

#: Error columns of the per-tensor tables (the full rows are in the main table).
_ERROR_COLUMNS = ("scheme", "rel_error", "bulk_rel_error", "sqnr_db", "max_abs_error", "flushed_frac",
                  "saturated_frac", "bits_per_element")
_CHUNK_ELEMS = 1 << 22


def check_html_path(path: str, inputs: list[str], output: str | None) -> str | None:
    """Why ``path`` may not be written (an input of the run, --output itself, a directory, an unwritable place),
    or None; checked before any work."""
    import os

    from fpsim.io import OutputError, check_writable

    if output and os.path.abspath(output) == os.path.abspath(path):
        return f"{path}: the same file as --output"
    try:
        check_writable(path, inputs)
    except OutputError as e:
        return str(e)
    return None


def binade_histogram(source) -> tuple[dict[int, int], float, int, int]:
    """({floor(log2|x|): count} over the finite non-zero elements, their max |x|, zeros, non-finite) of a tensor
    read in row chunks (a :class:`fpsim.io.RowSource` or an array).  The binade comes from the float64 exponent
    field (``frexp``), exact for every input dtype."""
    counts: dict[int, int] = {}
    amax, zeros, nonfinite = 0.0, 0, 0
    if hasattr(source, "stored_2d"):
        src = source.stored_2d()  # stored order: read contiguously, whatever --axis is
        n, width = src.rows, max(1, src.cols)
    else:
        src = np.asarray(source).reshape(1, -1)
        n, width = 1, max(1, src.size)
    step = max(1, _CHUNK_ELEMS // width)
    for i in range(0, n, step):
        x = np.abs(np.asarray(src[i:i + step], dtype=np.float64).reshape(-1))
        fin = np.isfinite(x)
        nonfinite += int(x.size - fin.sum())
        x = x[fin]
        zeros += int((x == 0).sum())
        x = x[x != 0]
        if x.size:
            amax = max(amax, float(x.max()))
            e = np.frexp(x)[1] - 1  # x = m·2^e with m in [0.5, 1): floor(log2 x) = e − 1
            vals, cnt = np.unique(e, return_counts=True)
            for v, c in zip(vals.tolist(), cnt.tolist()):
                counts[v] = counts.get(v, 0) + c
    return counts, amax, zeros, nonfinite


def scheme_window(name: str, amax: float) -> dict:
    """The representable window of scheme ``name`` on the tensor's axis, in values (see the module docstring):
    min_subnormal (None without subnormals), min_normal, max, flush, saturation, block_floor (None unless two-level),
    and whether the window is absolute (a cast) or placed on the block holding ``amax``."""
    from fpsim.schemes import Kind, get_scheme

    s = get_scheme(name)
    el = s.element
    cast = s.kind is Kind.CAST
    scale = 1.0 if cast or not amax > 0 else amax / el.max
    smallest = el.min_subnormal if el.min_subnormal is not None else el.min_normal
    floor = None
    if s.kind is Kind.TWO_LEVEL and s.tensor_scale and amax > 0 and s.scale.min_subnormal is not None:
        floor = amax * s.scale.min_subnormal / s.scale.max
    return {"scheme": s.name, "element": el.name, "absolute": cast,
            "min_subnormal": None if el.min_subnormal is None else el.min_subnormal * scale,
            "min_normal": el.min_normal * scale, "max": el.max * scale, "flush": smallest * scale / 2,
            "saturation": el.max * scale, "block_floor": floor}


def _figure(key: str, hist: dict[int, int], amax: float, windows: list[dict]) -> str:
    """The tensor's histogram and the schemes' windows as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    lo_w = [math.log2(w["flush"]) for w in windows if w["flush"] > 0]
    hi_w = [math.log2(w["max"]) for w in windows]
    xs = sorted(hist)
    lo = min(xs + [math.floor(v) for v in lo_w] or [0]) - 1
    hi = max(xs + [math.ceil(v) for v in hi_w] or [1]) + 1
    lo = max(lo, (min(xs) if xs else 0) - 24)  # a BF16 window reaches 2^-133: keep the data readable
    hi = min(hi, (max(xs) if xs else 0) + 24)
    fig, (ax, aw) = plt.subplots(2, 1, sharex=True, figsize=(8, 2.4 + 0.32 * len(windows)),
                                 gridspec_kw={"height_ratios": [3, max(1, 0.45 * len(windows))]})
    total = sum(hist.values()) or 1
    ax.bar([x + 0.5 for x in xs], [hist[x] / total for x in xs], width=1.0, color="#4c78a8", edgecolor="white")
    ax.set_ylabel("fraction of elements")
    ax.set_title(f"{key}: log2|x| by binade (finite non-zero elements)", fontsize=9)
    for i, w in enumerate(windows):
        def lg(v):
            return min(max(math.log2(v), lo), hi) if v and v > 0 else lo

        y = len(windows) - 1 - i
        aw.hlines(y, lg(w["min_subnormal"] or w["min_normal"]), lg(w["max"]), color="#999", lw=2)
        aw.hlines(y, lg(w["min_normal"]), lg(w["max"]), color="#4c78a8", lw=6)
        aw.plot([lg(w["flush"])], [y], marker="v", color="#e45756", ms=7, ls="none")
        aw.plot([lg(w["saturation"])], [y], marker="|", color="#d62728", ms=14, mew=2.5, ls="none")
        if w["block_floor"]:
            aw.plot([lg(w["block_floor"])], [y], marker="x", color="#54a24b", ms=7, mew=2, ls="none")
    aw.set_yticks(range(len(windows)), [w["scheme"] + (" (abs)" if w["absolute"] else "") for w in windows][::-1],
                  fontsize=8)
    aw.set_ylim(-0.7, len(windows) - 0.3)
    if amax > 0:
        for a in (ax, aw):
            a.axvline(math.log2(amax), color="#555", ls=":", lw=1)
    aw.set_xlim(lo, hi)
    aw.set_xlabel("log2|x|   (grey: subnormals, blue: normals, ▼ flush, | saturation, × block floor, ⋯ amax)",
                  fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _cell(v) -> tuple[str, str]:
    """(text shown, sort key) of one table value."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–", ""
    if isinstance(v, bool):
        return str(v).lower(), str(int(v))
    if isinstance(v, (int, float)):
        return (f"{v:.4g}" if isinstance(v, float) else str(v)), repr(float(v))
    if isinstance(v, (list, tuple)):
        return "×".join(map(str, v)) or "()", str(math.prod(v) if v else 1)
    return str(v), ""


def _table(rows: list[dict], columns, cls: str) -> str:
    head = "".join(f'<th scope="col" title="{html.escape(_legend().get(c, ""))}">{html.escape(c)}</th>'
                   for c in columns)
    body = []
    for r in rows:
        tds = []
        for c in columns:
            text, key = _cell(r.get(c))
            tds.append(f'<td data-v="{html.escape(key)}">{html.escape(text)}</td>' if key else
                       f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>' + "".join(body) + "</tbody></table>"


def _legend() -> dict:
    from fpsim.analysis import LEGEND

    return LEGEND


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;line-height:1.4;color:#222}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
td:first-child,th:first-child,td:not([data-v]){text-align:left}th{background:#f3f3f3;position:sticky;top:0}
table.results th{cursor:pointer}th[aria-sort=ascending]::after{content:" ▲"}
th[aria-sort=descending]::after{content:" ▼"}
dl.legend{font-size:13px;columns:2 30em}dl.legend dt{font-weight:bold;font-family:monospace}
dl.legend dd{margin:0 0 .5em 1em;break-before:avoid}figure{margin:1em 0}img{max-width:100%}
section.tensor{border-top:1px solid #ddd;margin-top:1.5em}figcaption{font-size:12px;color:#555}"""

#: Sorting by a header click: numbers by their data-v value (empty cells last), text by locale order.
_JS = """document.querySelectorAll('table.results').forEach(function(t){
 t.querySelectorAll('thead th').forEach(function(th,i){th.addEventListener('click',function(){
  var asc=th.getAttribute('aria-sort')!=='ascending';
  t.querySelectorAll('thead th').forEach(function(o){o.removeAttribute('aria-sort');});
  th.setAttribute('aria-sort',asc?'ascending':'descending');
  var tb=t.tBodies[0],rows=Array.prototype.slice.call(tb.rows);
  rows.sort(function(a,b){var x=a.cells[i],y=b.cells[i],p=x.getAttribute('data-v'),q=y.getAttribute('data-v');
   var c,e=(p===null||p===''),f=(q===null||q==='');
   if(p!==null||q!==null){if(e||f)return e-f;c=parseFloat(p)-parseFloat(q);}
   else{c=x.textContent.localeCompare(y.textContent);}return asc?c:-c;});
  rows.forEach(function(r){tb.appendChild(r);});});});});"""


def render_page(rows: list[dict], tensors: list[dict], schemes, summary: dict | None = None,
                title: str = "fpsim analyze") -> str:
    """The page's HTML.  ``tensors``: per tensor {"key", "hist", "amax", "zeros", "nonfinite"} in table order."""
    from fpsim.analysis import METRIC_COLUMNS

    cols = [c for c in METRIC_COLUMNS if any(c in r for r in rows)]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<meta name='viewport' content='width=device-width'><style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p>{len(tensors)} tensor(s), schemes {html.escape(', '.join(schemes))}; click a column header to sort "
             "(again to reverse). Hover a header for its definition.</p>",
             '<h2 id="results">Results</h2><div class="scroll">', _table(rows, cols, "results"), "</div>",
             '<h2 id="legend">Columns</h2><dl class="legend">']
    parts += [f"<dt>{html.escape(c)}</dt><dd>{html.escape(t)}</dd>" for c, t in _legend().items() if c in cols]
    parts.append("</dl>")
    if summary:
        parts.append('<h2 id="summary">Summary</h2><pre>' + html.escape(json.dumps(summary, indent=1, default=str))
                     + "</pre>")
    parts.append('<h2 id="tensors">Tensors</h2>')
    for i, t in enumerate(tensors):
        windows = [scheme_window(s, t["amax"]) for s in schemes]
        mine = [r for r in rows if r.get("tensor") == t["key"]]
        png = _figure(t["key"], t["hist"], t["amax"], windows)
        cap = (f"log2|x| of {sum(t['hist'].values())} finite non-zero elements (max |x| = {t['amax']:.4g}; "
               f"{t['zeros']} zeros and {t['nonfinite']} non-finite left out), with each scheme's representable "
               "window: a cast's is absolute, a scaled scheme's is the block holding max |x|.")
        parts += [f'<section class="tensor" id="t{i}"><h3>{html.escape(t["key"])}</h3><figure>'
                  f'<img alt="{html.escape("histogram of log2|x| for " + t["key"])}" src="data:image/png;base64,{png}">'
                  f"<figcaption>{html.escape(cap)}</figcaption></figure>",
                  '<div class="scroll">', _table(mine, [c for c in _ERROR_COLUMNS if c in cols], "errors"),
                  "</div></section>"]
    parts.append(f"<script>{_JS}</script></body></html>\n")
    return "\n".join(parts)


def write_page(path: str, rows: list[dict], refs, labels: dict, schemes, inputs, summary=None) -> None:
    """Read the analysed tensors again for their histograms and write the page atomically (never an input);
    :class:`fpsim.io.OutputError` when it cannot be written."""
    from fpsim.io import atomic_write

    analysed = {r["tensor"] for r in rows}
    tensors, seen = [], set()
    for ref in refs:
        key = f"{labels[ref.source]}:{ref.name}"
        if key not in analysed or key in seen:
            continue
        seen.add(key)
        hist, amax, zeros, nonfinite = binade_histogram(ref.row_source(-1, label=key))
        tensors.append({"key": key, "hist": hist, "amax": amax, "zeros": zeros, "nonfinite": nonfinite})
    atomic_write(path, render_page(rows, tensors, schemes, summary), inputs=inputs)


def write_report(path: str, rows, refs, labels, schemes, inputs, summary, note) -> bool:
    """:func:`write_page` for ``fpsim analyze``: a "wrote" note, or one error line and False when it fails."""
    from fpsim.io import InputError, OutputError

    try:
        write_page(path, rows, refs, labels, schemes, inputs, summary)
    except (OutputError, InputError) as e:
        note(f"error: --html {e}")
        return False
    note(f"wrote the HTML page of {len({r['tensor'] for r in rows})} tensor(s) to {path}")
    return True
