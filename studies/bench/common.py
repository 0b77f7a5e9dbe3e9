"""Helpers shared by the benchmark scripts (`make bench`): best-of timing, atomic report writing, and the
Numba cache directory that `make` and the tests use."""

from __future__ import annotations

import statistics
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


def on_threads(threads: int, fn):
    """``fn`` wrapped to run with ``threads`` Numba threads (benchmarks time one-thread and all-core runs
    of the same kernel in turns)."""
    from fpsim._jit import set_num_threads  # not at import: tests/conftest imports this module before numba

    def run():
        set_num_threads(threads)
        fn()

    return run


def round_times(fns: dict, repeat: int, warm_s: float = 3.0) -> dict:
    """Seconds of each function in each of ``repeat`` rounds (lists), the functions taking turns within a round,
    after warm-up rounds that last at least ``warm_s`` seconds.

    Why seconds of warm-up: on this 2-core VM a core that has been idle (say, during single-threaded
    baselines) runs parallel kernels at a fraction of their speed for the first 2–4 seconds of load
    (measured: 0.5 GB/s rising to 6 over four rounds), which one warm-up call does not cover.
    """
    t_end = time.perf_counter() + warm_s
    while True:
        for fn in fns.values():
            fn()
        if time.perf_counter() >= t_end:
            break
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def round_ratio(times: dict, slow: str, fast: str) -> float:
    """Median over rounds of times[slow] / times[fast]: a ratio of two timings taken seconds apart in each
    round, so drift that lasts longer than a round (a neighbour's job on a shared machine) cancels."""
    return statistics.median(a / b for a, b in zip(times[slow], times[fast], strict=True))


def best_times(fns: dict, repeat: int) -> dict:
    """Fastest of ``repeat`` rounds for each function, the functions taking turns within a round.

    Why interleaved: on a shared machine the speed drifts over seconds (on 2026-11-30 the best read-only
    pass of each scheme in one ``bench_scaling`` run ranged over 13.7–16.9 GB/s, ±10 %, git eb299ba; the ±25 %
    said here before had no recorded measurement behind it); timing a kernel and its baseline alternately makes
    their ratio robust to that drift, where timing them one after the other would not be.
    """
    return {k: min(v) for k, v in round_times(fns, repeat).items()}


def write_report(text: str, out: Path | None) -> None:
    """Print the Markdown report and, with ``out``, write it atomically."""
    print(text)
    if out:
        from fpsim.io import atomic_write

        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, text)


def numba_cache_dir() -> str:
    """The Numba cache directory fpsim uses (:func:`fpsim._jit.numba_cache_dir`)."""
    from fpsim._jit import numba_cache_dir as keyed

    return keyed()
