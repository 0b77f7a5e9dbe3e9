"""Operand copies and GEMMs of the training layer's fast ``gemm="blas"`` path (:mod:`fpsim.torch.nn`).

A :class:`Copy` holds what a GEMM consumes of one quantized operand, written by one fused Triton pass after the
amax pass, with no packed codes and no separate decode (how the training layer makes Wgrad's RHT'd, transposed
copies is :data:`WGRAD`):

* ``"scaled"``: the exact products e · s_b in BF16 of a two-level plan with a per-tensor second level (E2M1 × E4M3
  has at most 6 significant bits), with the tensor amax; the GEMM applies SPEC §8's alpha to its FP32
  accumulator in a fused epilogue (:func:`mm`);
* ``"exact"``: BF16 values equal to the dequantized copy (MX plans whose products are exact in BF16, two-level
  plans without a second level, BF16 casts);
* ``"quantized"``: per-tensor-scaled FP8 on a GPU with FP8 tensor cores: the :class:`TorchQuantized` itself, whose
  GEMM is :func:`fpsim.torch.gemm.gemm`'s ``"blas"`` path (``torch._scaled_mm``);
* ``"f32"``: the dequantized copy in float32 (every other plan: :func:`fpsim.torch.backend.fake_quantize`).

Every copy decodes to the reference's values bit for bit (:func:`values`); only the GEMMs' summation order is
the hardware's, as the ``"blas"`` model says.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import numpy as np

from ..plan import Plan
from ..schemes import Kind
from . import cublaslt
from .container import second_level_scales
from .gemm import gemm, mm_f32
from .launch import launch
from .quantize import absmax, quantize_fused, triton_unsupported
from .runtime import hw_cvt, kernels, torch_module, use_triton

__all__ = ["Copy", "copy_kind", "make_copy", "transposed", "values", "mm", "scaled_mm", "lt_mm", "alpha_epilogue",
           "enabled", "IMPL", "GEMM", "GEMMS", "WGRAD", "WGRAD_PATHS", "wgrad_path", "MMTiles", "MM_TILES"]

#: ``impl`` of the fast path's kernels: "auto" (CUDA tensors only) or "triton" (any device: the interpreter, tests).
IMPL = "auto"
#: How a scaled × scaled product is computed: ``"cublas"`` (``torch.mm`` with FP32 output, then the alpha
#: epilogue kernel), ``"cublaslt"`` (:func:`lt_mm`: alpha computed on the GPU into device memory, then one
#: cuBLASLt GEMM that reads it there and rounds alpha · acc once to the output type; where
#: :func:`fpsim.torch.cublaslt.available` is False, for FP16 outputs and for a configuration cuBLASLt has no
#: algorithm for, the ``"cublas"`` path) or ``"triton"`` (:func:`scaled_mm`:
#: one Triton GEMM with alpha applied to its accumulator tiles).  All accumulate exact BF16 products in FP32,
#: in their own orders.  ``"cublaslt"`` is the default: on the H200's benchmark step it removes the epilogue
#: kernel's pass over every FP32 product (``reports/bench_training.md``).
GEMM = "cublaslt"
GEMMS = ("cublas", "cublaslt", "triton")
#: How the training layer makes Wgrad's scaled copies of RHT(Xᵀ) and RHT(dYᵀ); every path gives the same bits:
#:
#: * ``"stored"``: one pass writes the RHT'd transpose as BF16 with its amax, the fused quantizer reads it back;
#: * ``"shared"``: ``"stored"``, and where Fprop's X copy (Dgrad's dY copy) is a scaled copy of the same tensor,
#:   that pass also takes its amax (:func:`fpsim.torch.rht.rht_transposed_amaxes`), in forward for X, so the plain
#:   copy skips its amax pass and backward keeps the BF16 transpose instead of X;
#: * ``"registers"``: an amax pass that stores nothing, then the RHT and the quantization in registers
#:   (:func:`fpsim.torch.rht.rht_transposed_scaled`: the transpose is never written);
#: * ``"paired"``: ``"registers"``, and where Fprop's X copy (Dgrad's dY copy) is another scaled copy of the same
#:   tensor, one read takes both amax values and, where the two share a plan, one more pass writes both copies
#:   (:func:`fpsim.torch.rht.rht_transposed_scaled_pair`).
#:
#: Fewer bytes are not always less time: on the H200 (2026-12-02, ``studies.bench.gpu``) the Wgrad copy took
#: 1.61 ms stored against 1.80 ms in registers, and dY's two SR copies 2.68 ms in four passes against 4.18 ms
#: paired; the register kernel's transposed tiles cost more than the bytes they save.  ``"shared"`` is the
#: default: its graph step (``studies.bench.training``, every block NVFP4, 2026-12-02) took 45.8 against 46.0 ms
#: stored in one run and 45.4 against 45.7 ms in another, with the transposed RHT's wide tiles 44.6 ms, and its
#: peak memory is 0.1-0.2 GiB lower (backward keeps the BF16 transpose, not X).
WGRAD = "shared"
WGRAD_PATHS = ("stored", "shared", "registers", "paired")

_BF16_PRECISION = 8  # significant bits of BFloat16
_BF16_MIN_EXP = -133  # exponent of its smallest subnormal


def wgrad_path() -> str:
    """:data:`WGRAD`, checked."""
    if WGRAD not in WGRAD_PATHS:
        raise ValueError(f"fpsim.torch.fastpath.WGRAD is {WGRAD!r}; choose one of {', '.join(WGRAD_PATHS)}")
    return WGRAD


class Copy(NamedTuple):
    """One operand copy as a GEMM reads it (rows × K, K last); see the module docstring for ``kind``."""

    values: object
    kind: str
    amax: object = None
    num: float = 0.0
    plan: Plan | None = None


def enabled(x) -> bool:
    """Whether the fast path runs on tensors like ``x`` (the fused kernels: CUDA, or ``IMPL="triton"``)."""
    return use_triton(x, IMPL)


def _quantum_exp(tr) -> int:
    """log2 of a format's smallest step (its subnormal quantum, or its smallest normal step without subnormals)."""
    return (tr.emin_b - 127) - tr.mbits


