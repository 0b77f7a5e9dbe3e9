"""Producer conventions: the NVFP4 arithmetic of the libraries that write NVFP4 tensors (docs/spec.md §4.1).

Every producer packs the same E2M1 codes into the same bytes and rounds to E2M1 and E4M3 the same way; they
differ in how the global scale is formed, how a block scale is formed and clamped, how the encode multiplier is
formed, how −0 and NaN are written, which global scale is stored and how values are decoded.  A
:class:`Convention` names each of these parts (one enum per part, each member's docstring its formula), and
:data:`CONVENTIONS` holds one per producer::

    fpsim.conventions.names()                       # ('fpsim', 'te-cuda', 'te-cuda-fastmath', 'te-python', ...)
    q = fpsim.quantize(x, "nvfp4", convention="compressed-tensors")   # that library's bytes
    q.dequantize()                                  # its values (the convention travels with q)
    q.dequantize(convention="te-cuda")              # the same bytes decoded in Transformer Engine's CUDA order
    fpsim.conventions.stored_global(q)              # the FP32 global scale the producer stores (G, amax/2688 or amax)
    fpsim.conventions.decode(codes, scales, g, "compressed-tensors")   # decode a checkpoint's stored arrays

:func:`fpsim.plan.lower` puts the convention into the :class:`~fpsim.plan.Plan`; the arithmetic below is one
algorithm over an array namespace (:class:`NumpyOps` here for the numba-cpu backend, the torch backend's ops for
torch-cpu and torch-cuda), so no backend branches on a producer's name.  ``fpsim`` is fpsim's own convention
(SPEC §4) and takes the fused kernels; a convention that equals it part for part gives its bytes.
All arithmetic is float32 with one rounding per operation unless a part says bfloat16.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

import numpy as np

from .codecs import decode as np_decode
from .codecs import encode as np_encode
from .formats import get_format

__all__ = ["GlobalRule", "BlockRule", "EncodeRule", "DecodeRule", "Stored", "Convention", "CONVENTIONS", "names",
           "get_convention", "NumpyOps", "quantize_blocks", "decode_blocks", "global_scale", "stored_global",
           "decode", "is_native"]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BF16_MAX = F32(3.3895313892515355e38)
TINY = F32(2.0**-126)


class GlobalRule(str, enum.Enum):
    """The FP32 global scale g computed from the tensor amax (the scale the block-scale and encode rules read)."""

    TE = "te"  #: S_enc = min(fl(2688/amax), FLT_MAX); 1 when amax = 0 or S_enc = 0 (SPEC §4)
    RECIP = "recip"  #: G = fl(fl(1/max(amax, 2^-126))·2688), 1 where not finite (bf16 ops for bf16 inputs)
    PTS = "pts"  #: pts = fl(amax/2688): the decode-side global scale


class BlockRule(str, enum.Enum):
    """The block scale sdb before clamping and E4M3 rounding, from the block amax vmax and the global g."""

    TE = "te"  #: min(fl(vmax·fl(S_enc·fl(1/6))), 448)
    MUL_G = "mul_g"  #: fl(G·fl(vmax/6)) (vmax/6 in bf16 for bf16 inputs)
    DIV_PTS = "div_pts"  #: fl(fl(vmax/6)/pts)
    DIV_6PTS = "div_6pts"  #: fl(vmax/fl(6·pts))


class EncodeRule(str, enum.Enum):
    """The scaled element y whose E2M1 code is stored, from x, the block scale's value s and the global g."""

    TE = "te"  #: fl(x·min(fl(1/fl(s·S_dec)), FLT_MAX)), S_dec = fl(1/S_enc)
    TE_BF16 = "te_bf16"  #: bfloat16 inputs: fl(x·c), c = bf16(min(fl(S_enc/s), BF16_MAX)) (TE's fast math); else TE
    DIV_S_G = "div_s_g"  #: fl(x/fl(s/G))
    RECIP_PTS_S = "recip_pts_s"  #: fl(x·fl(fl(1/pts)/s))
    DIV_S_PTS = "div_s_pts"  #: fl(x/fl(s·pts))


class DecodeRule(str, enum.Enum):
    """The decoded value of element value e in a block with scale value s (float32 result)."""

    FPSIM = "fpsim"  #: fl(fl(e·s)·S_dec), S_dec = fl(1/S_enc(amax))  (fpsim's own order, SPEC §4)
    TE_CUDA = "te_cuda"  #: fl(e·fl(fl(s·amax)·fl(1/2688)))  (Transformer Engine's CUDA dequantize)
    DIV_G = "div_g"  #: fl(e·fl(s/G))
    S_PTS = "s_pts"  #: fl(e·fl(s·pts)) (= fl(e·fl(pts·s)): IEEE multiplication commutes)


