"""Compare another implementation's codes and scales with fpsim's (:func:`diff`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .._arrays import as_float32
from ..codecs import Rounding, encode
from ..io import to_json
from ..packing import unpack_fp4
from ..scaling import BlockScheme, ScaleRule, _Kind, get_scheme, quantize, unswizzle_scales
from .common import F32, FLT_MAX, f32_class, hex32, positive_codes

__all__ = ["CAUSES", "DiffReport", "diff"]


#: Likely causes :func:`diff` assigns to a mismatch (the ``cause`` field), with what each means.
CAUSES: dict[str, str] = {
    "tie rounding": "the scaled value lies exactly halfway between two grid points and the candidate did not "
    "round to the even code (e.g. ties away from zero)",
    "scale operation order": "the candidate's block scale equals the one computed with another FP32 operation "
    "order (SPEC §4 normative: fl(vmax · fl(S_enc · fl(1/6))))",
    "scale clamp": "the candidate clamps small (subnormal or zero) block scales to a minimum; fpsim does not",
    "MX scale rule": "the candidate's E8M0 byte is the one of another scale rule (floor / ceil / even vs rceil)",
    "tensor amax": "the candidate's tensor amax differs, and its scale follows from that amax",
    "±0 sign": "both codes are zero and differ in the sign bit only",
    "NaN handling": "the block or the tensor amax holds a NaN and the candidate treats it differently (SPEC §9)",
    "nibble packing order": "swapping the two nibbles of each candidate byte fixes the code (fpsim: element 2j "
    "in the low nibble)",
    "swizzled scale layout": "the candidate's scales are ours in the Blackwell swizzled layout (or the plain "
    "layout where swizzled was declared)",
    "zero-scale block": "the block scale is 0 and the candidate did not cap enc_b = 1/0 at FLT_MAX: "
    "0·inf = NaN gives the NaN code (SPEC §4: enc_b = min(fl(1/…), FLT_MAX))",
    "rounding mode": "the candidate's code is the one of another rounding mode (truncation, directed rounding)",
    "saturation": "the candidate does not saturate (gives inf/NaN where fpsim gives ±max)",
    "other": "no known pattern; look at the input bits and both codes",
}


@dataclass
class DiffReport:
    """Result of :func:`diff`: mismatch counts and rates, first mismatches, a cause per mismatch.

    ``code_mismatches`` / ``scale_mismatches`` hold the first ``show`` entries
    (dicts); ``causes`` counts the cause of *every* mismatch (codes and scales);
    ``findings`` are whole-tensor diagnoses (packing order, swizzled layout, amax).
    """

    scheme: str
    n_elements: int
    n_code_mismatches: int
    n_blocks: int
    n_scale_mismatches: int
    amax_ours: float | list | None
    amax_candidate: float | list | None
    amax_match: bool | None
    code_mismatches: list = field(default_factory=list)
    scale_mismatches: list = field(default_factory=list)
    causes: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @property
    def code_mismatch_rate(self) -> float:
        return self.n_code_mismatches / self.n_elements if self.n_elements else 0.0

    @property
    def scale_mismatch_rate(self) -> float:
        return self.n_scale_mismatches / self.n_blocks if self.n_blocks else 0.0

    @property
    def identical(self) -> bool:
        return self.n_code_mismatches == 0 and self.n_scale_mismatches == 0 and self.amax_match is not False

    def to_dict(self) -> dict:
        """JSON-ready dict (``fpsim.io.to_json``: NaN and ±inf are ``null``; ``amax.*_class`` says which)."""
        return to_json(
            {
                "scheme": self.scheme,
                "identical": self.identical,
                "elements": self.n_elements,
                "code_mismatches": self.n_code_mismatches,
                "code_mismatch_rate": self.code_mismatch_rate,
                "blocks": self.n_blocks,
                "scale_mismatches": self.n_scale_mismatches,
                "scale_mismatch_rate": self.scale_mismatch_rate,
                "amax": {"ours": self.amax_ours, "ours_class": _classes(self.amax_ours),
                         "candidate": self.amax_candidate, "candidate_class": _classes(self.amax_candidate),
                         "match": self.amax_match},
                "causes": self.causes,
                "findings": self.findings,
                "first_code_mismatches": self.code_mismatches,
                "first_scale_mismatches": self.scale_mismatches,
            }
        )

    def format_table(self) -> str:
        """A human-readable report."""
        lines = [
            f"scheme {self.scheme}: "
            + ("IDENTICAL" if self.identical else "DIFFERENT"),
            f"codes:  {self.n_code_mismatches} / {self.n_elements} differ ({100 * self.code_mismatch_rate:.4g} %)",
            f"scales: {self.n_scale_mismatches} / {self.n_blocks} differ ({100 * self.scale_mismatch_rate:.4g} %)",
        ]
        if self.amax_match is not None:
            lines.append(f"amax:   ours {self.amax_ours}  candidate {self.amax_candidate}  "
                         + ("match" if self.amax_match else "DIFFER"))
        for f in self.findings:
            lines.append(f"finding: {f}")
        if self.causes:
            lines.append("likely causes (all mismatches): "
                         + ", ".join(f"{k} ×{v}" for k, v in sorted(self.causes.items(), key=lambda kv: -kv[1])))
        if self.scale_mismatches:
            lines.append("")
            lines.append(f"{'block':<14} {'vmax (hex)':<12} {'ours':>6} {'cand':>6}  cause")
            for m in self.scale_mismatches:
                lines.append(f"{str(tuple(m['block'])):<14} {m['vmax_hex']:<12} {m['ours_hex']:>6} "
                             f"{m['candidate_hex']:>6}  {m['cause']}"
                             + (f" ({m['detail']})" if m.get("detail") else ""))
        if self.code_mismatches:
            lines.append("")
            lines.append(f"{'index':<14} {'x':>14} {'x (hex)':<11} {'scaled (hex)':<12} {'ours':>5} {'cand':>5}  cause")
            for m in self.code_mismatches:
                lines.append(f"{str(tuple(m['index'])):<14} {m['x']:>14.7g} {m['x_hex']:<11} {m['scaled_hex']:<12} "
                             f"{m['ours_hex']:>5} {m['candidate_hex']:>5}  {m['cause']}"
                             + (f" ({m['detail']})" if m.get("detail") else ""))
        return "\n".join(lines)


def _classes(v):
    """:func:`f32_class` of an amax (a float or a list of them), None where there is none."""
    if v is None:
        return None
    return [f32_class(a) for a in v] if isinstance(v, list) else f32_class(v)


def _block_vmax(X: np.ndarray, BR: int, BC: int, nb: int) -> np.ndarray:
    """NaN-propagating block (tile) amax of the [R, C] view, shape [R, nb] (tiles repeated on their rows)."""
    R, C = X.shape
    Rp = BR * -(-R // BR)
    P = np.zeros((Rp, nb * BC), np.float32)
    P[:R, :C] = np.abs(X)
    t = P.reshape(Rp // BR, BR, nb, BC).max(axis=(1, 3))
    return np.repeat(t, BR, axis=0)[:R]


def _scale_orders(sch: BlockScheme, vmax, amax, s_enc, s_dec) -> dict[str, np.ndarray]:
    """sdb under other FP32 operation orders found in the wild (before the min with the scale max)."""
    f = F32
    M = f(sch.element.max)
    inv = f(1.0) / M
    num = M * f(sch.scale.max)
    with np.errstate(all="ignore"):
        alts = {
            "fl(fl(vmax·S_enc)·fl(1/6))": (vmax * s_enc) * inv,
            "fl(fl(vmax·S_enc)/6)": (vmax * s_enc) / M,
            "fl(fl(vmax/6)·S_enc)": (vmax / M) * s_enc,
            "fl(fl(vmax·fl(1/6))·S_enc)": (vmax * inv) * s_enc,
            "fl(fl(vmax/6)/S_dec)": (vmax / M) / s_dec,
            "fl(fl(vmax/6)/fl(amax/2688))": (vmax / M) / (amax / num),
        }
    return {k.replace("6", f"{sch.element.max:g}").replace("2688", f"{num:g}"): v for k, v in alts.items()}


def _orig_index(r: int, c: int, moved: tuple[int, ...], axis: int) -> list[int]:
    lead = list(np.unravel_index(r, moved[:-1])) if len(moved) > 1 else []
    lead = [int(i) for i in lead]
    return lead[:axis] + [int(c)] + lead[axis:]


def diff(
    candidate_codes,
    candidate_scales,
    x,
    scheme="nvfp4",
    axis: int = -1,
    candidate_amax=None,
    packed: bool = True,
    swizzled: bool = False,
    show: int = 10,
) -> DiffReport:
    """Compare another implementation's codes and scales with fpsim's, and guess why they differ.

    fpsim quantizes ``x`` with ``scheme`` (SPEC §4–§6) and compares element by
    element and block by block.  Each mismatch gets one likely cause from
    :data:`CAUSES`, found by recomputing it under the alternative convention
    (another FP32 operation order of the NVFP4 scale, a clamped scale, another
    MX scale rule, ties away from zero, swapped nibbles, a swizzled scale
    layout, …).  Elements whose block scale differs inherit the block's cause
    when their code follows from the candidate's scale.

    Parameters
    ----------
    candidate_codes
        Element codes in fpsim's layout: the quantized axis last
        (``np.moveaxis(x, axis, -1)``), one row per row of that view, each row
        either exactly ``C`` codes long or padded to whole blocks; for 4-bit
        elements two codes per byte (element 2j in the low nibble) unless
        ``packed=False`` (one code per byte).
    candidate_scales
        Raw scale bytes, one per block, ``[rows, blocks]`` (float32 for FP32
        scales); with ``swizzled=True`` the 1-D Blackwell layout (SPEC §4).
    x
        The input both sides quantized (converted to float32 first).
    scheme, axis
        As for :func:`fpsim.quantize` (block-scaled schemes only).
    candidate_amax
        Optional candidate tensor amax (float32) of two-level schemes.
    show
        How many mismatches of each kind to keep in the report.

    Returns
    -------
    DiffReport
    """
    sch = get_scheme(scheme)
    kind = sch.kind
    if kind is _Kind.CAST or sch.block is None:
        raise ValueError(f"diff compares block-scaled schemes (nvfp4, mx*, fp8_block128), not {sch.name}")
    if sch.rounding is Rounding.SR:
        raise ValueError("diff compares deterministic (RNE) quantization; stochastic rounding needs the same bits")
    el = sch.element
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("x needs at least one axis")
    q = quantize(x32, sch, axis=axis)
    ax = q.axis
    moved = tuple(x32.shape[:ax] + x32.shape[ax + 1 :] + (x32.shape[ax],))
    R, C = math.prod(moved[:-1]), moved[-1]
    BR, BC = sch.block
    nb = -(-C // BC)
    four = el.bits == 4
    ours = (unpack_fp4(q.data) if four else q.data).reshape(R, nb * BC)[:, :C].astype(np.int64)
    ours_s = np.ascontiguousarray(q.scales).reshape(R, nb)
    findings: list[str] = []

    # -- candidate codes: shape checks, unpacking, packing-order hypothesis
    cc = np.asarray(candidate_codes)
    if cc.dtype.kind not in "iu":
        raise ValueError(f"candidate codes must be integers (raw code bytes), got dtype {cc.dtype}")
    is_packed = four and packed
    lengths = ({-(-C // 2), nb * BC // 2} if is_packed else {C, nb * BC})
    if R == 0 or cc.size % max(R, 1) or cc.size // max(R, 1) not in lengths:
        want = " or ".join(f"{R}×{n}" for n in sorted(lengths))
        what = "packed bytes" if is_packed else "codes"
        raise ValueError(f"candidate codes have {cc.size} values (shape {cc.shape}); expected {want} {what} "
                         f"for x of shape {x32.shape} along axis {ax}")
    cc = cc.reshape(R, -1).astype(np.int64)
    if cc.size and (cc.min() < 0 or cc.max() > (0xFF if is_packed else (1 << el.bits) - 1)):
        hint = " (packed 4-bit codes? then do not pass packed=False)" if four and not packed else ""
        raise ValueError(f"candidate codes out of range for {el.name}{hint}")
    swapped = None
    if is_packed:
        b = cc.astype(np.uint8)
        cand = unpack_fp4(b)[:, :C].astype(np.int64)
        swapped = unpack_fp4(((b << 4) | (b >> 4)).astype(np.uint8))[:, :C].astype(np.int64)
    else:
        cand = cc[:, :C]
    n_plain = int(np.count_nonzero(cand != ours))
    packing_swapped = swapped is not None and n_plain > 0 and int(np.count_nonzero(swapped != ours)) < n_plain / 2
    if packing_swapped:
        findings.append("nibble packing order: the candidate puts element 2j in the HIGH nibble "
                        "(fpsim, cvt.*.e2m1x2 and cuBLAS: low nibble)")

    # -- candidate scales: layout (swizzle) hypothesis
    cs = np.asarray(candidate_scales)
    s_dtype = ours_s.dtype
    if kind is _Kind.FP32:
        if cs.dtype != np.float32:
            raise ValueError(f"candidate scales of {sch.name} must be float32, got {cs.dtype}")
    elif cs.dtype.kind not in "iu" or (cs.size and (cs.min() < 0 or cs.max() > 0xFF)):
        raise ValueError(f"candidate scales must be raw scale bytes (uint8), got dtype {cs.dtype}")
    cs = cs.reshape(-1).astype(s_dtype)
    n_sw = (128 * -(-R // 128)) * (4 * -(-nb // 4))
    layout_cause = np.zeros((R, nb), bool)
    if swizzled:
        if kind is _Kind.FP32:
            raise ValueError("FP32 scales have no swizzled layout")
        if cs.size != n_sw:
            extra = " (that is the plain [rows, blocks] size: drop swizzled)" if cs.size == R * nb else ""
            raise ValueError(f"expected {n_sw} swizzled scale bytes for [{R}, {nb}] scales, got {cs.size}{extra}")
        cand_s = unswizzle_scales(cs, R, nb)
        if n_sw == R * nb:
            plain = cs.reshape(R, nb)
            if np.count_nonzero(plain != ours_s) * 2 < np.count_nonzero(cand_s != ours_s):
                findings.append("swizzled scale layout: the scales are in the plain [rows, blocks] layout, "
                                "not swizzled as declared")
                layout_cause = cand_s != ours_s
    else:
        if cs.size == R * nb:
            cand_s = cs.reshape(R, nb)
            if kind is not _Kind.FP32 and n_sw == R * nb:
                un = unswizzle_scales(cs, R, nb)
                if np.count_nonzero(un != ours_s) * 2 < np.count_nonzero(cand_s != ours_s):
                    findings.append("swizzled scale layout: the candidate's scales are fpsim's in the Blackwell "
                                    "swizzled layout (pass swizzled=True / --swizzled)")
                    layout_cause = cand_s != ours_s
        elif kind is not _Kind.FP32 and cs.size == n_sw:
            un = unswizzle_scales(cs, R, nb)
            cand_s = np.zeros((R, nb), s_dtype)
            cand_s.reshape(-1)[:] = cs[: R * nb]
            findings.append(f"swizzled scale layout: {cs.size} scale bytes is the swizzled size of [{R}, {nb}] "
                            "(pass swizzled=True / --swizzled)"
                            + ("; unswizzled they equal fpsim's" if np.array_equal(un, ours_s) else ""))
            layout_cause = cand_s != ours_s
        else:
            raise ValueError(f"candidate scales have {cs.size} values; expected {R}×{nb} = {R * nb} "
                             f"(one per block) for x of shape {x32.shape} along axis {ax}")

    # -- amax
    amax_ours = np.asarray(q.amax, np.float32)
    amax_match = None
    amax_cand = None
    if candidate_amax is not None and sch.tensor_scale:
        ca = np.asarray(candidate_amax, np.float32).reshape(amax_ours.shape) if np.size(candidate_amax) == \
            amax_ours.size else None
        if ca is None:
            raise ValueError(f"candidate amax has {np.size(candidate_amax)} values, expected {amax_ours.size}")
        amax_cand = ca
        amax_match = bool(np.all((ca == amax_ours) | (np.isnan(ca) & np.isnan(amax_ours))))
        if not amax_match:
            findings.append(f"tensor amax differs: ours {amax_ours.tolist()}, candidate {ca.tolist()}")

    # -- per block: vmax, our scaling intermediates, and the scale causes
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(R, C)
    vmax = _block_vmax(X, BR, BC, nb)
    nan_block = np.isnan(vmax)
    with np.errstate(all="ignore"):
        if kind is _Kind.TWO_LEVEL:
            if sch.tensor_scale:
                am = np.broadcast_to(amax_ours.reshape(-1, 1) if sch.per_row_scale else amax_ours, (R, 1))
                num = F32(el.max) * F32(sch.scale.max)
                s_enc = np.minimum(num / am, FLT_MAX).astype(np.float32)
                s_enc = np.where(np.isnan(am), am, s_enc)
                s_enc = np.where((am == 0) | (s_enc == 0), F32(1.0), s_enc).astype(np.float32)
            else:
                am = np.full((R, 1), np.nan, np.float32)
                s_enc = np.ones((R, 1), np.float32)
            s_dec = (F32(1.0) / s_enc).astype(np.float32)
            nan_block = nan_block | np.isnan(am)
            scale_vals = sch.scale.decode_table()

            def enc_of(sbytes):
                p = (scale_vals[sbytes] * s_dec).astype(np.float32)
                return np.minimum(F32(1.0) / p, FLT_MAX).astype(np.float32)

            ours_enc = enc_of(ours_s)
            cand_enc = enc_of(cand_s.astype(np.int64))
        elif kind is _Kind.POW2:
            p2 = np.append(np.ldexp(np.float32(1), 127 - np.arange(255)).astype(np.float32), np.float32(np.nan))
            ours_enc, cand_enc = p2[ours_s], p2[cand_s.astype(np.int64)]
        else:
            ours_enc = (F32(1.0) / ours_s).astype(np.float32)
            cand_enc = (F32(1.0) / cand_s).astype(np.float32)

    scale_cause = np.full((R, nb), "", dtype=object)
    scale_detail = np.full((R, nb), "", dtype=object)
    if kind is _Kind.FP32:
        s_bad = ours_s.view(np.uint32) != cand_s.view(np.uint32)
    else:
        s_bad = ours_s != cand_s
    if np.any(s_bad):
        alts = {}
        if kind is _Kind.TWO_LEVEL:
            with np.errstate(all="ignore"):
                for name, sdb in _scale_orders(sch, vmax, am, s_enc, s_dec).items():
                    sdb = np.where(np.isnan(sdb), sdb, np.minimum(sdb, F32(sch.scale.max))).astype(np.float32)
                    alts[name] = encode(sdb, sch.scale).astype(np.int64)
                if amax_cand is not None and not amax_match:
                    qa = _two_level_scales_with_amax(sch, vmax, np.broadcast_to(amax_cand.reshape(-1, 1)
                                                     if sch.per_row_scale else amax_cand, (R, 1)))
                    alts["__amax__"] = qa
        elif kind is _Kind.POW2:
            for rule in ScaleRule:
                if rule is not sch.scale_rule:
                    qr = quantize(x32, sch, axis=axis, scale_rule=rule)
                    alts[rule.value] = np.ascontiguousarray(qr.scales).reshape(R, nb).astype(np.int64)
        cand_vals = sch.scale.decode_table()[cand_s.astype(np.int64)] if kind is not _Kind.FP32 else cand_s
        our_vals = sch.scale.decode_table()[ours_s] if kind is not _Kind.FP32 else ours_s
        finite = cand_vals[np.isfinite(cand_vals)]
        floor = finite.min() if finite.size else None
        for r, j in zip(*np.nonzero(s_bad)):
            c = int(cand_s[r, j]) if kind is not _Kind.FP32 else cand_s[r, j]
            cause, detail = "other", ""
            if layout_cause[r, j]:
                cause = "swizzled scale layout"
            elif nan_block[r, j] or np.isnan(our_vals[r, j]) or np.isnan(cand_vals[r, j]):
                cause = "NaN handling"
            else:
                hit = [n for n, a in alts.items() if a[r, j] == c]
                if "__amax__" in hit:
                    cause = "tensor amax"
                elif hit and kind is _Kind.TWO_LEVEL:
                    cause, detail = "scale operation order", "candidate = " + hit[0]
                elif hit and kind is _Kind.POW2:
                    cause, detail = "MX scale rule", f"candidate = {hit[0]} rule, fpsim = {sch.scale_rule.value}"
                elif floor is not None and cand_vals[r, j] > our_vals[r, j] and cand_vals[r, j] == floor:
                    cause, detail = "scale clamp", f"candidate floor {float(floor):g}"
                elif kind is not _Kind.FP32 and our_vals[r, j] == 0 and cand_vals[r, j] == 0:
                    cause = "±0 sign"
            scale_cause[r, j], scale_detail[r, j] = cause, detail

    # -- per element
    bad = cand != ours
    n_bad = int(np.count_nonzero(bad))
    vals64, _ = positive_codes(el)
    mids = (vals64[:-1] + vals64[1:]) / 2
    table = el.decode_table()
    code_cause: list[str] = []
    code_detail: list[str] = []
    rows, cols = np.nonzero(bad)
    for r, c in zip(rows, cols):
        j = c // BC
        oc, kc = int(ours[r, c]), int(cand[r, c])
        xv = X[r, c]
        with np.errstate(all="ignore"):
            y = F32(xv * ours_enc[r, j])
        cause, detail = "other", ""
        if packing_swapped and swapped[r, c] == oc:
            cause = "nibble packing order"
        elif s_bad[r, j] and scale_cause[r, j] in ("swizzled scale layout",):
            cause, detail = scale_cause[r, j], "element follows its block scale"
        elif np.isnan(xv) or nan_block[r, j]:
            cause = "NaN handling"
        elif table[oc] == 0 and table[kc] == 0:
            cause = "±0 sign"
        elif s_bad[r, j]:
            with np.errstate(all="ignore"):
                yc = F32(xv * cand_enc[r, j])
            if int(encode(np.array([yc], np.float32), el)[0]) == kc:
                cause, detail = scale_cause[r, j] or "other", "element follows its block scale"
        if (cause == "other" and kind is _Kind.TWO_LEVEL and not s_bad[r, j] and xv == 0
                and sch.scale.decode_table()[ours_s[r, j]] == 0 and kc == el.nan_code):
            cause = "zero-scale block"
        if cause == "other" and not s_bad[r, j] and np.isfinite(y):
            if abs(float(y)) in mids:
                cause = "tie rounding"
                rna = int(encode(np.array([y], np.float32), el, "rna")[0])
                detail = "candidate rounds ties away from zero" if rna == kc else "candidate's tie is not to even"
            else:
                for mode in ("rtz", "rup", "rdown"):
                    if int(encode(np.array([y], np.float32), el, mode)[0]) == kc:
                        cause, detail = "rounding mode", f"candidate = {mode}"
                        break
                else:
                    if int(encode(np.array([y], np.float32), el, "rne", saturate=False)[0]) == kc:
                        cause = "saturation"
        code_cause.append(cause)
        code_detail.append(detail)

    causes = Counter(code_cause)
    causes.update(str(v) for v in scale_cause[s_bad])
    code_list = []
    for i in range(min(show, n_bad)):
        r, c = int(rows[i]), int(cols[i])
        j = c // BC
        with np.errstate(all="ignore"):
            y = F32(X[r, c] * ours_enc[r, j])
        code_list.append({
            "index": _orig_index(r, c, moved, ax),
            "row": r, "col": c, "block": [r, j],
            "x": float(X[r, c]), "x_hex": hex32(X[r, c]), "scaled": float(y), "scaled_hex": hex32(y),
            "ours": int(ours[r, c]), "ours_hex": f"0x{int(ours[r, c]):X}",
            "candidate": int(cand[r, c]), "candidate_hex": f"0x{int(cand[r, c]):X}",
            "ours_value": float(table[int(ours[r, c])]), "candidate_value": float(table[int(cand[r, c])]),
            "cause": code_cause[i], "detail": code_detail[i],
        })
    scale_list = []
    srows, scols = np.nonzero(s_bad)
    for i in range(min(show, srows.size)):
        r, j = int(srows[i]), int(scols[i])
        o, k = ours_s[r, j], cand_s[r, j]
        hx = (lambda v: f"0x{int(v):02X}") if kind is not _Kind.FP32 else hex32
        scale_list.append({
            "block": [r, j], "vmax": float(vmax[r, j]), "vmax_hex": hex32(vmax[r, j]),
            "ours": o.item(), "ours_hex": hx(o), "candidate": k.item(), "candidate_hex": hx(k),
            "cause": str(scale_cause[r, j]), "detail": str(scale_detail[r, j]),
        })
    return DiffReport(
        scheme=sch.name,
        n_elements=R * C,
        n_code_mismatches=n_bad,
        n_blocks=R * nb,
        n_scale_mismatches=int(np.count_nonzero(s_bad)),
        amax_ours=amax_ours.tolist() if sch.tensor_scale else None,
        amax_candidate=None if amax_cand is None else amax_cand.tolist(),
        amax_match=amax_match,
        code_mismatches=code_list,
        scale_mismatches=scale_list,
        causes=dict(causes),
        findings=findings,
    )


def _two_level_scales_with_amax(sch: BlockScheme, vmax, am) -> np.ndarray:
    """Block scale bytes in TE order from another tensor amax (``am`` [R, 1])."""
    el, sc = sch.element, sch.scale
    with np.errstate(all="ignore"):
        num = F32(el.max) * F32(sc.max)
        s_enc = np.minimum(num / am, FLT_MAX).astype(np.float32)
        s_enc = np.where((am == 0) | (s_enc == 0), F32(1.0), s_enc).astype(np.float32)
        k = (s_enc * (F32(1.0) / F32(el.max))).astype(np.float32)
        sdb = (vmax * k).astype(np.float32)
        sdb = np.where(np.isnan(sdb), sdb, np.minimum(sdb, F32(sc.max))).astype(np.float32)
    return encode(sdb, sc).astype(np.int64)
