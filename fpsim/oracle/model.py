"""A vectorised numpy model of block quantization under a named :class:`Convention` (the oracle's hypotheses).

fpsim's own convention (``Convention()``) reproduces :func:`fpsim.quantize` bit for bit (tested over every
preset, 2-D tiles, per-row scales, NaN policies, MX rules and rounding modes); every other field value is a
convention found in another implementation (torchao, Transformer Engine's Python reference, microxcaling,
hand-written kernels), so that :func:`fpsim.oracle.diff` can test each one against a whole tensor at once.

All arithmetic is float32 with one IEEE rounding per operation, as the kernels do; block maxima are taken on
the float32 bit patterns (NaN propagates because every NaN pattern lies above +inf).  Four-over-six is not
modelled here: :func:`fpsim.oracle.diff` takes those bytes from :func:`fpsim.quantize`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..codecs import encode
from ..schemes import BlockScheme, Kind
from .common import F32, FLT_MAX

__all__ = ["Convention", "TensorView", "ENC_ORDERS", "SCALE_ORDERS", "SCALE_ROUNDINGS", "MX_RULES", "ROUNDINGS",
           "block_scales", "element_codes", "flush_subnormals", "model_bytes", "round_codes", "subnormal_codes",
           "tensor_s_enc"]

_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)

#: Two-level block scale sdb (before the min with the scale format's max), by name: formula.
SCALE_ORDERS: dict[str, str] = {
    "te": "fl(vmax·fl(S_enc·fl(1/6)))",
    "mul_first": "fl(fl(vmax·S_enc)·fl(1/6))",
    "mul_div": "fl(fl(vmax·S_enc)/6)",
    "div_mul": "fl(fl(vmax/6)·S_enc)",
    "inv_mul": "fl(fl(vmax·fl(1/6))·S_enc)",
    "div_sdec": "fl(fl(vmax/6)/S_dec)",
    "div_pts": "fl(fl(vmax/6)/fl(amax/2688))",
}
#: Two-level element scaling, by name: formula of the scaled element y.
ENC_ORDERS: dict[str, str] = {
    "te": "fl(x·min(fl(1/fl(s·S_dec)), FLT_MAX))",
    "te_nocap": "fl(x·fl(1/fl(s·S_dec)))  (1/0 = inf not capped at FLT_MAX)",
    "inv_pts_div_s": "fl(x·fl(fl(1/fl(amax/2688))/s))",
    "senc_div_s": "fl(x·fl(S_enc/s))",
    "div_s_sdec": "fl(x/fl(s·S_dec))",
    "div_pts_s": "fl(x/fl(fl(amax/2688)·s))",
    "x_senc_div_s": "fl(fl(x·S_enc)/s)",
}
#: E8M0 scale rules: the four of :class:`fpsim.ScaleRule` on bits, and two float32-log2 variants.
MX_RULES: dict[str, str] = {
    "floor": "floor(log2 amax) − emax_elem, on bits",
    "ceil": "floor rule + 1 unless amax is a power of two, on bits",
    "even": "floor rule on amax rounded to the element's mantissa width, on bits",
    "rceil": "ceil(log2(fl(amax·fl(1/max_elem)))), on bits (cvt.rp.satfinite.ue8m0)",
    "rceil_log2": "ceil(fl32(log2(fl(amax/max_elem)))): a float32 log2, one too low just above max_elem·2^k",
    "floor_log2": "floor(fl32(log2 amax)) − emax_elem: a float32 log2, one too high just below 2^k",
}
#: Rounding of the two-level block scale sdb to its E4M3 byte, by name: what it is.  fpsim (SPEC §4) uses
#: ``cvt.rn.satfinite.e4m3x2.f32`` (the only rounding PTX offers for f32 → e4m3x2, with ``.rs`` on sm_100a); the
#: others come from software encoders: taking the top mantissa bits of the float32 (truncation), rounding the
#: scale up so that no element saturates (ceil), or ties away from zero (microxcaling-style "nearest").
SCALE_ROUNDINGS: dict[str, str] = {
    "rne": "to nearest, ties to even (cvt.rn)",
    "rtz": "toward zero (truncated mantissa)",
    "rup": "up, to the next E4M3 value (ceil)",
    "rna": "to nearest, ties away from zero",
}
#: Element rounding: fpsim's modes, and two tie rules that no fpsim mode has.
ROUNDINGS: dict[str, str] = {
    "rne": "to nearest, ties to even",
    "rna": "to nearest, ties away from zero",
    "ties_zero": "to nearest, ties toward zero",
    "ties_odd": "to nearest, ties to the odd code",
    "rtz": "toward zero (truncation)",
    "rup": "toward +inf",
    "rdown": "toward −inf",
}


@dataclass(frozen=True)
class Convention:
    """How the bytes are computed; the defaults are fpsim's (SPEC §4–§6, §9).

    ``None`` fields take the scheme's value.  ``amax``: a tensor amax used instead of the measured one
    (two-level schemes with a tensor scale).  ``inf_amax="skip"``: ±inf left out of every amax.
    ``scale_min``: a lower clamp on the two-level sdb before it is encoded (torchao: 2^-6).  ``mx_byte0``:
    what happens in MX blocks whose scale byte is 0 (2^-127, a float32 subnormal): ``"scale"`` (fpsim),
    ``"ftz"`` (the scale flushed to 0: x/0), ``"zero"`` (codes written as 0), ``"clamp126"`` (the exponent
    clamped to −126).  ``mx_inf``: the scale byte of a block holding inf (fpsim 0xFE; ``0xFF`` = NaN).
    ``fp32_scale`` / ``fp32_enc``: FP32-scaled schemes, d = fl(amax/max) or fl(amax·fl(1/max)), and
    y = fl(x/d) or fl(x·fl(1/d)).  ``neg_zero=False``: −0 written as +0 (TE's Python reference).
    ``scale_rounding`` (:data:`SCALE_ROUNDINGS`), ``scale_saturate`` and ``scale_ftz``: how the two-level sdb
    becomes its E4M3 byte — fpsim's ``cvt.rn.satfinite`` after ``min(sdb, 448)``; ``scale_saturate=False``
    drops both the min and ``.satfinite`` (``__NV_NOSAT``: NaN beyond 464, only reachable without a tensor
    scale); ``scale_ftz=True`` writes subnormal scale bytes as 0.  ``element_ftz=True``: element codes in the
    subnormal range (E2M1 ±0.5, E4M3 below 2^-6, …) written as zero of the same sign (a flush-to-zero encoder).
    """

    nan_amax: str = "propagate"
    inf_amax: str = "keep"
    amax: float | None = None
    tensor_scale: bool | None = None
    per_row_scale: bool | None = None
    block: tuple[int, int] | None = None
    scale_order: str = "te"
    scale_min: float | None = None
    enc: str = "te"
    mx_rule: str | None = None
    mx_byte0: str = "scale"
    mx_inf: int = 0xFE
    fp32_scale: str = "div"
    fp32_enc: str = "div"
    rounding: str | None = None
    saturate: bool = True
    neg_zero: bool = True
    scale_rounding: str = "rne"
    scale_saturate: bool = True
    scale_ftz: bool = False
    element_ftz: bool = False

    def changes(self) -> dict:
        """The fields that differ from fpsim's convention."""
        base = Convention()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}

    def merge(self, other: Convention) -> Convention:
        """This convention with ``other``'s changed fields applied too."""
        return dataclasses.replace(self, **other.changes())