class Stored(str, enum.Enum):
    """Which FP32 global scale the producer stores beside the codes and block scales."""

    AMAX = "amax"  #: the tensor amax (Transformer Engine, fpsim)
    ENCODE = "encode"  #: the encode scale G ≈ 2688/amax (compressed-tensors' weight_global_scale)
    DECODE = "decode"  #: the decode scale pts = fl(amax/2688) (torchao's per_tensor_scale, ModelOpt's weight_scale_2)


@dataclass(frozen=True)
class Convention:
    """One producer's NVFP4 arithmetic, part by part (docs/spec.md §4.1 gives each producer's source)."""

    name: str
    source: str  #: the producer's files and functions this convention is read from
    global_rule: GlobalRule = GlobalRule.TE
    block_rule: BlockRule = BlockRule.TE
    zero_sdb: float | None = None  #: sdb == 0 is replaced by this before clamping (ModelOpt: 1.0)
    scale_min: float | None = None  #: lower clamp of sdb before E4M3 rounding (torchao 2^-6, ModelOpt 2^-9)
    zero_scale: float | None = None  #: a block scale that rounds to E4M3 zero becomes this (compressed-tensors 0.125)
    nan_scale: int = 0x7F  #: the E4M3 byte of a NaN block scale
    encode_rule: EncodeRule = EncodeRule.TE
    neg_zero: bool = True  #: a scaled element that is exactly −0 is written 0x8 (False: 0x0)
    nan_code: int = 0x7  #: the E2M1 code of a NaN scaled element
    inf_nan_code: int | None = None  #: the code of a NaN that is fl(0·inf) (x86's default NaN), if not nan_code
    stored: Stored = Stored.AMAX
    decode_rule: DecodeRule = DecodeRule.FPSIM
    decode_neg_zero: bool = True  #: code 0x8 decodes to −0 (False: to +0, ModelOpt's table)
    decode_bf16: bool = False  #: decoded values are rounded to bfloat16 (compressed-tensors' decompress)

    def parts(self) -> dict:
        """The arithmetic parts (every field but name and source)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("name", "source")}


_TE = "Transformer Engine (github.com/NVIDIA/TransformerEngine, transformer_engine/common/cast/nvfp4/)"
CONVENTIONS: dict[str, Convention] = {c.name: c for c in (
    Convention("fpsim", "docs/spec.md §4: Transformer Engine's CUDA quantize order, fpsim's decode order"),
    Convention("te-cuda", f"{_TE} core_nvfp4.cuh: compute_global_encode_scaling_factor_FP4, "
               "quantization_SF::compute_decoding_scaling_factor, compute_scaling_coefficient<float>; "
               "dequantize_nvfp4.cuh: dequantize_fp4_kernel", decode_rule=DecodeRule.TE_CUDA),
    Convention("te-cuda-fastmath", f"{_TE} specialized/quantize_transpose_nvfp4_tuned_1D.cuh: "
               "compute_nvfp4_scaling_coefficient<bf16> (NVTE_USE_FAST_MATH); util/ptx_arch_spec.cuh: "
               "mul_cvt_bf16_to_fp4_8x_round_to_nearest<bf16>; dequantize_nvfp4.cuh: dequantize_fp4_kernel",
               encode_rule=EncodeRule.TE_BF16, decode_rule=DecodeRule.TE_CUDA),
    Convention("te-python", "Transformer Engine transformer_engine/pytorch/custom_recipes/reference_nvfp4.py: "
               "NVFP4QuantizerRef._quantize_blockwise_reference, cast_to_fp4x2 (no dequantize of its own: "
               "decoded as the CUDA dequantize_fp4_kernel)", neg_zero=False, nan_code=0x0,
               decode_rule=DecodeRule.TE_CUDA),
    Convention("torchao", "torchao 0.18 torchao/prototype/mx_formats/nvfp4_tensor.py: per_tensor_amax_to_scale, "
               "nvfp4_quantize (two-level branch), NVFP4Tensor.get_hp_scales/dequantize; NaN codes measured on "
               "x86 CPU", global_rule=GlobalRule.PTS, block_rule=BlockRule.DIV_PTS, scale_min=2.0**-6,
               nan_scale=0xFF, encode_rule=EncodeRule.RECIP_PTS_S, nan_code=0xC, inf_nan_code=0xB,
               stored=Stored.DECODE,
               decode_rule=DecodeRule.S_PTS),
    Convention("compressed-tensors", "compressed-tensors 0.20 quantization/utils/helpers.py: generate_gparam, "
               "calculate_qparams; quantization/lifecycle/forward_helpers.py: _quantize, _dequantize; "
               "quantization/utils/fp4_utils.py: cast_to_fp4; compressors/nvfp4/helpers.py: pack_fp4_to_uint8",
               global_rule=GlobalRule.RECIP, block_rule=BlockRule.MUL_G, zero_scale=0.125,
               encode_rule=EncodeRule.DIV_S_G, neg_zero=False, stored=Stored.ENCODE, decode_rule=DecodeRule.DIV_G,
               decode_bf16=True),
    Convention("modelopt", "nvidia-modelopt 0.47 modelopt/torch/quantization/qtensor/nvfp4_tensor.py: "
               "NVFP4QTensor.get_weights_scaling_factor_2, get_weights_scaling_factor, "
               "_cast_per_block_scale_to_fp8, quantize, _cast_fp4, dequantize", global_rule=GlobalRule.PTS,
               block_rule=BlockRule.DIV_6PTS, zero_sdb=1.0, scale_min=2.0**-9, nan_scale=0xFF,
               encode_rule=EncodeRule.DIV_S_PTS, neg_zero=False, stored=Stored.DECODE,
               decode_rule=DecodeRule.S_PTS, decode_neg_zero=False),
)}
FPSIM = CONVENTIONS["fpsim"]


def names() -> tuple[str, ...]:
    """The names of the producer conventions."""
    return tuple(CONVENTIONS)


def get_convention(c: str | Convention | None) -> Convention:
    """A :class:`Convention` by name (``None`` is fpsim's own)."""
    if c is None:
        return FPSIM
    if isinstance(c, Convention):
        return c
    try:
        return CONVENTIONS[c]
    except (KeyError, TypeError):
        raise ValueError(f"unknown convention {c!r}; known: {', '.join(CONVENTIONS)}") from None


_DECODE_PARTS = ("stored", "decode_rule", "decode_neg_zero", "decode_bf16")


@functools.cache
def is_native(c: Convention) -> bool:
    """True when the quantize parts are fpsim's own (the fused kernels then give the convention's bytes)."""
    base = FPSIM.parts()
    return all(v == base[k] for k, v in c.parts().items() if k not in _DECODE_PARTS)


@functools.cache
def decodes_native(c: Convention) -> bool:
    """True when the decode parts are fpsim's own (SPEC §4's order, −0 kept, float32 values)."""
    base = FPSIM.parts()
    return all(c.parts()[k] == base[k] for k in _DECODE_PARTS if k != "stored")


class NumpyOps:
    """The array namespace of the numba-cpu backend: numpy float32 operations (one IEEE rounding each) and fpsim's
    reference codecs."""

    xp = np

    @staticmethod
    def f32(v, like=None):
        return F32(v)

    @staticmethod
    def bf16(x):
        """Round float32 values to bfloat16 (RNE), back as float32."""
        return np_decode(np_encode(np.asarray(x, F32), "bfloat16"), "bfloat16")

    @staticmethod
    def encode(y, fmt):
        return np_encode(np.asarray(y, F32), fmt)

    @staticmethod
    def decode(codes, fmt):
        return np_decode(codes, fmt)

    @staticmethod
    def signbit(y):
        return np.signbit(y)

    @staticmethod
    def amax_last(a):
        return np.max(a, axis=-1) if a.shape[-1] else np.zeros(a.shape[:-1], F32)


def _te_s_enc(amax, ops):
    xp = ops.xp
    s = xp.minimum(ops.f32(2688.0, amax) / amax, ops.f32(FLT_MAX, amax))
    s = xp.where((amax == 0) | (s == 0), ops.f32(1.0, amax), s)
    return xp.where(xp.isnan(amax), amax, s)


def global_scale(amax, conv: Convention, bf16: bool, ops=NumpyOps):
    """The global scale g of :class:`GlobalRule` (float32, amax's shape)."""
    xp = ops.xp
    if conv.global_rule is GlobalRule.TE:
        return _te_s_enc(amax, ops)
    if conv.global_rule is GlobalRule.PTS:
        return amax / ops.f32(2688.0, amax)
    # compressed-tensors: 2688.0 / t is torch's reciprocal(t) · 2688 (Tensor.__rtruediv__), in t's dtype
    a = xp.where(amax < ops.f32(TINY, amax), ops.f32(TINY, amax), amax)
    r = ops.f32(1.0, amax) / a
    if bf16:
        r = ops.bf16(r)
    g = r * ops.f32(2688.0, amax)
    if bf16:
        g = ops.bf16(g)
    return xp.where(xp.isfinite(g), g, ops.f32(1.0, amax))


def _block_sdb(vmax, g, conv: Convention, bf16: bool, ops):
    r = conv.block_rule
    if r is BlockRule.TE:
        return ops.xp.minimum(vmax * (g * (ops.f32(1.0, g) / ops.f32(6.0, g))), ops.f32(448.0, g))
    if r is BlockRule.MUL_G:
        d = vmax / ops.f32(6.0, g)
        return g * (ops.bf16(d) if bf16 else d)
    if r is BlockRule.DIV_PTS:
        return (vmax / ops.f32(6.0, g)) / g
    return vmax / (ops.f32(6.0, g) * g)


def _scale_bytes(sdb, conv: Convention, ops):
    """(E4M3 bytes, their float32 values) of the block scales sdb under the convention's clamps."""
    xp = ops.xp
    if conv.zero_sdb is not None:
        sdb = xp.where(sdb == 0, ops.f32(conv.zero_sdb, sdb), sdb)
    if conv.scale_min is not None:
        sdb = xp.where(sdb < ops.f32(conv.scale_min, sdb), ops.f32(conv.scale_min, sdb), sdb)
    sb = ops.encode(sdb, "float8_e4m3fn")
    if conv.zero_scale is not None:
        sb = xp.where(sb == 0, int(np_encode(F32(conv.zero_scale), "float8_e4m3fn")), sb)
    sb = xp.where(xp.isnan(sdb), conv.nan_scale, sb)
    return sb, ops.decode(sb, "float8_e4m3fn")


def _scaled(X3, s, g, conv: Convention, bf16: bool, ops):
    """The scaled elements y [R, nb, BC] of :class:`EncodeRule` (s: [R, nb, 1] scale values)."""
    one = ops.f32(1.0, g)
    r = conv.encode_rule
    if r is EncodeRule.TE_BF16 and not bf16:  # TE's fast-math kernel (the tuned 1D one) takes bfloat16 inputs only
        r = EncodeRule.TE
    if r is EncodeRule.TE:
        enc = ops.xp.minimum(one / (s * (one / g)), ops.f32(FLT_MAX, g))
        return X3 * enc
    if r is EncodeRule.TE_BF16:
        return X3 * ops.bf16(ops.xp.minimum(g / s, ops.f32(BF16_MAX, g)))
    if r is EncodeRule.DIV_S_G:
        return X3 / (s / g)
    if r is EncodeRule.RECIP_PTS_S:
        return X3 * ((one / g) / s)
    return X3 / (s * g)


def quantize_blocks(X3, conv: Convention, bf16: bool, ops=NumpyOps, amax=None):
    """Codes [R, nb, BC] (uint8, one per element), scale bytes [R, nb] and the tensor amax (0-d) of the float32
    blocks X3 (zero-padded to whole blocks) under ``conv``; ``bf16``: the input was bfloat16; ``amax``: a tensor
    amax to use instead of max |X3|."""
    xp = ops.xp
    vmax = ops.amax_last(xp.abs(X3))
    if amax is None:
        amax = ops.amax_last(vmax.reshape(-1))
    else:
        amax = ops.f32(amax, X3)
    g = global_scale(amax, conv, bf16, ops)
    sb, sv = _scale_bytes(_block_sdb(vmax, g, conv, bf16, ops), conv, ops)
    y = _scaled(X3, sv[..., None], g, conv, bf16, ops)
    codes = ops.encode(y, "float4_e2m1fn")
    if not conv.neg_zero:
        codes = xp.where((y == 0) & ops.signbit(y), 0, codes)
    if conv.nan_code != 0x7:
        codes = xp.where(xp.isnan(y), conv.nan_code, codes)
    if conv.inf_nan_code is not None:  # x · inf with x = 0: a finite block scale, an infinite multiplier
        codes = xp.where(xp.isnan(y) & ~xp.isnan(sv[..., None]), conv.inf_nan_code, codes)
    return codes, sb, amax


def stored_value(amax, conv: Convention, bf16: bool, ops=NumpyOps):
    """The FP32 global scale ``conv`` stores for a tensor of this amax (:class:`Stored`)."""
    if conv.stored is Stored.AMAX:
        return amax
    if conv.stored is Stored.DECODE:
        return amax / ops.f32(2688.0, amax)
    return global_scale(amax, conv, bf16, ops)


def decode_blocks(e, s, g, conv: Convention, ops=NumpyOps):
    """Decoded float32 values of element values e [R, nb, BC] and scale values s [R, nb, 1] given the stored
    global scale g (:class:`Stored`: amax, G or pts) under :class:`DecodeRule`."""
    r = conv.decode_rule
    if not conv.decode_neg_zero:
        e = e + ops.f32(0.0, g)  # −0 + 0 = +0: code 0x8 decodes to +0
    if r is DecodeRule.FPSIM:
        out = (e * s) * (ops.f32(1.0, g) / _te_s_enc(g, ops))
    elif r is DecodeRule.TE_CUDA:
        out = e * ((s * g) * ops.f32(F32(1.0) / F32(2688.0), g))
    elif r is DecodeRule.DIV_G:
        out = e * (s / g)
    else:
        out = e * (s * g)
    return ops.bf16(out) if conv.decode_bf16 else out


_DECODE_NEEDS = {DecodeRule.FPSIM: Stored.AMAX, DecodeRule.TE_CUDA: Stored.AMAX, DecodeRule.DIV_G: Stored.ENCODE,
                 DecodeRule.S_PTS: Stored.DECODE}


def decode_input(amax, conv: Convention, bf16: bool, ops=NumpyOps):
    """The global scale :func:`decode_blocks` reads under ``conv``'s decode rule, from the tensor amax."""
    need = _DECODE_NEEDS[conv.decode_rule]
    return stored_value(amax, dataclasses.replace(conv, stored=need), bf16, ops)


def stored_global(q) -> np.ndarray:
    """The FP32 global scale the producer of ``q`` (a :class:`~fpsim.tensor.QuantizedTensor`) stores."""
    conv = get_convention(q.convention)
    with np.errstate(all="ignore"):
        return np.asarray(stored_value(np.asarray(q.amax, F32), conv, q.dtype == "bfloat16"), F32)


def decode(codes, scales, global_scale_value, convention: str | Convention, block: int = 16) -> np.ndarray:
    """Decode stored NVFP4 arrays as ``convention``'s producer does (float32, codes' shape).

    ``codes``: E2M1 codes, one per element [..., n] (unpack packed bytes with :func:`fpsim.packing.unpack_fp4`);
    ``scales``: E4M3 bytes [..., n / block]; ``global_scale_value``: the FP32 global scale the producer stores
    (:class:`Stored`: amax for Transformer Engine, G for compressed-tensors, amax/2688 for torchao and ModelOpt).
    """
    conv = get_convention(convention)
    c = np.asarray(codes)
    s = np.asarray(scales)
    e = np_decode(c.astype(np.uint8), "float4_e2m1fn").reshape(c.shape[:-1] + (-1, block))
    sv = np_decode(s.astype(np.uint8), "float8_e4m3fn")[..., None]
    if conv.decode_rule in (DecodeRule.FPSIM, DecodeRule.TE_CUDA) and conv.stored is not Stored.AMAX:
        raise ValueError(f"{conv.name} decodes from the tensor amax")
    g = F32(global_scale_value)
    with np.errstate(all="ignore"):
        return np.asarray(decode_blocks(e, sv, g, conv), F32).reshape(c.shape)


def check_plan_parts(conv: Convention, scheme) -> None:
    """Raise ValueError unless ``scheme`` is what the producer conventions define: NVFP4 (E2M1 elements, E4M3
    scales, 1×16 blocks, one per-tensor FP32 scale, RNE, no four-over-six)."""
    if conv is FPSIM:
        return
    e2m1, e4m3 = get_format("float4_e2m1fn"), get_format("float8_e4m3fn")
    ok = (scheme.element.traits == e2m1.traits and scheme.scale is not None and scheme.scale.traits == e4m3.traits
          and tuple(scheme.block or ()) == (1, 16) and scheme.tensor_scale and not scheme.per_row_scale
          and not scheme.four_over_six and scheme.rounding.value == "rne")
    if not ok:
        raise ValueError(f"convention {conv.name!r} is defined for NVFP4 (1x16 blocks, per-tensor scale, RNE); "
                         f"{scheme.name} with these options is not what that producer writes")
