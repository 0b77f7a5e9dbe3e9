"""`make reports`: run every study, then assemble reports/index.md and reports/index.html.

    python -m studies.run_all [--quick] [--out reports] [--only NAME ...]

Each study writes ``<out>/<name>/`` (CSV, figures, section.md); this script
concatenates the sections in order into ``index.md`` and a self-contained
``index.html`` (figures embedded as base64), and links the benchmark pages.
The studies of ``RUN_LAST`` (the page of what each component buys) read the
others' outputs: they run after the rest, and again whenever ``--only`` runs
any study, while their sections keep their place in the order (first).
"""

from __future__ import annotations

import argparse
import base64
import html
import importlib
import re
import sys
import time
from pathlib import Path

from fpsim.io import atomic_write
from studies.common import REPORTS

#: Studies in report order (issue 7's numbering), after the page that sums them up (issue 46).
STUDIES = [
    "components",
    "format_error",
    "design_space",
    "scale_arithmetic",
    "outliers_rht",
    "weight_2d",
    "stochastic_rounding",
    "layer_sensitivity",
    "training",
    "smollm2",
    "probes",
]
#: Studies whose module is not ``studies/report/<name>.py``.
MODULES = {"smollm2": "studies.llm.study", "probes": "studies.probes.study"}
#: Studies that read the others' outputs: they run after every other study, their sections keep their place.
RUN_LAST = ("components",)


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"`(.+?)`", r"<code>\1</code>", text)
    return text


def md_to_html(md: str, base: Path) -> str:
    """The Markdown subset the studies write: headings, paragraphs, tables, images, lists."""
    out, para, table = [], [], []

    def flush():
        if para:
            out.append("<p>" + _inline(" ".join(para)) + "</p>")
            para.clear()
        if table:
            rows = [r for r in table if not re.fullmatch(r"\|(\s*-+\s*\|)+", r.replace(":", "-"))]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in cells[0]) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
                       + "</table>")
            table.clear()

    for line in md.splitlines():
        m_img = re.fullmatch(r"!\[(.*?)\]\((.+?)\)", line.strip())
        m_h = re.match(r"(#{1,4}) (.*)", line)
        if m_img:
            flush()
            src = base / m_img.group(2)
            data = base64.b64encode(src.read_bytes()).decode() if src.exists() else ""
            out.append(f'<figure><img alt="{html.escape(m_img.group(1))}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{html.escape(m_img.group(2))}</figcaption></figure>")
        elif m_h:
            flush()
            n = len(m_h.group(1))
            out.append(f"<h{n}>{_inline(m_h.group(2))}</h{n}>")
        elif line.startswith("|"):
            if para:
                flush()
            table.append(line)
        elif line.startswith("- "):
            flush()
            out.append(f"<ul><li>{_inline(line[2:])}</li></ul>")
        elif not line.strip():
            flush()
        else:
            if table:
                flush()
            para.append(line.strip())
    flush()
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=REPORTS)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [s for s in STUDIES if args.only is None or s in args.only]
    if names:  # a study that reads the others' outputs is rendered again after any of them runs
        names += [s for s in RUN_LAST if s not in names]
    sections, missing = {}, []
    for name in sorted(STUDIES, key=lambda s: s in RUN_LAST):  # report order, RUN_LAST's studies last
        if name not in names:  # --only: the other studies keep their last section in the index
            old = args.out / name / "section.md"
            if old.exists():
                sections[name] = old.read_text()
            continue
        try:
            mod = importlib.import_module(MODULES.get(name, f"studies.report.{name}"))
        except ModuleNotFoundError:
            missing.append(name)
            continue
        t = time.perf_counter()
        mod.main((["--quick"] if args.quick else []) + ["--out", str(args.out)])
        print(f"== {name}: {time.perf_counter() - t:.1f} s", flush=True)
        sections[name] = (args.out / name / "section.md").read_text()
    sections = [sections[s] for s in STUDIES if s in sections]
    benches = sorted(p.name for p in args.out.glob("bench_*.md"))
    head = [
        "# fpsim reports",
        "",
        "Evidence for each component of the NVFP4 training recipe, measured by fpsim itself "
        f"({'quick mode: small sizes' if args.quick else 'full run'}; regenerate with `make reports`). "
        "Every number comes from the CSV beside its figure.",
        "",
    ]
    if missing:
        head += [f"Not yet written: {', '.join(missing)}.", ""]
    if benches:
        head += ["Benchmarks: " + ", ".join(f"[{b}]({b})" for b in benches) + ".", ""]
    md = "\n".join(head) + "\n" + "\n".join(sections)
    atomic_write(args.out / "index.md", md)
    page = md_to_html(md, args.out)
    atomic_write(args.out / "index.html",
        "<!doctype html><html><head><meta charset='utf-8'><title>fpsim reports</title><style>"
        "body{font-family:sans-serif;max-width:60em;margin:auto;line-height:1.45}"
        "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
        "img{max-width:100%}figcaption{font-size:80%;color:#666}</style></head><body>\n" + page + "\n</body></html>\n"
    )
    print(f"wrote {args.out / 'index.md'} and {args.out / 'index.html'} ({len(sections)} studies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
