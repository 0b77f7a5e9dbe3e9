"""``D = alpha · (A · Bᵀ)`` on cuBLASLt with alpha read from device memory (the fast path's ``GEMM = "cublaslt"``).

Why: a scaled × scaled product's alpha (SPEC §8) is computed on the GPU from the two amax values, so the host
never knows it, and ``torch.mm`` takes alpha only as a host number.  The ``"cublas"`` path therefore writes the
FP32 product and a second kernel multiplies it by alpha and rounds it to BF16 (on the H200's benchmark step: 2.6
ms of 41.5, plus the GEMMs' FP32 stores).  cuBLASLt reads alpha from device memory (``CUBLASLT_POINTER_MODE_*``)
and rounds ``alpha · acc`` once, in its own epilogue, to the output type: the model ``fl_out(fl32(acc) · alpha)``
of the ``"blas"`` GEMM, with cuBLAS's own FP32 summation order.

Conventions kept so the product is the model's and repeats bit for bit:

* compute type ``CUBLAS_COMPUTE_32F`` with FP32 alpha: BF16 products accumulated in FP32;
* split-K partial sums only in FP32 (``CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK`` = COMPUTE_TYPE: the
  INPLACE and OUTPUT_TYPE schemes would add partial sums in BF16);
* the algorithm is cuBLASLt's first heuristic choice for the shape, layouts, alignment and a fixed workspace
  (no timing-based choice), cached per configuration;
* one workspace per (device, stream), so runs on concurrent streams never share one;
* beta is zero and C is never read: ``POINTER_MODE = "scalar"`` (``DEVICE``: alpha and a zero beta as device
  scalars, C = D; on the H200 a NaN-filled D came back without a NaN, so C was not read) or ``"vector"``
  (``ALPHA_DEVICE_VECTOR_BETA_ZERO``: alpha as a vector over D's rows; no algorithm on the H200).

The library is the one torch itself loaded (found in ``/proc/self/maps`` after a first torch GEMM on the
device); where there is none (no CUDA, another platform) :func:`available` is False and the fast path uses the
``"cublas"`` path instead.  Every call is capturable in a CUDA graph: no host synchronisation, and no allocation
but the output, the alpha and a stream's workspace on its first call, all from torch's allocator (inside a
capture, from the graph's pool; the workspace is kept for the life of the process).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import NamedTuple

from .runtime import torch_module

__all__ = ["available", "matmul", "operand", "Operand", "Unsupported", "POINTER_MODE", "POINTER_MODES",
           "WORKSPACE_BYTES"]


class Unsupported(RuntimeError):
    """cuBLASLt has no algorithm for a configuration (shape, layouts, types, pointer mode)."""


#: How alpha reaches cuBLASLt (see the module docstring).  On the H200 (2026-12-04, cuBLASLt of torch
#: 2.11+cu130) the heuristic found no algorithm in ``"vector"`` mode for BF16 × BF16 with FP32 compute.
POINTER_MODE = "scalar"
POINTER_MODES = {"scalar": 1, "vector": 3}  # cublasLtPointerMode_t: DEVICE, ALPHA_DEVICE_VECTOR_BETA_ZERO
#: Workspace per (device, stream), and the most a heuristic choice may use (torch's own default on Hopper).
WORKSPACE_BYTES = 32 << 20

# cublasLt.h / library_types.h values (stable across CUDA 11-13)
_COMPUTE_32F = 68
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_OP_N, _OP_T = 0, 1
_DESC_POINTER_MODE, _DESC_TRANSA, _DESC_TRANSB = 2, 3, 4
_PREF_MAX_WORKSPACE, _PREF_REDUCTION_MASK = 1, 3
_PREF_ALIGN = {"A": 5, "B": 6, "C": 7, "D": 8}
_REDUCTION_COMPUTE_TYPE = 2
_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
           11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED"}


class _HeuristicResult(ctypes.Structure):
    # cublasLtMatmulHeuristicResult_t: the algorithm (uint64_t[8]), its workspace, status, waves, reserved
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class Operand(NamedTuple):
    """How cuBLASLt reads one 2-D tensor: its transpose flag, the stored column-major matrix's rows, columns and
    leading dimension (in elements)."""

    trans: int
    rows: int
    cols: int
    ld: int


def operand(shape: tuple, strides: tuple, want_rows: bool) -> Operand | None:
    """cuBLASLt's view of a row-major-indexed ``shape`` tensor with ``strides`` (in elements) such that op(X) is
    the tensor itself (``want_rows`` False: X as it is, R × C) or its transpose (True: C × R), or None where the
    strides are neither row- nor column-major (the caller makes it contiguous).

    A row-major R × C tensor with row stride s is, to a column-major library, the C × R matrix Xᵀ with leading
    dimension s; a column-major one (strides (1, s)) is the R × C matrix X itself with leading dimension s."""
    r, c = shape
    s0, s1 = strides
    if s1 == 1 and s0 >= max(1, c):  # row-major: stored as the C × R matrix Xᵀ
        return Operand(_OP_N if want_rows else _OP_T, c, r, s0)
    if s0 == 1 and s1 >= max(1, r):  # column-major: stored as the R × C matrix X
        return Operand(_OP_T if want_rows else _OP_N, r, c, s1)
    return None


_lock = threading.Lock()
_state: dict = {}


def _library():
    """The cuBLASLt library torch loaded, or None."""
    if "lib" in _state:
        return _state["lib"]
    lib = None
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "libcublasLt.so" in ln})
        if paths:
            lib = ctypes.CDLL(paths[0])
            for name in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute",
                         "cublasLtMatrixLayoutCreate", "cublasLtMatmulPreferenceCreate",
                         "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"):
                getattr(lib, name).restype = ctypes.c_int
            lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                                        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
            lib.cublasLtMatmul.argtypes = [ctypes.c_void_p] * 14 + [ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):  # no such file (another OS), or a library without these symbols
        lib = None
    _state["lib"] = lib
    return lib


def available(device) -> bool:
    """Whether :func:`matmul` runs on ``device`` (a CUDA device whose process has torch's cuBLASLt loaded)."""
    torch = torch_module()
    if torch.device(device).type != "cuda":
        return False
    if "lib" not in _state:
        x = torch.zeros((16, 16), dtype=torch.bfloat16, device=device)
        torch.mm(x, x)  # torch loads cuBLAS and cuBLASLt on its first GEMM
        with _lock:
            _library()
    return _state["lib"] is not None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed: CUBLAS_STATUS_{_STATUS.get(status, status)}")


def _set(fn, obj, attr: int, value, ctype) -> None:
    v = ctype(value)
    _check(fn(obj, attr, ctypes.byref(v), ctypes.sizeof(v)), f"attribute {attr}")


def _handle(lib):
    h = _state.get("handle")
    if h is None:
        h = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        _state["handle"] = h
    return h


def _layout(lib, dtype: int, rows: int, cols: int, ld: int):
    lay = ctypes.c_void_p()
    _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
    return lay


def _alignment(ptr: int) -> int:
    """The largest power of two up to 256 dividing ``ptr`` (the heuristic's alignment preferences)."""
    a = 256
    while ptr % a:
        a //= 2
    return a


@functools.lru_cache(maxsize=1024)
def _plan(key: tuple):
    """(descriptor, layouts A, B, C/D, algorithm) of one configuration, built once (descriptors stay alive for
    the process: a few hundred bytes each)."""
    (_, m, n, k, opa, opb, out_type, mode, aligns) = key
    lib = _state["lib"]
    desc = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F), "cublasLtMatmulDescCreate")
    f = lib.cublasLtMatmulDescSetAttribute
    _set(f, desc, _DESC_POINTER_MODE, POINTER_MODES[mode], ctypes.c_int32)
    _set(f, desc, _DESC_TRANSA, opa.trans, ctypes.c_int32)
    _set(f, desc, _DESC_TRANSB, opb.trans, ctypes.c_int32)
    la = _layout(lib, _R_16BF, opa.rows, opa.cols, opa.ld)
    lb = _layout(lib, _R_16BF, opb.rows, opb.cols, opb.ld)
    ld_ = _layout(lib, out_type, m, n, m)
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    g = lib.cublasLtMatmulPreferenceSetAttribute
    _set(g, pref, _PREF_MAX_WORKSPACE, WORKSPACE_BYTES, ctypes.c_uint64)
    _set(g, pref, _PREF_REDUCTION_MASK, _REDUCTION_COMPUTE_TYPE, ctypes.c_uint32)
    for name, a in zip("ABCD", aligns):
        _set(g, pref, _PREF_ALIGN[name], a, ctypes.c_uint32)
    res = _HeuristicResult()
    count = ctypes.c_int(0)
    status = lib.cublasLtMatmulAlgoGetHeuristic(_handle(lib), desc, la, lb, ld_, ld_, pref, 1, ctypes.byref(res),
                                                ctypes.byref(count))
    if status == 15 or (status == 0 and count.value < 1):  # NOT_SUPPORTED: no algorithm (cached as such)
        return None
    _check(status, "cublasLtMatmulAlgoGetHeuristic")
    return desc, la, lb, ld_, res


