"""The hypotheses :func:`fpsim.oracle.diff` tests: other conventions, each run over the whole tensor at once.

A hypothesis is a :class:`~fpsim.oracle.model.Convention` that differs from the reference in one field (or
a named combination, or a pair of partial explanations); :class:`Evaluator` computes its bytes with the
vectorised model — only in the blocks where its scales or element factors differ from the reference's, or
everywhere for element-rule hypotheses — and counts how many of the candidate's mismatching bytes it
reproduces (``explains``) and how many matching bytes it would change (``breaks``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..dispatch import quantize
from ..packing import unpack_fp4
from ..schemes import BlockScheme, Kind
from .model import (
    ENC_ORDERS,
    MX_RULES,
    ROUNDINGS,
    SCALE_ORDERS,
    SCALE_ROUNDINGS,
    Convention,
    TensorView,
    block_scales,
    element_codes,
    flush_subnormals,
    model_bytes,
    round_codes,
    subnormal_codes,
    tensor_s_enc,
)

__all__ = ["MIN_SHARE", "SAMPLE_BLOCKS", "Evaluator", "Hypothesis", "Outcome", "generate", "infer_amax", "pairs",
           "rank", "refine_amax"]


@dataclass(frozen=True)
class Hypothesis:
    """One alternative convention: ``name`` (what the candidate does), its :data:`CAUSES` key, and how to compute it.

    ``conv``: fields changed against the reference (model-backed); ``scheme``: a scheme run through
    :func:`fpsim.quantize` instead (four-over-six); ``own_scales``: elements from the candidate's own scales.
    ``complexity``: how many conventions it changes (simpler explanations rank first).
    """

    name: str
    cause: str
    conv: Convention | None = None
    scheme: BlockScheme | None = None
    own_scales: bool = False
    complexity: int = 1
    parts: tuple = ()
    amax_range: tuple[float, float] | None = None


@dataclass
class Outcome:
    """Counts of one hypothesis over the whole tensor; ``hit_codes`` / ``hit_scales``: which mismatches it explains.

    ``wrong_codes`` / ``wrong_scales``: mismatching bytes it changes to a third value (neither fpsim's nor the
    candidate's): bytes it claims to model and gets wrong.  A true bug has none; a hypothesis that explains a few
    bytes of a region of garbage by chance has many (:meth:`credible`).
    """

    hyp: Hypothesis
    order: int
    explains_codes: int = 0
    explains_scales: int = 0
    explains_amax: int = 0
    breaks: int = 0
    wrong_codes: int = 0
    wrong_scales: int = 0
    hit_codes: np.ndarray | None = field(default=None, repr=False)
    hit_scales: np.ndarray | None = field(default=None, repr=False)

    @property
    def explains(self) -> int:
        return self.explains_codes + self.explains_scales + self.explains_amax

    @property
    def wrong(self) -> int:
        return self.wrong_codes + self.wrong_scales

    def credible(self, n_bad: int, what: str) -> bool:
        """Whether this partial explanation may name the cause of the mismatching ``what`` ("codes" or "scales")
        it reproduces: it explains at least :data:`MIN_SHARE` of all mismatches, and more of those bytes than it
        gets wrong (a chance match in a region of garbage gets ~15 of 16 codes wrong)."""
        hit, wrong = ((self.explains_codes, self.wrong_codes) if what == "codes"
                      else (self.explains_scales, self.wrong_scales))
        return self.explains >= MIN_SHARE * n_bad and hit > wrong

    def to_dict(self, n_bad: int) -> dict:
        return {"name": self.hyp.name, "cause": self.hyp.cause, "explains": self.explains,
                "explains_codes": self.explains_codes, "explains_scales": self.explains_scales,
                "breaks": self.breaks, "wrong": self.wrong,
                "explains_every_byte": self.explains == n_bad and self.breaks == 0,
                "complexity": self.hyp.complexity}


#: A hypothesis is first tried on an even sample of at most this many of the blocks holding mismatches; one
#: that explains no byte there is not evaluated further (exact below this many mismatching blocks).
SAMPLE_BLOCKS = 1 << 16
#: The smallest share of all mismatching bytes a partial explanation (one that does not explain every byte) must
#: explain to be named a likely cause: a handful of bytes out of thousands is a coincidence of the data.
MIN_SHARE = 0.01
#: Index meaning "every block" (a slice: numpy returns views, not copies).
ALL = slice(None)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equality of scale bytes, or of float32 scales by their bits (NaN equals NaN)."""
    if a.dtype == np.float32:
        return a.view(np.uint32) == b.view(np.uint32)
    return a == b


class Evaluator:
    """Evaluates hypotheses against one candidate: reference bytes, candidate bytes, the mismatches."""

    def __init__(self, view: TensorView, sch: BlockScheme, ref: Convention, ours_p: np.ndarray, ours_s: np.ndarray,
                 cand_p: np.ndarray, cand_s: np.ndarray, amax_ours, amax_cand):
        self.view, self.sch, self.ref = view, sch, ref
        self.ours_p, self.ours_s, self.cand_p, self.cand_s = ours_p, ours_s, cand_p, cand_s
        self.bad_c = ours_p != cand_p  # padding holds equal zeros on both sides
        self.bad_s = ~_same(ours_s, cand_s)
        self.amax_ours, self.amax_cand = amax_ours, amax_cand
        self.bad_a = amax_cand is not None and not _amax_equal(amax_ours, amax_cand)
        self.n_bad = int(self.bad_c.sum()) + int(self.bad_s.sum()) + int(self.bad_a)
        self.valid = np.broadcast_to(view.valid.reshape(-1), ours_p.shape)
        self.all_valid = bool(view.valid.all())
        if sch.four_over_six:
            self.ref_factor, self.ref_op = factor_of_scales(sch, ref, view, ours_s), "mul"
        else:
            _, self.ref_factor, self.ref_op = block_scales(view, sch, ref)
        self._y = None
        self._hot = self._cold = None

    def y_ref(self) -> np.ndarray:
        """The scaled elements under the reference factors, flat blocks [R·nb, BC] (computed once)."""
        if self._y is None:
            f = self.ref_factor
            with np.errstate(all="ignore"):
                if self.ref_op == "mul":
                    y = self.view.P3 * f[..., None]
                elif self.ref_op == "div":
                    y = self.view.P3 / f[..., None]
                else:
                    y = (self.view.P3 * f[0][..., None]).astype(np.float32) / f[1][..., None]
            self._y = y.astype(np.float32, copy=False).reshape(-1, self.view.BC)
        return self._y

    @property
    def hot(self) -> np.ndarray:
        """Flat indices of the blocks holding a mismatching code or scale; ``cold``: the others."""
        if self._hot is None:
            BC = self.view.BC
            blk = self.bad_s.reshape(-1) | self.bad_c.reshape(-1, BC).any(axis=1)
            self._hot, self._cold = np.flatnonzero(blk), np.flatnonzero(~blk)
        return self._hot

    def _count(self, blocks, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit, differ) masks [n, BC] of codes of flat ``blocks`` (indices, or ``ALL``) against the candidate's
        (padding excluded)."""
        BC = self.view.BC
        diff = codes != self.cand_p.reshape(-1, BC)[blocks]
        if not self.all_valid:
            cols = np.arange(self.view.R * self.view.nb)[blocks] % self.view.nb
            diff &= self.view.valid[cols]
        return self.bad_c.reshape(-1, BC)[blocks] & ~diff, diff

    def _run(self, o: Outcome, scales, amax, changed, codes_of) -> Outcome:
        """Score a hypothesis in two passes: the blocks holding mismatches (what it explains), then — only
        if it explains something — the other blocks it changes (what it breaks).  ``changed``: flat mask of
        the blocks whose codes can differ from fpsim's (None: any); ``codes_of(blocks)`` → codes [n, BC]."""
        if scales is not None:
            eq = _same(scales, self.cand_s)
            hs = self.bad_s & eq
            o.explains_scales = int(np.count_nonzero(hs))
            o.breaks += int(np.count_nonzero(~eq & ~self.bad_s))
            o.wrong_scales = int(np.count_nonzero(~eq & self.bad_s & ~_same(scales, self.ours_s)))
            o.hit_scales = hs if o.explains_scales else None
        if self.amax_cand is not None:
            same = _amax_equal(amax, self.amax_cand)
            o.explains_amax = int(self.bad_a and same)
            o.breaks += int(not self.bad_a and not same)
        hot = self.hot
        if changed is not None:
            hot = hot[changed[hot]]
        if hot.size > SAMPLE_BLOCKS and not o.explains:  # screen on an even sample of the mismatching blocks
            sample = hot[:: -(-hot.size // SAMPLE_BLOCKS)]
            if not self._count(sample, codes_of(sample))[0].any():
                return o
        if hot.size == self.view.R * self.view.nb:
            hot = ALL  # every block: views instead of gathered copies
        codes = codes_of(hot)
        hit, diff = self._count(hot, codes)
        o.explains_codes = int(np.count_nonzero(hit))
        if not o.explains:
            return o  # explains nothing: not ranked, so what it would break is not needed
        bad = self.bad_c.reshape(-1, self.view.BC)[hot]
        o.breaks += int(np.count_nonzero(diff & ~bad))
        o.wrong_codes = int(np.count_nonzero(diff & bad & (codes != self.ours_p.reshape(-1, self.view.BC)[hot])))
        del codes
        cold = self._cold if changed is None else self._cold[changed[self._cold]]
        for i in range(0, cold.size, 1 << 16):  # in chunks: bounded memory on large tensors
            part = cold[i: i + (1 << 16)]
            o.breaks += int(np.count_nonzero(self._count(part, codes_of(part))[1]))
        if o.explains_codes:
            full = np.zeros((self.view.R * self.view.nb, self.view.BC), bool)
            full[hot] = hit
            o.hit_codes = np.packbits(full.reshape(self.bad_c.shape)[self.bad_c])
        return o

    def _quantized(self, scheme: BlockScheme, rows=None):
        """Codes [n, nb·BC] and scales [n, nb] of fpsim.quantize under ``scheme`` (optionally some rows only,
        with the whole tensor's amax)."""
        view = self.view
        X = view.X if rows is None else view.X[rows]
        kw = {}
        if rows is not None and scheme.tensor_scale and not scheme.per_row_scale:
            kw["tensor_amax"] = float(np.asarray(self.amax_ours))
        q = quantize(X, scheme, nan_amax=self.ref.nan_amax, **kw)
        c = (unpack_fp4(q.data) if self.sch.element.bits == 4 else q.data).reshape(X.shape[0], -1)
        codes = np.zeros((X.shape[0], view.nb * view.BC), np.uint8)
        codes[:, : view.C] = c[:, : view.C]
        return codes, np.asarray(q.scales).reshape(X.shape[0], view.nb), np.asarray(q.amax, np.float32)

    def _four_over_six(self, o: Outcome, scheme: BlockScheme) -> Outcome:
        view = self.view
        if view.BR == 1 and self.hot.size:  # screen on (a sample of) the rows holding mismatches (independent
            # given the amax); none (only the amax differs): nothing to screen on, the whole tensor is scored below
            rows = np.unique(self.hot // view.nb)
            rows = rows[:: -(-rows.size // max(1, SAMPLE_BLOCKS // view.nb))]
            codes, scales, _ = self._quantized(scheme, rows)
            h_c = self.bad_c[rows] & (codes == self.cand_p[rows])
            h_s = self.bad_s[rows] & _same(scales, self.cand_s[rows])
            if not (h_c.any() or h_s.any()):
                return o
        codes, scales, amax = self._quantized(scheme)
        flat = codes.reshape(-1, view.BC)
        return self._run(o, scales, amax, None, lambda b: flat[b])

    def evaluate(self, hyp: Hypothesis, order: int) -> Outcome:
        """The :class:`Outcome` of one hypothesis over the whole tensor."""
        o = Outcome(hyp, order)
        view, sch = self.view, self.sch
        P = view.P3.reshape(-1, view.BC)
        if hyp.scheme is not None:  # four-over-six: fpsim.quantize computes it
            return self._four_over_six(o, hyp.scheme)
        if hyp.own_scales:
            f = factor_of_scales(sch, self.ref, view, self.cand_s).reshape(-1)
            op = "div" if sch.kind is Kind.FP32 else "mul"
            return self._run(o, None, self.amax_ours, self.bad_s.reshape(-1),
                             lambda b: element_codes(P[b], f[b], op, sch, self.ref))
        conv = self.ref.merge(hyp.conv)
        amax = self.amax_ours
        if conv.amax is not None:
            amax = np.asarray(conv.amax, np.float32)
        elif conv.nan_amax != self.ref.nan_amax or conv.inf_amax != self.ref.inf_amax:
            amax = view.amax_rows(conv.nan_amax, conv.inf_amax, bool(sch.per_row_scale))
            amax = amax if sch.per_row_scale else np.asarray(amax[0] if amax.size else np.float32(0))
        element_rule = {"rounding", "saturate", "neg_zero", "element_ftz"} & hyp.conv.changes().keys()
        if element_rule == hyp.conv.changes().keys():
            rounding = conv.rounding or sch.rounding.value

            def codes_of(b):
                c = round_codes(self.y_ref()[b], sch.element, rounding, conv.saturate).astype(np.uint8)
                if conv.element_ftz:
                    c = flush_subnormals(c, sch.element)
                if not conv.neg_zero and sch.element.signed:
                    c = np.where(c == sch.element.sign_mask, np.uint8(0), c)
                return c

            return self._run(o, None, amax, None, codes_of)
        sb, f, op = block_scales(view, sch, conv)
        changed = ~_same(sb, self.ours_s)
        if element_rule or op != self.ref_op or f.shape != self.ref_factor.shape:
            # an element rule (a pair's part) changes codes in every block, not only where the scales changed
            changed[:] = True
        else:  # a block whose factor bits differ may change codes even with the same scale byte
            fd = f.astype(np.float32).view(np.uint32) != self.ref_factor.astype(np.float32).view(np.uint32)
            changed |= fd if fd.ndim == 2 else fd.any(axis=0)
        zero = conv.mx_byte0 == "zero" and sch.kind is Kind.POW2
        if zero:
            changed |= sb == 0
        fl = f.reshape(f.shape[:-2] + (-1,))
        sbf = sb.reshape(-1)

        def codes_of(b):
            c = element_codes(P[b], fl[..., b], op, sch, conv)
            if zero:
                c[sbf[b] == 0] = 0
            return c

        return self._run(o, sb, amax, changed.reshape(-1), codes_of)


def _amax_equal(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def factor_of_scales(sch: BlockScheme, conv: Convention, view: TensorView, sb: np.ndarray) -> np.ndarray:
    """The reference element factor that given scale bytes imply (TE's enc_b, MX's 2^-E, FP32's d)."""
    kind = sch.kind
    if kind is Kind.POW2:
        p2 = np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32), np.float32(np.nan))
        return p2[sb.astype(np.int64)]
    if kind is Kind.FP32:
        return sb.astype(np.float32)
    if sch.tensor_scale:
        am = view.amax_rows(conv.nan_amax, conv.inf_amax, bool(sch.per_row_scale))[:, None]
        num = np.float32(sch.element.max) * np.float32(256.0 if sch.four_over_six else sch.scale.max)
        s_dec = (np.float32(1.0) / tensor_s_enc(am, num)).astype(np.float32)
    else:
        s_dec = np.ones((view.R, 1), np.float32)
    with np.errstate(all="ignore"):
        p = (sch.scale.decode_table()[sb.astype(np.int64)] * s_dec).astype(np.float32)
        return np.minimum(np.float32(1.0) / p, np.float32(np.finfo(np.float32).max)).astype(np.float32)


def _h(name: str, cause: str, **conv) -> Hypothesis:
    return Hypothesis(name, cause, Convention(**conv))


def _element_hypotheses(sch: BlockScheme, ref: Convention, has_nan: bool, has_sub: bool = False) -> list[Hypothesis]:
    """Other element rules: rounding modes and tie rules, no saturation, −0 as +0, subnormal codes flushed
    (``has_sub``: fpsim wrote a subnormal code somewhere or the candidate did; else flushing changes nothing)."""
    el = sch.element
    base = ref.rounding or sch.rounding.value
    ties = ("rne", "rna", "ties_zero", "ties_odd")
    out = [_h(f"candidate rounds {ROUNDINGS[r].split(', ')[1]}" if r in ties else f"candidate = {r} ({ROUNDINGS[r]})",
              "tie rounding" if r in ties and base in ties else "rounding mode", rounding=r)
           for r in ROUNDINGS if r != base]
    if el.has_inf or el.has_nan:
        out.append(_h("candidate does not saturate (overflow to inf/NaN)", "saturation", saturate=not ref.saturate))
    if el.signed:
        out.append(_h("candidate writes −0 as +0", "±0 sign", neg_zero=False))
    if has_sub and el.subnormals and not ref.element_ftz:
        out.append(_h(f"candidate flushes subnormal {el.name} codes (|v| < {el.min_normal:g}) to ±0 (fpsim and "
                      "cvt keep them)", "element flush to zero", element_ftz=True))
    return out


def _two_level_hypotheses(sch: BlockScheme, ref: Convention, view: TensorView, cand_s, ours_s) -> list[Hypothesis]:
    M, sc = sch.element.max, sch.scale
    def fmt(s: str) -> str:  # the formulas are written for NVFP4: put in this scheme's max_elem and 2688
        s = s.replace("2688", "\0").replace("2^-6", "\1").replace("6", f"{M:g}")
        return s.replace("\0", f"{float(np.float32(M) * np.float32(sc.max)):g}").replace("\1", "2^-6")

    out = [_h(f"candidate = {fmt(f)}", "scale operation order", scale_order=o)
           for o, f in SCALE_ORDERS.items() if o != ref.scale_order and (sch.tensor_scale or "amax" not in f)]
    for e, f in ENC_ORDERS.items():
        if e == ref.enc or (not sch.tensor_scale and "amax" in f):
            continue
        cause = "zero-scale block" if e == "te_nocap" else "encode multiplier"
        out.append(_h(f"candidate scales elements as {fmt(f)}", cause, enc=e))
    vals = sc.decode_table()
    cv, ov = vals[cand_s.astype(np.int64)], vals[ours_s.astype(np.int64)]
    floors = {2.0**-6: "torchao's 2^-6", float(sc.min_subnormal): "the smallest subnormal"}
    up = (cv > ov) & np.isfinite(cv)
    if up.any():
        floors.setdefault(float(cv[up].min()), "the candidate's smallest raised scale")
    for v, why in floors.items():
        if ref.scale_min is None or v != ref.scale_min:
            out.append(_h(f"candidate clamps block scales to ≥ {v:g} ({why})", "scale clamp", scale_min=v))
    # the E4M3 conversion of sdb itself: fpsim is cvt.rn.satfinite.e4m3x2.f32 after min(sdb, 448) (SPEC §4)
    cvt = f"fpsim: cvt.rn.satfinite.{'e4m3x2' if sc.name == 'float8_e4m3fn' else sc.name}.f32"
    for r, what in SCALE_ROUNDINGS.items():
        if r != ref.scale_rounding:
            out.append(_h(f"candidate rounds block scales {what} ({cvt})", "scale rounding", scale_rounding=r))
    if sc.has_nan and ref.scale_saturate and not sch.tensor_scale:  # with S_enc, sdb ≤ 448 (up to one rounding)
        out.append(_h(f"candidate converts block scales without saturation (no min(sdb, {sc.max:g}), __NV_NOSAT: "
                      f"NaN beyond {sc.max + (sc.max - float(vals[sc.max_code - 1])) / 2:g}; {cvt})",
                      "scale saturation", scale_saturate=False))
    if sc.subnormals and not ref.scale_ftz and bool(subnormal_codes(ours_s, sc).any()):
        out.append(_h(f"candidate flushes subnormal block scales (< {sc.min_normal:g}) to 0 (fpsim keeps them, "
                      "SPEC §4: no lower clamp)", "scale flush to zero", scale_ftz=True))
    if sch.tensor_scale:
        pre = ("torchao NVFP4: sdb = fl(fl(vmax/6)/pts), pts = fl(amax/2688), clamped to ≥ 2^-6; "
               "y = fl(x·fl(fl(1/pts)/s))")
        out.append(Hypothesis(fmt(pre), "library conventions",
                              Convention(scale_order="div_pts", scale_min=2.0**-6, enc="inv_pts_div_s"), complexity=3))
        out.append(_h("candidate drops the tensor scale (S_enc = S_dec = 1)", "tensor scale", tensor_scale=False))
        if sch.block[0] == 1:
            out.append(_h("candidate uses a per-row instead of a per-tensor scale" if not sch.per_row_scale else
                          "candidate uses a per-tensor instead of a per-row scale", "per-row scale",
                          per_row_scale=not sch.per_row_scale))
    else:
        out.append(_h("candidate adds a tensor scale (S_enc = fl(2688/amax))".replace("2688", f"{M * sc.max:g}"),
                      "tensor scale", tensor_scale=True))
    return out


def _four_over_six_hypotheses(sch: BlockScheme) -> list[Hypothesis]:
    """Four-over-six on or off, or the other metric; computed by :func:`fpsim.quantize`."""
    if not sch.four_over_six:
        return [Hypothesis(f"candidate uses four-over-six ({m})", "four-over-six",
                           scheme=sch.replace(four_over_six=True, four_over_six_metric=m)) for m in ("mse", "mae")]
    other = "mae" if sch.four_over_six_metric == "mse" else "mse"
    return [Hypothesis("candidate does not use four-over-six", "four-over-six",
                       scheme=sch.replace(four_over_six=False)),
            Hypothesis(f"candidate picks four-over-six blocks by {other}", "four-over-six",
                       scheme=sch.replace(four_over_six_metric=other))]


def _mx_hypotheses(sch: BlockScheme, ref: Convention, has_inf: bool, byte0: bool) -> list[Hypothesis]:
    base = ref.mx_rule or sch.scale_rule.value
    out = [_h(f"candidate = {r} rule ({MX_RULES[r]}), fpsim = {base}", "MX scale rule", mx_rule=r)
           for r in MX_RULES if r != base]
    if has_inf:
        out.append(_h("candidate gives a block holding inf the NaN scale 0xFF", "inf block max", mx_inf=0xFF))
    if byte0:
        out += [_h("candidate flushes the scale 2^-127 (byte 0) to zero: x/0", "MX byte-0 blocks", mx_byte0="ftz"),
                _h("candidate writes zero codes in blocks with scale byte 0", "MX byte-0 blocks", mx_byte0="zero"),
                _h("candidate clamps the scale exponent to ≥ −126 (no byte 0)", "MX byte-0 blocks",
                   mx_byte0="clamp126")]
    return out


def infer_amax(view: TensorView, sch: BlockScheme, ref: Convention, cand_s: np.ndarray) -> list[float]:
    """Tensor amax values (float32) under which the candidate's two-level scale bytes could all arise.

    Each block with a finite, non-zero, unsaturated candidate scale c bounds S_enc to
    [max_elem·lo(c)/vmax, max_elem·hi(c)/vmax] (lo, hi: the rounding interval of c); the intersection over
    every block (float64, widened by 1e-6 for the FP32 roundings) gives an amax interval; its middle and both
    ends are tried.  Empty when the blocks disagree (no single amax made these bytes).
    """
    sc, M = sch.scale, float(sch.element.max)
    vals = sc.decode_table().astype(np.float64)
    fin = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    v = view.vmax_bits(ref.nan_amax, ref.inf_amax).view(np.float32).astype(np.float64)
    cv = vals[cand_s.astype(np.int64)]
    use = np.isfinite(v) & (v > 0) & np.isfinite(cv) & (cv > 0)
    if not use.any():
        return [], None
    i = np.searchsorted(fin, cv[use])
    lo = (fin[i] + fin[np.maximum(i - 1, 0)]) / 2
    hi = np.where(i + 1 < fin.size, (fin[i] + fin[np.minimum(i + 1, fin.size - 1)]) / 2, np.inf)
    s_lo = float(np.max(M * lo / v[use])) * (1 - 1e-6)
    s_hi = float(np.min(M * hi / v[use])) * (1 + 1e-6)
    if not s_lo <= s_hi or s_lo <= 0:
        return [], None
    num = M * float(sc.max)
    mids = [np.sqrt(s_lo * s_hi) if np.isfinite(s_hi) else 2 * s_lo, s_lo, s_hi]
    out = []
    for s in mids:
        if np.isfinite(s) and s > 0:
            a = float(np.float32(num / s))
            if a not in out and np.isfinite(a):
                out.append(a)
    return out, (float(np.float32(num / s_hi)) if np.isfinite(s_hi) else 0.0, float(np.float32(num / s_lo)))


def refine_amax(view: TensorView, sch: BlockScheme, ref: Convention, cand_p, cand_s, hyp: Hypothesis,
                tries: int = 4096) -> Hypothesis | None:
    """A tensor amax in ``hyp.amax_range`` that also reproduces the blocks ``hyp``'s amax gets wrong.

    The scale bytes pin S_enc only to an interval; the codes depend on the exact S_dec.  The blocks that
    ``hyp`` gets wrong (at most 256) are recomputed under every float32 amax of the range (or ``tries``
    evenly spaced ones), and the one closest to ``hyp``'s amax that fixes them all is returned.
    """
    if view.BR != 1 or hyp.amax_range is None:
        return None
    codes, scales = model_bytes(view, sch, ref.merge(hyp.conv))
    BC = view.BC
    bad = (codes.reshape(-1, BC) != cand_p.reshape(-1, BC)).any(axis=1) | (scales.reshape(-1) != cand_s.reshape(-1))
    blocks = np.flatnonzero(bad)
    if not 0 < blocks.size <= 256:
        return None
    lo, hi = (np.float32(v).view(np.uint32) for v in hyp.amax_range)
    grid = np.unique(np.linspace(int(lo), int(hi), min(tries, int(hi) - int(lo) + 1)).astype(np.uint32))
    amaxes = grid.view(np.float32)
    sub = TensorView(view.P3.reshape(-1, BC)[blocks], (1, BC))
    want_c, want_s = cand_p.reshape(-1, BC)[blocks], cand_s.reshape(-1)[blocks]
    best = None
    for a in amaxes[np.argsort(np.abs(amaxes - np.float32(hyp.conv.amax)))]:
        c, s = model_bytes(sub, sch, ref.merge(Convention(amax=float(a))))
        if np.array_equal(c, want_c) and np.array_equal(s.reshape(-1), want_s):
            best = float(a)
            break
    if best is None:
        return None
    return Hypothesis(hyp.name.replace(f"{hyp.conv.amax:.9g}", f"{best:.9g}"), hyp.cause, Convention(amax=best),
                      amax_range=hyp.amax_range)


def generate(sch: BlockScheme, ref: Convention, view: TensorView, ours_s, cand_s, amax_ours, amax_cand,
             bad_s_any: bool, sub_codes: bool = False) -> list[Hypothesis]:
    """Every hypothesis that applies to this scheme and tensor, simplest first (``sub_codes``: some mismatching
    code is subnormal in fpsim's bytes, so that a flush to zero could explain it)."""
    kind = sch.kind
    bits = view.abs_bits("propagate", "keep")
    has_nan, has_inf = bool((bits > np.uint32(0x7F800000)).any()), bool((bits == np.uint32(0x7F800000)).any())
    out: list[Hypothesis] = []
    if sch.four_over_six:  # the model has no four-over-six: only quantize-backed and element-rule hypotheses
        return (_four_over_six_hypotheses(sch) + _element_hypotheses(sch, ref, has_nan, sub_codes)
                + [Hypothesis("candidate's codes follow from its own scales (fpsim's element rule)",
                              "element follows its block scale", own_scales=True)])
    if kind is Kind.TWO_LEVEL:
        out += _two_level_hypotheses(sch, ref, view, cand_s, ours_s)
        if sch.element.name == "float4_e2m1fn" and not ref.changes():
            out += _four_over_six_hypotheses(sch)
        if sch.tensor_scale and not sch.per_row_scale:
            if amax_cand is not None and not _amax_equal(amax_ours, amax_cand):
                out.append(_h(f"candidate's scales follow from its amax {float(np.asarray(amax_cand)):g}",
                              "tensor amax", amax=float(np.asarray(amax_cand))))
            elif bad_s_any and ref.amax is None:
                tries, rng = infer_amax(view, sch, ref, cand_s)
                for a in tries:
                    if a != float(np.asarray(amax_ours)):
                        out.append(Hypothesis(f"candidate's bytes follow from a tensor amax {a:.9g} (fpsim's: "
                                              f"{float(np.asarray(amax_ours)):.9g})", "tensor amax",
                                              Convention(amax=a), amax_range=rng))
    elif kind is Kind.POW2:
        out += _mx_hypotheses(sch, ref, has_inf, bool((ours_s == 0).any() or (cand_s == 0).any()))
    else:
        out += [_h("candidate computes d = fl(amax·fl(1/max))", "scale operation order", fp32_scale="mul"),
                _h("candidate scales elements as fl(x·fl(1/d))", "encode multiplier", fp32_enc="mul")]
    if sch.block is not None and sch.block[0] in (1, sch.block[1]) and sch.block[1] > 1 and view.R > 1:
        other = (sch.block[1], sch.block[1]) if sch.block[0] == 1 else (1, sch.block[1])
        if not (other[0] > 1 and sch.per_row_scale):
            out.append(_h(f"candidate uses {other[0]}×{other[1]} blocks", "block shape", block=other))
    if has_nan:
        pol = "ignore" if ref.nan_amax == "propagate" else "propagate"
        out.append(_h("candidate ignores NaN in the amax (fmaxf)" if pol == "ignore" else
                      "candidate propagates NaN through the amax", "NaN handling", nan_amax=pol))
    if has_inf:
        out.append(_h("candidate leaves ±inf out of the amax", "inf block max", inf_amax="skip"))
    out += _element_hypotheses(sch, ref, has_nan, sub_codes)
    out.append(Hypothesis("candidate's codes follow from its own scales (fpsim's element rule)",
                          "element follows its block scale", own_scales=True))
    return out


def _fields(h: Hypothesis) -> set:
    return set(h.conv.changes()) if h.conv is not None else {"scheme"}


def pairs(outcomes: list[Outcome], limit: int = 6) -> list[Hypothesis]:
    """Pairs of partial explanations (different fields) among the ``limit`` best: two bugs at once."""
    part, per_field = [], {}
    for o in rank(outcomes):  # the best two of each field, so that one field's variants do not crowd out the rest
        if o.explains and o.hyp.conv is not None and not o.hyp.own_scales:
            key = frozenset(_fields(o.hyp))
            if per_field.get(key, 0) < 2:
                per_field[key] = per_field.get(key, 0) + 1
                part.append(o)
    part = part[:limit]
    todo = [(a, b) for i, a in enumerate(part) for b in part[i + 1:]]
    # the partial that explains the most bytes with every other hypothesis, even one that explains nothing on its
    # own: a second bug can be hidden by the first (ties rounded away from zero inside 16×16 tiles change no byte
    # that fpsim's 1×16 scales would round the same way), so its own score says nothing about the pair's
    model = [o for o in outcomes if o.hyp.conv is not None and not o.hyp.own_scales]
    top = max((o for o in model if o.explains), key=lambda o: o.explains, default=None)
    if top is not None:
        seen = {frozenset((id(a), id(b))) for a, b in todo}  # by identity: Outcome's == would compare arrays
        todo += [(top, b) for b in model if b is not top and frozenset((id(top), id(b))) not in seen]
    out = []
    for a, b in todo:
        if _fields(a.hyp) & _fields(b.hyp):
            continue
        out.append(Hypothesis(f"{a.hyp.name}; and {b.hyp.name}", f"{a.hyp.cause} + {b.hyp.cause}",
                              a.hyp.conv.merge(b.hyp.conv), complexity=a.hyp.complexity + b.hyp.complexity,
                              parts=(a.hyp, b.hyp)))
    return out


def rank(outcomes: list[Outcome], n_bad: int | None = None) -> list[Outcome]:
    """Full explanations first (simplest first), then partial ones that break nothing (by bytes explained),
    then those that break bytes; ties keep the generation order."""
    full = lambda o: n_bad is not None and o.explains == n_bad and o.breaks == 0  # noqa: E731
    return sorted(outcomes, key=lambda o: (not full(o), o.breaks > 0, -o.explains, o.hyp.complexity, o.order))
