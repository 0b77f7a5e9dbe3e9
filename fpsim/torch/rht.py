"""The random Hadamard transform on torch tensors: the same float32 operations, in the same order, as
:func:`fpsim.rht` (one Triton kernel on CUDA, or torch operations)."""

from __future__ import annotations

import functools

import numpy as np

from ..transforms import sign_vector
from .codecs import bf16_round
from .launch import launch
from .runtime import WARPS, kernels, torch_module, use_triton

__all__ = ["rht", "rht_transposed"]


@functools.lru_cache(maxsize=256)
def _sign_tensor(d: int, signs, device: str):
    torch = torch_module()
    return torch.from_numpy(sign_vector(d, signs)).to(device)


def _signs_on(d: int, signs, device):
    """The ±1 sign vector on ``device``; named or seeded signs are cached per device (a fresh host-to-device copy
    per call would synchronise the host with the GPU on every Wgrad copy), an explicit vector is copied."""
    if isinstance(signs, (str, int, np.integer)):
        return _sign_tensor(int(d), signs if isinstance(signs, str) else int(signs), str(device))
    torch = torch_module()
    return torch.from_numpy(sign_vector(d, signs)).to(device)


def rht(x, d: int = 16, signs="recipe", axis: int = -1, bf16_in: bool = True, bf16_out: bool = True,
        inverse: bool = False, impl: str = "auto", out_dtype=None):
    """Random Hadamard transform with the same float32 operations, in the same order, as :func:`fpsim.rht`.

    Each butterfly stage computes (a + b, a − b) on the same pairs as the Numba kernel, so every output
    element sees the identical sequence of roundings.  On CUDA (``impl="auto"``) one Triton kernel does the
    whole transform in registers; ``impl="eager"`` runs it as torch operations (a few launches and
    temporaries per stage).  ``signs`` as :func:`fpsim.transforms.sign_vector` takes them.
    ``out_dtype=torch.bfloat16`` (with ``bf16_out``) returns the BF16-rounded values in BF16 storage, exactly;
    the Triton kernel reads a BF16 ``x`` as it is (widening is exact).
    """
    torch = torch_module()
    if out_dtype not in (None, torch.float32, torch.bfloat16) or (out_dtype == torch.bfloat16 and not bf16_out):
        raise ValueError("out_dtype is float32, or bfloat16 with bf16_out=True (the values are then exact)")
    s = _signs_on(d, signs, x.device)
    fused = use_triton(x, impl) and d <= 4096  # one tile in registers (larger d: the eager path)
    keep = fused and x.dtype == torch.bfloat16
    v = torch.movedim(x if keep else x.to(torch.float32), axis, -1)
    n = v.shape[-1]
    if n % d:
        raise ValueError(f"axis length {n} is not a multiple of the Hadamard size {d}")
    lead = v.shape[:-1]
    d = int(d)
    inv_sqrt = np.float32(1.0 / np.sqrt(d))
    if fused:
        from . import kernels as K

        v = v.contiguous()
        out = torch.empty(v.shape, dtype=out_dtype or torch.float32, device=v.device)
        nt = v.numel() // d
        bb = max(1, 2048 // d)  # tiles per program: 2048 values, like the quantizers' programs
        if nt:
            launch(K.rht_kernel, (-(-nt // bb),), (v, s, out, nt, float(inv_sqrt)),
                   {"D": d, "LOG2D": d.bit_length() - 1, "BB": bb, "BF16_IN": bool(bf16_in), "BF16_OUT": bool(bf16_out),
                    "INVERSE": bool(inverse), "IDX64": v.numel() >= (1 << 31) - 4096, "num_warps": WARPS})
        return torch.movedim(out, -1, axis)
    t = v.reshape(-1, n // d, d)
    if bf16_in:
        t = bf16_round(t)
    if not inverse:
        t = t * s
    h = 1
    while h < d:
        t4 = t.reshape(t.shape[0], t.shape[1], d // (2 * h), 2, h)
        a, b = t4[..., 0, :], t4[..., 1, :]
        t = torch.stack([a + b, a - b], dim=-2).reshape(t.shape[0], t.shape[1], d)
        h *= 2
    t = t * float(inv_sqrt)  # an exact float32 multiplier: one rounding, no host-to-device copy
    if inverse:
        t = t * s
    if bf16_out:
        t = bf16_round(t)
    t = t if out_dtype is None else t.to(out_dtype)
    return torch.movedim(t.reshape(*lead, n), -1, axis)


def rht_transposed(x, d: int = 16, signs="recipe", *, out_dtype=None, amax: bool = False, ignore_nan: bool = False,
                   impl: str = "auto"):
    """``rht(x.T, d, signs)`` (BF16 in and out, as the recipe's Wgrad copies) of a 2-D ``x`` without writing ``x.T``
    first, and with ``amax`` the float32 max |value| of the result (NaN-propagating unless ``ignore_nan``) from the
    same pass: ``(out, amax or None)``.  One Triton kernel where the kernels run; else ``rht`` of the transposed
    copy and a separate amax.  Bit-identical either way.
    """
    torch = torch_module()
    R, C = x.shape
    d = int(d)
    if R % d:
        raise ValueError(f"axis length {R} is not a multiple of the Hadamard size {d}")
    if not (use_triton(x, impl) and d <= 64 and x.dtype in (torch.float32, torch.bfloat16)):
        out = rht(x.t(), d, signs, out_dtype=out_dtype, impl=impl).contiguous()
        if not amax:
            return out, None
        from .quantize import absmax

        return out, absmax(out, ignore_nan)
    K = kernels()
    s = _signs_on(d, signs, x.device)
    x = x.contiguous()
    out = torch.empty((C, R), dtype=out_dtype or torch.float32, device=x.device)
    acc = torch.zeros(1, dtype=torch.int32, device=x.device)
    if R and C:
        inv_sqrt, kw = _rht_t_kw(d, bool(amax), bool(ignore_nan))
        launch(K.rht_t_kernel, (-(-(R // d) // _RHT_T_TILES), -(-C // _RHT_T_BF)), (x, s, out, acc, R, C, inv_sqrt), kw)
    return out, (acc.view(torch.float32).reshape(()) if amax else None)


_RHT_T_BF = 64  # columns of X (rows of Xᵀ) per program of rht_t_kernel
_RHT_T_TILES = 8  # D-row tiles per program: one atomic amax per 8 tiles (a 1024-token × 64-column block at D = 16)


@functools.lru_cache(maxsize=64)
def _rht_t_kw(d: int, amax: bool, ignore_nan: bool) -> tuple[float, dict]:
    """fl(1/√d) and the keyword arguments of one rht_t_kernel configuration (built once: the Wgrad hot path)."""
    return float(np.float32(1.0 / np.sqrt(d))), {
        "D": d, "LOG2D": d.bit_length() - 1, "BF": _RHT_T_BF, "TILES": _RHT_T_TILES, "BF16_IN": True,
        "BF16_OUT": True, "AMAX": amax, "IGNORE_NAN": ignore_nan, "num_warps": WARPS}