def _workspace(device, stream: int):
    key = (device.index, stream)
    ws = _state.get(("ws", key))
    if ws is None:
        ws = _state[("ws", key)] = torch_module().empty(WORKSPACE_BYTES, dtype=torch_module().uint8, device=device)
    return ws


def _as_operand(t, want_rows: bool):
    """(``t`` or its contiguous copy, its :func:`operand` layout): the tensor as it is where cuBLASLt can read its
    strides, else a row-major copy, which it always can."""
    op = operand(tuple(t.shape), tuple(t.stride()), want_rows=want_rows)
    if op is None:
        t = t.contiguous()
        op = operand(tuple(t.shape), tuple(t.stride()), want_rows=want_rows)
    return t, op


def matmul(a, b, alpha, out_dtype, out=None):
    """``fl_out(alpha · (a · bᵀ))``: ``a`` (M × K) and ``b`` (N × K) BF16 CUDA tensors, row- or column-major,
    FP32 accumulation; ``alpha`` a float32 device tensor of N values ("vector" mode) or one ("scalar" mode);
    the result M × N in ``out_dtype`` (float32, BF16 or FP16), written into ``out`` where given (contiguous).
    :class:`Unsupported` where cuBLASLt has no algorithm for the configuration (on the H200: FP16 outputs, and
    every output in "vector" mode) or the device has no cuBLASLt."""
    torch = torch_module()
    if not available(a.device):
        raise Unsupported(f"no cuBLASLt for tensors on {a.device}")
    (M, K), N = a.shape, b.shape[0]
    if b.shape[1] != K:
        raise ValueError(f"reduction lengths differ: {K} and {b.shape[1]}")
    out_type = {torch.float32: _R_32F, torch.bfloat16: _R_16BF, torch.float16: _R_16F}[out_dtype]
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out
    # D (column-major N × M, leading dimension N) is the row-major M × N output: D = op(B) · op(A) with cuBLAS's
    # "A" our B (op gives N × K) and its "B" our A (op gives K × M)
    b, opa = _as_operand(b, want_rows=False)
    a, opb = _as_operand(a, want_rows=True)
    mode = POINTER_MODE
    aligns = tuple(_alignment(t.data_ptr()) for t in (b, a, out, out))
    plan = _plan((a.device.index, N, M, K, opa, opb, out_type, mode, aligns))
    if plan is None:
        raise Unsupported(f"cuBLASLt has no algorithm for D[{M}x{N}] = A·Bᵀ, K = {K}, {out_dtype}, "
                          f"pointer mode {mode!r}")
    desc, la, lb, ld_, res = plan
    lib = _state["lib"]
    stream = torch.cuda.current_stream(a.device).cuda_stream
    ws = _workspace(a.device, stream)
    zero = ctypes.c_float(0.0)  # "vector" mode: beta is zero by the mode itself and this pointer is not read
    beta = ctypes.addressof(zero)
    if mode == "scalar":  # alpha and beta both in device memory
        beta_t = _state.get(("zero", a.device.index))
        if beta_t is None:
            beta_t = _state[("zero", a.device.index)] = torch.zeros(1, dtype=torch.float32, device=a.device)
        beta = beta_t.data_ptr()
    _check(lib.cublasLtMatmul(_handle(lib), desc, alpha.data_ptr(), b.data_ptr(), la, a.data_ptr(), lb, beta,
                              out.data_ptr(), ld_, out.data_ptr(), ld_, ctypes.addressof(res.algo), ws.data_ptr(),
                              WORKSPACE_BYTES, stream),
           "cublasLtMatmul")
    return out
