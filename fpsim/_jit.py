"""The one place where Numba is configured.

Every kernel of fpsim is compiled with these settings:

* ``cache=True`` so the CLI does not pay the compile time on every call;
* ``nogil=True`` so kernels can run from threads;
* ``fastmath=False``: bit-exact code must not reassociate additions or flush
  float32 subnormals to zero (SPEC §9).

Where Numba finds no writable cache location (a system-wide install run by another user, no
writable HOME, a read-only ``NUMBA_CACHE_DIR``), kernels are compiled uncached instead — the same
machine code, compiled once per process — and one ``RuntimeWarning`` says so (Numba itself would
raise ``RuntimeError: cannot cache function …`` at import and make every command fail).

The cache directory (unless ``NUMBA_CACHE_DIR`` is set, or numba was imported before fpsim) is
:func:`numba_cache_dir`, keyed on the text of every fpsim source file, and the same for the CLI, the tests,
``make`` and the benchmarks, so a new user compiles once.  Why keyed: Numba's disk cache checks only the
source file of each jitted function, not the modules whose code it inlines (the vector intrinsics of
``fpsim._simd``, the helpers of ``fpsim._kernels``), so after an edit there it would run stale machine code.

``parallel`` kernels use Numba's threading layer; their thread count follows
:func:`numba.set_num_threads` (``NUMBA_NUM_THREADS`` in the environment).
"""

from __future__ import annotations

import os
import warnings

import numba

from ._cache import numba_cache_dir

__all__ = ["njit", "pjit", "prange", "numba_cache_dir", "set_num_threads", "get_num_threads", "uncached_kernels"]

_OPTIONS = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}
_uncached = False
#: Every disk-cached kernel made by :data:`njit` / :data:`pjit` (in the modules imported so far).
_CACHED: list = []


def _decorator(**preset):
    def decorate(fn=None, **kw):
        if fn is None:  # used as @njit(inline="always")
            return lambda f: decorate(f, **kw)
        opts = {**_OPTIONS, **preset, **kw}
        global _uncached
        if not _uncached:
            try:
                disp = numba.njit(**opts)(fn)
                _CACHED.append(disp)
                return disp
            except RuntimeError as e:  # Numba checks for a cache location when the decorator runs
                if "cannot cache" not in str(e):
                    raise
                _uncached = True
                warnings.warn(f"fpsim: Numba has no writable cache directory ({e}); compiling without a cache "
                              "(set NUMBA_CACHE_DIR to a writable directory to keep compiled kernels)",
                              RuntimeWarning, stacklevel=2)
        return numba.njit(**{**opts, "cache": False})(fn)

    return decorate


#: Decorator for serial kernels and inlined scalar helpers.
njit = _decorator()

#: Decorator for kernels whose outer loop is a ``numba.prange``.
pjit = _decorator(parallel=True)

prange = numba.prange


def uncached_kernels() -> tuple[int, int]:
    """(kernels with no compiled code on disk, disk-cached kernels) among those of the fpsim modules imported so far.

    A kernel has code on disk once Numba has written its cache index (``<name>-<line>.pyXY.nbi`` in
    :func:`numba_cache_dir`, keyed on fpsim's sources): a fresh install or an edited source starts with none, so
    the first call of each kernel compiles it (seconds each).  Inlined helpers are never called on their own and
    have no index: count them out by comparing the two numbers, not by expecting 0.
    """
    missing = 0
    for disp in _CACHED:
        cache = getattr(disp, "_cache", None)
        index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        missing += index is None or not os.path.exists(index)
    return missing, len(_CACHED)


def set_num_threads(n: int) -> None:
    """Set the number of threads used by parallel kernels (1 … ``numba.config.NUMBA_NUM_THREADS``)."""
    numba.set_num_threads(int(n))


def get_num_threads() -> int:
    """Number of threads parallel kernels currently use."""
    return int(numba.get_num_threads())
