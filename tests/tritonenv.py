"""Set-up shared by the tests that run the Triton kernels (import it before fpsim.torch's kernels).

Without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set here before Triton is
imported), which executes the same kernel source on CPU tensors; on the device machine they compile for the GPU.
Importing this module skips the importing test module where torch or Triton is missing or cannot run.
"""

import os

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'fpsim[torch]')")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="Triton not installed")

from fpsim.torch.runtime import triton_available  # noqa: E402

if not triton_available():
    pytest.skip("Triton cannot run here", allow_module_level=True)

#: The interpreter evaluates float32 arithmetic with NumPy, which warns on overflow to inf and on NaN operands
#: (the IEEE results are what the kernels want).
INTERPRETER_WARNINGS = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
                        pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
                        pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]

DEV = "cuda" if torch.cuda.is_available() else "cpu"
