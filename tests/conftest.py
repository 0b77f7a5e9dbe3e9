import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# fpsim sets Numba's cache directory (keyed on its sources, shared with the CLI) when it is imported, before
# numba is: see fpsim._jit.numba_cache_dir.
import fpsim  # noqa: E402

# Without a CUDA GPU the Triton kernels run under Triton's interpreter (on CPU tensors).  The switch is
# read when a kernel is decorated, so it must be set before any test imports fpsim.torch.kernels.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "default", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Formats with a code table (everything but the float32 passthrough).
CODED = [n for n, s in fpsim.FORMATS.items() if not s.is_passthrough]
SMALL = [n for n, s in fpsim.FORMATS.items() if s.bits <= 8]
MODES = ["rne", "rtz", "rup", "rdown", "rna"]


@pytest.fixture(scope="session")
def nvref():
    """NVIDIA's host conversions, compiled live; skips where no CUDA headers exist."""
    from tests.nvref import load

    lib = load()
    if lib is None:
        pytest.skip("CUDA headers (cuda_fp4.h …) or a C++ compiler not found; golden tables still run")
    return lib


@pytest.fixture(scope="session")
def golden():
    from pathlib import Path

    path = Path(__file__).parent / "data" / "nvidia_golden.npz"
    with np.load(path, allow_pickle=False) as g:
        return {k: g[k] for k in g.files}


@pytest.fixture
def one_thread():
    """Numba's parallel kernels on one thread for the test: diff and the producer checks run hundreds of
    quantizations of tiny tensors, where a thread pool's start-up per call costs more than the work (8 ms instead of
    10 µs per call on a busy 2-core machine).  Use with ``pytest.mark.usefixtures("one_thread")``."""
    from fpsim._jit import get_num_threads, set_num_threads

    n = get_num_threads()
    set_num_threads(1)
    yield
    set_num_threads(n)
