"""GEMM of quantized operands on torch devices: SPEC §8's bit-defined ``"fp32"`` model, the tensor-core paths
(exact dequantize-to-BF16 for NVFP4-like operands, FP8 tensor cores, Blackwell's native block-scaled GEMM),
dispatched by capability."""

from __future__ import annotations

import numpy as np

from ..formats import get_format
from ..plan import Plan
from ..schemes import Kind
from .codecs import decode
from .container import TorchQuantized, dequantize_fused, unpack_codes
from .runtime import FLT_MAX, fdiv, torch_module, use_triton

__all__ = ["gemm", "mm_f32", "gemm_fp32_model", "gemm_bf16_exact", "gemm_fp8_scaled_mm", "gemm_blackwell",
           "blackwell_scaled_mm_args", "second_level_alpha", "scaled_values_bf16", "bf16_exact"]

_E2M1 = get_format("float4_e2m1fn").traits
_E4M3 = get_format("float8_e4m3fn").traits


def bf16_exact(plan: Plan) -> bool:
    """NVFP4-like operands: E2M1 elements × E4M3 block scales (1-D blocks or 2-D tiles, whose scales are stored
    per row) with a per-tensor second level, so that e · s_b (at most 6 significant bits) is exact in BF16 (read
    off the traits, not the names)."""
    return (plan.kind is Kind.TWO_LEVEL and plan.element.traits == _E2M1 and plan.scale.traits == _E4M3
            and plan.block is not None and plan.two_level.tensor_scale and not plan.two_level.per_row)


def second_level_alpha(a_amax, b_amax, num_a: float, num_b: float):
    """SPEC §8's alpha = fl(fl(amax_a·amax_b) / fl(N_a·N_b)), or fl(S_dec_a·S_dec_b) where that formula fails.

    Python scalars only (exact in float32): ``torch.tensor(v, device="cuda")`` would copy from pageable
    host memory and synchronise the host with the GPU on every call.
    """
    torch = torch_module()
    aa, ab = a_amax.to(torch.float32).reshape(()), b_amax.to(torch.float32).reshape(())
    alpha = fdiv(aa * ab, float(np.float32(num_a) * np.float32(num_b)))

    def sdec(amax, num):
        s_enc = torch.clamp(fdiv(num, amax), max=FLT_MAX)  # clamp keeps a NaN, like fmin_nan
        s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
        return fdiv(1.0, s_enc)

    def ok(amax, num):
        return torch.isfinite(amax) & (amax > 0) & (fdiv(num, amax) < FLT_MAX)

    good = ok(aa, num_a) & ok(ab, num_b) & torch.isfinite(alpha) & (alpha > 0)
    return torch.where(good, alpha, sdec(aa, num_a) * sdec(ab, num_b))


def _alpha(a: TorchQuantized, b: TorchQuantized):
    return second_level_alpha(a.amax, b.amax, float(a.plan.two_level.num), float(b.plan.two_level.num))


def mm_f32(a, b_t, alpha=None, out_dtype=None):
    """fl(alpha · a·b_tᵀ): BF16 tensor cores with FP32 accumulation and FP32 output on CUDA (``mm.dtype``),
    then one in-place FP32 multiply by the 0-d device tensor ``alpha`` (no host synchronisation, which a
    scalar alpha for cuBLAS's epilogue would need); exact float32 products on CPU.  ``out_dtype=bfloat16``
    rounds the FP32 result to BF16 (the output of a BF16 ``torch.matmul``)."""
    torch = torch_module()
    if a.is_cuda and a.dtype == torch.bfloat16:
        out = torch.mm(a, b_t.t(), out_dtype=torch.float32)
    else:
        out = torch.mm(a.float(), b_t.float().t())
    if alpha is not None:
        out.mul_(alpha)
    return out if out_dtype in (None, torch.float32) else out.to(out_dtype)


def gemm_bf16_exact(a: TorchQuantized, b: TorchQuantized, out_dtype=None):
    """NVFP4 × NVFP4 on Hopper/Ada tensor cores: exact dequantize-to-BF16 then one BF16 GEMM (SPEC §8).

    e · s_b (an E2M1 value times an E4M3 scale) is exact in BF16, so the tensor cores multiply the
    exact block-scaled values and accumulate in FP32 in their own order; the result is
    fl(acc · alpha).  Equal to :func:`fpsim.gemm`'s ``"blas"`` model up to FP32 summation order.
    ``out_dtype=torch.bfloat16`` rounds that FP32 result to BF16 (the output of a BF16 ``torch.matmul``).
    """
    ka, kb = a.shape[-1], b.shape[-1]
    if ka != kb:
        raise ValueError(f"reduction lengths differ: {ka} and {kb}")
    return mm_f32(scaled_values_bf16(a), scaled_values_bf16(b), _alpha(a, b), out_dtype)


