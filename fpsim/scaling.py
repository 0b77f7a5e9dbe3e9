"""The reference quantizer: block-scaled tensors on the CPU (Numba), from a lowered plan (docs/spec.md §4–§6, §9).

:func:`quantize` turns a float tensor into a :class:`~fpsim.tensor.QuantizedTensor` (packed codes + raw
scale bytes + tensor amax), :func:`dequantize` back to float32.  Both run the plan of
:func:`fpsim.plan.lower`; this module is the bit-level reference every other backend is tested against,
and imports no backend (:func:`fpsim.quantize` is the dispatcher above it).

Conventions (NVIDIA's, docs/spec.md):

* NVFP4 quantizes in Transformer Engine's FP32 operation order exactly (§4; the decode order is fpsim's own,
  ``convention="te-cuda"`` decodes as Transformer Engine does, §4.1); block scales are *not* clamped
  from below, so blocks far below the tensor amax get subnormal or zero E4M3 scales (a zero-scale block
  decodes to zeros);
* MX scales come from the block amax's exponent bits under a :class:`~fpsim.schemes.ScaleRule`
  (``rceil`` = ``cvt.rp.satfinite.ue8m0`` by default), elements are ``x · 2^-E`` encoded with
  saturation (§5);
* FP8 with FP32 scales stores ``d = fl(amax / max_elem)`` and encodes ``fl(x / d)`` (§6);
* ``convention=`` selects another producer's NVFP4 arithmetic (:mod:`fpsim.conventions`, §4.1), run by
  :func:`fpsim.conventions.quantize_blocks` over numpy instead of the fused kernels;
* inputs are converted to float32 first (float64/float16/bfloat16 by RNE); blocks run along the last
  axis unless ``axis`` says otherwise; ragged shapes are zero-padded for the computation and restored
  on decode;
* NaN (§9): by default the amax propagates NaN (an NVFP4 tensor with a NaN decodes to NaN everywhere;
  an MX block with a NaN gets scale 0xFF and decodes to NaN); ``nan_amax="ignore"`` skips NaNs in every
  amax like CUDA's ``fmaxf``, and the NaN elements themselves then take the element format's NaN code
  (for E2M1 that is +6, a finite value: the price of ignoring NaN).

The blocks of a 2-D tile mode (16×16, 128×128) store the tile's one scale on each of its rows, so
quantizing ``W.T`` gives exactly the transposed codes and scales of quantizing ``W``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _row_kernels as RK
from . import _scaling_kernels as SK
from . import conventions as CV
from ._arrays import as_float32
from .codecs import Rounding, decode, encode, encode_lut, encode_quotient
from .packing import pack_fp4, unpack_fp4
from .plan import Plan, is_e2m1, lower
from .random import seed_key
from .schemes import BlockScheme, Kind, ScaleRule
from .tensor import QuantizedTensor, moved_2d
from .validate import amax_arg, axis_arg, counter_arg

__all__ = [
    "quantize",
    "dequantize",
    "fake_quantize",
    "swizzle_scales",
    "unswizzle_scales",
    "s_enc_dec",
    "byte_table",
    "row_decoder",
    "RowDecode",
    "POW2_POS",
    "POW2_NEG",
]

F32 = np.float32
_NAN = F32(np.nan)
_NO_TMAX = np.zeros((1, 1), np.uint32)

#: E8M0 byte b → 2**(b − 127) (decode) and 2**(127 − b) (element multiplier), exact float32; NaN for 0xFF.
POW2_POS = np.append(np.ldexp(F32(1), np.arange(255) - 127).astype(F32), _NAN)
POW2_NEG = np.append(np.ldexp(F32(1), 127 - np.arange(255)).astype(F32), _NAN)
POW2_POS.setflags(write=False)
POW2_NEG.setflags(write=False)


def s_enc_dec(plan: Plan, amax_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row S_enc = min(fl(num / amax), FLT_MAX) (1 for amax 0 or S_enc 0) and S_dec = fl(1 / S_enc) (§4).

    Ones where the plan has no second-level scale.
    """
    n = amax_rows.size
    if plan.two_level is None or not plan.two_level.tensor_scale:
        one = np.ones(n, F32)
        return one, one.copy()
    s_enc = np.empty(n, F32)
    s_dec = np.empty(n, F32)
    SK.tensor_scales(np.ascontiguousarray(amax_rows, dtype=F32), plan.two_level.num, s_enc, s_dec)
    return s_enc, s_dec