class TensorView:
    """The quantized 2-D view of a float32 tensor, padded to whole blocks, with cached block and tensor maxima.

    ``X`` [R, C]; ``P3`` [R, nb, BC] (zero padding); ``valid`` [nb, BC]: the columns inside the tensor.
    """

    def __init__(self, X: np.ndarray, block: tuple[int, int]):
        self.X = X
        self.R, self.C = X.shape
        self.BR, self.BC = block
        self.nb = -(-self.C // self.BC)
        P = np.zeros((self.R, self.nb * self.BC), np.float32)
        P[:, : self.C] = X
        self.P3 = P.reshape(self.R, self.nb, self.BC)
        self.valid = (np.arange(self.nb * self.BC) < self.C).reshape(self.nb, self.BC)
        self._cache: dict = {}

    def abs_bits(self, nan_amax: str, inf_amax: str) -> np.ndarray:
        """|x| as uint32 bits [R, nb, BC], NaN → 0 when ignored (``fmaxf``), inf → 0 when skipped."""
        key = ("bits", nan_amax, inf_amax)
        if key not in self._cache:
            b = self.P3.view(np.uint32) & _ABS
            if nan_amax == "ignore":
                b = np.where(b > _INF, np.uint32(0), b)
            if inf_amax == "skip":
                b = np.where(b == _INF, np.uint32(0), b)
            self._cache[key] = b
        return self._cache[key]

    def vmax_bits(self, nan_amax: str = "propagate", inf_amax: str = "keep", BR: int | None = None) -> np.ndarray:
        """Bits of the block (tile) amax, [R, nb]; a tile's amax is repeated on each of its rows."""
        BR = self.BR if BR is None else BR
        key = ("vmax", nan_amax, inf_amax, BR)
        if key not in self._cache:
            m = self.abs_bits(nan_amax, inf_amax)
            while m.shape[2] > 1 and m.shape[2] % 2 == 0:  # halving: faster than .max over a short axis
                h = m.shape[2] // 2
                m = np.maximum(m[:, :, :h], m[:, :, h:])
            m = m.max(axis=2)
            if BR > 1:
                Rp = BR * -(-self.R // BR)
                t = np.zeros((Rp, self.nb), np.uint32)
                t[: self.R] = m
                m = np.repeat(t.reshape(Rp // BR, BR, self.nb).max(axis=1), BR, axis=0)[: self.R]
            self._cache[key] = m
        return self._cache[key]

    def amax_rows(self, nan_amax: str, inf_amax: str, per_row: bool) -> np.ndarray:
        """The tensor amax (or each row's, ``per_row``) as float32, one value per row [R]."""
        rows = self.vmax_bits(nan_amax, inf_amax, BR=1).max(axis=1, initial=np.uint32(0))
        if not per_row:
            rows = np.full(self.R, rows.max(initial=np.uint32(0)), np.uint32)
        return rows.view(np.float32)


def _rows(conv: Convention) -> int | None:
    """The tile height of ``conv.block`` (same width as the scheme's: 1×16 vs 16×16), or None."""
    return None if conv.block is None else int(conv.block[0])


def tensor_s_enc(am: np.ndarray, num: np.float32) -> np.ndarray:
    """S_enc = min(fl(num/amax), FLT_MAX); 1 if amax == 0 or S_enc == 0; NaN amax → NaN (SPEC §4, §9)."""
    with np.errstate(all="ignore"):
        s = np.minimum(num / am, FLT_MAX).astype(np.float32)
    s = np.where((am == 0) | (s == 0), F32(1.0), s)
    return np.where(np.isnan(am), am, s).astype(np.float32)


def _two_level(view: TensorView, sch: BlockScheme, conv: Convention) -> tuple[np.ndarray, np.ndarray, str]:
    """Scale bytes [R, nb], the per-block element factor and how it applies ("mul" or "div")."""
    el, sc = sch.element, sch.scale
    tensor_scale = sch.tensor_scale if conv.tensor_scale is None else conv.tensor_scale
    per_row = sch.per_row_scale if conv.per_row_scale is None else conv.per_row_scale
    M = F32(el.max)
    num = M * F32(sc.max)
    vmax = view.vmax_bits(conv.nan_amax, conv.inf_amax, _rows(conv)).view(np.float32)
    with np.errstate(all="ignore"):
        if tensor_scale:
            am = (np.full(view.R, F32(conv.amax), np.float32) if conv.amax is not None
                  else view.amax_rows(conv.nan_amax, conv.inf_amax, per_row))[:, None]
            s_enc = tensor_s_enc(am, num)
        else:
            am = np.full((view.R, 1), np.nan, np.float32)  # unused: orders that read amax need a tensor scale
            s_enc = np.ones((view.R, 1), np.float32)
        s_dec = (F32(1.0) / s_enc).astype(np.float32)
        pts = (am / num).astype(np.float32) if tensor_scale else s_dec
        inv = F32(1.0) / M
        o = conv.scale_order
        sdb = {
            "te": lambda: vmax * (s_enc * inv),
            "mul_first": lambda: (vmax * s_enc) * inv,
            "mul_div": lambda: (vmax * s_enc) / M,
            "div_mul": lambda: (vmax / M) * s_enc,
            "inv_mul": lambda: (vmax * inv) * s_enc,
            "div_sdec": lambda: (vmax / M) / s_dec,
            "div_pts": lambda: (vmax / M) / pts,
        }[o]().astype(np.float32)
        if conv.scale_saturate:
            sdb = np.minimum(sdb, F32(sc.max))
        if conv.scale_min is not None:
            sdb = np.where(sdb < F32(conv.scale_min), F32(conv.scale_min), sdb)
        sb = encode(sdb, sc, conv.scale_rounding, conv.scale_saturate)
        if conv.scale_ftz:
            sb = flush_subnormals(sb, sc)
        sv = sc.decode_table()[sb]
        e = conv.enc
        if e in ("te", "te_nocap"):
            f = (F32(1.0) / (sv * s_dec)).astype(np.float32)
            f = np.minimum(f, FLT_MAX) if e == "te" else f
            return sb, f.astype(np.float32), "mul"
        if e == "inv_pts_div_s":
            return sb, ((F32(1.0) / pts) / sv).astype(np.float32), "mul"
        if e == "senc_div_s":
            return sb, (s_enc / sv).astype(np.float32), "mul"
        if e == "div_s_sdec":
            return sb, (sv * s_dec).astype(np.float32), "div"
        if e == "div_pts_s":
            return sb, (pts * sv).astype(np.float32), "div"
        if e == "x_senc_div_s":
            return sb, np.stack(np.broadcast_arrays(s_enc, sv)).astype(np.float32), "mul_div"
    raise ValueError(f"unknown encode order {e!r}")


def _mx_bytes(m: np.ndarray, rule: str, el) -> np.ndarray:
    """E8M0 scale bytes from block amax bits ``m`` under ``rule`` (:data:`MX_RULES`); NaN → 0xFF, inf → 0xFE."""
    with np.errstate(all="ignore"):
        a = m.view(np.float32)
        if rule in ("rceil_log2", "floor_log2"):
            t = (a / F32(el.max)).astype(np.float32) if rule == "rceil_log2" else a
            lg = np.log2(t.astype(np.float64)).astype(np.float32)  # a float32 log2, correctly rounded
            ex = np.ceil(lg) if rule == "rceil_log2" else np.floor(lg) - el.emax
            byte = np.clip(np.nan_to_num(ex, nan=0.0, neginf=-1e9, posinf=1e9) + 127, 0, 254).astype(np.int32)
        elif rule == "rceil":
            t = (a * (F32(1.0) / F32(el.max))).astype(np.float32).view(np.uint32)
            e = (t >> 23).astype(np.int32)
            frac = (t & np.uint32(0x7FFFFF)).astype(np.int32)
            byte = np.where(e > 0, e + (frac != 0), (frac > 0x400000).astype(np.int32))
            byte = np.minimum(byte, 254)
        else:
            e = (m >> 23).astype(np.int32)
            frac = (m & np.uint32(0x7FFFFF)).astype(np.int32)
            if rule == "ceil":
                inc = (frac != 0).astype(np.int32)
            elif rule == "even":
                inc = (frac + ((1 << (22 - el.mbits)) & 0x7FFFFF) >= 0x800000).astype(np.int32)
            else:
                inc = np.zeros_like(e)
            ex = np.clip(e - 127 + inc - el.emax, -127, 127)
            byte = np.where(e > 0, ex + 127, 0)
    byte = np.where(m == _INF, 0xFE, byte)
    return np.where(m > _INF, 0xFF, byte).astype(np.uint8)


def _mx(view: TensorView, sch: BlockScheme, conv: Convention) -> tuple[np.ndarray, np.ndarray, str]:
    el = sch.element
    m = view.vmax_bits(conv.nan_amax, conv.inf_amax, _rows(conv))
    rule = conv.mx_rule or sch.scale_rule.value
    sb = _mx_bytes(m, rule, el)
    if conv.mx_inf != 0xFE:
        sb = np.where(m == _INF, np.uint8(conv.mx_inf), sb)
    if conv.mx_byte0 == "clamp126":
        sb = np.where(sb == 0, np.uint8(1), sb)
    # 2^(127 − b) as float32, exact for every byte ≤ 0xFE (2^-127 is a subnormal); NaN for 0xFF
    p2 = np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32), np.float32(np.nan))
    mul = p2[sb]
    if conv.mx_byte0 == "ftz":  # the decode scale 2^-127 flushed to 0: x / 0
        mul = np.where(sb == 0, F32(np.inf), mul).astype(np.float32)
    return sb, mul, "mul"


def _fp32(view: TensorView, sch: BlockScheme, conv: Convention) -> tuple[np.ndarray, np.ndarray, str]:
    M = F32(sch.element.max)
    a = view.vmax_bits(conv.nan_amax, conv.inf_amax, _rows(conv)).view(np.float32)
    with np.errstate(all="ignore"):
        d = (a / M if conv.fp32_scale == "div" else a * (F32(1.0) / M)).astype(np.float32)
        d = np.where(~np.isnan(d) & ((d == 0) | (d > FLT_MAX)), F32(1.0), d).astype(np.float32)
        if conv.fp32_enc == "div":
            return d, d, "div"
        return d, (F32(1.0) / d).astype(np.float32), "mul"


def block_scales(view: TensorView, sch: BlockScheme, conv: Convention) -> tuple[np.ndarray, np.ndarray, str]:
    """``(scales [R, nb], factor, op)``: the scale bytes (float32 for FP32 scales) and the element factor.

    ``op`` "mul": y = fl(x·factor); "div": y = fl(x/factor); "mul_div": y = fl(fl(x·factor[0])/factor[1]).
    """
    kind = sch.kind
    if kind is Kind.TWO_LEVEL:
        return _two_level(view, sch, conv)
    if kind is Kind.POW2:
        return _mx(view, sch, conv)
    return _fp32(view, sch, conv)


def round_codes(y: np.ndarray, el, rounding: str, saturate: bool) -> np.ndarray:
    """Element codes of scaled values ``y`` under a rounding of :data:`ROUNDINGS`.

    The two tie rules start from RNE: where RNE and RNA differ, y is a tie that RNE rounded toward zero;
    where they agree on an even code that is not RTZ's, y may be a tie that RNE rounded away — checked
    exactly in float32 (|y| − |lo| == |hi| − |y|: both differences are exact by Sterbenz, adjacent grid
    values of a minifloat with subnormals lying within a factor 2 of each other).
    """
    if rounding not in ("ties_zero", "ties_odd"):
        return encode(y, el, rounding, saturate)
    rne, rna, rtz = (encode(y, el, m, saturate) for m in ("rne", "rna", "rtz"))
    toward = rne != rna
    maybe = np.flatnonzero(~toward & (rna != rtz) & ((rne & 1) == 0))
    t = np.abs(el.decode_table())
    a = np.abs(y.reshape(-1)[maybe])
    lo, hi = rtz.reshape(-1)[maybe], rna.reshape(-1)[maybe]
    with np.errstate(all="ignore"):
        away = maybe[a - t[lo] == t[hi] - a]
    out = rne.copy()
    if rounding == "ties_odd":
        out[toward] = rna[toward]
    out.reshape(-1)[away] = rtz.reshape(-1)[away]
    return out


def subnormal_codes(codes: np.ndarray, el) -> np.ndarray:
    """Mask of the codes of format ``el`` in its subnormal range (exponent field 0, mantissa ≠ 0)."""
    mag = codes & el.magnitude_mask
    return (mag != 0) & (mag < (1 << el.mbits))


def flush_subnormals(codes: np.ndarray, el) -> np.ndarray:
    """``codes`` with the subnormal ones replaced by the zero of their sign (a flush-to-zero encoder)."""
    if not el.subnormals or not el.mbits:
        return codes
    return np.where(subnormal_codes(codes, el), codes & el.sign_mask, codes
                    ).astype(codes.dtype, copy=False)


def element_codes(xb: np.ndarray, factor: np.ndarray, op: str, sch: BlockScheme, conv: Convention) -> np.ndarray:
    """Codes of blocks ``xb`` [..., BC] with per-block ``factor`` [...] (see :func:`block_scales`), uint8."""
    el = sch.element
    with np.errstate(all="ignore"):
        if op == "mul":
            y = xb * factor[..., None]
        elif op == "div":
            y = xb / factor[..., None]
        else:
            y = (xb * factor[0][..., None]).astype(np.float32) / factor[1][..., None]
    rounding = conv.rounding or sch.rounding.value
    codes = round_codes(y.astype(np.float32, copy=False), el, rounding, conv.saturate).astype(np.uint8, copy=False)
    if conv.element_ftz:
        codes = flush_subnormals(codes, el)
    if not conv.neg_zero and el.signed:
        codes = np.where(codes == el.sign_mask, np.uint8(0), codes)
    return codes


def model_bytes(view: TensorView, sch: BlockScheme, conv: Convention) -> tuple[np.ndarray, np.ndarray]:
    """All codes [R, nb·BC] (padding 0) and scales [R, nb] of ``view`` under ``conv``."""
    sb, factor, op = block_scales(view, sch, conv)
    codes = element_codes(view.P3, factor, op, sch, conv).reshape(view.R, -1)
    if conv.mx_byte0 == "zero" and sch.kind is Kind.POW2:
        codes = np.where(np.repeat(sb == 0, view.BC, axis=1), np.uint8(0), codes)
    codes[:, ~view.valid.reshape(-1)] = 0
    return codes, sb