def scaled_values_bf16(q: TorchQuantized):
    """e · s_b of an NVFP4 operand in BF16 (exact): the fused kernel on CUDA, torch ops elsewhere."""
    torch = torch_module()
    k = q.shape[-1]
    plan = q.plan
    if use_triton(q.data, "auto"):
        return dequantize_fused(q.data, q.scales, q.amax, k, plan, torch.bfloat16, apply_s_dec=False)
    sv = decode(q.scales, plan.scale).repeat_interleave(plan.block[1], dim=-1)
    return (decode(unpack_codes(q.data, plan.packed), plan.element) * sv)[..., :k].to(torch.bfloat16)


def _f64_exact_sums(ea, eb, chunk: int) -> bool:
    """Whether every sum of ``chunk`` products of these element formats is exact in float64 (whatever the order):
    the products' span, from the smallest non-zero to the largest magnitude, plus the carry bits fits 53 bits."""
    lo = float(ea.min_subnormal or ea.min_normal) * float(eb.min_subnormal or eb.min_normal)
    hi = float(ea.max) * float(eb.max)
    return np.log2(hi / lo) + np.log2(chunk) + 1 <= 53


def gemm_fp32_model(a: TorchQuantized, b: TorchQuantized):
    """SPEC §8's bit-defined ``"fp32"`` accumulator model on the operands' device: equal to
    ``fpsim.gemm(qa, qb, "fp32")`` bit for bit (tested).

    Per K-chunk (ascending): P = Σ e_a·e_b by one matmul over the chunk (BF16 tensor cores where both
    element formats are E2M1, whose 16-term block sums are exact in FP32; float64 otherwise, as the
    reference), then term = fl(fl(s_a ⊗ s_b) · fl(P)) and acc = fl(acc + term) as three separate
    float32 operations, and finally fl(acc · alpha).
    """
    from ..gemm import alpha_factor, chunked_operands

    torch = torch_module()
    dev = a.data.device
    oa, ob, k, chunk, nch, sa, sb = chunked_operands(a.to_quantized(), b.to_quantized())
    sa, sb = torch.from_numpy(sa).to(dev), torch.from_numpy(sb).to(dev)
    fp4 = a.plan.element.traits == b.plan.element.traits == _E2M1
    wdt = torch.bfloat16 if (fp4 and dev.type == "cuda") else torch.float64
    # A float64 matmul sums in the library's order; that equals the reference's ascending float64 sum only where
    # every partial sum is exact.  Otherwise (BF16, FP16, E5M2 × E5M2 …) sum term by term, in ascending order.
    seq = wdt == torch.float64 and not _f64_exact_sums(a.plan.element, b.plan.element, chunk)
    ea = torch.zeros((oa.values.shape[0], nch * chunk), dtype=torch.float32, device=dev)
    eb = torch.zeros((ob.values.shape[0], nch * chunk), dtype=torch.float32, device=dev)
    ea[:, :k] = torch.from_numpy(oa.values).to(dev)
    eb[:, :k] = torch.from_numpy(ob.values).to(dev)
    ea, eb = ea.to(wdt), eb.to(wdt)
    acc = torch.zeros((ea.shape[0], eb.shape[0]), dtype=torch.float32, device=dev)
    for c in range(nch):
        s = slice(c * chunk, (c + 1) * chunk)
        if seq:
            p64 = torch.zeros_like(acc, dtype=torch.float64)
            for t in range(s.start, s.stop):
                p64 += ea[:, t, None] * eb[None, :, t]  # each product exact in float64, one rounding per sum
            p = p64.float()
        else:
            p = mm_f32(ea[:, s], eb[:, s]) if wdt == torch.bfloat16 else (ea[:, s] @ eb[:, s].t()).float()
        acc = acc + (sa[:, c, None] * sb[None, :, c]) * p
    return acc * torch.from_numpy(alpha_factor(oa, ob)).to(dev)


def gemm_fp8_scaled_mm(a: TorchQuantized, b: TorchQuantized, out_dtype=None):
    """Per-tensor-scaled FP8 × FP8 on FP8 tensor cores (compute capability ≥ 8.9) via ``torch._scaled_mm``.

    The codes are reinterpreted as torch's float8_e4m3fn / float8_e5m2 (the same OCP bit layouts);
    ``scale_a``/``scale_b`` are the stored FP32 decode scales d = amax / max_elem.  cuBLAS accumulates
    in its own order (and, on Hopper, with a narrower-than-FP32 accumulator): compare with the
    ``"exact"`` model, not bit for bit.  E5M2 × E5M2 is not a cuBLAS FP8 combination.
    """
    torch = torch_module()
    dt = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    ea, eb = a.scheme.element.name, b.scheme.element.name
    if ea == eb == "float8_e5m2":
        raise ValueError("cuBLAS has no E5M2 × E5M2 FP8 GEMM")
    ma = a.data.view(dt[ea])
    mb = b.data.view(dt[eb])
    sa = a.scales.to(torch.float32).reshape(())
    sb = b.scales.to(torch.float32).reshape(())
    return torch._scaled_mm(ma, mb.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype or torch.float32)


