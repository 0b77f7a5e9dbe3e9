"""Element codecs on torch tensors, bit-identical to :mod:`fpsim.codecs`; the Philox stream of SPEC §3.

≤ 8-bit formats encode through the reference's own lookup table (:func:`fpsim.codecs.encode_lut`, indexed by
sign, exponent, top mantissa bits and a sticky bit of the float32 input), or on CUDA by one Triton kernel
(RNE, satfinite); wider formats use the branch-free integer rounding of ``fpsim._kernels``; stochastic
rounding adds Philox bits exactly as ``encode_one_sr`` does.  Every format is read through its
:class:`~fpsim.formats.Traits` fields.  PyTorch compiles its CUDA kernels without fast-math, so each float32
torch operation is one IEEE operation on every device.
"""

from __future__ import annotations

import functools

import numpy as np

from ..codecs import SR_EXACT_BITS, Rounding, default_saturate, encode_lut
from ..formats import FormatSpec, get_format
from ..plan import is_e2m1
from ..random import seed_key, stream_width
from ..scaling import POW2_NEG, POW2_POS, byte_table
from .runtime import torch_module, use_triton

__all__ = ["encode", "decode", "encode_fused", "random_bits", "block_random_bits", "philox4x32", "code_table",
           "elem_consts", "f32_bits", "bf16_round", "pow2_table"]


@functools.cache
def code_table(kind: str, spec: FormatSpec, mode: int = 0, sat: bool = True, device: str = "cpu"):
    """A codec table on ``device``: ``"enc"`` (the reference's RNE/… lookup table, int64), ``"dec"`` (the
    decode table) or ``"byte"`` (decode of all 256 byte values, NaN past the format's codes)."""
    torch = torch_module()
    if kind == "enc":
        arr = encode_lut(spec, mode, sat).astype(np.int64)
    elif kind == "dec":
        arr = spec.decode_table()
    else:
        arr = byte_table(spec)
    return torch.from_numpy(np.array(arr)).to(device)  # a writable copy: the tables are read-only


@functools.cache
def pow2_table(sign: int, device: str = "cpu"):
    """E8M0 byte b → 2**(sign · (b − 127)) as exact float32 (NaN for 0xFF): :data:`fpsim.scaling.POW2_POS`
    (sign +1, decode) or ``POW2_NEG`` (−1, the element multiplier), cached on ``device``."""
    torch = torch_module()
    return torch.from_numpy((POW2_POS if sign > 0 else POW2_NEG).copy()).to(device)


def f32_bits(x):
    """float32 tensor → its bit patterns as int64 in [0, 2**32)."""
    torch = torch_module()
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def elem_consts(spec: FormatSpec) -> dict:
    """The constexpr arguments of a Triton element encoder, by name from the format's traits."""
    tr = spec.traits
    return {"E2M1": is_e2m1(spec), "MBITS": tr.mbits, "EMIN_B": tr.emin_b, "MAX_CODE": tr.max_code,
            "NAN_CODE": tr.nan_code, "SIGN_SHIFT": tr.bits - 1}


def philox4x32(c0, c1, k0: int, k1: int):
    """Philox4x32-10 on int64 tensors of 32-bit counters (words c0, c1; c2 = c3 = 0): four int64 word tensors.

    The 32×32 → 64-bit products are split into 16-bit halves so that every
    intermediate fits a signed int64 on every device.
    """
    torch = torch_module()
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


