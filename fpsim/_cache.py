"""Numba's cache directory for fpsim, set before numba is imported (``fpsim/__init__`` imports this first).

Unless ``NUMBA_CACHE_DIR`` is set (or numba was imported before fpsim), it is :func:`numba_cache_dir`: keyed
on the text of every fpsim source file and the same for the CLI, the tests, ``make`` and the benchmarks, so a
new user compiles once.  Why keyed: Numba's disk cache checks only the source file of each jitted function,
not the modules whose code it inlines (the vector intrinsics of ``fpsim._simd``, the helpers of
``fpsim._kernels``), so after an edit there it would run stale machine code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

__all__ = ["numba_cache_dir"]


def numba_cache_dir() -> str:
    """The source-keyed cache directory: ``fpsim/__pycache__/numba/<key>`` where that is writable, else
    ``~/.cache/fpsim/numba/<key>``; caches of older sources beside it are removed."""
    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(pkg.rglob("*.py")):
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes())
    key = h.hexdigest()[:16]
    for base in (pkg / "__pycache__" / "numba", Path.home() / ".cache" / "fpsim" / "numba"):
        probe = base
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if os.access(probe, os.W_OK | os.X_OK):
            if base.is_dir():
                for old in base.iterdir():
                    if old.name != key:
                        shutil.rmtree(old, ignore_errors=True)
            return str(base / key)
    return str(pkg / "__pycache__" / "numba" / key)  # unwritable everywhere: fpsim._jit compiles uncached


if "NUMBA_CACHE_DIR" not in os.environ and "numba" not in sys.modules:
    os.environ["NUMBA_CACHE_DIR"] = numba_cache_dir()  # Numba reads it once, when it is first imported