def byte_table(spec) -> np.ndarray:
    """The element decode table over all 256 byte values: a byte that is no code of a < 8-bit format (a corrupt
    or hand-made ``.data``) decodes to NaN instead of reading past the table."""
    t = spec.decode_table()
    if t.size >= 256:
        return t
    return np.concatenate([t, np.full(256 - t.size, np.nan, F32)])


def _dtype_name(x) -> str:
    return getattr(x, "dtype", np.asarray(x).dtype).name


def _rbits_2d(rbits, x_shape, axis, k) -> np.ndarray:
    r = np.asarray(rbits)
    if r.shape != tuple(x_shape):
        raise ValueError(f"rbits must have the shape of x {tuple(x_shape)}, got {r.shape}")
    if not np.issubdtype(r.dtype, np.integer):
        raise TypeError(f"rbits must be integers, got {r.dtype}")
    if r.size and (int(r.min()) < 0 or int(r.max()) >= (1 << k)):
        raise ValueError(f"rbits must lie in [0, 2**{k})")
    r = np.moveaxis(r, axis, -1)
    return np.ascontiguousarray(r, dtype=np.int64).reshape(-1, r.shape[-1] if r.ndim else 1)


def _as_f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(F32)


def _tensor_amax(row_bits: np.ndarray) -> np.ndarray:
    return _as_f32(np.uint32(row_bits.max()) if row_bits.size else np.uint32(0))


