"""Quantized tensors on torch devices (:class:`TorchQuantized`) and their decoders.

The fields and layouts are :class:`fpsim.QuantizedTensor`'s (same bits); decoding follows the tensor's
:class:`~fpsim.plan.Plan`: on CUDA (or with ``impl="triton"``) two-level and MX tensors with blocks the
kernels take decode in one Triton launch; everything else by the same float32 operations as torch ops
(x̂ = fl((e · s_b) · S_dec) two-level, fl(e · 2^(b−127)) MX, fl(e · d) with FP32 scales).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..conventions import check_plan_parts, decodes_native, get_convention
from ..plan import ElemPath, Plan, lower
from ..schemes import Kind
from ..tensor import QuantizedTensor, moved_2d
from .codecs import code_table, decode, pow2_table
from .runtime import FLT_MAX, fdiv, hw_cvt, layout, torch_module, use_triton

__all__ = ["TorchQuantized", "unpack_codes", "second_level_scales", "decodable", "dequantize_fused",
           "dequantize_eager", "triton_block_width"]


@dataclasses.dataclass(frozen=True, eq=False)
class TorchQuantized:
    """:class:`fpsim.QuantizedTensor`'s fields as torch tensors on one device (same bits, same layouts)."""

    data: object
    scales: object
    amax: object
    scheme: object
    shape: tuple
    axis: int = -1
    convention: str = "fpsim"  #: the producer convention of the bytes (:mod:`fpsim.conventions`)
    bf16: bool = False  #: the quantized input was bfloat16 (a convention's global scale may depend on it)

    @property
    def plan(self) -> Plan:
        return lower(self.scheme, convention=self.convention if self.convention != "fpsim" else None)

    @classmethod
    def from_quantized(cls, q: QuantizedTensor, device="cpu") -> TorchQuantized:
        torch = torch_module()
        # np.array(order="C"), not ascontiguousarray, which makes a 0-d per-tensor scale 1-d; codes wider than
        # 8 bits (BF16 casts) travel as int32, which every torch version has.
        data = np.array(q.data, order="C")
        if data.dtype == np.uint16:
            data = data.astype(np.int32)
        return cls(torch.from_numpy(data).to(device), torch.from_numpy(np.array(q.scales, order="C")).to(device),
                   torch.from_numpy(np.asarray(q.amax, np.float32).copy()).to(device), q.scheme, tuple(q.shape), q.axis,
                   q.convention, q.dtype == "bfloat16")

    def to_quantized(self, dtype: str = "float32") -> QuantizedTensor:
        """The numpy :class:`fpsim.QuantizedTensor` with these bits."""
        data = self.data.cpu().numpy().astype(self.plan.element.code_dtype, copy=False)
        return QuantizedTensor(data, self.scales.cpu().numpy(), self.amax.cpu().numpy(), self.scheme,
                               tuple(self.shape), dtype, self.axis % len(self.shape), self.convention)

    def dequantize(self, dtype=None, impl: str = "auto", convention: str | None = None):
        """Decode to float32 (or ``dtype``) in the original shape, on the tensor's device (the reference's bits);
        ``convention``: decode as that producer does (:mod:`fpsim.conventions`; default the tensor's own)."""
        torch = torch_module()
        plan = self.plan
        ax = self.axis % len(self.shape)
        conv = get_convention(self.convention if convention is None else convention)
        if not decodes_native(conv):
            from .conventions import dequantize_convention

            check_plan_parts(conv, self.scheme)
            moved, R, C = moved_2d(tuple(self.shape), ax)
            out = dequantize_convention(self.data, self.scales, self.amax, conv, R, C, plan.block[1], self.bf16)
            out = torch.movedim(out.reshape(moved), -1, ax)
            return out if dtype is None else out.to(dtype)
        if plan.block is not None and use_triton(self.data, impl) and decodable(plan):
            out = dequantize_fused(self.data, self.scales, self.amax, self.shape[ax], plan, dtype)
            return torch.movedim(out, -1, ax)
        out = dequantize_eager(self, plan)
        return out if dtype is None else out.to(dtype)


def triton_block_width(plan: Plan) -> int | None:
    """The block width W when the block kernels take the plan's block shape ((1, W) or (W, W), W = 16 … 128), else
    None."""
    if plan.block is None:
        return None
    br, bc = plan.block
    if bc not in (16, 32, 64, 128) or br not in (1, bc):
        return None
    return bc


def decodable(plan: Plan) -> bool:
    """Whether the Triton decoders take the plan (two-level with any scale format, or MX; blocks of
    :func:`triton_block_width`)."""
    return plan.kind in (Kind.TWO_LEVEL, Kind.POW2) and triton_block_width(plan) is not None


def unpack_codes(data, packed: bool):
    """Codes as int64, two per byte unpacked (element 2j in the low nibble) when ``packed``."""
    torch = torch_module()
    p = data.to(torch.int64)
    if not packed:
        return p
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])  # no -1: R may be 0