def _stream_values(counters, seed: int, k: int):
    """The k-bit values of Philox calls ``counters`` (int64, any shape): shape + (128 // width,)."""
    torch = torch_module()
    k0, k1 = seed_key(seed)
    width = stream_width(k)
    words = torch.stack(philox4x32(counters & 0xFFFFFFFF, counters >> 32, k0, k1), dim=-1)  # (..., 4)
    shifts = torch.arange(32 // width, dtype=torch.int64, device=counters.device) * width
    vals = (words.unsqueeze(-1) >> shifts) & ((1 << width) - 1)  # (..., 4, per_word)
    # an explicit width, not -1: no counters (an empty tensor) leave nothing to infer it from
    return vals.reshape(*counters.shape, vals.shape[-2] * vals.shape[-1]) & ((1 << k) - 1)


def random_bits(seed: int, n: int, k: int = 8, counter: int = 0, device="cpu"):
    """The same k-bit integers as :func:`fpsim.random.random_bits` (Philox stream of SPEC §3), as int64."""
    torch = torch_module()
    per_call = 128 // stream_width(k)
    c = torch.arange(-(-n // per_call), dtype=torch.int64, device=device) + int(counter)
    return _stream_values(c, seed, k).reshape(-1)[:n]


def block_random_bits(seed: int, rows: int, nb: int, bc: int, k: int, counter: int = 0, device="cpu"):
    """(rows, nb·bc) k-bit integers of the block quantizers' stream (SPEC §3, :func:`fpsim.quantize`): block
    b = row · nb + j uses calls counter + b · ⌈bc / per_call⌉ + cc, element t value t mod per_call of call
    t // per_call."""
    torch = torch_module()
    per_call = 128 // stream_width(k)
    calls = -(-bc // per_call)
    b = torch.arange(rows * nb, dtype=torch.int64, device=device)
    c = int(counter) + b[:, None] * calls + torch.arange(calls, dtype=torch.int64, device=device)[None, :]
    return _stream_values(c, seed, k).reshape(rows * nb, calls * per_call)[:, :bc].reshape(rows, nb * bc)


def _fields(u, spec: FormatSpec):
    """The integer decomposition both wide encoders start from (fpsim._kernels._encode_branchfree's prologue).

    Returns |x| bits, sign, E' = max(E, 1), the 24-bit significand, the kept quanta ``t``, the discarded
    remainder, half a quantum, and the code magnitude of ``t`` before rounding.
    """
    torch = torch_module()
    tr = spec.traits
    if not tr.subnormals or tr.emin_b < 1:
        raise NotImplementedError(f"{spec.name}: formats without subnormals are not supported by this path")
    a = u & 0x7FFFFFFF
    s = (u >> 31) & tr.signed
    e = a >> 23
    ep = e.clamp(min=1)
    sig = (a & 0x7FFFFF) | (e.clamp(max=1) << 23)
    sh = (23 - tr.mbits + (tr.emin_b - ep).clamp(min=0)).clamp(max=25)
    one = torch.ones_like(sh)
    t = sig >> sh
    rem = sig & ((one << sh) - 1)
    half = one << (sh - 1)
    mag = ((ep.clamp(min=tr.emin_b) - tr.emin_b) << tr.mbits) + t
    return a, s, ep, sig, t, rem, half, mag


def _encode_sr(u, r, k: int, spec: FormatSpec):
    """fpsim._kernels encode_one_sr on int64 tensors: t = fl32(|x| + r·2^(qexp−k)), then truncate (SPEC §3)."""
    torch = torch_module()
    tr = spec.traits
    a, s, ep, sig, t, rem, _half, mag = _fields(u, spec)
    qexp = ep.clamp(min=tr.emin_b) - 127 - tr.mbits

    def pow2(ex):  # 2**ex as float64, built from its bits (exact)
        return ((ex + 1023) << 52).view(torch.float64)

    val = sig.to(torch.float64) * pow2(ep - 150) + r.to(torch.float64) * pow2(qexp - k)
    t32 = val.to(torch.float32).to(torch.float64)  # the one float32 rounding of the FMA
    up = (t32 >= (t + 1).to(torch.float64) * pow2(qexp)) & (rem != 0)
    mag = (mag + up.to(torch.int64)).clamp(max=tr.max_code)
    res = (s << (tr.bits - 1)) | mag
    return torch.where(a > 0x7F800000, tr.nan_code, res)


def _encode_wide(u, spec: FormatSpec, mode: int, sat: bool):
    """fpsim._kernels._encode_branchfree on int64 tensors (formats with subnormals, emin_b ≥ 1)."""
    torch = torch_module()
    tr = spec.traits
    a, s, ep, sig, t, rem, half, base = _fields(u, spec)
    if mode == Rounding.RNE.kernel_id:
        up = (rem > half) | ((rem == half) & ((base & 1) == 1))
        away = torch.ones_like(up)
    elif mode == Rounding.RNA.kernel_id:
        up = rem >= half
        away = torch.ones_like(up)
    elif mode == Rounding.RUP.kernel_id:
        up = (rem != 0) & (s == 0)
        away = s == 0
    elif mode == Rounding.RDOWN.kernel_id:
        up = (rem != 0) & (s == 1)
        away = s == 1
    else:  # RTZ
        up = torch.zeros_like(rem, dtype=torch.bool)
        away = up
    mag = base + up.to(torch.int64)
    special = tr.max_code if (sat or not (tr.has_inf or tr.has_nan)) else (tr.inf_code if tr.has_inf else tr.nan_code)
    ovf = torch.where(away | (a == 0x7F800000), special, tr.max_code)
    mag = torch.where(mag > tr.max_code, ovf, mag)
    res = (s << (tr.bits - 1)) | mag
    return torch.where(a > 0x7F800000, tr.nan_code, res)


def encode(x, fmt: str | FormatSpec, rounding: str | Rounding = "rne", saturate: bool | None = None, *,
           seed: int | None = None, rbits=None, k: int | None = None, counter: int = 0):
    """Codes of a float32 tensor (same bits as :func:`fpsim.encode`, SR included); int64 tensor of the same shape.

    ``saturate=None`` is the format's default (:func:`fpsim.codecs.default_saturate`: satfinite ≤ 8 bits, IEEE
    BF16/FP16); stochastic rounding is satfinite.

    Stochastic rounding takes exactly one of ``rbits`` (integers of x's shape) or ``seed`` (the flat stream
    from ``counter``); ``k`` random bits (default the format's ``sr_bits``).
    """
    torch = torch_module()
    spec = get_format(fmt)
    mode = Rounding.parse(rounding)
    x = x.to(torch.float32)
    if saturate is None:
        saturate = True if mode is Rounding.SR else default_saturate(spec)
    if mode is Rounding.SR:
        if not saturate:
            raise ValueError("stochastic rounding is satfinite only (cvt.rs.satfinite)")
        if (seed is None) == (rbits is None):
            raise ValueError("rounding='sr' needs exactly one of rbits= or seed=")
        kbits = spec.sr_bits if k is None else int(k)
        r = rbits if rbits is not None else random_bits(seed, x.numel(), kbits, counter, x.device).reshape(x.shape)
        return _encode_sr(f32_bits(x), r.to(torch.int64), kbits, spec)
    if (mode is Rounding.RNE and saturate and spec.bits <= 8 and spec.subnormals and spec.signed
            and use_triton(x, "auto")):
        return encode_fused(x, spec).to(torch.int64)
    u = f32_bits(x)
    if spec.bits <= 8:
        shift = 21 - spec.mbits
        key = ((u >> shift) << 1) | ((u & ((1 << shift) - 1)) != 0).to(torch.int64)
        return code_table("enc", spec, mode.kernel_id, bool(saturate), str(x.device))[key]
    return _encode_wide(u, spec, mode.kernel_id, bool(saturate))


def decode(codes, fmt: str | FormatSpec):
    """float32 values of codes (same bits as :func:`fpsim.decode`)."""
    torch = torch_module()
    spec = get_format(fmt)
    return code_table("dec", spec, 0, True, str(codes.device))[codes.to(torch.int64)]


def encode_fused(x, fmt: str | FormatSpec, rbits=None, k: int | None = None):
    """Satfinite codes (uint8) of a float32 tensor for a signed ≤ 8-bit format with subnormals, by one Triton
    kernel (the E2M1 arithmetic for E2M1, the generic encoder otherwise): RNE, or with ``rbits`` (integers of
    x's shape in [0, 2^k); k defaults to the format's SR width) stochastic rounding, SPEC §3, as
    ``fpsim.encode(x, fmt, rounding="sr", rbits=, k=)``."""
    from . import kernels as K

    torch = torch_module()
    spec = get_format(fmt)
    if spec.bits > 8 or not spec.subnormals or not spec.signed:
        raise ValueError(f"{spec.name}: the fused encoder covers signed ≤ 8-bit formats with subnormals")
    x = x.to(torch.float32).contiguous()
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    sr = {}
    if rbits is not None:
        kbits = spec.sr_bits if k is None else int(k)
        if not 1 <= kbits <= SR_EXACT_BITS:
            raise ValueError(f"k must be in 1..{SR_EXACT_BITS}, got {kbits}")
        if tuple(rbits.shape) != tuple(x.shape):
            raise ValueError(f"rbits must have the shape of x {tuple(x.shape)}, got {tuple(rbits.shape)}")
        sr = {"r_ptr": rbits.to(device=x.device, dtype=torch.int32).contiguous(), "SR": True, "K": kbits}
    n = x.numel()
    if n:
        K.encode_kernel[(-(-n // 1024),)](x, out, n, BLOCK=1024, **elem_consts(spec), **sr)
    return out


def bf16_round(x):
    """float32 → nearest BF16 value as float32 (RNE; NaN → 0x7FC00000; inf kept), as fpsim.transforms does."""
    torch = torch_module()
    b = f32_bits(x)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000)
    r = torch.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, r)
    return r.to(torch.int32).view(torch.float32) if r.dtype != torch.int32 else r.view(torch.float32)
