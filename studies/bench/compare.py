"""Two runs of one benchmark side by side: the rows both Markdown reports share, with the ratio new / old.

    python -m studies.bench.compare OLD.md NEW.md [--out FILE] [--column 2]

For an A/B on one machine (e.g. ``studies.bench.gpu`` run on the tree before a change and on today's, in the
same device call): a row is matched by its first cell, and the ``--column``-th cell (1-based; the first
numeric column by default) is read as a number in both.  Rows missing from one report, or without a number
there, are listed after the table instead of being given a ratio.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from fpsim.io import atomic_write

__all__ = ["table_rows", "compare", "main"]

_NUM = re.compile(r"^[*_]*([-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?)")


def table_rows(text: str) -> dict[str, list[str]]:
    """First cell → all cells of every Markdown table row in ``text`` (header and rule rows left out; a key seen
    twice keeps its first row)."""
    rows: dict[str, list[str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or set(line.replace("|", "").strip()) <= set("-: "):
            continue
        if i + 1 < len(lines) and lines[i + 1].startswith("|") and set(lines[i + 1].replace("|", "").strip()) <= \
                set("-: ") and lines[i + 1].strip("| "):
            continue  # a header row (the rule follows it)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.setdefault(cells[0], cells)
    return rows


def _number(cell: str) -> float | None:
    m = _NUM.match(cell.strip())
    return float(m.group(1).replace(",", "")) if m else None


def compare(old: str, new: str, column: int | None = None) -> str:
    """The Markdown comparison of two reports' texts (see the module docstring)."""
    a, b = table_rows(old), table_rows(new)
    out = ["| row | old | new | new / old |", "|---|---:|---:|---:|"]
    skipped = []
    for key, cells in b.items():
        if key not in a:
            skipped.append(f"{key} (only in the new report)")
            continue
        idx = column - 1 if column else next((i for i, c in enumerate(cells[1:], 1) if _number(c) is not None), None)
        if idx is None or idx >= len(cells) or idx >= len(a[key]):
            skipped.append(f"{key} (no number)")
            continue
        vo, vn = _number(a[key][idx]), _number(cells[idx])
        if vo is None or vn is None or vo == 0:
            skipped.append(f"{key} (no number in both)")
            continue
        out.append(f"| {key} | {a[key][idx]} | {cells[idx]} | {vn / vo:.3f} |")
    skipped += [f"{k} (only in the old report)" for k in a if k not in b]
    text = "\n".join(out) + "\n"
    if skipped:
        text += "\nNot compared: " + "; ".join(skipped) + ".\n"
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--column", type=int, default=None, help="1-based cell to compare (default: first numeric)")
    a = ap.parse_args(argv)
    text = compare(a.old.read_text(), a.new.read_text(), a.column)
    if a.out:
        atomic_write(a.out, text)
    print(text, end="")


if __name__ == "__main__":
    main()