def _products_exact(el, sc_mbits: int, sc_quantum_exp: int) -> bool:
    """Every element value × scale value is a BF16 number: the significands fit its 8 bits and the smallest
    step is on its grid (larger products overflow to inf in float32 and BF16 alike)."""
    return el.mbits + 1 + sc_mbits + 1 <= _BF16_PRECISION and _quantum_exp(el) + sc_quantum_exp >= _BF16_MIN_EXP


@functools.lru_cache(maxsize=512)
def copy_kind(plan: Plan) -> str:
    """``"scaled"``, ``"exact"``, ``"cast"`` (a BF16 cast) or ``"f32"``: how :func:`make_copy` writes the plan."""
    if plan.kind is Kind.CAST:
        return "cast" if plan.element.name == "bfloat16" and plan.rounding.value == "rne" else "f32"
    if triton_unsupported(plan) is not None:
        return "f32"
    el = plan.element.traits
    if plan.kind is Kind.TWO_LEVEL:
        tl_ = plan.two_level
        sc = plan.scale.traits
        if tl_.per_row or not _products_exact(el, sc.mbits, _quantum_exp(sc)):
            return "f32"
        return "scaled" if tl_.tensor_scale else "exact"
    if plan.kind is Kind.POW2 and _products_exact(el, plan.scale.traits.mbits, _quantum_exp(plan.scale.traits)):
        return "exact"
    return "f32"


def make_copy(x, plan: Plan, seed: int | None = None, amax=None) -> Copy:
    """The copy of the 2-D ``x`` (float32 or BF16, quantized along its last axis; contiguous unless the plan is a
    BF16 cast) under ``plan``; ``amax``: the tensor amax of ``x`` where the caller has it (the NaN policy's), else
    measured here."""
    torch = torch_module()
    kind = copy_kind(plan)
    kw = {} if seed is None else {"seed": seed}
    if kind == "cast":  # RNE with IEEE overflow: torch's conversion is the reference cast (any strides)
        return Copy(x.to(torch.bfloat16), "exact")
    if kind == "f32" and _fp8_tensor_cores(plan, x):
        from .backend import quantize

        return Copy(quantize(x.to(torch.float32), plan), "quantized", plan=plan)
    if kind == "f32":
        from .backend import fake_quantize

        return Copy(fake_quantize(x.to(torch.float32), plan, **kw), "f32")
    if plan.kind is Kind.TWO_LEVEL and plan.two_level.tensor_scale:
        amax = absmax(x, plan.ignore_nan) if amax is None else amax
        v = quantize_fused(x, plan, amax, fake=True, apply_s_dec=False, out_dtype=torch.bfloat16, **kw)
        return Copy(v, "scaled", amax, float(plan.two_level.num), plan)
    nan = torch.full((), float("nan"), dtype=torch.float32, device=x.device)
    return Copy(quantize_fused(x, plan, nan, fake=True, out_dtype=torch.bfloat16, **kw), "exact", plan=plan)


