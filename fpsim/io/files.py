"""Writing results safely, and the one JSON convention of every fpsim command.

:func:`atomic_write` is the only way fpsim writes a file: the bytes go to a temporary file in the
target's directory, are flushed, and replace the target with one ``os.replace``, so a reader (or a
crash, even SIGKILL) sees either the old file or the whole new one.  It never replaces an input of
the run or a device: character devices and FIFOs (``/dev/null``, a pipe) and every path under ``/dev``
or ``/proc`` (``/dev/stdout`` even when the shell redirected it to a file) are written through instead
of replaced; a symbolic link is kept and its target replaced; a regular file that is replaced keeps
its permission bits.
:func:`check_writable` runs the same checks before any work starts, so a bad ``--output`` fails in
the first second, not after the analysis.

JSON (:func:`to_json`, :func:`dumps`): numbers are JSON numbers or ``null``; NaN and ±inf become
``null`` (plain ``json.dumps`` writes the invalid bare ``NaN``), and a field that can be non-finite
for a reason says so in a sibling field of the caller's choosing (e.g. ``"sqnr_db": null,
"sqnr_note": "exact"``).  numpy scalars and arrays become Python numbers and lists, tuples lists,
``-0.0`` becomes ``0.0`` (the sign of a zero metric carries no information); shapes are lists of ints.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import numpy as np

__all__ = ["OutputError", "atomic_write", "check_writable", "to_json", "dumps"]


class OutputError(Exception):
    """An output path that must not or cannot be written; the message is one line naming the path."""


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _write_through(p: Path, st: os.stat_result) -> bool:
    """Devices, FIFOs and anything under /dev or /proc are written in place, never replaced."""
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return True
    return any(str(q).startswith(("/dev/", "/proc/")) for q in (Path(os.path.abspath(p)), Path(os.path.realpath(p))))


def check_writable(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """The output path, after checking that :func:`atomic_write` may write it; else :class:`OutputError`.

    Refused: a path that is one of ``inputs`` (the same file, through any link), a directory (or a name
    ending with ``/``), a path whose directory does not exist or is not writable.  Character devices and
    FIFOs are accepted (they are written through, never replaced).
    """
    p = Path(path)
    for q in inputs:
        if _same_file(p, Path(q)):
            raise OutputError(f"{p}: refusing to overwrite an input of this run")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"{p}: cannot write ({e.strerror or type(e).__name__})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{p}: is a directory")
        if _write_through(p, st):
            if not os.access(p, os.W_OK):
                raise OutputError(f"{p}: device is not writable")
            return p
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{p}: not a regular file, device or FIFO; refusing to replace it")
    elif os.fspath(path).endswith(("/", os.sep)):  # Path() drops the slash: "-o out/" would create a file "out"
        raise OutputError(f"{os.fspath(path)}: names a directory that does not exist (trailing slash); "
                          "give a file name")
    q = Path(os.path.realpath(p)) if p.is_symlink() else p
    if any(str(x).startswith(("/dev/", "/proc/")) for x in (Path(os.path.abspath(p)), Path(os.path.abspath(q)))):
        raise OutputError(f"{p}: refusing to create a file under /dev or /proc")
    parent = q.parent if str(q.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{p}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{p}: directory {parent} is not writable")
    return p


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[IO[bytes]], None],
                 inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Write ``data`` (bytes, text as UTF-8, or a function that writes to a binary file) to ``path``.

    Regular files are replaced atomically (temporary file in the same directory, fsync, ``os.replace``),
    keeping the replaced file's permission bits; character devices and FIFOs are written through.
    On any failure the temporary file is removed and :class:`OutputError` names the path.
    """
    p = check_writable(path, inputs)
    write = data if callable(data) else None
    blob = data.encode() if isinstance(data, str) else data
    try:
        st = os.stat(p)
    except OSError:
        st = None
    if st is not None and _write_through(p, st):
        try:
            with open(p, "wb") as f:
                write(f) if write is not None else f.write(blob)
        except OSError as e:
            raise OutputError(f"{p}: cannot write ({e.strerror or type(e).__name__})") from None
        return
    if p.is_symlink():  # keep the link: replace what it points to
        p = Path(os.path.realpath(p))
    parent = p.parent if str(p.parent) else Path(".")
    tmp = None
    try:
        # the name's first 40 characters only: a target name near the 255-byte limit is valid, its temporary
        # twin with a prefix and suffix added would not be (ENAMETOOLONG after the whole analysis)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name[:40]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f) if write is not None else f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise OutputError(f"{p}: cannot write ({e.strerror or type(e).__name__})") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def to_json(obj):
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts, under the convention above."""
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_json(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        if not math.isfinite(v):
            return None
        return v + 0.0  # -0.0 + 0.0 == +0.0 under round-to-nearest
    return obj


def dumps(obj, indent: int | None = 1) -> str:
    """``json.dumps`` of :func:`to_json` (strict: a value outside the convention raises), newline-terminated."""
    return json.dumps(to_json(obj), indent=indent, allow_nan=False, ensure_ascii=False) + "\n"