def blackwell_scaled_mm_args(a: TorchQuantized, b: TorchQuantized) -> dict:
    """Arguments of ``torch._scaled_mm`` for a native block-scaled GEMM on Blackwell (compute capability 10.x).

    NVFP4: ``mat_a`` (M, K/2) float4_e2m1fn_x2 (element 2j in the low nibble, as fpsim packs),
    ``mat_b`` the (N, K/2) codes transposed to a column-major (K/2, N) view, block scales as
    float8_e4m3fn in the swizzled layout of SPEC §4 (:func:`fpsim.swizzle_scales`), flattened;
    the second level is applied after the GEMM as ``alpha`` (SPEC §8).  MXFP4/MXFP8: the same with
    float8_e8m0fnu scales and blocks of 32 (MXFP8 codes as float8_e4m3fn/e5m2, one per byte).
    Unit-tested on CPU for layout and dtypes only: never run on Blackwell hardware.
    """
    from ..scaling import swizzle_scales

    torch = torch_module()
    sa, sb = a.scheme, b.scheme
    if len(a.shape) != 2 or len(b.shape) != 2 or a.axis % 2 != 1 or b.axis % 2 != 1:
        raise ValueError("operands must be 2-D and quantized along K (their last axis)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"reduction lengths differ: {a.shape} and {b.shape}")
    k = a.shape[1]
    nv = bf16_exact(a.plan) and bf16_exact(b.plan)
    mx = sa.kind is sb.kind is Kind.POW2 and sa.block == sb.block == (1, 32) and sa.element == sb.element
    if not (nv or mx):
        raise ValueError(f"no native block-scaled GEMM for {sa.name} × {sb.name}")
    blk = 16 if nv else 32
    if k % (4 * blk):
        raise ValueError(f"K = {k} must be a multiple of {4 * blk} for the tensor-core scale layout")
    el = sa.element.name
    mdt = {"float4_e2m1fn": torch.float4_e2m1fn_x2, "float8_e4m3fn": torch.float8_e4m3fn,
           "float8_e5m2": torch.float8_e5m2}
    if el not in mdt:
        raise ValueError(f"no native tensor-core GEMM for {el} elements")
    sdt = torch.float8_e4m3fn if nv else torch.float8_e8m0fnu

    def scales(q):
        sw = swizzle_scales(q.scales.cpu().numpy())
        return torch.from_numpy(sw).to(q.data.device).view(sdt)

    args = {
        "mat_a": a.data.contiguous().view(mdt[el]),
        "mat_b": b.data.contiguous().view(mdt[el]).t(),
        "scale_a": scales(a),
        "scale_b": scales(b),
        "out_dtype": torch.float32 if nv else torch.bfloat16,
    }
    return {"args": args, "alpha": _alpha(a, b) if nv else None}


def gemm_blackwell(a: TorchQuantized, b: TorchQuantized):
    """Native NVFP4/MX GEMM on Blackwell tensor cores (untested on hardware; see :func:`blackwell_scaled_mm_args`)."""
    torch = torch_module()
    prep = blackwell_scaled_mm_args(a, b)
    out = torch._scaled_mm(**prep["args"]).float()
    return out * prep["alpha"] if prep["alpha"] is not None else out


def gemm(a: TorchQuantized, b: TorchQuantized, accumulator: str = "fp32"):
    """``A · Bᵀ`` of two quantized operands on their device, dispatched by capability.

    ``"fp32"``: :func:`gemm_fp32_model`, bit-identical to the reference on every device.
    ``"blas"`` (fast; FP32 summation order is the hardware's): on Blackwell (10.x) NVFP4/MX go to
    native block-scaled tensor cores; on compute capability ≥ 8.9 per-tensor FP8 goes to FP8 tensor
    cores; NVFP4 anywhere on CUDA to :func:`gemm_bf16_exact`; everything else to the reference's
    ``"blas"`` model on the host.  ``"exact"`` / ``"truncated"`` run the reference on the host.
    """
    from ..gemm import gemm as np_gemm

    torch = torch_module()
    dev = a.data.device
    if accumulator == "fp32":
        return gemm_fp32_model(a, b)
    if accumulator == "blas" and dev.type == "cuda":
        cc = torch.cuda.get_device_capability(dev)
        nv = bf16_exact(a.plan) and bf16_exact(b.plan)
        if cc[0] == 10:
            try:
                blackwell_scaled_mm_args(a, b)
                return gemm_blackwell(a, b)
            except ValueError:
                pass
        fp8 = {"float8_e4m3fn", "float8_e5m2"}
        if (cc >= (8, 9) and a.scheme.kind is b.scheme.kind is Kind.FP32 and a.scheme.block is None
                and b.scheme.block is None and {a.scheme.element.name, b.scheme.element.name} <= fp8
                and not a.scheme.element.name == b.scheme.element.name == "float8_e5m2"):
            return gemm_fp8_scaled_mm(a, b)
        if nv and a.shape[-1] == b.shape[-1]:
            return gemm_bf16_exact(a, b)
    out = np_gemm(a.to_quantized(), b.to_quantized(), accumulator)
    return torch.from_numpy(out).to(dev)