def _fp8_tensor_cores(plan: Plan, x) -> bool:
    """Per-tensor FP8 (E4M3/E5M2 elements, one FP32 scale) on a CUDA device with FP8 tensor cores (8.9+)."""
    torch = torch_module()
    return (plan.kind is Kind.FP32 and plan.block is None and plan.element.name in ("float8_e4m3fn", "float8_e5m2")
            and x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 9))


def transposed(c: Copy) -> Copy:
    """The copy of the transposed tensor, where its blocks are square tiles (the same tiles, the same values)."""
    return c._replace(values=c.values.t())


def values(c: Copy):
    """The float32 values the copy stands for (the reference's dequantized copy, bit for bit)."""
    torch = torch_module()
    if c.kind == "quantized":
        return c.values.dequantize()
    v = c.values.to(torch.float32)
    if c.kind != "scaled":
        return v
    _, s_dec = second_level_scales(c.plan, c.amax.reshape(1))
    return v * s_dec  # fl((e · s_b) · S_dec), the reference's decode


def alpha_epilogue(acc, a: Copy, b: Copy, out_dtype):
    """fl(acc · alpha) of two scaled copies in ``out_dtype`` (float32 or BF16), one fused kernel."""
    K = kernels()

    torch = torch_module()
    if out_dtype not in (torch.float32, torch.bfloat16):
        return alpha_epilogue(acc, a, b, torch.float32).to(out_dtype)
    out = acc if out_dtype == torch.float32 else torch.empty(acc.shape, dtype=out_dtype, device=acc.device)
    n = acc.numel()
    if n:
        bf16 = out.dtype == torch.bfloat16
        launch(K.alpha_epilogue_kernel, (-(-n // _EPILOGUE_BLOCK),),
               (acc, out.view(torch.int16) if bf16 else out, a.amax, b.amax, n), _epilogue_kw(a.num, b.num, bf16,
                                                                                               hw_cvt()))
    return out


_EPILOGUE_BLOCK = 2048


def _alpha_kw(num_a: float, num_b: float, out_bf16: bool, hw: bool) -> dict:
    """The keywords every alpha-applying kernel takes: the two second-level numerators, their float32 product
    (SPEC §8's NUM_AB) and the output switches."""
    na, nb = np.float32(num_a), np.float32(num_b)
    return {"NUM_A": float(na), "NUM_B": float(nb), "NUM_AB": float(na * nb), "OUT_BF16": out_bf16, "HW_CVT": hw}


@functools.lru_cache(maxsize=64)
def _epilogue_kw(num_a: float, num_b: float, out_bf16: bool, hw: bool) -> dict:
    """The epilogue kernel's keywords for one pair of second-level numerators (built once per configuration)."""
    return {**_alpha_kw(num_a, num_b, out_bf16, hw), "BLOCK": _EPILOGUE_BLOCK, "num_warps": 4}


class MMTiles(NamedTuple):
    """The tiling of :func:`scaled_mm`: output tiles BM × BN, K steps of BK, GROUP_M tile rows per program group,
    warps and pipeline stages.  Fixed, not tuned per call: the FP32 sums' order follows BK, so a timing-based
    choice would change the bits from run to run (``studies/bench/scaled_mm.py`` sweeps candidates offline)."""

    BM: int = 128
    BN: int = 128
    BK: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3


#: The tiling every scaled_mm call uses.
MM_TILES = MMTiles()


@functools.lru_cache(maxsize=64)
def _mm_kw(num_a: float, num_b: float, out_bf16: bool, hw: bool, tiles: MMTiles) -> dict:
    """The scaled GEMM's keywords for one pair of second-level numerators and one tiling (built once)."""
    return {**_alpha_kw(num_a, num_b, out_bf16, hw), **tiles._asdict()}


def scaled_mm(a: Copy, b: Copy, out_dtype, tiles: MMTiles | None = None):
    """fl(A·Bᵀ · alpha) of two scaled copies in one Triton kernel (float32 or BF16 out; see :data:`GEMM`), tiled
    by ``tiles`` (default :data:`MM_TILES`)."""
    K = kernels()

    torch = torch_module()
    A, B = a.values, b.values
    (M, k), N = A.shape, B.shape[0]
    if B.shape[1] != k:
        raise ValueError(f"reduction lengths differ: {k} and {B.shape[1]}")
    out = torch.empty((M, N), dtype=out_dtype, device=A.device)
    if out.numel():
        bf16 = out_dtype == torch.bfloat16
        t = MM_TILES if tiles is None else tiles
        grid = (-(-M // t.BM) * -(-N // t.BN),)
        launch(K.scaled_mm_kernel, grid, (A, B, out.view(torch.int16) if bf16 else out, a.amax, b.amax, M, N, k,
                                          A.stride(0), A.stride(1), B.stride(0), B.stride(1), N),
               _mm_kw(a.num, b.num, bf16, hw_cvt(), t))
    return out


def alpha_vector(a: Copy, b: Copy, n: int):
    """SPEC §8's alpha of two scaled copies, written ``n`` times into a new float32 device tensor (one kernel)."""
    K = kernels()
    torch = torch_module()
    out = torch.empty(max(n, 1), dtype=torch.float32, device=a.amax.device)
    launch(K.alpha_kernel, (-(-out.numel() // _ALPHA_BLOCK),), (a.amax, b.amax, out, out.numel()),
           _alpha_vector_kw(a.num, b.num))
    return out


_ALPHA_BLOCK = 1024


@functools.lru_cache(maxsize=64)
def _alpha_vector_kw(num_a: float, num_b: float) -> dict:
    kw = _alpha_kw(num_a, num_b, False, True)
    return {k: kw[k] for k in ("NUM_A", "NUM_B", "NUM_AB")} | {"BLOCK": _ALPHA_BLOCK, "num_warps": 4}


def lt_mm(a: Copy, b: Copy, out_dtype):
    """fl(A·Bᵀ · alpha) of two scaled copies on cuBLASLt (:mod:`fpsim.torch.cublaslt`): alpha from
    :func:`alpha_vector`, one value per output column in its "vector" pointer mode, else one."""
    n = b.values.shape[0] if cublaslt.POINTER_MODE == "vector" else 1
    try:
        return cublaslt.matmul(a.values, b.values, alpha_vector(a, b, n), out_dtype)
    except cublaslt.Unsupported as e:  # a configuration cuBLASLt has no algorithm for: the epilogue path
        if str(e) not in _LT_UNSUPPORTED:
            _LT_UNSUPPORTED.add(str(e))
            log.warning("fpsim.torch: %s; using torch.mm and the alpha epilogue", e)
        return alpha_epilogue(mm_f32(a.values, b.values), a, b, out_dtype)


_LT_UNSUPPORTED: set = set()  # what lt_mm fell back on, once each (a warning, then silence)
log = logging.getLogger("fpsim.torch")


def mm(a: Copy, b: Copy, out_dtype):
    """``A · Bᵀ`` of two copies in ``out_dtype``: BF16 tensor cores with FP32 accumulation for scaled × scaled
    (then × alpha) and exact × exact; a float32 GEMM of the dequantized values otherwise."""
    torch = torch_module()
    if a.kind == b.kind == "scaled":
        if GEMM not in GEMMS:
            raise ValueError(f"fpsim.torch.fastpath.GEMM is {GEMM!r}; choose one of {', '.join(GEMMS)}")
        if GEMM == "triton" and out_dtype in (torch.float32, torch.bfloat16):
            return scaled_mm(a, b, out_dtype)
        if GEMM == "cublaslt" and out_dtype in (torch.float32, torch.bfloat16) \
                and a.values.shape[1] and cublaslt.available(a.values.device):
            return lt_mm(a, b, out_dtype)
        return alpha_epilogue(mm_f32(a.values, b.values), a, b, out_dtype)
    if (a.kind == b.kind == "quantized" and not a.plan.element.name == b.plan.element.name == "float8_e5m2"
            and all(n % 16 == 0 for n in (*a.values.shape, *b.values.shape))):  # torch._scaled_mm's shapes
        return gemm(a.values, b.values, "blas").to(out_dtype)  # FP8 tensor cores (cuBLAS has no E5M2 × E5M2)
    if a.kind == b.kind == "exact":
        if a.values.is_cuda and out_dtype == torch.bfloat16:
            return torch.mm(a.values, b.values.t())  # FP32 accumulation, rounded to BF16 once
        return mm_f32(a.values, b.values).to(out_dtype)
    return (values(a) @ values(b).t()).to(out_dtype)
