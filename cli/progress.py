"""Progress of the long commands on stderr: a tqdm bar with rate and ETA on a terminal, a plain line per step
otherwise, nothing when quiet.  Never on stdout, so piped and JSON results stay clean.

* a terminal (``isatty()``): one bar, updated per unit (a tensor, a study), with the unit being worked on;
* a file or pipe: one line per finished step (a file, a study) with counts, rate and ETA, for logs; a run of one
  step has no line (its result says it is done);
* a stream with no file descriptor (stderr captured in memory by a calling program or a test runner), or
  ``quiet``: nothing.

:func:`announce_compile` says on a terminal that Numba compiles fpsim's kernels when (almost) none of them has code
on disk yet.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "progress_mode", "announce_compile", "compile_note"]


def progress_mode(stream, quiet: bool = False) -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` for ``stream`` (see the module docstring)."""
    if quiet or stream is None:
        return "off"
    try:
        if stream.isatty():
            return "bar"
        stream.fileno()  # an in-memory stream has none: a program capturing our stderr wants no progress in it
    except (AttributeError, OSError, ValueError):
        return "off"
    return "lines"


def _terminal_size(stream) -> tuple[int, int]:
    """(columns, lines) of the terminal ``stream`` writes to; 0 where it reports none."""
    import os

    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, OSError, ValueError):
        return (0, 0)


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Progress:
    """``total`` units (tensors, studies) in steps (files, studies): :meth:`advance` after each unit,
    :meth:`step` after each step; use as a context manager (or call :meth:`close`)."""

    def __init__(self, total: int, *, desc: str, unit: str, steps: int, quiet: bool = False, stream=None,
                 step_units: str = "files", mode: str | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.mode = mode or progress_mode(self.stream, quiet)  # mode: "bar" forces a bar (fpsim probe --progress)
        self.total, self.steps, self.desc, self.unit, self.step_units = total, steps, desc, unit, step_units
        self.done = self.steps_done = 0
        self.t0 = time.perf_counter()
        self.bar = None
        if self.mode == "bar" and total > 1:
            from tqdm import tqdm

            size = _terminal_size(self.stream)
            # a terminal that reports no size (0 × 0: a fresh pty, some containers) gets 80 × 24, not a hidden bar
            fixed = {"ncols": size[0] or 80, "nrows": size[1] or 24} if 0 in size else {"dynamic_ncols": True}
            self.bar = tqdm(total=total, file=self.stream, unit=unit, desc=desc, leave=False, mininterval=0.2, **fixed)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1, label: str | None = None) -> None:
        """``n`` more units done; ``label``: the one being worked on next (shown on the bar)."""
        self.done += n
        if self.bar is not None:
            if label is not None:
                self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(n)

    def show(self, label: str) -> None:
        """Name the unit now being worked on (on the bar only)."""
        if self.bar is not None:
            self.bar.set_postfix_str(label)

    def step(self, label: str) -> None:
        """A step (a file, a study) is done: one line in ``lines`` mode, when there is more than one step."""
        self.steps_done += 1
        if self.mode != "lines" or self.steps < 2:
            return
        dt = time.perf_counter() - self.t0
        rate = self.done / dt if dt > 0 else 0.0
        left = self.total - self.done
        eta = f", ETA {_duration(left / rate)}" if rate > 0 and left > 0 else ""
        units = f", {self.done}/{self.total} {self.unit}s" if self.total != self.steps else ""
        line = (f"{self.desc}: [{self.steps_done}/{self.steps} {self.step_units}{units}] {label} "
                f"({_duration(dt)} elapsed, {rate:.3g} {self.unit}/s{eta})")
        from fpsim.io.errors import printable

        self.write(printable(line))

    def write(self, line: str) -> None:
        """A message line that does not break the bar (it is drawn again below the line)."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def compile_note(seconds: str) -> str | None:
    """The note announcing the first compile of fpsim's kernels when (almost) none of them has code on disk — a
    fresh install, or sources edited since the last run — else None.  "Almost": a few kernels cached by an earlier
    small command (one codec) still leave the minutes of compiling to come; after one ``fpsim analyze`` about a
    third of them are cached (25 of 82), which counts as warm."""
    import fpsim.scaling  # noqa: F401 - defines most kernels: they are counted even before the first call needs them
    from fpsim._jit import uncached_kernels

    missing, total = uncached_kernels()
    if not total or (total - missing) * 10 >= total:
        return None
    return (f"note: compiling fpsim's kernels once ({seconds}); later runs use the cache "
            "(NUMBA_CACHE_DIR or fpsim/__pycache__/numba)")


def announce_compile(seconds: str, quiet: bool = False, stream=None) -> bool:
    """Write :func:`compile_note` on ``stream`` (stderr) when it is a terminal and not quiet; True when written.
    A log gets no note: its per-step lines show the time each step took."""
    stream = sys.stderr if stream is None else stream
    if progress_mode(stream, quiet) != "bar":
        return False
    note = compile_note(seconds)
    if note:
        print(note, file=stream, flush=True)
    return note is not None
