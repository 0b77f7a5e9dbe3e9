"""Helpers shared by the benchmark scripts (`make bench`): best-of timing and atomic report writing."""

from __future__ import annotations

import time
from pathlib import Path


def best_time(fn, repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls, after one warm-up call (compilation, page faults)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def write_report(text: str, out: Path | None) -> None:
    """Print the Markdown report and, with ``out``, write it atomically."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(out)
