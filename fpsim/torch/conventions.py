"""The producer conventions (:mod:`fpsim.conventions`) on torch tensors: the same algorithm over torch operations.

:class:`TorchOps` is the array namespace :func:`fpsim.conventions.quantize_blocks` and
:func:`~fpsim.conventions.decode_blocks` run on here (float32 torch operations, one IEEE rounding each on CPU
and CUDA; bfloat16 rounding by torch's RNE cast; codes through :mod:`fpsim.torch.codecs`), so torch-cpu and
torch-cuda give the numba-cpu backend's bytes.  The fused Triton kernels do not run conventions
(:func:`fpsim.torch.quantize.triton_unsupported` says so); on CUDA these torch operations run them.
"""

from __future__ import annotations

from .. import conventions as CV
from ..plan import Plan
from .codecs import decode, encode
from .runtime import torch_module

__all__ = ["TorchOps", "quantize_convention", "dequantize_convention"]


class TorchOps:
    """:class:`fpsim.conventions.NumpyOps` for torch tensors."""

    def __init__(self):
        self.xp = torch_module()

    def f32(self, v, like=None):
        t = self.xp
        return t.tensor(float(v), dtype=t.float32, device=None if like is None else like.device)

    def bf16(self, x):
        t = self.xp
        return x.to(t.bfloat16).to(t.float32)

    @staticmethod
    def encode(y, fmt):
        return encode(y.contiguous(), fmt).to(torch_module().uint8)

    @staticmethod
    def decode(codes, fmt):
        return decode(codes, fmt)

    def signbit(self, y):
        return self.xp.signbit(y)

    def amax_last(self, a):
        t = self.xp
        if a.shape[-1] == 0:
            return t.zeros(a.shape[:-1], dtype=t.float32, device=a.device)
        return t.amax(a, dim=-1)


def quantize_convention(X, plan: Plan, bf16: bool, tensor_amax=None):
    """(packed codes [R, nb·8], scale bytes [R, nb], amax) of the float32 rows X [R, C] under the plan's convention."""
    torch = torch_module()
    R, C = X.shape
    bc = plan.block[1]
    nb = -(-C // bc)
    P = torch.zeros((R, nb * bc), dtype=torch.float32, device=X.device)
    P[:, :C] = X
    codes, scales, amax = CV.quantize_blocks(P.reshape(R, nb, bc), plan.convention, bf16, TorchOps(), tensor_amax)
    c = codes.reshape(R, nb * bc)
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8)
    return packed, scales.to(torch.uint8), amax.reshape(())


def dequantize_convention(data, scales, amax, conv: CV.Convention, rows: int, cols: int, bc: int, bf16: bool):
    """float32 [rows, cols] decoded from packed codes and scale bytes as ``conv``'s producer does."""
    torch = torch_module()
    ops = TorchOps()
    d = data.reshape(rows, -1).to(torch.int64)
    codes = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(rows, -1)
    e = decode(codes, "float4_e2m1fn").reshape(rows, -1, bc)
    s = decode(scales.reshape(rows, -1).to(torch.int64), "float8_e4m3fn")[..., None]
    g = CV.decode_input(amax.to(torch.float32).reshape(()), conv, bf16, ops)
    return CV.decode_blocks(e, s, g, conv, ops).reshape(rows, -1)[:, :cols]
