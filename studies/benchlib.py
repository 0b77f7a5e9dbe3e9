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


def best_times(fns: dict, repeat: int) -> dict:
    """Fastest of ``repeat`` rounds for each function, the functions taking turns within a round.

    Why interleaved: on a shared machine the speed drifts by ±25 % over seconds;
    timing a kernel and its baseline alternately makes their ratio robust to that
    drift, where timing them one after the other would not be.
    """
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def write_report(text: str, out: Path | None) -> None:
    """Print the Markdown report and, with ``out``, write it atomically."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(out)
