"""The one place where Numba is configured.

Every kernel of fpsim is compiled with these settings:

* ``cache=True`` so the CLI does not pay the compile time on every call;
* ``nogil=True`` so kernels can run from threads;
* ``fastmath=False``: bit-exact code must not reassociate additions or flush
  float32 subnormals to zero (SPEC §9).

``parallel`` kernels use Numba's threading layer; their thread count follows
:func:`numba.set_num_threads` (``NUMBA_NUM_THREADS`` in the environment).
"""

from __future__ import annotations

import functools

import numba

_OPTIONS = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}

#: Decorator for serial kernels and inlined scalar helpers.
njit = functools.partial(numba.njit, **_OPTIONS)

#: Decorator for kernels whose outer loop is a ``numba.prange``.
pjit = functools.partial(numba.njit, parallel=True, **_OPTIONS)

prange = numba.prange


def set_num_threads(n: int) -> None:
    """Set the number of threads used by parallel kernels (1 … ``numba.config.NUMBA_NUM_THREADS``)."""
    numba.set_num_threads(int(n))


def get_num_threads() -> int:
    """Number of threads parallel kernels currently use."""
    return int(numba.get_num_threads())
