"""The producer conventions on the Triton path of the torch backend (issue 47): the fused kernels decline them
(``triton_unsupported`` names the convention) and the backend runs the torch operations on the same device, so
``impl="auto"`` (Triton on CUDA) and the Triton decoder's entry point give the libraries' golden bytes and values.
Under Triton's interpreter on CPU tensors here; compiled on the device machine."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.plan import lower
from fpsim.torch import backend as tb
from fpsim.torch.quantize import triton_unsupported
from tests import tritonenv  # sets TRITON_INTERPRET before Triton is imported (the kernels import it lazily)
from tests.test_producers import PRODUCERS, as_input, golden, same_values

torch = tritonenv.torch
pytestmark = tritonenv.INTERPRETER_WARNINGS


@pytest.mark.parametrize("producer", PRODUCERS)
def test_conventions_on_the_triton_path_give_the_libraries_bytes(producer):
    plan = lower("nvfp4", convention=producer)
    assert producer in triton_unsupported(plan)
    for case, g in golden(producer).items():
        x = as_input(case, g["input"])
        t = torch.from_numpy(np.asarray(x, np.float32)).to(tritonenv.DEV)
        if case.endswith(".bfloat16"):
            t = t.to(torch.bfloat16)
        with pytest.raises(ValueError, match=producer):
            tb.quantize(t, plan, impl="triton")
        q = tb.quantize(t, plan)  # auto: the Triton kernels on CUDA, which hand the convention to torch operations
        assert fpsim.unpack_fp4(q.data.cpu().numpy()).tobytes() == g["codes"].tobytes(), case
        assert q.scales.cpu().numpy().tobytes() == g["scales"].tobytes(), case
        assert same_values(q.dequantize(impl="triton").cpu().numpy(), g["decoded"]), case
        assert same_values(q.dequantize(impl="triton", convention="fpsim").cpu().numpy(),
                           q.to_quantized().dequantize(convention="fpsim")), case
