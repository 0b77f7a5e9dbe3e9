"""`make reports`: run every study, then assemble reports/index.md and reports/index.html.

    python -m studies.run_all [--quick] [--out reports] [--only NAME ...] [-q]

Each study writes ``<out>/<name>/`` (CSV, figures, section.md); this script
concatenates the sections in order into ``index.md`` and a self-contained
``index.html`` (:mod:`studies.report.page`: figures embedded as base64, a table of contents), and links the
benchmark pages.  Progress goes to stderr (a bar on a terminal, a line per study otherwise; none with ``-q``).
The studies of ``RUN_LAST`` (the page of what each component buys) read the
others' outputs: they run after the rest, and again whenever ``--only`` runs
any study, while their sections keep their place in the order (first).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from fpsim.io import atomic_write
from fpsim_cli.progress import Progress, announce_compile
from studies.common import REPORTS
from studies.report.page import page

#: Studies in report order (the report's numbering), after the page that sums them up.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=REPORTS)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar or lines on stderr")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [s for s in STUDIES if args.only is None or s in args.only]
    if names:  # a study that reads the others' outputs is rendered again after any of them runs
        names += [s for s in RUN_LAST if s not in names]
    sections, missing = {}, []
    announce_compile("about 3 min on 2 cores", args.quiet)
    prog = Progress(len(names), desc="make reports", unit="study", steps=len(names), step_units="studies",
                    quiet=args.quiet)
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
        prog.show(name)
        mod.main((["--quick"] if args.quick else []) + ["--out", str(args.out)])
        print(f"== {name}: {time.perf_counter() - t:.1f} s", flush=True)
        prog.advance(1)
        prog.step(name)
        sections[name] = (args.out / name / "section.md").read_text()
    prog.close()
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
    atomic_write(args.out / "index.html", page(md, args.out))
    print(f"wrote {args.out / 'index.md'} and {args.out / 'index.html'} ({len(sections)} studies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