def _block_amax(X: np.ndarray, plan: Plan, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile amax bits (ceil(R / BR), nb) and the amax bits of each tile row (a row when BR = 1): one read of X."""
    assert plan.block is not None
    BR, BC = plan.block
    tmax = np.empty((-(-X.shape[0] // BR), nb), np.uint32)
    row_bits = np.empty(tmax.shape[0], np.uint32)
    RK.block_absmax_bits(X, BR, BC, plan.ignore_nan, tmax, row_bits)
    return tmax, row_bits


class _Call:
    """One quantize call's arrays and stochastic-rounding stream, shared by the per-kind passes."""

    def __init__(self, plan: Plan, X: np.ndarray, seed, rbits, counter: int, shape, axis: int):
        self.plan, self.X = plan, X
        R, C = X.shape
        self.nb = plan.blocks_per_row(C)
        assert plan.block is not None  # block-scaled plans only (per-tensor and cast plans take other paths)
        BC = plan.block[1]
        el = plan.element
        self.lut = encode_lut(el, plan.encode_mode.kernel_id, True)
        self.shift = 21 - el.mbits
        sr = plan.sr
        k0, k1 = seed_key(seed) if seed is not None else (0, 0)
        width, per_call = (sr.width, sr.per_call) if sr is not None else (8, 16)
        self.kbits = sr.k if sr is not None else el.sr_bits
        self.seq = tuple(np.int64(v) for v in (k0, k1, counter, width, per_call, -(-BC // per_call), self.nb))
        self.use_rb = rbits is not None
        self.rb = _rbits_2d(rbits, shape, axis, self.kbits) if self.use_rb else np.zeros((1, 1), np.int64)
        self.out = np.empty((R, self.nb * BC // 2 if plan.packed else self.nb * BC), np.uint8)


def _quantize_two_level(c: _Call, tensor_amax) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4-style scales and codes (§4); returns (scales, amax)."""
    plan, X = c.plan, c.X
    tl, sc, el = plan.two_level, plan.scale, plan.element
    assert tl is not None and sc is not None and plan.block is not None
    R = X.shape[0]
    BR, BC = plan.block
    scales = np.empty((R, c.nb), np.uint8)
    fast = not plan.is_sr and tl.four_over_six == 0
    # The fast kernel takes its block amax from a tile-amax pass when one is needed anyway (2-D tiles, or a
    # tensor amax to measure): that pass also gives the tensor amax, so the input is read twice in all.
    tmax = tile_rows = None
    if fast and (BR > 1 or (tl.tensor_scale and tensor_amax is None)):
        tmax, tile_rows = _block_amax(X, plan, c.nb)
    if not tl.tensor_scale:
        amax = np.array(_NAN)
        amax_rows = np.ones(R, F32)
    elif tl.per_row:
        if tile_rows is not None and BR == 1:
            row_bits = tile_rows
        else:
            row_bits = np.empty(R, np.uint32)
            SK.row_absmax_bits(X, plan.ignore_nan, row_bits)
        amax = _as_f32(row_bits).copy()
        amax_rows = amax
    else:
        if tensor_amax is not None:
            amax = np.array(F32(tensor_amax))
        elif tile_rows is not None:
            amax = _tensor_amax(tile_rows)
        else:
            row_bits = np.empty(R, np.uint32)
            SK.row_absmax_bits(X, plan.ignore_nan, row_bits)
            amax = _tensor_amax(row_bits)
        amax_rows = np.broadcast_to(amax, (R,))
    s_enc, s_dec = s_enc_dec(plan, amax_rows)
    slut = encode_lut(sc, Rounding.RNE.kernel_id, True)
    if fast:
        RK.quantize_two_level_rne(
            X, BR, BC, s_enc, s_dec, tl.inv_t, tl.bound, slut, 21 - sc.mbits, sc.decode_table(), c.lut, c.shift,
            plan.ignore_nan, plan.packed, _NO_TMAX if tmax is None else tmax, tmax is not None, c.out, scales,
            int(plan.elem_path), plan.elem_arith, tuple(tl.scale_arith),
        )
    else:
        SK.quantize_two_level(
            X, BR, BC, s_enc, s_dec, tl.inv_t, tl.inv_t46, tl.bound, sc.traits, sc.decode_table(), el.traits,
            el.decode_table(), c.lut, c.shift, plan.is_sr, c.kbits, c.seq, c.rb, c.use_rb, int(tl.four_over_six),
            plan.ignore_nan, plan.packed, c.out, scales,
        )
    return scales, amax


def _quantize_pow2(c: _Call) -> np.ndarray:
    """MX scales and codes (§5); returns the scale bytes."""
    plan, X = c.plan, c.X
    p2, el, sc = plan.pow2, plan.element, plan.scale
    assert p2 is not None and sc is not None and plan.block is not None
    BR, BC = plan.block
    scales = np.empty((X.shape[0], c.nb), np.uint8)
    if not plan.is_sr:
        tmax = (_block_amax(X, plan, c.nb)[0], True) if BR > 1 else (_NO_TMAX, False)
        RK.quantize_mx_rne(
            X, BR, BC, p2.rule_id, p2.emax, p2.mbits, p2.inv_max, c.lut, c.shift, el.nan_code, plan.ignore_nan,
            plan.packed, *tmax, POW2_NEG, c.out, scales, int(plan.elem_path), plan.elem_arith,
        )
    else:
        SK.quantize_mx(
            X, BR, BC, p2.rule_id, p2.emax, p2.mbits, p2.inv_max, sc.traits, el.traits, c.lut, c.shift,
            el.nan_code, True, c.kbits, c.seq, c.rb, c.use_rb, plan.ignore_nan, plan.packed, c.out, scales,
        )
    return scales


def _quantize_fp32(c: _Call) -> np.ndarray:
    """Blockwise FP8 with FP32 scales (§6); returns the scales."""
    plan, X = c.plan, c.X
    assert plan.block is not None
    BR, BC = plan.block
    scales = np.empty((X.shape[0], c.nb), F32)
    SK.quantize_fp32_scaled(X, BR, BC, F32(plan.element.max), plan.element.traits, c.lut, c.shift, plan.is_sr,
                            c.kbits, c.seq, c.rb, c.use_rb, plan.ignore_nan, plan.packed, c.out, scales)
    return scales


def quantize(
    x: np.typing.ArrayLike,
    scheme: str | BlockScheme | Plan = "nvfp4",
    axis: int = -1,
    block: tuple[int, int] | None = None,
    rounding: str | Rounding | None = None,
    scale_rule: str | ScaleRule | None = None,
    seed: int | None = None,
    rbits: np.typing.ArrayLike | None = None,
    k: int | None = None,
    counter: int = 0,
    nan_amax: str = "propagate",
    tensor_amax: float | None = None,
    convention: str | CV.Convention | None = None,
) -> QuantizedTensor:
    """Quantize a tensor with a block-scaled scheme on the CPU reference (docs/spec.md §4–§6).

    Parameters
    ----------
    x
        Values; converted to float32 first (RNE).
    scheme
        A preset name (:data:`fpsim.schemes.SCHEMES`), a :class:`~fpsim.schemes.BlockScheme`, or a
        :class:`~fpsim.plan.Plan` (then ``block``/``rounding``/``scale_rule``/``k``/``nan_amax`` must be unset).
    axis
        The axis the blocks run along (default: last).  The "columnwise" copy of a GEMM operand is
        ``axis=0`` of a 2-D tensor.
    block, rounding, scale_rule, k
        Override the scheme's block shape, element rounding, E8M0 scale rule, SR bits.
    seed, rbits, counter
        Stochastic rounding only (exactly one of seed/rbits): Philox4x32-10 keyed by ``seed``, counter =
        ``counter`` + block index × calls per block, where block index = row × blocks per row of the
        quantized 2-D view; one call is 16 bytes = one NVFP4 block of 8-bit values.  ``rbits``: integers
        of the shape of ``x``.  Per-tensor FP8 and casts use :func:`fpsim.encode`'s flat stream.
    nan_amax
        ``"propagate"`` (default) or ``"ignore"`` NaNs in every amax (§9).
    tensor_amax
        Use this FP32 tensor amax instead of measuring it (schemes with a per-tensor second level or
        per-tensor FP8 scale): quantizing a large tensor chunk by chunk with its global amax gives the
        bits of quantizing it whole.
    convention
        A producer's arithmetic (:mod:`fpsim.conventions`, NVFP4 only): the bytes that library writes; the
        result remembers it, so ``q.dequantize()`` decodes in that producer's order.

    Examples
    --------
    >>> q = quantize(np.arange(16, dtype=np.float32), "nvfp4")
    >>> q.scales, float(q.amax), q.dequantize()[[1, 15]]
    (array([126], dtype=uint8), 15.0, array([ 1.25, 15.  ], dtype=float32))
    """
    plan = lower(scheme, block=block, rounding=rounding, scale_rule=scale_rule, k=k, nan_amax=nan_amax,
                 convention=convention)
    if isinstance(scheme, Plan) and (block, rounding, scale_rule, k) != (None,) * 4:
        raise ValueError("a Plan carries its options: pass block/rounding/scale_rule/k to lower() instead")
    sch = plan.scheme
    if plan.is_sr and (seed is None) == (rbits is None):
        raise ValueError("rounding='sr' needs exactly one of seed= or rbits=")
    if not plan.is_sr and (seed is not None or rbits is not None):
        raise ValueError("seed/rbits apply only to rounding='sr'")
    dtype = _dtype_name(x)
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("quantize needs at least one axis")
    shape = tuple(x32.shape)
    ax = axis_arg(axis, x32.ndim)
    counter = counter_arg(counter)
    tensor_amax = amax_arg(tensor_amax)
    sr_kw: dict[str, Any] = ({"seed": seed, "rbits": rbits, "k": plan.sr.k, "counter": counter}
                             if plan.sr is not None and plan.is_sr else {})
    if plan.kind is Kind.CAST:
        codes = encode(x32, plan.element, plan.rounding, **sr_kw)
        return QuantizedTensor(codes, np.zeros(0, np.uint8), np.array(_NAN), sch, shape, dtype, ax)
    per_tensor = plan.block is None or (plan.two_level is not None and plan.two_level.tensor_scale
                                        and not plan.two_level.per_row)
    if tensor_amax is not None and not per_tensor:
        raise ValueError(f"tensor_amax applies to schemes with a per-tensor scale, not {sch.name}")
    moved, R, C = moved_2d(shape, ax)
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(R, C).view(np.uint32)
    if plan.block is None:  # per-tensor FP32 scale (FP8 current scaling)
        if tensor_amax is not None:
            amax = np.array(F32(tensor_amax))
        else:
            row_bits = np.empty(R, np.uint32)
            SK.row_absmax_bits(X, plan.ignore_nan, row_bits)
            amax = _tensor_amax(row_bits)
        d = SK.fp32_block_scale(F32(amax), F32(plan.element.max))
        codes = encode_quotient(x32, F32(d), plan.element, plan.rounding, **sr_kw)
        return QuantizedTensor(codes, np.array(d, F32), np.array(amax), sch, shape, dtype, ax)
    conv = plan.convention
    if not CV.is_native(conv):
        return _quantize_convention(plan, X, moved, shape, dtype, ax, tensor_amax)
    BR = plan.block[0]
    if BR > 1 and len(moved) != 2:
        raise ValueError(f"2-D blocks {plan.block} need a 2-D tensor, got shape {shape}")
    c = _Call(plan, X, seed, rbits, counter, shape, ax)
    if plan.sr is not None and plan.is_sr:
        counter_arg(counter, span=R * c.nb * plan.sr.calls_per_block)
    amax = np.array(_NAN)
    if plan.kind is Kind.TWO_LEVEL:
        scales, amax = _quantize_two_level(c, tensor_amax)
        amax = amax.reshape(moved[:-1]) if plan.two_level is not None and plan.two_level.per_row else np.array(amax)
    elif plan.kind is Kind.POW2:
        scales = _quantize_pow2(c)
    else:
        scales = _quantize_fp32(c)
    data = c.out.reshape(moved[:-1] + (c.out.shape[1],))
    return QuantizedTensor(data, scales.reshape(moved[:-1] + (c.nb,)), amax, sch, shape, dtype, ax, conv.name)


def blocks_3d(X: np.ndarray, bc: int) -> np.ndarray:
    """float32 [R, nb, bc] of the float32 rows X [R, C] (or their bits), zero-padded to whole blocks."""
    R, C = X.shape
    nb = -(-C // bc)
    P = np.zeros((R, nb * bc), F32)
    P[:, :C] = X.view(F32)
    return P.reshape(R, nb, bc)


def _quantize_convention(plan: Plan, X, moved, shape, dtype: str, ax: int, tensor_amax) -> QuantizedTensor:
    """A producer convention's NVFP4 bytes (:mod:`fpsim.conventions`) from the float32 bits X [R, C]."""
    assert plan.block is not None
    bc = plan.block[1]
    am = None if tensor_amax is None else F32(tensor_amax)
    with np.errstate(all="ignore"):
        codes, scales, amax = CV.quantize_blocks(blocks_3d(X, bc), plan.convention, dtype == "bfloat16", amax=am)
    R, nb = scales.shape
    data = pack_fp4(np.asarray(codes, np.uint8).reshape(R, nb * bc))
    return QuantizedTensor(data.reshape(moved[:-1] + (data.shape[1],)), np.asarray(scales, np.uint8).reshape(
        moved[:-1] + (nb,)), np.array(amax, F32), plan.scheme, shape, dtype, ax, plan.convention.name)


def dequantize_convention(qt: QuantizedTensor, conv: CV.Convention) -> np.ndarray:
    """Decode an NVFP4 :class:`~fpsim.tensor.QuantizedTensor` as the producer of ``conv`` does (float32, [R, C])."""
    CV.check_plan_parts(conv, qt.scheme)
    moved, R, C = moved_2d(tuple(qt.shape), qt.axis)
    assert qt.scheme.block is not None  # NVFP4
    bc = qt.scheme.block[1]
    codes = np.ascontiguousarray(qt.data).reshape(R, -1) if R else np.zeros((0, 0), np.uint8)
    e = decode(unpack_fp4(codes), "float4_e2m1fn").reshape(R, -1, bc)
    s = decode(np.ascontiguousarray(qt.scales).reshape(R, -1), "float8_e4m3fn")[..., None]
    with np.errstate(all="ignore"):
        g = CV.decode_input(np.asarray(qt.amax, F32), conv, qt.dtype == "bfloat16")
        out = np.asarray(CV.decode_blocks(e, s, g, conv), F32).reshape(R, -1)[:, :C]
    return np.moveaxis(np.ascontiguousarray(out).reshape(moved), -1, qt.axis)


def into(out: np.ndarray | None, res: np.ndarray) -> np.ndarray:
    if out is None:
        return res
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == res.shape and out.flags.writeable):
        raise ValueError(f"out must be a writeable float32 array of shape {res.shape}")
    out[...] = res
    return out


def dequantize(qt: QuantizedTensor, out: np.ndarray | None = None, convention: str | None = None) -> np.ndarray:
    """Decode a :class:`~fpsim.tensor.QuantizedTensor` to float32 in its original shape (CPU reference).

    NVFP4: ``fl((e2m1 · f32(s_b)) · S_dec)`` with S_dec recomputed from the stored amax; MX:
    ``fl(e · 2^(b−127))``, scale byte 0xFF → NaN; FP32 scales: ``fl(e · d)``.
    ``out``: a C-contiguous, writeable float32 array of the original shape to decode into (block schemes
    quantized along the last axis): reusing it saves the allocation and the page faults of a fresh output,
    which cost about as much as the decoding itself on large tensors.
    ``convention``: decode as that producer does (:mod:`fpsim.conventions`; default the tensor's own).
    """
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"dequantize needs a QuantizedTensor (from fpsim.quantize), got {type(qt).__name__}")
    conv = CV.get_convention(qt.convention if convention is None else convention)
    if not CV.decodes_native(conv):
        return into(out, dequantize_convention(qt, conv))
    sch = qt.scheme
    plan = lower(sch)
    el = plan.element
    if plan.kind is Kind.CAST:
        return into(out, decode(qt.data, el).reshape(qt.shape))
    if plan.block is None:
        with np.errstate(all="ignore"):
            v = decode(qt.data, el)  # a fresh float32 array: scaled in place, fl(e · d) as the product would be
            np.multiply(v, F32(qt.scales), out=v)
            return into(out, v.reshape(qt.shape))
    moved, R, C = moved_2d(tuple(qt.shape), qt.axis)
    BC = plan.block[1]
    # explicit widths, not -1: a tensor with no rows (R = 0) has no size to infer them from
    codes = np.ascontiguousarray(qt.data).reshape(R, qt.data.shape[-1])
    scales = np.ascontiguousarray(qt.scales).reshape(R, qt.scales.shape[-1])
    user_out = out
    if out is None:
        out = np.empty((R, C), F32)
    else:
        if qt.axis != len(qt.shape) - 1:
            raise ValueError("out= needs a tensor quantized along its last axis")
        if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == tuple(qt.shape)
                and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"out must be a C-contiguous writeable float32 array of shape {tuple(qt.shape)}")
        out = out.reshape(R, C)
    if plan.kind in (Kind.TWO_LEVEL, Kind.POW2):
        d = _block_rows(qt, plan, codes, scales, R)
        RK.dequantize_blocks_fast(d.codes, d.scales, d.BC, d.svtable, d.s_dec, d.two, d.etable, d.packed, out,
                                  d.e2m1)
    else:
        SK.dequantize_fp32_scaled(codes, scales, BC, _element_table(plan), plan.packed, out)
    if user_out is not None:
        return user_out
    return np.moveaxis(out.reshape(moved), -1, qt.axis)


class RowDecode(NamedTuple):
    """What :func:`fpsim._row_kernels.decode_row_into` decodes a quantized tensor with, row r of its 2-D view at a
    time: x̂ = fl(fl(e(code) · svtable[scales[r, c // BC]]) · s_dec[r])."""

    codes: np.ndarray  #: (R, code bytes per row)
    scales: np.ndarray  #: (R, blocks per row) scale bytes
    BC: int  #: block width
    svtable: np.ndarray  #: float32 value of each scale byte
    s_dec: np.ndarray  #: (R,) float32 second-level decode scale (1 where there is none)
    two: bool  #: a second level is applied
    etable: np.ndarray  #: element decode table (all 256 byte values for one-byte codes)
    packed: bool  #: two codes per byte
    e2m1: bool  #: E2M1 elements (decoded from their bits)


def _element_table(plan: Plan) -> np.ndarray:
    """The element decode table the block decoders index: the format's own for packed codes, all 256 byte values
    (:func:`byte_table`) for one code per byte."""
    return plan.element.decode_table() if plan.packed else byte_table(plan.element)


def _block_rows(qt: QuantizedTensor, plan: Plan, codes: np.ndarray, scales: np.ndarray, R: int) -> RowDecode:
    """The :class:`RowDecode` of a two-level or MX tensor (``codes``, ``scales``: its 2-D views)."""
    assert plan.block is not None
    el = plan.element
    etable = _element_table(plan)
    if plan.kind is Kind.TWO_LEVEL:
        assert plan.two_level is not None and plan.scale is not None
        amax = np.asarray(qt.amax, F32)
        amax_rows = amax.reshape(R) if plan.two_level.per_row else np.broadcast_to(amax.reshape(()), (R,))
        _, s_dec = s_enc_dec(plan, amax_rows)
        return RowDecode(codes, scales, plan.block[1], plan.scale.decode_table(), s_dec, True, etable, plan.packed,
                         is_e2m1(el))
    return RowDecode(codes, scales, plan.block[1], POW2_POS, np.ones(R, F32), False, etable, plan.packed,
                     is_e2m1(el))


def row_decoder(qt: QuantizedTensor) -> RowDecode | None:
    """The :class:`RowDecode` of ``qt`` (rows of its 2-D view along its quantized axis) that gives
    :func:`dequantize`'s bits: two-level and MX block scales, and a per-tensor FP32 scale d over one-byte codes
    quantized along the last axis (one
    block of the whole row, svtable = [d], s_dec = 1: fl(fl(e · d) · 1) = fl(e · d), the product
    :func:`dequantize` takes); None for the others (casts, FP32 block scales, 16-bit codes, a producer's decode)."""
    conv = CV.get_convention(qt.convention)
    if not CV.decodes_native(conv):
        return None
    plan = lower(qt.scheme)
    _, R, C = moved_2d(tuple(qt.shape), qt.axis)
    if plan.kind in (Kind.TWO_LEVEL, Kind.POW2):
        codes = np.ascontiguousarray(qt.data).reshape(R, qt.data.shape[-1])
        return _block_rows(qt, plan, codes, np.ascontiguousarray(qt.scales).reshape(R, qt.scales.shape[-1]), R)
    if (plan.kind is Kind.CAST or plan.block is not None or qt.data.dtype != np.uint8 or plan.packed
            or qt.axis != len(qt.shape) - 1):  # per-tensor codes keep the input's layout: rows of its last axis
        return None
    one = np.ones(R, F32)
    return RowDecode(np.ascontiguousarray(qt.data).reshape(R, C), np.zeros((R, 1), np.uint8), max(C, 1),
                     np.asarray(qt.scales, F32).reshape(1), one, False, byte_table(plan.element), False, False)


def fake_quantize(x: np.typing.ArrayLike, scheme: str | BlockScheme | Plan = "nvfp4", **kwargs) -> np.ndarray:
    """``dequantize(quantize(x, scheme, **kwargs))``: the float32 values the scheme can represent."""
    return dequantize(quantize(x, scheme, **kwargs))


# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# Blackwell scale layout (SPEC §4)


def _swizzle_offsets(R: int, C: int) -> tuple[np.ndarray, int, int]:
    Rp = 128 * -(-R // 128)
    C4 = -(-C // 4)
    r = np.arange(Rp, dtype=np.int64)[:, None]
    c = np.arange(4 * C4, dtype=np.int64)[None, :]
    off = ((r // 128) * C4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)
    return off, Rp, 4 * C4


def swizzle_scales(scales: np.ndarray) -> np.ndarray:
    """[R, C] scale bytes → the 1-D Blackwell tensor-core layout (SPEC §4).

    The matrix is zero-padded to [128·⌈R/128⌉, 4·⌈C/4⌉]; byte (r, c) goes to
    ((r//128)·⌈C/4⌉ + c//4)·512 + (r%32)·16 + ((r%128)//32)·4 + (c%4).

    >>> swizzle_scales(np.arange(8, dtype=np.uint8).reshape(2, 4))[[0, 3, 16, 19]]
    array([0, 3, 4, 7], dtype=uint8)
    """
    s = np.asarray(scales)
    if s.ndim != 2:
        raise ValueError(f"swizzle_scales needs a 2-D [rows, blocks] matrix, got shape {s.shape}")
    R, C = s.shape
    off, Rp, Cp = _swizzle_offsets(R, C)
    pad = np.zeros((Rp, Cp), s.dtype)
    pad[:R, :C] = s
    out = np.empty(Rp * Cp, s.dtype)
    out[off.reshape(-1)] = pad.reshape(-1)
    return out


def unswizzle_scales(buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of :func:`swizzle_scales`: the [rows, cols] matrix back from the swizzled bytes."""
    b = np.asarray(buf).reshape(-1)
    off, Rp, Cp = _swizzle_offsets(int(rows), int(cols))
    if b.size != Rp * Cp:
        raise ValueError(f"expected {Rp * Cp} swizzled bytes for [{rows}, {cols}], got {b.size}")
    return b[off][:rows, :cols].copy()