def second_level_scales(plan: Plan, amax_rows):
    """(S_enc, S_dec) per row (SPEC §4): S_enc = min(fl(num / amax), FLT_MAX), 1 for amax 0 or S_enc 0, NaN for a
    NaN amax; S_dec = fl(1 / S_enc).  Ones without a second-level scale."""
    torch = torch_module()
    if not plan.two_level.tensor_scale:
        one = torch.ones_like(amax_rows)
        return one, one
    s_enc = torch.clamp(fdiv(float(plan.two_level.num), amax_rows), max=FLT_MAX)  # clamp keeps a NaN (fmin_nan)
    s_enc = torch.where((amax_rows == 0) | (s_enc == 0), 1.0, s_enc)
    return s_enc, fdiv(1.0, s_enc)


def _out_view(out):
    """The output buffer as the kernels write it: float32 as is, bfloat16 as its int16 bits."""
    torch = torch_module()
    if out.dtype == torch.float32:
        return out
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16)
    raise ValueError(f"dequantize writes float32 or bfloat16, not {out.dtype}")


def dequantize_fused(codes, scales, amax, c: int, plan: Plan, dtype=None, apply_s_dec: bool = True):
    """Decode blocks along the last axis by one Triton kernel, in ``dtype`` (float32 default), to length ``c``.

    ``apply_s_dec=False`` (two-level) gives the exact products e · s_b, which bfloat16 holds exactly for E2M1
    elements and E4M3 scales (at most 5 significant bits): the operands of the dequantize-to-BF16 GEMM.
    """
    from . import kernels_quant as KQ

    torch = torch_module()
    lead = tuple(codes.shape[:-1])
    R = int(np.prod(lead, dtype=np.int64))  # not -1 in the reshapes: a tensor with no columns has no size to infer
    Q = codes.reshape(R, codes.shape[-1]).contiguous()
    S = scales.reshape(R, scales.shape[-1]).contiguous()
    nb = S.shape[1]
    out = torch.empty((R, c), dtype=torch.float32 if dtype is None else dtype, device=codes.device)
    w = triton_block_width(plan)
    bb = max(2048 // w, 1)
    dev = str(codes.device)
    el = plan.element
    dec = code_table("dec" if plan.packed else "byte", el, device=dev)
    kw = dict(BB=bb, W=w, PACK4=plan.packed, OUT_BF16=out.dtype == torch.bfloat16, HW_CVT=hw_cvt(), **layout(R, c, w))
    nblk = R * nb
    if nblk and plan.kind is Kind.TWO_LEVEL:
        tl_ = plan.two_level
        a = torch.as_tensor(amax, dtype=torch.float32, device=codes.device).reshape(-1)
        KQ.two_level_dequant_kernel[(-(-nblk // bb),)](
            Q.view(torch.int32), S, code_table("byte", plan.scale, device=dev), dec, a, _out_view(out), c, nb, nblk,
            APPLY_SDEC=bool(apply_s_dec), NUM=float(tl_.num), TENSOR_SCALE=tl_.tensor_scale, PER_ROW=tl_.per_row,
            E2M1=plan.elem_path is ElemPath.E2M1, **kw)
    elif nblk:
        KQ.mx_dequant_kernel[(-(-nblk // bb),)](Q.view(torch.int32), S, dec, _out_view(out), c, nb, nblk, **kw)
    return out.reshape(*lead, c)


def dequantize_eager(q: TorchQuantized, plan: Plan):
    """Decode with torch operations (any plan): the reference's float32 operations in its order."""
    torch = torch_module()
    el = plan.element
    dev = q.data.device
    if plan.kind is Kind.CAST:
        return decode(q.data, el).reshape(q.shape)
    if plan.block is None:
        return decode(q.data, el) * q.scales.to(torch.float32)
    ax = q.axis % len(q.shape)
    moved, R, C = moved_2d(tuple(q.shape), ax)
    bc = plan.block[1]
    # an explicit width, not -1: a tensor with no rows (R = 0) has no size to infer it from
    codes = unpack_codes(q.data.reshape(R, q.data.shape[-1]), plan.packed)
    e = code_table("dec" if plan.packed else "byte", el, device=str(dev))[codes]
    nb = codes.shape[1] // bc
    if plan.kind is Kind.TWO_LEVEL:
        sv = code_table("byte", plan.scale, device=str(dev))[q.scales.reshape(R, nb).to(torch.int64)]
        amax = q.amax.to(torch.float32)
        amax_rows = amax.reshape(R) if plan.two_level.per_row else amax.reshape(1).expand(R)
        _, s_dec = second_level_scales(plan, amax_rows)
        out = (e.reshape(R, nb, bc) * sv[..., None]) * s_dec[:, None, None]
    elif plan.kind is Kind.POW2:
        p2 = pow2_table(1, str(dev))
        out = e.reshape(R, nb, bc) * p2[q.scales.reshape(R, nb).to(torch.int64)][..., None]
    else:
        out = e.reshape(R, nb, bc) * q.scales.reshape(R, nb).to(torch.float32)[..., None]
    out = out.reshape(R, nb * bc)[:, :C].reshape(moved)
    return torch.movedim(out, -1, ax)
