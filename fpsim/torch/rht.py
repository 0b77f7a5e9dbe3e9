"""The random Hadamard transform on torch tensors: the same float32 operations, in the same order, as
:func:`fpsim.rht` (one Triton kernel on CUDA, or torch operations)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..schemes import Kind
from ..transforms import sign_vector
from .codecs import bf16_round, code_table
from .launch import launch
from .runtime import WARPS, dummy, hw_cvt, kernels, torch_module, use_triton

__all__ = ["rht", "rht_transposed", "rht_transposed_amaxes", "rht_transposed_scaled", "rht_transposed_scaled_pair",
           "rht_t_amaxes", "scaled_fusable", "RhtTTiles", "RHT_T_TILES", "RHT_T_WIDE"]


def _check_length(n: int, d: int) -> None:
    """One clear error where an axis of ``n`` values cannot be cut into Hadamard blocks of ``d``."""
    if n % d:
        raise ValueError(f"axis length {n} is not a multiple of the Hadamard size {d}")


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
    _check_length(n, d)
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
    t = v.reshape(math.prod(lead), n // d, d)  # not -1: an axis of length 0 leaves nothing to infer it from
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
    out, am, _ = _rht_t(x, d, signs, out_dtype, amax, ignore_nan, None, impl)
    return out, am


def rht_transposed_amaxes(x, d: int = 16, signs="recipe", *, out_dtype=None, amax: bool = True,
                          ignore_nan: bool = False, plain_ignore_nan: bool = False, impl: str = "auto"):
    """:func:`rht_transposed` of a 2-D ``x`` that also takes the amax of ``x`` itself from the same read:
    ``(out, amax of out or None, amax of x)``, each amax under its own NaN policy, the second as
    :func:`fpsim.torch.quantize.absmax` takes it (the Fprop or Dgrad copy of ``x`` then needs no amax pass).
    One Triton kernel where the kernels run; else the separate passes.  Bit-identical either way."""
    return _rht_t(x, d, signs, out_dtype, amax, ignore_nan, bool(plain_ignore_nan), impl)


def _rht_t(x, d: int, signs, out_dtype, amax: bool, ignore_nan: bool, plain, impl: str):
    """(RHT of x.T, its amax or None, x's amax or None): ``plain`` as in :func:`_rht_t_pass`."""
    torch = torch_module()
    R, C = x.shape
    d = int(d)
    _check_length(R, d)
    if not (use_triton(x, impl) and d <= 64 and x.dtype in (torch.float32, torch.bfloat16)):
        from .quantize import absmax

        out = rht(x.t(), d, signs, out_dtype=out_dtype, impl=impl).contiguous()
        return (out, absmax(out, ignore_nan) if amax else None,
                None if plain is None else absmax(x.contiguous(), plain))
    out = torch.empty((C, R), dtype=out_dtype or torch.float32, device=x.device)
    if plain is None:
        return out, _rht_t_pass(x, d, signs, out, amax, ignore_nan), None
    return (out, *_rht_t_pass(x, d, signs, out, amax, ignore_nan, plain=plain))


def _rht_t_pass(x, d: int, signs, out, amax: bool, ignore_nan: bool, store: bool = True, plain=None):
    """One launch of rht_t_kernel over the 2-D ``x`` into ``out`` (or, ``store=False``, into nothing: a 1-element
    placeholder of the output dtype); the 0-d float32 amax of the result, or None.  ``plain`` (None, or the NaN
    policy's ``ignore_nan`` of a copy of ``x`` itself): also that amax of ``x``, returned as a second value."""
    torch = torch_module()
    R, C = x.shape
    x = x.contiguous()
    acc = torch.zeros(2 if plain is not None else 1, dtype=torch.int32, device=x.device)
    if R and C:
        t = RHT_T_TILES
        inv_sqrt, kw = _rht_t_kw(d, bool(amax), bool(ignore_nan), bool(store), bool(RHT_T_WIDE), t)
        if plain is not None:
            kw = {**kw, "plain_ptr": acc[1:], "PLAIN": True, "PLAIN_IGNORE_NAN": bool(plain)}
        launch(kernels().rht_t_kernel, (-(-(R // d) // t.TILES), -(-C // t.BF)),
               (x, _signs_on(d, signs, x.device), out, acc, R, C, inv_sqrt), kw)
    v = acc.view(torch.float32)
    am = v[0].reshape(()) if amax else None
    return am if plain is None else (am, v[1].reshape(()))


def rht_t_amaxes(x, d: int = 16, signs="recipe", *, ignore_nan: bool = False, plain_ignore_nan: bool = False):
    """``(amax of x, amax of rht(x.T, d, signs))`` of a 2-D ``x`` (tokens × features, the token count a multiple of
    ``d``) from one read of ``x``: the tensor amax of its Fprop (or Dgrad) copy, as
    :func:`fpsim.torch.quantize.absmax` takes it, and that of its Wgrad copy, as :func:`rht_transposed` takes it,
    each under its own NaN policy.  Triton only (CUDA, or the interpreter); 0-d float32 tensors."""
    R, C = x.shape
    d = int(d)
    _check_length(R, d)
    rht_amax, plain = _rht_t_pass(x, d, signs, dummy(str(x.device), "bfloat16"), True, ignore_nan, store=False,
                                  plain=bool(plain_ignore_nan))
    return plain, rht_amax


def scaled_fusable(plan, d: int) -> bool:
    """Whether :func:`rht_transposed_scaled` takes ``plan`` after a size-``d`` RHT: a two-level plan with one tensor
    scale (no per-row scales, no four-over-six) and 1 × d blocks, d ≤ 64, whose e · s_b are exact in BF16 (the
    caller's :func:`fpsim.torch.fastpath.copy_kind` ``"scaled"``)."""
    tl_ = plan.two_level
    return (plan.kind is Kind.TWO_LEVEL and tl_.tensor_scale and not tl_.per_row and not int(tl_.four_over_six)
            and plan.block == (1, d) and d in (16, 32, 64))


def rht_transposed_scaled(x, plan, d: int = 16, signs="recipe", *, seed=None, counter: int = 0, amax=None):
    """Wgrad's scaled copy of ``rht(x.T, d, signs)`` (BF16 in and out) under ``plan`` (:func:`scaled_fusable`):
    ``(v, amax)`` with ``v`` the exact e · s_b of every element of the transformed Xᵀ as a C × R BF16 tensor (the
    "scaled" copy of :mod:`fpsim.torch.fastpath`, S_dec not applied) and ``amax`` its tensor amax (0-d float32).

    Two passes over ``x`` instead of four transfers: an amax pass that transforms without storing, then one
    kernel that transforms again and quantizes in registers (the transform is a few adds per value; the
    transposed BF16 tensor the two-pass path writes and reads back is never made).  The same bits as
    :func:`rht_transposed` followed by ``quantize_fused(fake=True, apply_s_dec=False, out_dtype=bfloat16)``,
    including stochastic rounding's counters (``seed``: the 64-bit seed or the device key table of
    :mod:`fpsim.torch.graphs`).  ``amax``: the transformed tensor's amax where the caller has it
    (:func:`rht_t_amaxes`), which skips the amax pass.  Triton only (CUDA, or the interpreter)."""
    from .quantize import sr_kw

    torch = torch_module()
    R, C, d = _check_scaled(x, plan, d)
    if amax is None:
        amax = _rht_t_pass(x, d, signs, dummy(str(x.device), "bfloat16"), True, plan.ignore_nan, store=False)
    out = torch.empty((C, R), dtype=torch.bfloat16, device=x.device)
    _scaled_launch(x, plan, d, signs, out, amax, sr_kw(plan, seed, counter), {})
    return out, amax


def rht_transposed_scaled_pair(x, plan, d: int = 16, signs="recipe", *, amax, plain_amax, seed=None,
                               plain_seed=None, counter: int = 0):
    """:func:`rht_transposed_scaled` of ``x`` and, from the same read of ``x``, the scaled copy of ``x`` itself
    under the same plan (1 × W blocks along its rows, the copy :func:`fpsim.torch.fastpath.make_copy` writes):
    ``(plain, transposed)``, R × C and C × R BF16 tensors of exact e · s_b.  ``amax`` / ``plain_amax``: the two
    tensor amax values (:func:`rht_t_amaxes` takes both in one read); ``seed`` / ``plain_seed``: their SR keys
    (both seeds, or both device key tables).  The bits of the two separate copies."""
    from .quantize import sr_kw

    torch = torch_module()
    R, C, d = _check_scaled(x, plan, d)
    out = torch.empty((C, R), dtype=torch.bfloat16, device=x.device)
    plain = torch.empty((R, C), dtype=torch.bfloat16, device=x.device)
    p = sr_kw(plan, plain_seed, counter)
    extra = {"fp_ptr": plain.view(torch.int16), "amax_p_ptr": plain_amax.reshape(1), "NBP": -(-C // d),
             "PLAIN": True, "W": d}
    if plan.is_sr:
        extra.update({"key_p_ptr": p["key_ptr"]} if "key_ptr" in p else {"k0p": p["k0"], "k1p": p["k1"]})
    _scaled_launch(x, plan, d, signs, out, amax, sr_kw(plan, seed, counter), extra)
    return plain, out


def _check_scaled(x, plan, d: int) -> tuple[int, int, int]:
    """(R, C, d) of a 2-D ``x`` the scaled Wgrad kernels take under ``plan``; one clear error otherwise."""
    R, C = x.shape
    d = int(d)
    _check_length(R, d)
    if not scaled_fusable(plan, d):
        raise ValueError(f"plan {plan.scheme.name!r} is not a one-tensor-scale two-level plan with 1 × {d} blocks")
    return R, C, d


def _scaled_launch(x, plan, d: int, signs, out, amax, sr: dict, extra: dict) -> None:
    """One launch of rht_t_two_level_kernel (``extra``: its PLAIN outputs)."""
    torch = torch_module()
    R, C = x.shape
    if R and C:
        dev = str(x.device)
        kw = {**_rht_t_scaled_kw(plan, d, hw_cvt()), **sr, **extra}
        inv_sqrt = _rht_t_kw(d, True, plan.ignore_nan, False)[0]
        launch(kernels("kernels_quant").rht_t_two_level_kernel, (-(-(R // d) // _SCALED_TILES), -(-C // _SCALED_BF)),
               (x.contiguous(), _signs_on(d, signs, x.device), out.view(torch.int16),
                code_table("dec" if plan.packed else "byte", plan.element, device=dev), amax.reshape(1), R, C, R // d,
                inv_sqrt), kw)


class RhtTTiles(NamedTuple):
    """The launch shape of rht_t_kernel: BF columns of X (rows of Xᵀ) and TILES tiles of D tokens per program (one
    atomic amax per program), on ``num_warps`` warps.  Every shape gives the same bits: each group of D tokens of
    one column is transformed alone, and a maximum does not depend on its order (``studies/bench/tune_kernels.py``
    checks this on the GPU while it times them)."""

    BF: int = 32
    TILES: int = 4
    num_warps: int = WARPS


#: The launch shape every rht_t_kernel call uses.  32 columns × 4 tiles of D tokens (64 tokens at the recipe's
#: D = 16): on the H200
#: (2026-12-03, ``studies.bench.tune_kernels`` over the benchmark GPT's calls) 6.29 ms a step against 7.63 ms at the
#: earlier 64 × 8, the fastest of 18 shapes; with it the every-block NVFP4 graph step took 41.3 against 42.8 ms.
RHT_T_TILES = RhtTTiles()
_SCALED_BF = 64  # columns per program of rht_t_two_level_kernel (the "registers" and "paired" Wgrad paths)
_SCALED_TILES = 8  # D-row tiles per program of that kernel
#: rht_t_kernel's WIDE layout (one [TILES·D, BF] tile per program, 256-byte row segments stored at D = 16, where
#: the tile loop stores 32 bytes at a time); the same bits.  On: the every-block NVFP4 graph step on the H200
#: (2026-12-02, ``studies.bench.training``) took 45.6 against 46.0 ms with the tile loop (Wgrad copies stored) and
#: 44.6 against 45.4 ms (shared).
RHT_T_WIDE = True


@functools.lru_cache(maxsize=64)
def _rht_t_kw(d: int, amax: bool, ignore_nan: bool, store: bool = True, wide: bool = False,
              tiles: RhtTTiles = RHT_T_TILES) -> tuple[float, dict]:
    """fl(1/√d) and the keyword arguments of one rht_t_kernel configuration (built once: the Wgrad hot path)."""
    return float(np.float32(1.0 / np.sqrt(d))), {
        "D": d, "LOG2D": d.bit_length() - 1, "BF": tiles.BF, "TILES": tiles.TILES, "BF16_IN": True,
        "BF16_OUT": True, "AMAX": amax, "IGNORE_NAN": ignore_nan, "STORE": store, "WIDE": wide,
        "num_warps": tiles.num_warps}


@functools.lru_cache(maxsize=64)
def _rht_t_scaled_kw(plan, d: int, hw: bool) -> dict:
    """The constexpr arguments of rht_t_two_level_kernel for one plan (the SR key aside), built once."""
    from .quantize import two_level_kw

    kw = {k: v for k, v in two_level_kw(plan).items() if k != "PACK4"}  # fake output only: no packed codes
    return {"D": d, "LOG2D": d.bit_length() - 1, "BF": _SCALED_BF, "TILES": _SCALED_TILES,
            "IGNORE_NAN": plan.ignore_nan, "HW_CVT": hw, "num_warps": WARPS, **kw}
