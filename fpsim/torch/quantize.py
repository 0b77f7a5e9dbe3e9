"""Block quantization on torch tensors from a :class:`~fpsim.plan.Plan`: the fused Triton launchers and the
eager (torch-operation) quantizer, both bit-identical to :func:`fpsim.scaling.quantize`.

Both read every constant from the plan: the element and scale formats' traits, the two-level ``num``,
``inv_t``, ``inv_t46`` and ``bound``, the E8M0 ``rule_id``, the SR layout and the NaN policy.
:func:`triton_unsupported` and :func:`eager_unsupported` say which plans each path takes; the entry
points of :mod:`fpsim.torch.backend` choose between them.  Inputs here are 2-D float32 ``(R, C)`` views
with the quantized axis last (the entry points move the axis).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..codecs import Rounding
from ..conventions import is_native
from ..plan import ElemPath, Plan
from ..random import seed_key
from ..schemes import Kind, ScaleRule
from .codecs import block_random_bits, code_table, elem_consts, encode, f32_bits, pow2_table
from .container import second_level_scales, triton_block_width
from .launch import launch
from .runtime import FLT_MAX, WARPS, dummy, f32, fdiv, hw_cvt, kernels, layout, torch_module

__all__ = ["triton_unsupported", "eager_unsupported", "absmax", "amax_bits", "tile_absmax", "quantize_fused",
           "quantize_eager", "pack_codes", "e8m0_bytes", "sr_kw", "two_level_kw", "TwoLevelTiles", "TWO_LEVEL_TILES"]

_INF = 0x7F800000


def _elements_unsupported(plan: Plan) -> str | None:
    el = plan.element
    if el.bits > 8 or not el.subnormals or not el.signed:
        return f"the Triton encoders take signed ≤ 8-bit elements with subnormals, not {el.name}"
    return None


def triton_unsupported(plan: Plan) -> str | None:
    """Why the fused Triton kernels do not run this plan, or None (they then give the reference's bits)."""
    if not is_native(plan.convention):
        return f"the {plan.convention.name} convention runs as torch operations (fpsim.torch.conventions)"
    if plan.kind is Kind.CAST:
        return "casts run as torch operations"
    if plan.rounding not in (Rounding.RNE, Rounding.SR):
        return f"the Triton kernels round elements by RNE or SR, not {plan.rounding.value}"
    if plan.is_sr and plan.sr.k > 16:
        return "stochastic rounding with more than 16 random bits has no Triton kernel"
    why = _elements_unsupported(plan)
    if why:
        return why
    if plan.kind is Kind.FP32:
        if plan.is_sr:
            return "FP32-scaled stochastic rounding has no Triton kernel"
        if plan.packed:
            return "4-bit elements with FP32 scales have no Triton kernel"
        if plan.block is not None and (plan.block[0] != 1 or plan.block[1] not in (16, 32, 64, 128, 256)):
            return f"FP32 scales over {plan.block} blocks have no Triton kernel (1×16 … 1×256 do)"
        return None
    if triton_block_width(plan) is None:
        return f"{plan.block} blocks have no Triton kernel ((1, W) or (W, W) with W = 16, 32, 64, 128 do)"
    if plan.kind is Kind.TWO_LEVEL:
        if plan.two_level.four_over_six and plan.block[0] > 1 and plan.block != (16, 16):
            return "four-over-six on 2-D tiles other than 16×16 has no Triton kernel"
        if plan.two_level.scale_arith.mbits == 0:
            return f"scale format {plan.scale.name} has no arithmetic encoder (ScaleArith)"
    return None


def eager_unsupported(plan: Plan) -> str | None:
    """Why the torch-operation quantizer does not run this plan, or None."""
    if plan.kind is Kind.FP32 and plan.block is not None and plan.packed:
        return "4-bit elements with FP32 block scales are quantized by the reference"
    if plan.is_sr and not plan.element.subnormals:
        return f"stochastic rounding to {plan.element.name} (no subnormals) runs on the reference"
    return None


# ---------------------------------------------------------------------------
# amax


def amax_bits(X, ignore_nan: bool, dim=None):
    """max |X| from the float32 bits (NaN, whose bits exceed inf's, propagates unless ``ignore_nan``): the
    reference's integer max, so a NaN amax keeps its payload.  float32, over ``dim`` (all when None)."""
    torch = torch_module()
    a = X.contiguous().view(torch.int32) & 0x7FFFFFFF
    if ignore_nan:
        a = torch.where(a > _INF, 0, a)
    if a.numel() == 0:
        shape = () if dim is None else tuple(s for i, s in enumerate(a.shape) if i != dim % a.dim())
        return torch.zeros(shape, dtype=torch.float32, device=X.device)
    m = a.amax() if dim is None else a.amax(dim=dim)
    return m.view(torch.float32)


def absmax(x, ignore_nan: bool = False):
    """max |x| as a 0-d float32 tensor in one fused Triton pass (NaN-propagating unless ``ignore_nan``); 0 when
    empty."""
    K = kernels()

    torch = torch_module()
    if x.dtype not in (torch.float32, torch.bfloat16):  # BF16 widens exactly inside the kernel: no float32 copy
        x = x.to(torch.float32)
    x = x.contiguous()
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    n = x.numel()
    if n:
        block, iters = 1024, 16
        launch(K.absmax_kernel, (-(-n // (block * iters)),), (x, out, n),
               {"BLOCK": block, "ITERS": iters, "IGNORE_NAN": bool(ignore_nan)})
    return out.view(torch.float32).reshape(())


def tile_absmax(X, tr: int, bw: int, ignore_nan: bool):
    """|x| bits max of every tr × bw tile of the 2-D ``X`` (int32, tile rows × blocks), by one Triton kernel."""
    K = kernels()

    torch = torch_module()
    R, C = X.shape
    nb = -(-C // bw)
    out = torch.empty((-(-R // tr), nb), dtype=torch.int32, device=X.device)
    bb = 16
    K.tile_absmax_kernel[(out.shape[0], -(-nb // bb))](X, out, R, C, nb, TR=tr, BW=bw, BB=bb,
                                                       IGNORE_NAN=bool(ignore_nan))
    return out


# ---------------------------------------------------------------------------
# Fused Triton launchers


def sr_kw(plan: Plan, seed, counter: int) -> dict:
    """Kernel arguments of stochastic rounding with the CPU quantizer's Philox stream (zeros for RNE).

    ``seed``: the 64-bit seed, or a device tensor of the two int32 key words (:mod:`fpsim.torch.graphs`), which
    the kernel then reads at run time."""
    if not plan.is_sr:
        return {"k0": 0, "k1": 0, "counter0": 0}
    sr = {"counter0": int(counter), "SR": True, "K": plan.sr.k, "WIDTH": plan.sr.width}
    if hasattr(seed, "data_ptr"):
        return {"k0": 0, "k1": 0, "key_ptr": seed, "KEY_PTR": True, **sr}
    k0, k1 = seed_key(seed)
    return {"k0": k0, "k1": k1, **sr}


def _elem_kw(plan: Plan) -> dict:
    kw = elem_consts(plan.element)
    kw["E2M1"] = plan.elem_path is ElemPath.E2M1
    kw["PACK4"] = plan.packed
    return kw


@functools.lru_cache(maxsize=512)
def two_level_kw(plan: Plan) -> dict:
    """The two-level constants and the element format of ``plan`` as the kernels' named constexpr arguments."""
    tl_ = plan.two_level
    sa = tl_.scale_arith
    return {"NUM": float(tl_.num), "INV_T": float(tl_.inv_t), "BOUND": float(tl_.bound),
            "TENSOR_SCALE": tl_.tensor_scale, "S_MBITS": sa.mbits, "S_EMIN_B": sa.emin_b, "S_Q": float(sa.q),
            "S_MAX_CODE": plan.scale.traits.max_code, "S_NAN_CODE": sa.nan_code, **_elem_kw(plan)}


def _outputs(X, plan: Plan, fake: bool, w: int, out_dtype=None):
    torch = torch_module()
    R, C = X.shape
    nb = -(-C // w)
    if fake:
        return torch.empty((R, C), dtype=out_dtype or torch.float32, device=X.device), None
    q = torch.empty((R, nb * w // 2 if plan.packed else nb * w), dtype=torch.uint8, device=X.device)
    return q, torch.empty((R, nb), dtype=torch.uint8, device=X.device)


class _Blocks(NamedTuple):
    """A block launch's geometry on the 2-D ``X`` (R × C, blocks of ``w`` along rows, tiles ``br`` rows tall) and
    its outputs: the codes and scales, or the fake-quantized values (``s`` None)."""

    R: int
    C: int
    w: int
    br: int
    nb: int
    nblk: int
    dev: str
    out: object
    s: object


def _blocks(X, plan: Plan, fake: bool, out_dtype=None) -> _Blocks:
    R, C = X.shape
    w = triton_block_width(plan)
    nb = -(-C // w)
    return _Blocks(R, C, w, plan.block[0], nb, R * nb, str(X.device), *_outputs(X, plan, fake, w, out_dtype))


def _fake_kw(fake: bool, out, apply_s_dec: bool | None = None) -> dict:
    """The FAKE-output switches: float32 or BF16 bits, and (two-level kernels) S_dec applied or not (the exact
    e · s_b)."""
    if not fake:
        return {}
    torch = torch_module()
    kw = {"OUT_BF16": out.dtype == torch.bfloat16, "HW_CVT": hw_cvt()}
    if apply_s_dec is not None:
        kw["APPLY_SDEC"] = bool(apply_s_dec)
    return kw


def _fake_view(out):
    """The fake output as the kernels write it: float32, or BF16 as its int16 bits."""
    torch = torch_module()
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16)
    if out.dtype != torch.float32:
        raise ValueError(f"fake quantization writes float32 or bfloat16, not {out.dtype}")
    return out


_BT_2D = 8  # 16×16 tiles per program of the one-pass 2-D kernel


class TwoLevelTiles(NamedTuple):
    """The launch shape of the 1-D / tiled two-level kernel (two_level_quant_kernel): about ``elems`` elements (that
    many over the block width, at least one block) per program, on ``num_warps`` warps.  Every shape gives the
    same bits: a block's scale, values and random bits depend on its index alone (``studies/bench/tune_kernels.py``
    checks this on the GPU while it times them)."""

    elems: int = 1024
    num_warps: int = WARPS


#: The launch shape every two_level_quant_kernel call uses.  1024 elements on 4 warps: on the H200 (2026-12-03,
#: ``studies.bench.tune_kernels``) 11.76 against 11.84 ms a step at the earlier 2048, a difference within run-to-run
#: noise; kept because the benchmark's graph step was measured with it (11 of the 12 shapes were slower).
TWO_LEVEL_TILES = TwoLevelTiles()


@functools.lru_cache(maxsize=1024)
def _two_level_launch_kw(plan: Plan, R: int, C: int, fake: bool, out_bf16: bool = False, apply_s_dec: bool = True,
                         hw: bool = True, tiles: TwoLevelTiles = TWO_LEVEL_TILES) -> dict:
    """Every keyword of a two-level launch but the SR key (the one-pass 16×16 kernel, or the 1-D / tiled one), for
    one plan, shape and output (``fake``: the FAKE-output switches too), built once per configuration: the
    training layer launches it for every copy of every step."""
    tl_ = plan.two_level
    w, br = triton_block_width(plan), plan.block[0]
    out = {"FAKE": True, "OUT_BF16": out_bf16, "HW_CVT": hw, "APPLY_SDEC": apply_s_dec} if fake else {"FAKE": False}
    sr = {} if plan.is_sr else sr_kw(plan, None, 0)
    fos = {"FOS": int(tl_.four_over_six), "INV_T46": float(tl_.inv_t46)}
    if br == 16 == w:
        return {"BT": _BT_2D, "W": w, "IGNORE_NAN": plan.ignore_nan, **out, **sr, **two_level_kw(plan), **fos,
                "num_warps": WARPS}
    return {**out, "BB": max(tiles.elems // w, 1), "W": w, "TR": br, "TILE": br > 1, "IGNORE_NAN": plan.ignore_nan,
            "PER_ROW": tl_.per_row, **fos, **layout(R, C, w), **sr, **two_level_kw(plan),
            "num_warps": tiles.num_warps}


def _two_level_fused(X, plan: Plan, amax, fake: bool, seed, counter: int, apply_s_dec: bool = True,
                     out_dtype=None):
    KQ = kernels("kernels_quant")

    torch = torch_module()
    R, C, w, br, nb, nblk, dev, out, s = _blocks(X, plan, fake, out_dtype)
    if not nblk:
        return out if fake else (out, s)
    if amax.dim() != 1 or amax.dtype != torch.float32 or not amax.is_contiguous():
        amax = amax.reshape(-1).to(torch.float32).contiguous()
    dec = code_table("dec" if plan.packed else "byte", plan.element, device=dev)
    d8 = dummy(dev, "int32")
    if fake:
        kw = _two_level_launch_kw(plan, R, C, True, out.dtype == torch.bfloat16, bool(apply_s_dec), hw_cvt(),
                                  TWO_LEVEL_TILES)
        q, sc, f = d8, d8, _fake_view(out)
    else:
        kw = _two_level_launch_kw(plan, R, C, False, tiles=TWO_LEVEL_TILES)
        q, sc, f = out.view(torch.int32), s, d8
    if plan.is_sr:
        kw = {**kw, **sr_kw(plan, seed, counter)}
    if br == 16 == w:  # one pass: the tile amax is taken inside the program
        launch(KQ.two_level_quant_2d_kernel, (-(-R // 16), -(-nb // _BT_2D)), (X, q, sc, f, dec, amax, R, C, nb), kw)
    else:
        tmax = tile_absmax(X, br, w, plan.ignore_nan) if br > 1 else d8
        launch(KQ.two_level_quant_kernel, (-(-nblk // kw["BB"]),),
               (X, q, sc, f, dec, tmax, amax, R, C, nb, nblk), kw)
    return out if fake else (out, s)


def _mx_fused(X, plan: Plan, fake: bool, seed, counter: int, out_dtype=None):
    KQ = kernels("kernels_quant")

    torch = torch_module()
    R, C, w, br, nb, nblk, dev, out, s = _blocks(X, plan, fake, out_dtype)
    if not nblk:
        return out if fake else (out, s)
    p2 = plan.pow2
    tmax = tile_absmax(X, br, w, plan.ignore_nan) if br > 1 else dummy(dev, "int32")
    bb = max(2048 // w, 1)
    dec = code_table("dec", plan.element, device=dev)
    # E2M1=False: the generic encoder, as before the redesign; on the H200 (2026-12-02, 1.07 GB float32, 5 × 50
    # calls each) MXFP4 took 0.418-0.421 ms with it against 0.433-0.438 ms with the E2M1 short form (same bits)
    kw = dict(BB=bb, W=w, TR=br, RULE=p2.rule_id, EMAX=p2.emax, TILE=br > 1, IGNORE_NAN=plan.ignore_nan,
              **{**_elem_kw(plan), "E2M1": False}, **layout(R, C, w), **sr_kw(plan, seed, counter))
    grid = (-(-nblk // bb),)
    d8 = dummy(dev, "int32")
    inv_max = float(p2.inv_max)
    if fake:
        launch(KQ.mx_quant_kernel, grid, (X, d8, d8, _fake_view(out), dec, tmax, inv_max, R, C, nb, nblk),
               {"FAKE": True, **_fake_kw(True, out), **kw})
        return out
    KQ.mx_quant_kernel[grid](X, out.view(torch.int32), s, X, dec, tmax, inv_max, R, C, nb, nblk, FAKE=False, **kw)
    return out, s


def _fp32_fused(X, plan: Plan, amax, fake: bool):
    """FP32-scaled elements: per tensor (``plan.block`` None: X is the tensor in its own layout, one d from
    ``amax``) or per 1×W block along the rows."""
    KQ = kernels("kernels_quant")

    torch = torch_module()
    dev = str(X.device)
    per_tensor = plan.block is None
    if per_tensor:
        w = 16
        Xk = X.reshape(1, -1)
        amax = amax.reshape(1).to(torch.float32)
    else:
        w = plan.block[1]
        Xk = X
        amax = dummy(dev, "float32")
    Rk, Ck = Xk.shape
    nb = -(-Ck // w)
    nblk = Rk * nb
    consts = elem_consts(plan.element)
    consts["E2M1"] = plan.elem_path is ElemPath.E2M1
    bb = max(2048 // w, 1)
    kw = dict(BB=bb, W=w, PER_TENSOR=per_tensor, IGNORE_NAN=plan.ignore_nan, **consts, **layout(Rk, Ck, w))
    grid = (max(-(-nblk // bb), 1),)
    dec = code_table("byte", plan.element, device=dev)
    emax_f = float(np.float32(plan.element.max))
    if fake:
        out = torch.empty_like(X)
        if nblk:
            d = dummy(dev, "int32")
            KQ.fp32_scaled_quant_kernel[grid](Xk, d, d, out, dec, amax, emax_f, Rk, Ck, nb, nblk, FAKE=True, **kw)
        return out
    q = torch.empty((Rk, nb * w), dtype=torch.uint8, device=X.device)
    s = torch.empty((1,) if per_tensor else (Rk, nb), dtype=torch.float32, device=X.device)
    if nblk:
        KQ.fp32_scaled_quant_kernel[grid](Xk, q.view(torch.int32), s, X, dec, amax, emax_f, Rk, Ck, nb, nblk,
                                          FAKE=False, **kw)
    elif per_tensor:
        s.fill_(1.0)
    if per_tensor:
        return q.reshape(-1)[: X.numel()].reshape(X.shape), s.reshape(())
    return q, s


def quantize_fused(X, plan: Plan, amax=None, *, fake: bool = False, seed=None, counter: int = 0,
                   apply_s_dec: bool = True, out_dtype=None):
    """Quantize the 2-D contiguous float32 (or, for block plans, BF16) ``X`` by the Triton kernels: (codes,
    scales), or the fake-quantized values with ``fake``.  ``amax``: the tensor amax (0-d) or the per-row amax (R,)
    for two-level plans with a second-level scale, the tensor amax for per-tensor FP32 scales; unused otherwise.

    Fake outputs of block plans can skip the two-level S_dec (``apply_s_dec=False``: the exact e · s_b) and be
    written as ``out_dtype=torch.bfloat16``, which rounds each value to BF16 (exact where the values are)."""
    if plan.kind is Kind.TWO_LEVEL:
        return _two_level_fused(X, plan, amax, fake, seed, counter, apply_s_dec, out_dtype)
    if plan.kind is Kind.POW2:  # no second level: apply_s_dec changes nothing
        return _mx_fused(X, plan, fake, seed, counter, out_dtype)
    if not apply_s_dec or out_dtype is not None:
        raise ValueError("apply_s_dec=False and out_dtype are for two-level and MX plans")
    return _fp32_fused(X, plan, amax, fake)


# ---------------------------------------------------------------------------
# Eager quantizer: whole-tensor torch operations, the reference's float32 operations in its order


def pack_codes(codes, packed: bool):
    """uint8 codes, two per byte when ``packed`` (element 2j in the low nibble, as :func:`fpsim.pack_fp4`)."""
    torch = torch_module()
    if packed:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes.to(torch.uint8)


def e8m0_bytes(m, plan: Plan):
    """E8M0 scale bytes of block amax bits ``m`` (int64) under the plan's rule: fpsim._scaling_kernels'
    mx_scale_byte_fast as torch operations (NaN → 0xFF, inf → 0xFE)."""
    torch = torch_module()
    p2 = plan.pow2
    rule = p2.rule_id
    if rule == ScaleRule.RCEIL.rule_id:
        t = (m.to(torch.int32).view(torch.float32) * float(p2.inv_max))
        m = f32_bits(t)
    e = m >> 23
    frac = m & 0x7FFFFF
    if rule == ScaleRule.RCEIL.rule_id:
        byte = torch.where(e > 0, e + (frac != 0).to(torch.int64), (frac > 0x400000).to(torch.int64)).clamp(max=254)
    else:
        if rule == ScaleRule.CEIL.rule_id:
            inc = (frac != 0).to(torch.int64)
        elif rule == ScaleRule.EVEN.rule_id:
            inc = (frac + ((1 << (22 - p2.mbits)) & 0x7FFFFF) >= 0x800000).to(torch.int64)
        else:
            inc = torch.zeros_like(frac)
        ex = (e - 127 + inc - p2.emax).clamp(-127, 127)
        byte = torch.where(e > 0, ex + 127, 0)
    return torch.where(m > _INF, 0xFF, torch.where(m == _INF, 0xFE, byte))


class _Tiles:
    """X zero-padded to whole blocks and viewed as (tile rows G, BR, blocks nb, BC), with the mask of real
    elements, the tile amax bits (G, 1, nb, 1) and the SR bits of the plan's block stream (or None)."""

    def __init__(self, X, plan: Plan, seed, counter: int):
        torch = torch_module()
        R, C = X.shape
        br, bc = plan.block
        self.R, self.C, self.br, self.bc = R, C, br, bc
        self.nb = -(-C // bc)
        self.G = -(-R // br)
        rp, cp = self.G * br, self.nb * bc
        xp = torch.nn.functional.pad(X, (0, cp - C, 0, rp - R))
        self.x = xp.reshape(self.G, br, self.nb, bc)
        rows = torch.arange(rp, device=X.device) < R
        cols = torch.arange(cp, device=X.device) < C
        self.valid = (rows[:, None] & cols[None, :]).reshape(self.x.shape)
        a = self.x.contiguous().view(torch.int32) & 0x7FFFFFFF
        if plan.ignore_nan:
            a = torch.where(a > _INF, 0, a)
        self.vmax_bits = a.amax(dim=(1, 3), keepdim=True).to(torch.int64)
        self.rbits = None
        if plan.is_sr:
            self.rbits = block_random_bits(seed, rp, self.nb, bc, plan.sr.k, counter, X.device).reshape(self.x.shape)

    def vmax(self):
        torch = torch_module()
        return self.vmax_bits.to(torch.int32).view(torch.float32)

    def encode(self, y, plan: Plan):
        """Element codes of the scaled tile values ``y``; padding is code 0."""
        torch = torch_module()
        mode = plan.rounding
        if plan.is_sr:
            codes = encode(y, plan.element, mode, rbits=self.rbits, k=plan.sr.k)
        else:
            codes = encode(y, plan.element, mode)
        return torch.where(self.valid, codes, 0)

    def rows(self, t):
        """(G, BR, nb, BC) → the (R, nb·BC) rows of the quantized 2-D view."""
        return t.reshape(self.G * self.br, self.nb * self.bc)[: self.R]


def _tile_error(t: _Tiles, codes, sv, sd, etab, metric: int):
    """Σ|x − x̂| (metric 1) or Σ(x − x̂)² (2) per tile, float64, summed element by element in the reference's
    order (rows of the tile, then columns): a pairwise sum could round differently and pick the other scale."""
    torch = torch_module()
    xh = (etab[codes] * sv) * sd
    d = t.x.to(torch.float64) - xh.to(torch.float64)
    err = torch.where(t.valid, d.abs() if metric == 1 else d * d, 0.0)
    acc = torch.zeros((t.G, t.nb), dtype=torch.float64, device=err.device)
    for r in range(t.br):
        for c in range(t.bc):
            acc = acc + err[:, r, :, c]
    return acc[:, None, :, None]


def _two_level_eager(t: _Tiles, plan: Plan, amax_rows):
    """(codes, scale bytes) of a two-level plan (SPEC §4); the tile's first row gives its S_enc (per-row scales
    come with 1-row blocks only)."""
    torch = torch_module()
    tl_ = plan.two_level
    dev = t.x.device
    s_enc, s_dec = second_level_scales(plan, amax_rows)
    first = torch.arange(t.G, device=dev) * t.br
    se = s_enc[first].reshape(t.G, 1, 1, 1)
    sd = s_dec[first].reshape(t.G, 1, 1, 1)
    stab = code_table("byte", plan.scale, device=str(dev))
    vmax = t.vmax()

    def candidate(inv_target):
        sdb = torch.clamp(vmax * (se * float(inv_target)), max=float(tl_.bound))  # a NaN stays NaN (fmin_nan)
        sb = encode(sdb, plan.scale)
        sv = stab[sb]
        enc = torch.clamp(fdiv(1.0, sv * sd), max=FLT_MAX)
        return sb, sv, t.encode(t.x * enc, plan)

    sb, sv, codes = candidate(tl_.inv_t)
    if tl_.four_over_six:
        sb4, sv4, codes4 = candidate(tl_.inv_t46)
        etab = code_table("dec", plan.element, device=str(dev))
        metric = int(tl_.four_over_six)
        four = _tile_error(t, codes4, sv4, sd, etab, metric) < _tile_error(t, codes, sv, sd, etab, metric)
        sb, codes = torch.where(four, sb4, sb), torch.where(four, codes4, codes)
    return codes, sb


def _blocks_eager(X, plan: Plan, amax_rows, seed, counter: int):
    """(codes (R, nb·BC) unpacked, scales (R, nb)) of a block plan."""
    torch = torch_module()
    t = _Tiles(X, plan, seed, counter)
    if plan.kind is Kind.TWO_LEVEL:
        codes, sb = _two_level_eager(t, plan, amax_rows)
        scales = sb.to(torch.uint8)
    elif plan.kind is Kind.POW2:
        sb = e8m0_bytes(t.vmax_bits, plan)
        mul = pow2_table(-1, str(X.device))[sb]  # 2**(127 − b), exact float32; NaN for 0xFF
        codes = t.encode(t.x * mul, plan)
        codes = torch.where((sb == 0xFF) & t.valid, plan.element.nan_code, codes)
        scales = sb.to(torch.uint8)
    else:
        d = fdiv(t.vmax(), float(np.float32(plan.element.max)))
        d = torch.where((d == 0) | (d > FLT_MAX), 1.0, d)  # a NaN d stays NaN
        codes = t.encode(fdiv(t.x, d), plan)
        scales = d
    scales = scales.expand(t.G, t.br, t.nb, 1).reshape(t.G * t.br, t.nb)[: t.R]
    return t.rows(codes), scales.contiguous()


def quantize_eager(x, plan: Plan, amax=None, *, seed=None, counter: int = 0):
    """(codes, scales, amax) of a cast, a per-tensor FP32 plan (``x`` in its own layout) or a block plan (``x``
    2-D with the quantized axis last; ``amax`` as in :func:`quantize_fused`) by torch operations."""
    torch = torch_module()
    dev = x.device
    nan = f32(float("nan"), dev)
    flat = {"seed": seed, "k": plan.sr.k, "counter": counter} if plan.is_sr else {}
    if plan.kind is Kind.CAST:
        codes = encode(x, plan.element, plan.rounding, **flat)
        codes = codes.to(torch.uint8 if plan.element.bits <= 8 else torch.int32)  # BF16 codes travel as int32
        return codes, torch.zeros(0, dtype=torch.uint8, device=dev), nan
    if plan.block is None:
        d = fdiv(amax, float(np.float32(plan.element.max)))
        d = torch.where((d == 0) | (d > FLT_MAX), 1.0, d)
        codes = encode(fdiv(x, d), plan.element, plan.rounding, **flat)
        return pack_codes(codes, False), d.reshape(()), amax.reshape(())
    amax_rows = None
    if plan.kind is Kind.TWO_LEVEL:
        amax_rows = amax.reshape(-1).expand(x.shape[0]) if amax.numel() == 1 else amax
    codes, scales = _blocks_eager(x, plan, amax_rows, seed, counter)
    return pack_codes(codes, plan.packed), scales, amax
