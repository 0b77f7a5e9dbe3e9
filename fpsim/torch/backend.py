"""Torch implementation of the element codecs and NVFP4 / MX quantization, bit-identical to the Numba reference.

Works on CPU or CUDA tensors (issue 8, first step).  The arithmetic is the
reference's, expressed as whole-tensor torch operations:

* ≤ 8-bit formats encode through the same lookup table the Numba kernels use
  (built by the generic scalar encoder, :func:`fpsim.codecs.encode_lut`), indexed
  by sign, exponent, top mantissa bits and a sticky bit of the float32 input;
* 16-bit formats use the branch-free integer rounding of ``fpsim._kernels``;
* NVFP4 follows Transformer Engine's FP32 operation order (SPEC §4); every
  ``fl()`` is one float32 torch operation (PyTorch compiles its CUDA kernels
  without fast-math, so division and multiplication are IEEE-rounded and
  subnormals are kept).

Stochastic rounding uses the same Philox4x32-10 stream as the CPU path, so a
seed gives the same codes on every device.  Not yet: SR inside block
quantization, 2-D tiles, MX rules other than ``rceil``, the GEMM and the
tensor-core dispatch.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from ..codecs import Rounding, encode_lut
from ..formats import FormatSpec, get_format
from ..schemes import Kind, ScaleRule

__all__ = ["encode", "decode", "random_bits", "philox4x32", "rht", "quantize_nvfp4", "dequantize_nvfp4", "quantize_mx",
           "dequantize_mx"]

_FLT_MAX = float(np.finfo(np.float32).max)


def _t():
    import torch

    return torch


@functools.cache
def _table(kind: str, spec: FormatSpec, mode: int, sat: bool, device: str):
    torch = _t()
    if kind == "enc":
        arr = encode_lut(spec, mode, sat).astype(np.int64)
    else:
        arr = spec.decode_table()
    return torch.from_numpy(np.array(arr)).to(device)  # a writable copy: the tables are read-only


def _bits(x):
    """float32 tensor → its bit patterns as int64 in [0, 2**32)."""
    torch = _t()
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def philox4x32(c0, c1, k0: int, k1: int):
    """Philox4x32-10 on int64 tensors of 32-bit counters (words c0, c1; c2 = c3 = 0): four int64 word tensors.

    The 32×32 → 64-bit products are split into 16-bit halves so that every
    intermediate fits a signed int64 on every device.
    """
    torch = _t()
    m32 = 0xFFFFFFFF
    x0, x1 = c0 & m32, c1 & m32
    x2 = torch.zeros_like(x0)
    x3 = torch.zeros_like(x0)
    k0, k1 = k0 & m32, k1 & m32

    def mulhilo(m, v):
        lo_part = m * (v & 0xFFFF)
        hi_part = m * (v >> 16)
        return (hi_part + (lo_part >> 16)) >> 16, (((hi_part & 0xFFFF) << 16) + lo_part) & m32

    for _ in range(10):
        h0, l0 = mulhilo(0xD2511F53, x0)
        h1, l1 = mulhilo(0xCD9E8D57, x2)
        x0, x1, x2, x3 = (h1 ^ x1 ^ k0), l1, (h0 ^ x3 ^ k1), l0
        k0 = (k0 + 0x9E3779B9) & m32
        k1 = (k1 + 0xBB67AE85) & m32
    return x0, x1, x2, x3


def random_bits(seed: int, n: int, k: int = 8, counter: int = 0, device="cpu"):
    """The same k-bit integers as :func:`fpsim.random.random_bits` (Philox stream of SPEC §3), as int64."""
    from ..random import seed_key, stream_width

    torch = _t()
    k0, k1 = seed_key(seed)
    width = stream_width(k)
    per_block = 128 // width
    nblocks = -(-n // per_block)
    c = torch.arange(nblocks, dtype=torch.int64, device=device) + int(counter)
    words = torch.stack(philox4x32(c & 0xFFFFFFFF, c >> 32, k0, k1), dim=-1)  # (blocks, 4)
    per_word = 32 // width
    shifts = torch.arange(per_word, dtype=torch.int64, device=device) * width
    vals = (words.unsqueeze(-1) >> shifts) & ((1 << width) - 1)  # (blocks, 4, per_word)
    return vals.reshape(-1)[:n] & ((1 << k) - 1)


def _encode_sr(u, r, k: int, spec: FormatSpec):
    """fpsim._kernels encode_one_sr on int64 tensors: t = fl32(|x| + r·2^(qexp−k)), then truncate (SPEC §3)."""
    torch = _t()
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = spec.traits
    a, s, ep, sig, t, rem, _half, mag = _fields(u, spec)
    qexp = ep.clamp(min=emin_b) - 127 - mbits

    def pow2(ex):  # 2**ex as float64, built from its bits (exact)
        return ((ex + 1023) << 52).view(torch.float64)

    val = sig.to(torch.float64) * pow2(ep - 150) + r.to(torch.float64) * pow2(qexp - k)
    t32 = val.to(torch.float32).to(torch.float64)  # the one float32 rounding of the FMA
    up = (t32 >= (t + 1).to(torch.float64) * pow2(qexp)) & (rem != 0)
    mag = (mag + up.to(torch.int64)).clamp(max=max_code)
    res = (s << (bits - 1)) | mag
    return torch.where(a > 0x7F800000, nan_code, res)


def encode(x, fmt: str | FormatSpec, rounding: str = "rne", saturate: bool = True, *, seed: int | None = None,
           rbits=None, k: int | None = None, counter: int = 0):
    """Codes of a float32 tensor (same bits as :func:`fpsim.encode`, SR included); int64 tensor of the same shape."""
    torch = _t()
    spec = get_format(fmt)
    mode = Rounding.parse(rounding)
    if mode is Rounding.SR:
        if not saturate:
            raise ValueError("stochastic rounding is satfinite only (cvt.rs.satfinite)")
        if (seed is None) == (rbits is None):
            raise ValueError("rounding='sr' needs exactly one of rbits= or seed=")
        kbits = spec.sr_bits if k is None else int(k)
        x = x.to(torch.float32)
        r = rbits if rbits is not None else random_bits(seed, x.numel(), kbits, counter, x.device).reshape(x.shape)
        return _encode_sr(_bits(x), r.to(torch.int64), kbits, spec)
    x = x.to(torch.float32)
    if (mode is Rounding.RNE and saturate and spec.bits <= 8 and spec.traits.subnormals == 1 and spec.signed
            and _impl(x, "auto")):
        return encode_fused(x, spec).to(torch.int64)
    u = _bits(x)
    dev = str(x.device)
    if spec.bits <= 8:
        shift = 21 - spec.mbits
        key = ((u >> shift) << 1) | ((u & ((1 << shift) - 1)) != 0).to(torch.int64)
        return _table("enc", spec, mode.kernel_id, bool(saturate), dev)[key]
    return _encode_wide(u, spec, mode.kernel_id, bool(saturate))


def _fields(u, spec: FormatSpec):
    """The integer decomposition both wide encoders start from (fpsim._kernels._encode_branchfree's prologue).

    Returns |x| bits, sign, E' = max(E, 1), the 24-bit significand, the kept quanta ``t``, the discarded
    remainder, half a quantum, and the code magnitude of ``t`` before rounding.
    """
    torch = _t()
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = spec.traits
    if not subn or emin_b < 1:
        raise NotImplementedError(f"{spec.name}: formats without subnormals are not supported by this path")
    a = u & 0x7FFFFFFF
    s = (u >> 31) & signed
    e = a >> 23
    ep = e.clamp(min=1)
    sig = (a & 0x7FFFFF) | (e.clamp(max=1) << 23)
    sh = (23 - mbits + (emin_b - ep).clamp(min=0)).clamp(max=25)
    one = torch.ones_like(sh)
    t = sig >> sh
    rem = sig & ((one << sh) - 1)
    half = one << (sh - 1)
    mag = ((ep.clamp(min=emin_b) - emin_b) << mbits) + t
    return a, s, ep, sig, t, rem, half, mag


def _encode_wide(u, spec: FormatSpec, mode: int, sat: bool):
    """fpsim._kernels._encode_branchfree on int64 tensors (formats with subnormals, emin_b ≥ 1)."""
    torch = _t()
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = spec.traits
    a, s, ep, sig, t, rem, half, base = _fields(u, spec)
    if mode == 0:  # RNE
        up = (rem > half) | ((rem == half) & ((base & 1) == 1))
        away = torch.ones_like(up)
    elif mode == 4:  # RNA
        up = rem >= half
        away = torch.ones_like(up)
    elif mode == 2:  # RUP
        up = (rem != 0) & (s == 0)
        away = s == 0
    elif mode == 3:  # RDOWN
        up = (rem != 0) & (s == 1)
        away = s == 1
    else:  # RTZ
        up = torch.zeros_like(rem, dtype=torch.bool)
        away = up
    mag = base + up.to(torch.int64)
    special = max_code if (sat or not (has_inf or has_nan)) else (inf_code if has_inf else nan_code)
    ovf = torch.where(away | (a == 0x7F800000), special, max_code)
    mag = torch.where(mag > max_code, ovf, mag)
    res = (s << (bits - 1)) | mag
    return torch.where(a > 0x7F800000, nan_code, res)


def decode(codes, fmt: str | FormatSpec):
    """float32 values of codes (same bits as :func:`fpsim.decode`)."""
    torch = _t()
    spec = get_format(fmt)
    return _table("dec", spec, 0, True, str(codes.device))[codes.to(torch.int64)]


def _f32(v, device):
    return _t().tensor(v, dtype=_t().float32, device=device)


def quantize_nvfp4(x):
    """NVFP4 1×16 along the last axis, RNE (SPEC §4): (packed uint8 data, E4M3 scale bytes, float32 amax).

    Shapes match :func:`fpsim.quantize` (``x.shape[:-1] + (blocks·8,)`` and
    ``x.shape[:-1] + (blocks,)``); a ragged last axis is zero-padded.
    """
    torch = _t()
    x = x.to(torch.float32)
    dev = x.device
    lead, c = x.shape[:-1], x.shape[-1]
    nb = -(-c // 16)
    xp = torch.nn.functional.pad(x, (0, nb * 16 - c)).reshape(*lead, nb, 16)
    amax = x.abs().amax() if x.numel() else _f32(0.0, dev)
    s_enc = torch.minimum(_f32(2688.0, dev) / amax, _f32(_FLT_MAX, dev))
    s_enc = torch.where((amax == 0) | (s_enc == 0), _f32(1.0, dev), s_enc)
    s_dec = _f32(1.0, dev) / s_enc
    vmax = xp.abs().amax(dim=-1)
    sdb = torch.minimum(vmax * (s_enc * (_f32(1.0, dev) / _f32(6.0, dev))), _f32(448.0, dev))
    sb = encode(sdb, "float8_e4m3fn")
    sv = decode(sb, "float8_e4m3fn")
    enc = torch.minimum(_f32(1.0, dev) / (sv * s_dec), _f32(_FLT_MAX, dev))
    codes = encode(xp * enc.unsqueeze(-1), "float4_e2m1fn").reshape(*lead, nb * 16)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, sb.to(torch.uint8), amax


def dequantize_nvfp4(packed, scales, amax, c: int):
    """x̂ = fl((e2m1 · f32(s_b)) · S_dec) in the original last-axis length ``c``."""
    torch = _t()
    dev = packed.device
    p = packed.to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*packed.shape[:-1], -1)
    e = decode(codes, "float4_e2m1fn")
    sv = decode(scales, "float8_e4m3fn").repeat_interleave(16, dim=-1)
    s_enc = torch.minimum(_f32(2688.0, dev) / amax, _f32(_FLT_MAX, dev))
    s_enc = torch.where((amax == 0) | (s_enc == 0), _f32(1.0, dev), s_enc)
    s_dec = _f32(1.0, dev) / s_enc
    return ((e * sv) * s_dec)[..., :c]


def quantize_mx(x, element: str = "float4_e2m1fn"):
    """MX 1×32 along the last axis with the ``rceil`` rule (SPEC §5), RNE elements: (codes, scale bytes).

    Codes are packed two per byte for 4-bit elements, one per byte otherwise.
    """
    torch = _t()
    el = get_format(element)
    x = x.to(torch.float32)
    dev = x.device
    lead, c = x.shape[:-1], x.shape[-1]
    nb = -(-c // 32)
    xp = torch.nn.functional.pad(x, (0, nb * 32 - c)).reshape(*lead, nb, 32)
    vmax = xp.abs().amax(dim=-1)
    t = vmax * (_f32(1.0, dev) / _f32(el.max, dev))
    sb = encode(t, "float8_e8m0fnu", "rup", True)  # cvt.rp.satfinite.ue8m0x2.f32
    p2 = torch.from_numpy(np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32),
                                    np.float32(np.nan))).to(dev)
    y = xp * p2[sb].unsqueeze(-1)
    codes = encode(y, el)
    codes = torch.where((sb == 0xFF).unsqueeze(-1), el.nan_code, codes).reshape(*lead, nb * 32)
    if el.bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes.to(torch.uint8), sb.to(torch.uint8)


def dequantize_mx(codes, scales, c: int, element: str = "float4_e2m1fn"):
    """x̂ = fl(e · 2^(b − 127)); scale 0xFF gives NaN."""
    torch = _t()
    el = get_format(element)
    k = codes.to(torch.int64)
    if el.bits == 4:
        k = torch.stack([k & 0xF, k >> 4], dim=-1).reshape(*codes.shape[:-1], -1)
    e = decode(k, el)
    p2 = torch.from_numpy(np.append(np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32),
                                    np.float32(np.nan))).to(codes.device)
    return (e * p2[scales.to(torch.int64)].repeat_interleave(32, dim=-1))[..., :c]


def _bf16_round(x):
    """float32 → nearest BF16 value as float32 (RNE; NaN → 0x7FC00000; inf kept), as fpsim.transforms does."""
    torch = _t()
    b = _bits(x)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000)
    r = torch.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, r)
    return r.to(torch.int32).view(torch.float32) if r.dtype != torch.int32 else r.view(torch.float32)


def rht(x, d: int = 16, signs="recipe", axis: int = -1, bf16_in: bool = True, bf16_out: bool = True,
        inverse: bool = False, impl: str = "auto"):
    """Random Hadamard transform with the same float32 operations, in the same order, as :func:`fpsim.rht`.

    Each butterfly stage computes (a + b, a − b) on the same pairs as the Numba
    kernel, so every output element sees the identical sequence of roundings.
    On CUDA (``impl="auto"``) one Triton kernel does the whole transform in
    registers; ``impl="eager"`` runs it as torch operations (a few launches and
    temporaries per stage).
    """
    from ..transforms import sign_vector

    torch = _t()
    s = torch.from_numpy(sign_vector(d, signs)).to(x.device)
    v = torch.movedim(x.to(torch.float32), axis, -1)
    n = v.shape[-1]
    if n % d:
        raise ValueError(f"axis length {n} is not a multiple of the Hadamard size {d}")
    lead = v.shape[:-1]
    d = int(d)
    if _impl(x, impl) and d <= 4096:  # one tile in registers (larger d: the eager path)
        from . import kernels as K

        v = v.contiguous()
        out = torch.empty_like(v)
        nt = v.numel() // d
        bb = max(1, 2048 // d)  # tiles per program: 2048 values, like the quantizers' programs
        if nt:
            K.rht_kernel[(-(-nt // bb),)](
                v, s, out, nt, float(np.float32(1.0 / np.sqrt(d))), D=d, LOG2D=d.bit_length() - 1, BB=bb,
                BF16_IN=bf16_in, BF16_OUT=bf16_out, INVERSE=inverse, IDX64=v.numel() >= (1 << 31) - 4096,
                num_warps=_WARPS)
        return torch.movedim(out, -1, axis)
    t = v.reshape(-1, n // d, d)
    if bf16_in:
        t = _bf16_round(t)
    if not inverse:
        t = t * s
    h = 1
    while h < d:
        t4 = t.reshape(t.shape[0], t.shape[1], d // (2 * h), 2, h)
        a, b = t4[..., 0, :], t4[..., 1, :]
        t = torch.stack([a + b, a - b], dim=-2).reshape(t.shape[0], t.shape[1], d)
        h *= 2
    t = t * torch.tensor(np.float32(1.0 / np.sqrt(d)), device=x.device)
    if inverse:
        t = t * s
    if bf16_out:
        t = _bf16_round(t)
    return torch.movedim(t.reshape(*lead, n), -1, axis)


def fake_quantize(x, scheme, rounding: str | None = None, seed: int | None = None, counter: int = 0):
    """Quantize-dequantize a 2-D tensor (blocks along the last axis) under any block scheme, on torch.

    Equal to ``fpsim.quantize(x, scheme, rounding=rounding, seed=seed, counter=counter).dequantize()``
    bit for bit (tested), stochastic rounding included (the same Philox bits in the same block order):
    two-level (NVFP4-style, 1×N or N×N tiles), E8M0 with any scale rule (MX), FP32-scaled (FP8
    per-tensor or blockwise) and casts.  On CUDA the NVFP4, MX and FP8 schemes run the fused Triton
    kernels; SR schemes without one are quantized by the reference.
    """
    from ..schemes import Kind, get_scheme

    torch = _t()
    sch = get_scheme(scheme)
    mode = Rounding.parse(rounding) if rounding is not None else sch.rounding
    el = sch.element
    x = x.to(torch.float32)
    sr_kw = {"seed": seed, "k": sch.k, "counter": counter} if mode is Rounding.SR else {}
    kind = sch.kind
    if kind is Kind.CAST:
        return decode(encode(x, el, mode.value, **sr_kw), el)
    if mode is Rounding.SR:
        if seed is None:
            raise ValueError("rounding='sr' needs a seed")
        return quantize(x, sch, rounding="sr", seed=seed, counter=counter).dequantize()
    if mode is Rounding.RNE and x.dim() == 2 and _impl(x, "auto") and (_nvfp4_like(sch) or _mx_like(sch)):
        X = x.contiguous()
        tile = sch.block[0] > 1
        if _nvfp4_like(sch):
            return _nvfp4_triton(X, absmax(X), tile, False, True)
        return _mx_triton(X, el, sch.scale_rule.rule_id, tile, False, True)
    if mode is Rounding.RNE and x.dim() == 2 and _impl(x, "auto") and _fp8_like(sch):
        return quantize_fp8_fused(x, el.name, None if sch.block is None else sch.block[1], fake=True)
    r, c = x.shape
    dev = x.device
    br, bc = sch.block if sch.block is not None else (r, c)
    rp, cp = -(-r // br) * br, -(-c // bc) * bc
    xp = torch.nn.functional.pad(x, (0, cp - c, 0, rp - r))
    tiles = xp.reshape(rp // br, br, cp // bc, bc)
    vmax = tiles.abs().amax(dim=(1, 3), keepdim=True)  # NaN-propagating, like the reference
    one = _f32(1.0, dev)
    if kind is Kind.TWO_LEVEL:
        amax = x.abs().amax()
        if sch.tensor_scale:
            num = _f32(float(np.float32(el.max) * np.float32(256.0 if sch.four_over_six else sch.scale.max)), dev)
            s_enc = torch.minimum(num / amax, _f32(_FLT_MAX, dev))
            s_enc = torch.where((amax == 0) | (s_enc == 0), one, s_enc)
        else:
            s_enc = one
        s_dec = one / s_enc
        sdb = torch.minimum(vmax * (s_enc * (one / _f32(el.max, dev))), _f32(sch.scale.max, dev))
        sv = decode(encode(sdb, sch.scale), sch.scale)
        enc = torch.minimum(one / (sv * s_dec), _f32(_FLT_MAX, dev))
        codes = encode((tiles * enc).reshape(rp, cp), el, mode.value, **sr_kw).reshape(tiles.shape)
        out = (decode(codes, el) * sv) * s_dec
    elif kind is Kind.POW2:
        if sch.scale_rule.value != "rceil":
            raise NotImplementedError("the torch backend implements the rceil MX scale rule only")
        sb = encode(vmax * (one / _f32(el.max, dev)), "float8_e8m0fnu", "rup", True)
        exp = 127 - sb
        mul = ((exp + 127) << 23).to(torch.int32).view(torch.float32)  # 2**(127 - b): exact float32
        mul = torch.where(exp == -127, _f32(2.0**-127, dev), mul)  # b = 254: 2**-127 is subnormal
        codes = encode((tiles * mul).reshape(rp, cp), el, mode.value, **sr_kw).reshape(tiles.shape)
        back = torch.where(sb == 255, _f32(float("nan"), dev), one / mul)
        out = torch.where(sb == 255, _f32(float("nan"), dev), decode(codes, el) * back)
    else:  # FP32 scales
        d = vmax / _f32(el.max, dev)
        d = torch.where((d == 0) | torch.isinf(d), one, d)
        codes = encode((tiles / d).reshape(rp, cp), el, mode.value, **sr_kw).reshape(tiles.shape)
        out = decode(codes, el) * d
    return out.reshape(rp, cp)[:r, :c]


# ---------------------------------------------------------------------------
# Fused Triton path (CUDA): one kernel for block amax + scale + encode + pack.


@functools.cache
def triton_available() -> bool:
    """Whether the fused Triton kernels can be imported here (they run on CUDA, or on CPU under TRITON_INTERPRET=1)."""
    try:
        from . import kernels  # noqa: F401
    except Exception:  # ImportError, or a Triton that cannot initialise its backend
        return False
    return True


def _impl(x, impl: str) -> bool:
    """True when the Triton kernels should run on ``x`` (``impl``: "auto" = on CUDA tensors, "triton", "eager")."""
    if impl not in ("auto", "triton", "eager"):
        raise ValueError("impl must be 'auto', 'triton' or 'eager'")
    if impl == "eager":
        return False
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' needs Triton (pip install triton)")
        return True
    return x.is_cuda and triton_available()


_BB = 128  # NVFP4 blocks per Triton program (2048 elements; MX programs take _BB // 2 blocks of 32): H200 sweep
_WARPS = 4


@functools.cache
def _dummy(device: str, dtype_name: str):
    """A one-element placeholder for a kernel pointer argument the chosen variant never reads."""
    torch = _t()
    return torch.zeros(1, dtype=getattr(torch, dtype_name), device=device)


def _hw_cvt() -> bool:
    """Compiled kernels may use the GPU's float conversions; the interpreter's truncate, so it gets integer code."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


def _layout(R: int, C: int, w: int) -> dict:
    """Kernel switches: EVEN (no ragged tail: contiguous blocks), IDX64 (offsets past 2^31)."""
    return {"EVEN": C % w == 0, "IDX64": R * (-(-C // w) * w) >= (1 << 31) - 4096, "num_warps": _WARPS}


def _as_rows(x):
    """float32 contiguous (R, C) view of ``x`` with its last axis as C, and the leading shape."""
    torch = _t()
    x = x.to(torch.float32)
    lead, c = tuple(x.shape[:-1]), x.shape[-1]
    return x.reshape(-1, c).contiguous(), lead, c


def absmax(x, ignore_nan: bool = False):
    """max |x| as a 0-d float32 tensor in one fused pass (NaN-propagating unless ``ignore_nan``); 0 when empty."""
    torch = _t()
    from . import kernels as K

    x = x.to(torch.float32).contiguous()
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    n = x.numel()
    if n:
        block, iters = 1024, 16
        K.absmax_kernel[(-(-n // (block * iters)),)](x, out, n, BLOCK=block, ITERS=iters, IGNORE_NAN=bool(ignore_nan))
    return out.view(torch.float32).reshape(())


def _tile_absmax(X, tr: int, bw: int, ignore_nan: bool):
    torch = _t()
    from . import kernels as K

    R, C = X.shape
    nb = -(-C // bw)
    out = torch.empty((-(-R // tr), nb), dtype=torch.int32, device=X.device)
    bb = 16
    K.tile_absmax_kernel[(out.shape[0], -(-nb // bb))](X, out, R, C, nb, TR=tr, BW=bw, BB=bb,
                                                       IGNORE_NAN=bool(ignore_nan))
    return out


def _sr_kw(seed, k: int, counter: int) -> dict:
    """Kernel arguments of stochastic rounding with the CPU quantizer's Philox stream (none for RNE)."""
    if seed is None:
        return {"k0": 0, "k1": 0, "counter0": 0}
    from ..random import seed_key, stream_width

    k0, k1 = seed_key(seed)
    return {"k0": k0, "k1": k1, "counter0": int(counter), "SR": True, "K": int(k), "WIDTH": stream_width(int(k))}


def _nvfp4_triton(X, amax, tile: bool, ignore_nan: bool, fake: bool, seed=None, k: int = 8, counter: int = 0):
    torch = _t()
    from . import kernels as K

    R, C = X.shape
    nb = -(-C // 16)
    nblk = R * nb
    dev = X.device
    amax = amax.reshape(1).to(torch.float32)
    tmax = _tile_absmax(X, 16, 16, ignore_nan) if (tile and fake) else _dummy(str(dev), "int32")
    grid = (max(-(-nblk // _BB), 1),)
    kw = dict(BB=_BB, TILE=tile, IGNORE_NAN=bool(ignore_nan), **_layout(R, C, 16), **_sr_kw(seed, k, counter))
    if tile and not fake:  # one pass: the tile amax is taken inside the program
        q = torch.empty((R, nb * 8), dtype=torch.uint8, device=dev)
        s = torch.empty((R, nb), dtype=torch.uint8, device=dev)
        if nblk:
            bt = 8
            K.nvfp4_quant_2d_kernel[(-(-R // 16), -(-nb // bt))](
                X, q.view(torch.int32), s, amax, R, C, nb, BT=bt, IGNORE_NAN=bool(ignore_nan),
                **_sr_kw(seed, k, counter), num_warps=_WARPS)
        return q, s
    if fake:
        out = torch.empty((R, C), dtype=torch.float32, device=dev)
        if nblk:
            d8 = _dummy(str(dev), "int32")
            K.nvfp4_quant_kernel[grid](X, d8, d8, out, tmax, amax, R, C, nb, nblk, FAKE=True, **kw)
        return out
    q = torch.empty((R, nb * 8), dtype=torch.uint8, device=dev)
    s = torch.empty((R, nb), dtype=torch.uint8, device=dev)
    if nblk:
        K.nvfp4_quant_kernel[grid](X, q.view(torch.int32), s, X, tmax, amax, R, C, nb, nblk, FAKE=False, **kw)
    return q, s


def quantize_nvfp4_fused(x, *, tensor_amax=None, tile: bool = False, nan_amax: str = "propagate",
                         seed: int | None = None, k: int = 8, counter: int = 0):
    """NVFP4 quantization by the fused Triton kernels: (packed uint8, E4M3 scale bytes, float32 amax).

    Same bits and shapes as :func:`fpsim.quantize` with ``"nvfp4"`` (``tile=True``: 16×16 tiles, 2-D
    input) along the last axis.  ``tensor_amax`` (a float or 0-d tensor) skips the amax pass, as
    :func:`fpsim.quantize`'s argument of that name does.
    """
    torch = _t()
    ignore = nan_amax == "ignore"
    X, lead, c = _as_rows(x)
    if tile and len(lead) != 1:
        raise ValueError("16×16 tiles need a 2-D tensor")
    if tensor_amax is None:
        amax = absmax(X, ignore)
    else:
        amax = torch.as_tensor(tensor_amax, dtype=torch.float32, device=X.device).reshape(())
    q, s = _nvfp4_triton(X, amax, tile, ignore, False, seed, k, counter)
    return q.reshape(*lead, q.shape[-1]), s.reshape(*lead, s.shape[-1]), amax


def _out_view(out):
    """The output buffer as the kernels write it: float32 as is, bfloat16 as its int16 bits."""
    torch = _t()
    if out.dtype == torch.float32:
        return out
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16)
    raise ValueError(f"dequantize writes float32 or bfloat16, not {out.dtype}")


def _decode_buffers(codes, scales, c: int, dtype):
    """(leading shape, 2-D contiguous codes, 2-D contiguous scales, the (R, c) output) of a decode kernel."""
    torch = _t()
    lead = tuple(codes.shape[:-1])
    Q = codes.reshape(-1, codes.shape[-1]).contiguous()
    S = scales.reshape(-1, scales.shape[-1]).contiguous()
    out = torch.empty((S.shape[0], c), dtype=torch.float32 if dtype is None else dtype, device=codes.device)
    return lead, Q, S, out


def dequantize_nvfp4_fused(packed, scales, amax, c: int, dtype=None, apply_s_dec: bool = True):
    """Decode NVFP4 by one Triton kernel: fl((e · f32(s_b)) · S_dec) in ``dtype`` (float32 default).

    ``apply_s_dec=False`` gives the exact products e · s_b, which bfloat16 holds exactly (an E2M1
    value times an E4M3 value has at most 5 significant bits): the operands of the exact
    dequantize-to-BF16 GEMM.
    """
    torch = _t()
    from . import kernels as K

    lead, Q, S, out = _decode_buffers(packed, scales, c, dtype)
    R, nb = S.shape
    amax = torch.as_tensor(amax, dtype=torch.float32, device=packed.device).reshape(1)
    nblk = R * nb
    if nblk:
        K.nvfp4_dequant_kernel[(-(-nblk // _BB),)](Q.view(torch.int32), S, amax, _out_view(out), c, nb, nblk,
                                                   BB=_BB, APPLY_SDEC=bool(apply_s_dec),
                                                   OUT_BF16=out.dtype == torch.bfloat16, HW_CVT=_hw_cvt(),
                                                   **_layout(R, c, 16))
    return out.reshape(*lead, c)


def _mx_consts(el: FormatSpec):
    bits, mbits, signed, has_inf, has_nan, subn, max_code, emin_b, nan_code, inf_code = el.traits
    return {"EMAX": int(el.emax), "MBITS": int(mbits), "EMIN_B": int(emin_b), "MAX_CODE": int(max_code),
            "NAN_CODE": int(nan_code), "SIGN_SHIFT": int(bits - 1), "PACK4": bits == 4}


def _mx_triton(X, el: FormatSpec, rule: int, tile: bool, ignore_nan: bool, fake: bool, seed=None, k: int = 8,
               counter: int = 0):
    torch = _t()
    from . import kernels as K

    R, C = X.shape
    nb = -(-C // 32)
    nblk = R * nb
    dev = X.device
    inv_max = float(np.float32(1.0) / np.float32(el.max))
    dec = _table("dec", el, 0, True, str(dev)).contiguous()
    tmax = _tile_absmax(X, 32, 32, ignore_nan) if tile else _dummy(str(dev), "int32")
    kw = dict(BB=_BB // 2, RULE=int(rule), TILE=tile, IGNORE_NAN=bool(ignore_nan), **_mx_consts(el),
              **_layout(R, C, 32), **_sr_kw(seed, k, counter))
    grid = (max(-(-nblk // (_BB // 2)), 1),)
    dummy8 = _dummy(str(dev), "int32")
    if fake:
        out = torch.empty((R, C), dtype=torch.float32, device=dev)
        if nblk:
            K.mx_quant_kernel[grid](X, dummy8, dummy8, out, dec, tmax, inv_max, R, C, nb, nblk, FAKE=True, **kw)
        return out
    q = torch.empty((R, nb * (16 if el.bits == 4 else 32)), dtype=torch.uint8, device=dev)
    s = torch.empty((R, nb), dtype=torch.uint8, device=dev)
    if nblk:
        K.mx_quant_kernel[grid](X, q.view(torch.int32), s, X, dec, tmax, inv_max, R, C, nb, nblk, FAKE=False, **kw)
    return q, s


def quantize_mx_fused(x, element: str = "float4_e2m1fn", scale_rule: str = "rceil", *, tile: bool = False,
                      nan_amax: str = "propagate", seed: int | None = None, k: int = 8, counter: int = 0):
    """MX quantization (blocks of 32 along the last axis, or 32×32 tiles) by one Triton kernel.

    Any of the four E8M0 scale rules of SPEC §5; RNE satfinite elements.  Returns (codes, scale bytes)
    with :func:`fpsim.quantize`'s bits and shapes.
    """
    from ..schemes import ScaleRule

    el = get_format(element)
    X, lead, c = _as_rows(x)
    q, s = _mx_triton(X, el, ScaleRule.parse(scale_rule).rule_id, tile, nan_amax == "ignore", False, seed, k,
                      counter)
    return q.reshape(*lead, q.shape[-1]), s.reshape(*lead, s.shape[-1])


def quantize_fp8_fused(x, element: str = "float8_e4m3fn", block: int | None = None, *, tensor_amax=None,
                      nan_amax: str = "propagate", fake: bool = False):
    """FP8 with FP32 scales by one Triton kernel: per tensor (``block=None``, after the amax pass) or per
    1×``block`` along the last axis (128 for DeepSeek-style blockwise).  Returns (codes uint8, scales float32)
    with :func:`fpsim.quantize`'s bits and shapes, or the fake-quantized float32 tensor with ``fake=True``."""
    torch = _t()
    from . import kernels as K

    el = get_format(element)
    X, lead, c = _as_rows(x)
    R = X.shape[0]
    ignore = nan_amax == "ignore"
    dev = X.device
    if block is None:
        w = 16
        amax = (absmax(X, ignore) if tensor_amax is None
                else torch.as_tensor(tensor_amax, dtype=torch.float32, device=dev)).reshape(1)
        flat = X.reshape(1, -1)
        Xk, Rk, Ck = flat, 1, flat.shape[1]
    else:
        if tensor_amax is not None:
            raise ValueError("tensor_amax applies to per-tensor scaling")
        w = int(block)
        amax = _dummy(str(dev), "float32")
        Xk, Rk, Ck = X, R, c
    nb = -(-Ck // w)
    nblk = Rk * nb
    consts = _mx_consts(el)
    del consts["EMAX"], consts["PACK4"]
    kw = dict(BB=max(2048 // w, 1), W=w, PER_TENSOR=block is None, IGNORE_NAN=ignore, **consts,
              **_layout(Rk, Ck, w))
    grid = (max(-(-nblk // kw["BB"]), 1),)
    dec = _table("dec", el, 0, True, str(dev)).contiguous()
    emax_f = float(np.float32(el.max))
    if fake:
        out = torch.empty_like(X)
        if nblk:
            d = _dummy(str(dev), "int32")
            K.fp32_scaled_quant_kernel[grid](Xk, d, d, out, dec, amax, emax_f, Rk, Ck, nb, nblk, FAKE=True, **kw)
        return out.reshape(*lead, c)
    q = torch.empty((Rk, nb * w), dtype=torch.uint8, device=dev)
    s = torch.empty((1,) if block is None else (Rk, nb), dtype=torch.float32, device=dev)
    if nblk:
        K.fp32_scaled_quant_kernel[grid](Xk, q.view(torch.int32), s, X, dec, amax, emax_f, Rk, Ck, nb, nblk,
                                         FAKE=False, **kw)
    elif block is None:
        s.fill_(1.0)
    if block is None:
        return q.reshape(-1)[: X.numel()].reshape(*lead, c), s.reshape(())
    return q.reshape(*lead, nb * w), s.reshape(*lead, nb)


def encode_fused(x, fmt: str | FormatSpec):
    """RNE satfinite codes (uint8) of a float32 tensor for a ≤ 8-bit format with subnormals, by one Triton kernel."""
    torch = _t()
    from . import kernels as K

    spec = get_format(fmt)
    if spec.bits > 8 or spec.is_passthrough or spec.traits.subnormals == 0:
        raise ValueError(f"{spec.name}: the fused encoder covers ≤ 8-bit formats with subnormals")
    x = x.to(torch.float32).contiguous()
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    n = x.numel()
    c = _mx_consts(spec)
    del c["EMAX"], c["PACK4"]
    if n:
        K.encode_kernel[(-(-n // 1024),)](x, out, n, BLOCK=1024, **c)
    return out


def dequantize_mx_fused(codes, scales, c: int, element: str = "float4_e2m1fn", dtype=None):
    """x̂ = fl(e · 2^(b − 127)) by one Triton kernel, in ``dtype`` (float32 default)."""
    torch = _t()
    from . import kernels as K

    el = get_format(element)
    lead, Q, S, out = _decode_buffers(codes, scales, c, dtype)
    R, nb = S.shape
    dec = _table("dec", el, 0, True, str(codes.device)).contiguous()
    nblk = R * nb
    if nblk:
        K.mx_dequant_kernel[(-(-nblk // (_BB // 2)),)](Q.view(torch.int32), S, dec, _out_view(out), c, nb, nblk,
                                                       BB=_BB // 2, PACK4=el.bits == 4,
                                                       OUT_BF16=out.dtype == torch.bfloat16, HW_CVT=_hw_cvt(),
                                                       **_layout(R, c, 32))
    return out.reshape(*lead, c)


# ---------------------------------------------------------------------------
# Quantized tensors on torch devices, and the GEMM dispatch.


@dataclasses.dataclass(frozen=True, eq=False)
class TorchQuantized:
    """:class:`fpsim.QuantizedTensor`'s fields as torch tensors on one device (same bits, same layouts)."""

    data: object
    scales: object
    amax: object
    scheme: object
    shape: tuple
    axis: int = -1

    @classmethod
    def from_quantized(cls, q, device="cpu") -> TorchQuantized:
        torch = _t()
        # np.asarray(order="C"), not ascontiguousarray, which makes a 0-d per-tensor scale 1-d.
        return cls(torch.from_numpy(np.array(q.data, order="C")).to(device),
                   torch.from_numpy(np.array(q.scales, order="C")).to(device),
                   torch.from_numpy(np.asarray(q.amax, np.float32).copy()).to(device), q.scheme, tuple(q.shape), q.axis)

    def to_quantized(self, dtype: str = "float32"):
        """The numpy :class:`fpsim.QuantizedTensor` with these bits."""
        from ..tensor import QuantizedTensor

        return QuantizedTensor(self.data.cpu().numpy(), self.scales.cpu().numpy(), self.amax.cpu().numpy(),
                               self.scheme, tuple(self.shape), dtype, self.axis % len(self.shape))

    def dequantize(self, dtype=None, impl: str = "auto"):
        """Decode to the original shape (fused kernels on CUDA for NVFP4 and MX; the reference otherwise)."""
        torch = _t()
        sch = self.scheme
        nd = len(self.shape)
        ax = self.axis % nd
        c = self.shape[ax]
        fused = None
        if _impl(self.data, impl) and _nvfp4_like(sch):
            fused = dequantize_nvfp4_fused(self.data, self.scales, self.amax, c, dtype)
        elif _impl(self.data, impl) and _mx_like(sch):
            fused = dequantize_mx_fused(self.data, self.scales, c, sch.element.name, dtype)
        elif _fp8_like(sch):
            el = sch.element
            vals = decode(self.data, el)
            if sch.block is None:
                out = vals * self.scales.to(torch.float32)
                return out if dtype is None else out.to(dtype)
            w = sch.block[1]
            fused = (vals * self.scales.repeat_interleave(w, dim=-1))[..., :c]
            fused = fused if dtype is None else fused.to(dtype)
        if fused is not None:
            return torch.movedim(fused, -1, ax)
        from ..scaling import dequantize as np_dequantize

        out = torch.from_numpy(np_dequantize(self.to_quantized())).to(self.data.device)
        return out if dtype is None else out.to(dtype)


def _nvfp4_like(sch) -> bool:
    from ..schemes import Kind

    return (sch.kind is Kind.TWO_LEVEL and sch.element.name == "float4_e2m1fn" and sch.scale.name == "float8_e4m3fn"
            and sch.block in ((1, 16), (16, 16)) and sch.tensor_scale and not sch.per_row_scale
            and not sch.four_over_six)


def _fp8_like(sch) -> bool:
    """FP8 (E4M3/E5M2) with FP32 scales, per tensor or per 1×W block: the fused FP8 kernel's schemes."""
    from ..schemes import Kind

    return (sch.kind is Kind.FP32 and sch.element.name in ("float8_e4m3fn", "float8_e5m2")
            and (sch.block is None or (sch.block[0] == 1 and sch.block[1] in (16, 32, 64, 128, 256))))


def _mx_like(sch) -> bool:
    from ..schemes import Kind

    return (sch.kind is Kind.POW2 and sch.block in ((1, 32), (32, 32)) and sch.element.bits <= 8
            and sch.element.traits.subnormals == 1)


def quantize(x, scheme="nvfp4", axis: int = -1, *, impl: str = "auto", **kwargs) -> TorchQuantized:
    """:func:`fpsim.quantize` for a torch tensor, result on the tensor's device (same bits).

    NVFP4 (1×16, 16×16), MX (any rule) and FP8 (FP32 scales) run the fused Triton kernels on CUDA
    (``impl="triton"`` forces them, e.g. under ``TRITON_INTERPRET=1``), with RNE or seeded stochastic
    rounding (k ≤ 16; the same Philox bits in the same block order as the CPU quantizer); every other
    option (``rbits=``, four-over-six, per-row scales, casts) is computed by the Numba reference on the
    host and moved back, so the bits never depend on the path.
    """
    import dataclasses as dc

    from ..codecs import Rounding
    from ..scaling import quantize as np_quantize
    from ..schemes import ScaleRule, get_scheme

    torch = _t()
    sch = get_scheme(scheme)
    changes = {k: kwargs.pop(k) for k in ("block", "rounding", "scale_rule") if kwargs.get(k) is not None}
    for k in ("block", "rounding", "scale_rule"):
        kwargs.pop(k, None)
    if changes:
        if "block" in changes:
            changes["block"] = tuple(changes["block"])
        sch = dc.replace(sch, **changes)
    nd = x.dim()
    ax = axis % nd if nd else 0
    shape = tuple(x.shape)
    if kwargs.get("k") is not None:
        sch = dc.replace(sch, sr_bits=int(kwargs["k"]))
    fused_kw = set(kwargs) <= {"nan_amax", "tensor_amax", "seed", "k", "counter"}
    mode = Rounding.parse(sch.rounding)
    sr = mode is Rounding.SR and kwargs.get("seed") is not None and sch.k <= 16
    rne = mode is Rounding.RNE and kwargs.get("seed") is None
    sr_kw = {"seed": kwargs.get("seed"), "k": sch.k, "counter": int(kwargs.get("counter", 0))} if sr else {}
    if nd and fused_kw and rne and _impl(x, impl) and _fp8_like(sch):
        nan_amax = kwargs.get("nan_amax", "propagate")
        if sch.block is None:  # per tensor: one amax pass, shared by the kernel and the result; codes keep x's layout
            amax = (absmax(x, nan_amax == "ignore") if kwargs.get("tensor_amax") is None
                    else torch.as_tensor(kwargs["tensor_amax"], dtype=torch.float32, device=x.device))
            q, s = quantize_fp8_fused(x, sch.element.name, None, tensor_amax=amax, nan_amax=nan_amax)
        else:
            if "tensor_amax" in kwargs:
                raise ValueError(f"tensor_amax applies to schemes with a per-tensor scale, not {sch.name}")
            q, s = quantize_fp8_fused(torch.movedim(x, ax, -1), sch.element.name, sch.block[1], nan_amax=nan_amax)
            amax = torch.tensor(float("nan"), dtype=torch.float32, device=x.device)
        return TorchQuantized(q, s, amax.reshape(()), sch, shape, ax)
    if nd and fused_kw and (rne or sr) and _impl(x, impl) and (_nvfp4_like(sch) or _mx_like(sch)):
        tile = sch.block[0] > 1
        xm = torch.movedim(x, ax, -1)
        if tile and xm.dim() != 2:
            raise ValueError(f"2-D blocks {sch.block} need a 2-D tensor, got shape {shape}")
        nan_amax = kwargs.get("nan_amax", "propagate")
        if _nvfp4_like(sch):
            q, s, amax = quantize_nvfp4_fused(xm, tensor_amax=kwargs.get("tensor_amax"), tile=tile,
                                              nan_amax=nan_amax, **sr_kw)
        else:
            if "tensor_amax" in kwargs:
                raise ValueError(f"tensor_amax applies to schemes with a per-tensor scale, not {sch.name}")
            q, s = quantize_mx_fused(xm, sch.element.name, ScaleRule.parse(sch.scale_rule).value, tile=tile,
                                     nan_amax=nan_amax, **sr_kw)
            amax = torch.tensor(float("nan"), dtype=torch.float32, device=x.device)
        return TorchQuantized(q, s, amax, sch, shape, ax)
    qn = np_quantize(x.detach().cpu().numpy(), sch, axis=axis, **kwargs)
    return TorchQuantized.from_quantized(qn, x.device)


def _alpha_t(a_amax, b_amax, num_a: float, num_b: float):
    """SPEC §8's alpha = fl(fl(amax_a·amax_b) / fl(N_a·N_b)), or fl(S_dec_a·S_dec_b) where that formula fails.

    Python scalars only (exact in float32): ``torch.tensor(v, device="cuda")`` would copy from pageable
    host memory and synchronise the host with the GPU on every call.
    """
    torch = _t()
    aa, ab = a_amax.to(torch.float32).reshape(()), b_amax.to(torch.float32).reshape(())
    alpha = (aa * ab) / float(np.float32(num_a) * np.float32(num_b))

    def sdec(amax, num):
        s_enc = torch.clamp(num / amax, max=_FLT_MAX)  # clamp keeps a NaN, like fmin_nan
        s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
        return 1.0 / s_enc

    def ok(amax, num):
        return torch.isfinite(amax) & (amax > 0) & (num / amax < _FLT_MAX)

    good = ok(aa, num_a) & ok(ab, num_b) & torch.isfinite(alpha) & (alpha > 0)
    return torch.where(good, alpha, sdec(aa, num_a) * sdec(ab, num_b))


def _mm_f32(a, b_t, alpha=None, out_dtype=None):
    """fl(alpha · a·b_tᵀ): BF16 tensor cores with FP32 accumulation and FP32 output on CUDA (``mm.dtype``),
    then one in-place FP32 multiply by the 0-d device tensor ``alpha`` (no host synchronisation, which a
    scalar alpha for cuBLAS's epilogue would need); exact float32 products on CPU.  ``out_dtype=bfloat16``
    rounds the FP32 result to BF16 (the output of a BF16 ``torch.matmul``)."""
    torch = _t()
    if a.is_cuda and a.dtype == torch.bfloat16:
        out = torch.mm(a, b_t.t(), out_dtype=torch.float32)
    else:
        out = torch.mm(a.float(), b_t.float().t())
    if alpha is not None:
        out.mul_(alpha)
    return out if out_dtype in (None, torch.float32) else out.to(out_dtype)


def gemm_nvfp4_bf16(a: TorchQuantized, b: TorchQuantized, out_dtype=None):
    """NVFP4 × NVFP4 on Hopper/Ada tensor cores: exact dequantize-to-BF16 then one BF16 GEMM (SPEC §8).

    e · s_b (an E2M1 value times an E4M3 scale) is exact in BF16, so the tensor cores multiply the
    exact block-scaled values and accumulate in FP32 in their own order; the result is
    fl(acc · alpha).  Equal to :func:`fpsim.gemm`'s ``"blas"`` model up to FP32 summation order.
    ``out_dtype=torch.bfloat16`` rounds that FP32 result to BF16 (the output of a BF16 ``torch.matmul``).
    """
    ka, kb = a.shape[-1], b.shape[-1]
    if ka != kb:
        raise ValueError(f"reduction lengths differ: {ka} and {kb}")
    return _mm_f32(_scaled_values_bf16(a), _scaled_values_bf16(b), _alpha_t(a.amax, b.amax, 2688.0, 2688.0),
                   out_dtype)


def _scaled_values_bf16(q: TorchQuantized):
    """e · s_b of an NVFP4 operand in BF16 (exact): the fused kernel on CUDA, torch ops elsewhere."""
    torch = _t()
    k = q.shape[-1]
    if _impl(q.data, "auto"):
        return dequantize_nvfp4_fused(q.data, q.scales, q.amax, k, torch.bfloat16, apply_s_dec=False)
    p = q.data.to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*q.data.shape[:-1], -1)
    sv = decode(q.scales, "float8_e4m3fn").repeat_interleave(16, dim=-1)
    return (decode(codes, "float4_e2m1fn") * sv)[..., :k].to(torch.bfloat16)


def gemm_fp32_model(a: TorchQuantized, b: TorchQuantized):
    """SPEC §8's bit-defined ``"fp32"`` accumulator model on the operands' device: equal to
    ``fpsim.gemm(qa, qb, "fp32")`` bit for bit (tested).

    Per K-chunk (ascending): P = Σ e_a·e_b by one matmul over the chunk (BF16 tensor cores where both
    element formats are E2M1, whose 16-term block sums are exact in FP32; float64 otherwise, as the
    reference), then term = fl(fl(s_a ⊗ s_b) · fl(P)) and acc = fl(acc + term) as three separate
    float32 operations, and finally fl(acc · alpha).
    """
    from ..gemm import alpha_factor, chunked_operands

    torch = _t()
    dev = a.data.device
    oa, ob, k, chunk, nch, sa, sb = chunked_operands(a.to_quantized(), b.to_quantized())
    sa, sb = torch.from_numpy(sa).to(dev), torch.from_numpy(sb).to(dev)
    fp4 = a.scheme.element.name == b.scheme.element.name == "float4_e2m1fn"
    wdt = torch.bfloat16 if (fp4 and dev.type == "cuda") else torch.float64
    ea = torch.zeros((oa.values.shape[0], nch * chunk), dtype=torch.float32, device=dev)
    eb = torch.zeros((ob.values.shape[0], nch * chunk), dtype=torch.float32, device=dev)
    ea[:, :k] = torch.from_numpy(oa.values).to(dev)
    eb[:, :k] = torch.from_numpy(ob.values).to(dev)
    ea, eb = ea.to(wdt), eb.to(wdt)
    acc = torch.zeros((ea.shape[0], eb.shape[0]), dtype=torch.float32, device=dev)
    for c in range(nch):
        s = slice(c * chunk, (c + 1) * chunk)
        p = _mm_f32(ea[:, s], eb[:, s]) if wdt == torch.bfloat16 else (ea[:, s] @ eb[:, s].t()).float()
        acc = acc + (sa[:, c, None] * sb[None, :, c]) * p
    return acc * torch.from_numpy(alpha_factor(oa, ob)).to(dev)


def gemm_fp8_scaled_mm(a: TorchQuantized, b: TorchQuantized, out_dtype=None):
    """Per-tensor-scaled FP8 × FP8 on FP8 tensor cores (compute capability ≥ 8.9) via ``torch._scaled_mm``.

    The codes are reinterpreted as torch's float8_e4m3fn / float8_e5m2 (the same OCP bit layouts);
    ``scale_a``/``scale_b`` are the stored FP32 decode scales d = amax / max_elem.  cuBLAS accumulates
    in its own order (and, on Hopper, with a narrower-than-FP32 accumulator): compare with the
    ``"exact"`` model, not bit for bit.  E5M2 × E5M2 is not a cuBLAS FP8 combination.
    """
    torch = _t()
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
    from ..schemes import Kind

    torch = _t()
    sa, sb = a.scheme, b.scheme
    if len(a.shape) != 2 or len(b.shape) != 2 or a.axis % 2 != 1 or b.axis % 2 != 1:
        raise ValueError("operands must be 2-D and quantized along K (their last axis)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"reduction lengths differ: {a.shape} and {b.shape}")
    k = a.shape[1]
    nv = _nvfp4_like(sa) and _nvfp4_like(sb) and sa.block == sb.block == (1, 16)
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
    alpha = _alpha_t(a.amax, b.amax, 2688.0, 2688.0) if nv else None
    return {"args": args, "alpha": alpha}


def gemm_blackwell(a: TorchQuantized, b: TorchQuantized):
    """Native NVFP4/MX GEMM on Blackwell tensor cores (untested on hardware; see :func:`blackwell_scaled_mm_args`)."""
    torch = _t()
    prep = blackwell_scaled_mm_args(a, b)
    out = torch._scaled_mm(**prep["args"]).float()
    return out * prep["alpha"] if prep["alpha"] is not None else out


def gemm(a: TorchQuantized, b: TorchQuantized, accumulator: str = "fp32"):
    """``A · Bᵀ`` of two quantized operands on their device, dispatched by capability (issue 8).

    ``"fp32"``: :func:`gemm_fp32_model`, bit-identical to the reference on every device.
    ``"blas"`` (fast; FP32 summation order is the hardware's): on Blackwell (10.x) NVFP4/MX go to
    native block-scaled tensor cores; on compute capability ≥ 8.9 per-tensor FP8 goes to FP8 tensor
    cores; NVFP4 anywhere on CUDA to :func:`gemm_nvfp4_bf16`; everything else to the reference's
    ``"blas"`` model on the host.  ``"exact"`` / ``"truncated"`` run the reference on the host.
    """
    from ..gemm import gemm as np_gemm
    from ..schemes import Kind

    torch = _t()
    dev = a.data.device
    if accumulator == "fp32":
        return gemm_fp32_model(a, b)
    if accumulator == "blas" and dev.type == "cuda":
        cc = torch.cuda.get_device_capability(dev)
        nv = _nvfp4_like(a.scheme) and _nvfp4_like(b.scheme)
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
            return gemm_nvfp4_bf16(a, b)
    out = np_gemm(a.to_quantized(), b.to_quantized(), accumulator)
    return torch.from_numpy(out).to(dev)


def unsupported(op: str, plan, device: str, **options) -> str | None:
    """Why this backend does not run ``op`` for ``plan`` on ``device`` (``"cpu"``/``"cuda"``), or None.

    The dispatcher (:mod:`fpsim.dispatch`) hands every call this returns a reason for to the Numba
    reference and moves the result, so the bits never depend on the path.
    """
    if op in ("encode", "decode", "rht"):
        if op == "encode" and options.get("rbits"):
            return "explicit rbits= are applied by the reference"
        return None
    if op == "gemm":
        acc = options.get("accumulator", "fp32")
        return None if acc in ("fp32", "blas") else f"the {acc!r} accumulator model runs on the reference only"
    if options.get("rbits"):
        return "explicit rbits= are applied by the reference"
    sch = plan.scheme
    if op == "fake_quantize":
        if sch.four_over_six:
            return "four-over-six has no torch kernel"
        if sch.per_row_scale:
            return "per-row tensor scales have no torch kernel"
        if plan.kind is Kind.POW2 and plan.pow2.rule is not ScaleRule.RCEIL and device == "cpu":
            return f"the eager torch MX path implements the rceil rule only, not {plan.pow2.rule.value}"
        return None
    fused = _nvfp4_like(sch) or _mx_like(sch) or (_fp8_like(sch) and not plan.is_sr)
    if op == "quantize":
        if device == "cpu":
            return "torch-cpu has no quantizer of its own (the fused Triton kernels run on CUDA)"
        if not triton_available():
            return "Triton is not available"
        if not fused:
            return f"no fused Triton kernel for {sch.name} with these options"
        if plan.is_sr and plan.sr.k > 16:
            return "stochastic rounding with more than 16 random bits has no Triton kernel"
        return None
    if op == "dequantize":
        if _fp8_like(sch) or (device == "cuda" and triton_available() and (_nvfp4_like(sch) or _mx_like(sch))):
            return None
        return f"no torch decoder for {sch.name} on {device}"
    raise ValueError(f"unknown op {op!r}")
