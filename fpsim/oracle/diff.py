"""Compare another implementation's codes and scales with fpsim's, and rank the conventions that explain them.

:func:`diff` quantizes the input with fpsim (the reference), finds every mismatching code, scale byte and
amax, then tests every hypothesis of :mod:`fpsim.oracle.hypotheses` — another scale rule or operation order,
encode multiplier, tie rule, NaN / inf policy, dropped tensor scale, block shape, amax, clamp, … — against
the whole tensor, vectorised, and reports all that explain every byte (simplest first), or the best partial
ones, with pairs of them for two bugs at once.  Each mismatch then gets the cause of the best hypothesis
that explains it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .._arrays import as_float32
from ..codecs import Rounding
from ..dispatch import quantize
from ..io import to_json
from ..packing import unpack_fp4
from ..scaling import unswizzle_scales
from ..schemes import BlockScheme, Kind, get_scheme
from ..transforms import RECIPE_SIGNS, hadamard_matrix
from ..transforms import rht as _rht
from .common import DiagnosisError, f32_class, hex32, internal_errors
from .hypotheses import Evaluator, Hypothesis, Outcome, generate, pairs, rank, refine_amax
from .model import ROUNDINGS, Convention, TensorView, model_bytes, subnormal_codes
from .rounding import OFF_GRID, SR_LIKE, NeighbourCheck, check_blocks, other_k, rounding_findings, sr_causes

__all__ = ["CAUSES", "DiagnosisError", "DiffReport", "diff", "RHT_SIZE", "RHT_TRY_RATE"]

#: The recipe's Hadamard tile along the quantized axis (SPEC §7; fpsim.recipe: ``rht=16``, signs ``"recipe"``).
RHT_SIZE = 16
#: Code mismatch rate above which :func:`diff` also compares with the RHT toggled (applied or removed).
RHT_TRY_RATE = 0.25
#: Cause index of the bytes that only the toggled-RHT reference reproduces (past the −3, −4 of rounding.py).
_RHT = -5

#: Likely causes :func:`diff` assigns to a mismatch (the ``cause`` field), with what each means.
CAUSES: dict[str, str] = {
    "tie rounding": "the candidate's codes are those of another tie rule (away from zero, toward zero, to odd)",
    "rounding mode": "the candidate's codes are those of another rounding mode (truncation, directed rounding)",
    "scale operation order": "the candidate's block scales are those of another FP32 operation order "
    "(SPEC §4 normative: fl(vmax · fl(S_enc · fl(1/6))))",
    "encode multiplier": "the candidate scales elements with another FP32 formula (e.g. torchao's "
    "fl(fl(1/pts)/s), a division): 1 ulp from TE's enc_b changes codes at rounding boundaries",
    "zero-scale block": "the candidate did not cap enc_b = 1/0 at FLT_MAX: 0·inf = NaN gives the NaN code "
    "(SPEC §4: enc_b = min(fl(1/…), FLT_MAX))",
    "scale clamp": "the candidate clamps small (subnormal or zero) block scales to a minimum; fpsim does not",
    "library conventions": "the candidate follows another library's combination of conventions (named)",
    "tensor scale": "the candidate drops the second-level tensor scale (S_enc = 1), or adds one",
    "per-row scale": "the candidate uses a per-row second-level scale where fpsim's is per tensor, or vice versa",
    "tensor amax": "the candidate's bytes follow from another tensor amax (given, or inferred from its scales)",
    "block shape": "the candidate uses another block shape (1×16 rows vs 16×16 tiles)",
    "four-over-six": "the candidate uses four-over-six scaling (or not, or another metric)",
    "MX scale rule": "the candidate's E8M0 bytes are those of another scale rule (floor / ceil / even / rceil, "
    "or a float32 log2)",
    "MX byte-0 blocks": "blocks with the scale 2^-127 (byte 0) differ: the candidate flushes it, writes zeros, "
    "or clamps the exponent to −126",
    "inf block max": "blocks holding ±inf differ: the candidate gives them a NaN scale or leaves inf out of "
    "the amax",
    "NaN handling": "the tensor holds a NaN and the candidate treats it differently in the amax (SPEC §9)",
    "saturation": "the candidate does not saturate (gives inf/NaN where fpsim gives ±max)",
    "±0 sign": "the candidate writes −0 as +0 (TE's Python reference) or the other way round",
    "scale rounding": "the candidate converts the block scale sdb to E4M3 with another rounding (truncation, "
    "rounding up, ties away) where fpsim and cvt.rn.satfinite.e4m3x2.f32 round to nearest even (SPEC §4)",
    "scale saturation": "the candidate converts block scales without saturating at 448 (__NV_NOSAT: NaN beyond "
    "464); only single-level scaling reaches it",
    "scale flush to zero": "the candidate writes subnormal E4M3 block scales (< 2^-6) as 0; fpsim keeps them "
    "(SPEC §4: no lower clamp)",
    "element flush to zero": "the candidate writes subnormal element codes (E2M1 ±0.5, FP8 below its smallest "
    "normal) as ±0; fpsim and cvt keep them",
    "element follows its block scale": "the code is what fpsim's element rule gives with the candidate's own "
    "(different) scale",
    "nibble packing order": "swapping the two nibbles of each candidate byte fixes the code (fpsim: element 2j "
    "in the low nibble)",
    "swizzled scale layout": "the candidate's scales are ours in the Blackwell swizzled layout (or the plain "
    "layout where swizzled was declared)",
    "transposed scale layout": "the candidate's [rows, blocks] scales are ours stored transposed ([blocks, rows])",
    "shifted scales": "the candidate's scale bytes are ours shifted by one byte (an off-by-one offset)",
    "transposed code layout": "the candidate's codes are ours with rows and columns transposed",
    "shifted codes": "the candidate's codes are ours shifted by one element or one byte along the row-major "
    "stream (an off-by-one offset)",
    "stochastic rounding": "fpsim compared round-to-nearest, and the candidate's differing codes are all the other "
    "neighbour of x·enc_b with unbiased away-roundings: it rounds stochastically (compare with rounding='sr')",
    "SR random bits": "the code is the other neighbour of x·enc_b: the candidate rounds stochastically with "
    "other random bits than fpsim's for this seed (another stream, seed, counter layout or K; SPEC §3)",
    "not a rounding of x·enc_b": "the code is neither neighbour of the scaled value: no rounding of x·enc_b gives "
    "it (look at the block scale and the element encoder)",
    "random Hadamard transform": "the candidate quantized the random-Hadamard-transformed input (16-point tiles "
    "along the quantized axis, the recipe's sign vector, BF16 in and out; SPEC §7) where fpsim did not, or the "
    "other way round (diff's rht option)",
    "RHT with other signs": "the candidate quantized the Hadamard-transformed input with another sign vector than "
    "the recipe's fixed one (seeded random signs, or none; SPEC §7)",
    "other": "no hypothesis explains it; look at the input bits and both codes",
}


@dataclass
class DiffReport:
    """Result of :func:`diff`: mismatch counts and rates, ranked hypotheses, first mismatches, causes.

    ``explained_by``: the hypotheses that reproduce every byte (simplest first; empty if none does);
    ``hypotheses``: every hypothesis that explains at least one mismatching byte, ranked, as dicts
    (``name``, ``cause``, ``explains``, ``breaks``: matching bytes it would change, ``explains_every_byte``);
    ``causes`` counts the cause of *every* mismatch (codes, scales, amax); ``code_mismatches`` /
    ``scale_mismatches`` hold the first ``show`` entries; ``findings`` are layout and amax diagnoses.
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
    hypotheses: list = field(default_factory=list)
    explained_by: list = field(default_factory=list)
    rounding: str = "rne"
    seed: int | None = None
    rounding_check: NeighbourCheck | None = None

    @property
    def code_mismatch_rate(self) -> float | None:
        return self.n_code_mismatches / self.n_elements if self.n_elements else None

    @property
    def scale_mismatch_rate(self) -> float | None:
        return self.n_scale_mismatches / self.n_blocks if self.n_blocks else None

    @property
    def identical(self) -> bool:
        """Every byte fpsim's; with ``rounding="sr"`` and no seed (no bits to compare): every code a neighbour of
        its x·enc_b, the scales fpsim's, and the away-roundings those of an unbiased stochastic rounding."""
        same = self.n_code_mismatches == 0 and self.n_scale_mismatches == 0 and self.amax_match is not False
        if self.rounding == "sr" and self.seed is None:
            return same and (self.rounding_check is None or self.rounding_check.z is None
                             or self.rounding_check.stochastic)
        return same

    @property
    def _verdict(self) -> str:
        if self.rounding == "sr" and self.seed is None:
            return "CONSISTENT with stochastic rounding" if self.identical else "INCONSISTENT with stochastic rounding"
        return "IDENTICAL" if self.identical else "DIFFERENT"

    def to_dict(self) -> dict:
        """JSON-ready dict (``fpsim.io.to_json``: NaN and ±inf are ``null``; ``amax.*_class`` says which)."""
        return to_json({
            "scheme": self.scheme,
            "identical": self.identical,
            "rounding": self.rounding,
            "seed": self.seed,
            "rounding_check": None if self.rounding_check is None else self.rounding_check.to_dict(),
            "elements": self.n_elements,
            "code_mismatches": self.n_code_mismatches,
            "code_mismatch_rate": self.code_mismatch_rate,
            "blocks": self.n_blocks,
            "scale_mismatches": self.n_scale_mismatches,
            "scale_mismatch_rate": self.scale_mismatch_rate,
            "amax": {"ours": self.amax_ours, "ours_class": _classes(self.amax_ours),
                     "candidate": self.amax_candidate, "candidate_class": _classes(self.amax_candidate),
                     "match": self.amax_match},
            "explained_by": self.explained_by,
            "hypotheses": self.hypotheses,
            "causes": self.causes,
            "findings": self.findings,
            "first_code_mismatches": self.code_mismatches,
            "first_scale_mismatches": self.scale_mismatches,
        })

    def format_table(self) -> str:
        """A human-readable report."""
        lines = [
            f"scheme {self.scheme}" + ("" if self.rounding == "rne" else
                                       f", stochastic rounding, seed {'none' if self.seed is None else self.seed}")
            + f": {self._verdict}",
            f"codes:  {self.n_code_mismatches} / {self.n_elements} differ ({_pct(self.code_mismatch_rate)})",
            f"scales: {self.n_scale_mismatches} / {self.n_blocks} differ ({_pct(self.scale_mismatch_rate)})",
        ]
        if self.amax_match is not None:
            lines.append(f"amax:   ours {self.amax_ours}  candidate {self.amax_candidate}  "
                         + ("match" if self.amax_match else "DIFFER"))
        lines += [f"finding: {f}" for f in self.findings]
        if self.rounding_check is not None:
            lines.append(f"rounding: {self.rounding_check.summary()}")
        if not self.identical and (self.explained_by or self.rounding == "rne"):
            if self.explained_by:
                lines.append("explained by (every byte): " + self.explained_by[0])
                lines += [f"  also explained by: {n}" for n in self.explained_by[1:4]]
                if len(self.explained_by) > 4:
                    lines.append(f"  and {len(self.explained_by) - 4} more (--format json lists them)")
            elif not self.hypotheses:
                lines.append("no hypothesis explains any of the differing bytes")
            else:
                lines.append("no hypothesis explains every byte; the best partial explanations:")
                for h in self.hypotheses[:5]:
                    lines.append(f"  {h['explains']} bytes ({h['breaks']} matching bytes broken): {h['name']}")
        if self.causes:
            lines.append("likely causes (all mismatches): "
                         + ", ".join(f"{k} ×{v}" for k, v in sorted(self.causes.items(), key=lambda kv: -kv[1])))
        if self.scale_mismatches:
            lines += ["", f"{'block':<14} {'vmax (hex)':<12} {'ours':>10} {'cand':>10}  cause"]
            for m in self.scale_mismatches:
                lines.append(f"{str(tuple(m['block'])):<14} {m['vmax_hex']:<12} {m['ours_hex']:>10} "
                             f"{m['candidate_hex']:>10}  {m['cause']}" + (f" ({m['detail']})" if m["detail"] else ""))
        if self.code_mismatches:
            lines += ["", f"{'index':<14} {'x':>14} {'x (hex)':<11} {'scaled (hex)':<12} {'ours':>5} {'cand':>5}"
                          "  cause"]
            for m in self.code_mismatches:
                lines.append(f"{str(tuple(m['index'])):<14} {m['x']:>14.7g} {m['x_hex']:<11} {m['scaled_hex']:<12} "
                             f"{m['ours_hex']:>5} {m['candidate_hex']:>5}  {m['cause']}"
                             + (f" ({m['detail']})" if m["detail"] else ""))
        return "\n".join(lines)


def _pct(rate: float | None) -> str:
    return "n/a: nothing to compare" if rate is None else f"{100 * rate:.4g} %"


def _classes(v):
    """:func:`f32_class` of an amax (a float or a list of them), None where there is none."""
    if v is None:
        return None
    return [f32_class(a) for a in v] if isinstance(v, list) else f32_class(v)


def _orig_index(r: int, c: int, moved: tuple[int, ...], axis: int) -> list[int]:
    lead = [int(i) for i in np.unravel_index(r, moved[:-1])] if len(moved) > 1 else []
    return lead[:axis] + [int(c)] + lead[axis:]


def _candidate_codes(candidate_codes, R: int, C: int, nb: int, BC: int, el, packed: bool, what: str):
    """Candidate codes [R, C] (uint8) and the other readings of its bytes (:func:`_code_readings`)."""
    cc = np.asarray(candidate_codes)
    if cc.dtype.kind not in "iu":
        raise ValueError(f"candidate codes must be integers (raw code bytes), got dtype {cc.dtype}")
    four = el.bits == 4
    is_packed = four and packed
    lengths = {-(-C // 2), nb * BC // 2} if is_packed else {C, nb * BC}
    if R == 0 or cc.size % max(R, 1) or cc.size // max(R, 1) not in lengths:
        want = " or ".join(f"{R}×{n}" for n in sorted(lengths))
        raise ValueError(f"candidate codes have {cc.size} values (shape {cc.shape}); expected {want} "
                         f"{'packed bytes' if is_packed else 'codes'} for {what}")
    cc = cc.reshape(R, -1)
    if cc.size and (cc.min() < 0 or cc.max() > (0xFF if is_packed else (1 << el.bits) - 1)):
        hint = " (packed 4-bit codes? then do not pass packed=False)" if four and not packed else ""
        raise ValueError(f"candidate codes out of range for {el.name}{hint}")
    b = cc.astype(np.uint8, copy=False)
    return (unpack_fp4(b) if is_packed else b)[:, :C], _code_readings(b, R, C, is_packed)


def _code_readings(b: np.ndarray, R: int, C: int, is_packed: bool) -> list[tuple[str, str, object]]:
    """The layout mistakes a kernel's code bytes ``b`` [R, W] may hold, as ``(cause, finding, read)``; ``read()``
    gives the codes [R, C] fpsim would compare if the candidate made that mistake, and the mask of the codes the
    mistake leaves unknown (shifted out of the stream), or None where the bytes cannot hold it.

    Nibble order (element 2j in the high nibble), the whole stream shifted by one element or one byte (an
    off-by-one pointer) or one row, and rows and columns transposed (the code matrix stored [C, R], or for packed codes
    the byte matrix [R, C/2] stored transposed)."""
    W = b.shape[1]
    unpack = unpack_fp4 if is_packed else (lambda a: a)
    per = 2 if is_packed else 1  # codes per byte

    def shifted(s: int):
        def read():
            u = unpack(b).reshape(-1)
            # the candidate's code j is fpsim's code j − s: read it back s codes later; the s codes at the
            # stream's end have no candidate byte (and the first s candidate codes no fpsim code)
            out = np.roll(u, -s)
            lost = np.zeros(u.size, bool)
            if s > 0:
                lost[-s:] = True
            else:
                lost[:-s] = True
            return out.reshape(R, -1)[:, :C], lost.reshape(R, -1)[:, :C]
        return read

    out: list[tuple[str, str, object]] = []
    if is_packed:
        out.append(("nibble packing order", "the candidate puts element 2j in the HIGH nibble (fpsim, cvt.*.e2m1x2 "
                    "and cuBLAS: low nibble)", lambda: (unpack_fp4(((b << 4) | (b >> 4)).astype(np.uint8))[:, :C],
                                                         None)))
    row = W * per  # codes per candidate row: a row offset is a shift by one row of the stream
    for s in (1, -1) + ((2, -2) if is_packed else ()) + ((row, -row) if R > 1 and row > 2 else ()):
        unit = ("one element" if abs(s) == 1 else "one byte (two codes)" if abs(s) == 2 == per
                else f"one row ({row} codes)")
        where = "i−" if s > 0 else "i+"
        out.append(("shifted codes", f"the candidate's codes are fpsim's shifted by {unit}: code i holds fpsim's "
                    f"code {where}{abs(s)} of the row-major stream (an off-by-one offset)", shifted(s)))
    if R > 1 and C > 1:
        if b.size == C * (-(-R // per)):
            out.append(("transposed code layout", "the candidate's codes are fpsim's with rows and columns "
                        f"transposed (the code matrix stored [{C}, {R}] instead of [{R}, {C}])",
                        lambda: (unpack(b.reshape(C, -1))[:, :R].T, None)))
        if is_packed and W > 1:
            out.append(("transposed code layout", f"the candidate's packed bytes are fpsim's [{R}, {W}] byte matrix "
                        f"stored transposed ([{W}, {R}])", lambda: (unpack_fp4(b.reshape(W, R).T)[:, :C], None)))
    return out


def _candidate_scales(candidate_scales, R: int, nb: int, sch: BlockScheme, ours_s, swizzled: bool, what: str):
    """Candidate scales [R, nb] in the plain layout, and a finding when the layout was not the declared one."""
    kind = sch.kind
    cs = np.asarray(candidate_scales)
    if kind is Kind.FP32:
        if cs.dtype != np.float32:
            raise ValueError(f"candidate scales of {sch.name} must be float32, got {cs.dtype}")
    elif cs.dtype.kind not in "iu" or (cs.size and (cs.min() < 0 or cs.max() > 0xFF)):
        raise ValueError(f"candidate scales must be raw scale bytes (uint8), got dtype {cs.dtype}")
    cs = cs.reshape(-1).astype(ours_s.dtype)
    n_sw = (128 * -(-R // 128)) * (4 * -(-nb // 4))
    closer = lambda a, b: np.count_nonzero(a != ours_s) * 2 < np.count_nonzero(b != ours_s)  # noqa: E731
    if swizzled:
        if kind is Kind.FP32:
            raise ValueError("FP32 scales have no swizzled layout")
        if cs.size != n_sw:
            extra = " (that is the plain [rows, blocks] size: drop swizzled)" if cs.size == R * nb else ""
            raise ValueError(f"expected {n_sw} swizzled scale bytes for [{R}, {nb}] scales, got {cs.size}{extra}")
        un = unswizzle_scales(cs, R, nb)
        if n_sw == R * nb and closer(cs.reshape(R, nb), un):
            return un, cs.reshape(R, nb), ("swizzled scale layout: the scales are in the plain [rows, blocks] "
                                           "layout, not swizzled as declared")
        return un, None, None
    if cs.size == R * nb:
        plain = cs.reshape(R, nb)
        if kind is not Kind.FP32 and n_sw == R * nb:
            un = unswizzle_scales(cs, R, nb)
            if closer(un, plain):
                return plain, un, ("swizzled scale layout: the candidate's scales are fpsim's in the Blackwell "
                                   "swizzled layout (pass swizzled=True / --swizzled)")
        if np.count_nonzero(plain != ours_s):
            # transposed ([blocks, rows] flattened) or shifted by one byte (an off-by-one offset): the reading
            # that fixes more than half of the differing bytes, the transpose first
            alts = []
            if R > 1 and nb > 1:
                alts.append((cs.reshape(nb, R).T, f"transposed scale layout: the candidate's scales are fpsim's "
                             f"[{R}, {nb}] scales stored transposed ([{nb}, {R}], blocks-major)"))
            for sh in (1, -1):
                alts.append((np.roll(cs, -sh).reshape(R, nb), f"shifted scales: the candidate's scale bytes are "
                             f"fpsim's shifted by one byte (byte i holds fpsim's byte i{'−' if sh > 0 else '+'}1)"))
            alt, note = min(alts, key=lambda a: np.count_nonzero(a[0] != ours_s))
            if closer(alt, plain):
                return plain, alt, note
        return plain, None, None
    if kind is not Kind.FP32 and cs.size == n_sw:
        un = unswizzle_scales(cs, R, nb)
        plain = np.zeros((R, nb), ours_s.dtype)
        plain.reshape(-1)[:] = cs[: R * nb]
        note = (f"swizzled scale layout: {cs.size} scale bytes is the swizzled size of [{R}, {nb}] (pass "
                "swizzled=True / --swizzled)" + ("; unswizzled they equal fpsim's" if np.array_equal(un, ours_s)
                                                 else ""))
        return plain, un, note
    # a kernel with another block width (1×32 where NVFP4 has 1×16, or 1×16 for MX) is a usage error, but say so
    width = nb * sch.block[1]
    other = [w for w in (16, 32, 64, 128) if w != sch.block[1] and width and cs.size == R * -(-width // w)]
    hint = f"; that is one per 1×{other[0]} block: another block size (--block)" if other else ""
    raise ValueError(f"candidate scales have {cs.size} values; expected {R}×{nb} = {R * nb} (one per block) "
                     f"for {what}{hint}")


def _reference(x32: np.ndarray, sch: BlockScheme, ax: int, ref: Convention, seed: int | None = None):
    """fpsim's bytes: the 2-D view, codes [R, nb·BC], scales [R, nb], amax (fpsim.quantize unless the
    reference uses a convention only the model has, e.g. a scale clamp); ``seed``: stochastic rounding's."""
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(-1, x32.shape[ax])
    view = TensorView(X, sch.block)
    model_only = {k for k in ref.changes() if k != "nan_amax"}
    if not model_only:
        q = quantize(x32, sch, axis=ax, nan_amax=ref.nan_amax, seed=seed)
        c = (unpack_fp4(q.data) if sch.element.bits == 4 else q.data).reshape(view.R, -1)
        codes = np.zeros((view.R, view.nb * view.BC), np.uint8)
        codes[:, : view.C] = c[:, : view.C]
        return view, codes, np.ascontiguousarray(q.scales).reshape(view.R, view.nb), np.asarray(q.amax, np.float32)
    if sch.four_over_six:
        raise ValueError(f"{', '.join(sorted(model_only))} cannot be combined with four-over-six")
    codes, scales = model_bytes(view, sch, ref)
    amax = np.asarray(np.nan, np.float32)
    if sch.tensor_scale:
        rows = view.amax_rows(ref.nan_amax, ref.inf_amax, bool(sch.per_row_scale))
        amax = np.asarray(ref.amax if ref.amax is not None else (rows if sch.per_row_scale else
                                                                  (rows[0] if rows.size else 0.0)), np.float32)
    return view, codes, scales, amax


def _schemes(scheme, rounding: str, seed, sr_bits, scale_min, nan_amax: str):
    """The checked arguments of :func:`diff`: the scheme, whether the candidate rounds stochastically, its K, and
    the scheme under round-to-nearest and under stochastic rounding (None unless ``sr``)."""
    sch = get_scheme(scheme)
    if sch.kind is Kind.CAST or sch.block is None:
        raise ValueError(f"diff compares block-scaled schemes (nvfp4, mx*, fp8_block128), not {sch.name}")
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', not {rounding!r}")
    sr = rounding == "sr" or sch.rounding is Rounding.SR
    if not sr and (seed is not None or sr_bits is not None):
        raise ValueError("seed and sr_bits are stochastic rounding's: give rounding='sr' (--rounding sr)")
    if sr and (scale_min is not None or sch.four_over_six):
        raise ValueError("diff with stochastic rounding takes no scale_min and no four-over-six")
    if sr_bits is not None and not 1 <= int(sr_bits) <= 24:
        raise ValueError("sr_bits must be in 1..24")
    if nan_amax not in ("propagate", "ignore"):
        raise ValueError("nan_amax must be 'propagate' or 'ignore'")
    if scale_min is not None and sch.kind is not Kind.TWO_LEVEL:
        raise ValueError(f"scale_min applies to two-level (E4M3-scaled) schemes, not {sch.name}")
    k = int(sr_bits) if sr_bits is not None else sch.k
    rne_sch = sch.replace(rounding=Rounding.RNE) if sch.rounding is not Rounding.RNE else sch
    return sch, sr, k, rne_sch, sch.replace(rounding=Rounding.SR, sr_bits=k) if sr else None


def _assign(ev: Evaluator, order: list[Outcome], layout_c, layout_s, full: bool = False):
    """Per mismatching code / scale byte, the index in ``order`` of the first outcome that explains it (−1 none;
    −2 the layout finding).  Unless ``order`` starts with a full explanation (``full``), a partial one names the
    cause of the codes (scales) it reproduces only where it is :meth:`~Outcome.credible` for them."""
    nbc = int(ev.bad_c.sum())
    ci = np.full(nbc, -1, np.int32)
    si = np.full(ev.bad_s.shape, -1, np.int32)
    for k, o in enumerate(order):
        if o.hit_codes is not None and (full or o.credible(ev.n_bad, "codes")):
            h = np.unpackbits(o.hit_codes, count=nbc).astype(bool)
            ci[h & (ci == -1)] = k
        if o.hit_scales is not None and (full or o.credible(ev.n_bad, "scales")):
            si[o.hit_scales & (si == -1)] = k
    full_c = np.full(ev.bad_c.shape, -1, np.int32)
    full_c[ev.bad_c] = ci
    full_c[layout_c] = -2
    si[layout_s] = -2
    return full_c, si


def diff(candidate_codes, candidate_scales, x, scheme="nvfp4", axis: int = -1, candidate_amax=None,
         packed: bool = True, swizzled: bool = False, show: int = 10, nan_amax: str = "propagate",
         scale_min: float | None = None, rounding: str = "rne", seed: int | None = None,
         sr_bits: int | None = None, rht: bool = False) -> DiffReport:
    """Compare another implementation's codes and scales with fpsim's, and find the conventions that explain them.

    fpsim quantizes ``x`` with ``scheme`` (SPEC §4–§6).  Every hypothesis of :mod:`fpsim.oracle.hypotheses`
    that applies (other scale rules and FP32 operation orders, encode multipliers, tie rules and rounding
    modes, NaN / inf policies, a dropped tensor scale, another block shape or amax, scale clamps, MX byte-0
    blocks, four-over-six, …) is computed over the whole tensor; all that reproduce every byte are reported
    (simplest first), else the best partial ones and pairs of them.  Each mismatch gets the cause
    (:data:`CAUSES`) of the best hypothesis that explains it.  The whole diagnosis is vectorised (no loop
    over mismatches).

    Parameters
    ----------
    candidate_codes
        Element codes in fpsim's layout: the quantized axis last (``np.moveaxis(x, axis, -1)``), one row per
        row of that view, each row exactly ``C`` codes long or padded to whole blocks; for 4-bit elements two
        codes per byte (element 2j in the low nibble) unless ``packed=False`` (one code per byte).
    candidate_scales
        Raw scale bytes, one per block, ``[rows, blocks]`` (float32 for FP32 scales); with ``swizzled=True``
        the 1-D Blackwell layout (SPEC §4).
    x
        The input both sides quantized (converted to float32 first).
    scheme, axis
        As for :func:`fpsim.quantize` (block-scaled schemes; the scheme's block shape, scale rule,
        four-over-six, tensor and per-row scale options apply).
    candidate_amax
        Optional candidate tensor amax (float32) of two-level schemes.
    show
        How many mismatches of each kind to list.
    nan_amax, scale_min
        Reference options: NaN policy of every amax (``"propagate"`` or ``"ignore"``, SPEC §9); a lower
        clamp on the two-level block scale before it is encoded (torchao: ``2**-6``; fpsim: none).
    rounding, seed, sr_bits
        The candidate's element rounding: ``"rne"`` (the hypotheses above; where none explains the codes and
        every differing one is a neighbour of x·enc_b with unbiased away-roundings, the cause is "stochastic
        rounding") or ``"sr"`` (also implied by an SR scheme): with ``seed`` fpsim's bits for that seed and
        ``sr_bits`` (default the scheme's K) are the reference, and a mismatch is checked against other K;
        without a seed there are no bits to compare, so a code "mismatches" when it is neither neighbour of
        x·enc_b, and the away-roundings are tested for bias (:mod:`fpsim.oracle.rounding`).  The block scales
        do not depend on the rounding; the scale hypotheses run for ``"rne"`` only.
    rht
        The reference quantizes the random-Hadamard-transformed input, as the NVFP4 recipe's Wgrad operands are
        (:func:`fpsim.recipe.quantize_operand`, SPEC §7): ``fpsim.transforms.rht(x, 16, "recipe", axis=axis)`` —
        16-point tiles along the quantized axis (its length must be a multiple of 16), the fixed sign vector
        :data:`fpsim.transforms.RECIPE_SIGNS`, the input rounded to BF16 (RNE) first and the float32 output
        rounded to BF16 again (``bf16_in=bf16_out=True``), then quantized as above.  Whatever ``rht`` says, when
        more than :data:`RHT_TRY_RATE` of the codes differ (round-to-nearest, no layout finding, the axis a
        multiple of 16), fpsim also compares with the RHT toggled (applied when not asked for, removed when
        asked for) and then with the sign vector the candidate's codes imply (sign of ``x_i · (v·H)_i`` summed
        over the tiles, ``v`` its element values): a reference that reproduces more than half of the differing
        bytes becomes a finding (cause "random Hadamard transform" or "RHT with other signs"), its bytes get
        that cause, and the rest is diagnosed against it.

    Returns
    -------
    DiffReport (``ValueError`` for unusable inputs; :class:`DiagnosisError` for a failure of fpsim's own)
    """
    sch, sr, k, rne_sch, sr_sch = _schemes(scheme, rounding, seed, sr_bits, scale_min, nan_amax)
    ref = Convention(nan_amax=nan_amax, scale_min=None if scale_min is None else float(scale_min))
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("x needs at least one axis")
    if not -x32.ndim <= axis < x32.ndim:
        raise ValueError(f"axis {axis} out of range for shape {x32.shape}")
    ax = axis % x32.ndim
    bits_sch = sr_sch if sr and seed is not None else rne_sch
    if rht and x32.shape[ax] % RHT_SIZE:
        raise ValueError(f"rht: the quantized axis has {x32.shape[ax]} elements, not a multiple of the Hadamard "
                         f"size {RHT_SIZE}")
    x_ref = _rht_input(x32, ax, "recipe") if rht else x32
    view, ours_p, ours_s, amax_ours = _reference(x_ref, bits_sch, ax, ref, seed if sr else None)
    sch = rne_sch  # the hypotheses' and the listings' scheme: the scales are the same under either rounding
    R, C, BC, nb = view.R, view.C, view.BC, view.nb
    moved = tuple(x32.shape[:ax] + x32.shape[ax + 1:] + (x32.shape[ax],))
    what = f"x of shape {x32.shape} along axis {ax}"
    findings: list[str] = []
    cand, fixed, layout_c, lay_c = _codes_layout(candidate_codes, ours_p, view, sch, packed, what, findings)
    cand_s, fixed_s, layout_s, lay_s = _scales_layout(candidate_scales, ours_s, view, sch, swizzled, what, findings)
    amax_cand = amax_match = None
    if candidate_amax is not None and sch.tensor_scale:
        if np.size(candidate_amax) != amax_ours.size:
            raise ValueError(f"candidate amax has {np.size(candidate_amax)} values, expected {amax_ours.size}")
        amax_cand = np.asarray(candidate_amax, np.float32).reshape(amax_ours.shape)
        amax_match = bool(np.all((amax_cand == amax_ours) | (np.isnan(amax_cand) & np.isnan(amax_ours))))
        if not amax_match:
            findings.append(f"tensor amax differs: ours {amax_ours.tolist()}, candidate {amax_cand.tolist()}")
    with internal_errors():  # the inputs are checked: from here on an exception is fpsim's bug (DiagnosisError)
        cand_p = ours_p.copy()
        cand_p[:, :C] = fixed
        ev = ev0 = Evaluator(view, sch, ref, ours_p, ours_s, cand_p, fixed_s, amax_ours, amax_cand)
        alt = None
        if (not sr and lay_c is None and lay_s is None and C and C % RHT_SIZE == 0
                and np.count_nonzero(fixed != ours_p[:, :C]) > RHT_TRY_RATE * R * C):
            alt = _rht_reference(x32, ax, rht, sch, ref, fixed, fixed_s, ours_p, ours_s)
        if alt is not None:  # the rest is diagnosed against the toggled-RHT reference (as after a layout finding)
            findings.insert(0, alt.finding)
            cand_p = alt.ours_p.copy()
            cand_p[:, :C] = fixed
            ev = Evaluator(alt.view, sch, ref, alt.ours_p, alt.ours_s, cand_p, fixed_s, alt.amax, amax_cand)
        ranked, order, explained = ([], [], []) if sr else _diagnose(ev, sch, ref, ev.amax_ours, amax_cand)
        if not ev.n_bad and (layout_c.any() or layout_s.any()):
            explained = [c for c in (lay_c, lay_s) if c is not None]
        ci, si = _assign(ev, order, layout_c, layout_s, bool(explained))
        if alt is not None:  # the bytes only the toggled reference reproduces are its cause's
            only = np.zeros(ours_p.shape, bool)
            only[:, :C] = (fixed != ours_p[:, :C]) & (fixed == alt.ours_p[:, :C])
            ci = np.where(only, _RHT, ci)
            si = np.where(~_same_scales(fixed_s, ours_s) & _same_scales(fixed_s, alt.ours_s), _RHT, si)
            explained = [f"{alt.name}; and {n}" for n in explained] or ([] if ev.n_bad else [alt.name])
        bad_c = np.zeros(ours_p.shape, bool)
        bad_c[:, :C] = cand != ours_p[:, :C]
        bad_s = ~_same_scales(cand_s, ours_s)
        hyps = [o.hyp for o in order]
        cidx, detail_own = _code_cause_index(ci, si, hyps, BC)
        check = None
        if sr or (ev.bad_c.any() and not explained):
            check, compared, on_grid = check_blocks(ev, _same_scales(fixed_s, ev.ours_s), cand_p, ev.ours_p, k)
            if sr and seed is None:  # no bits to compare: a code mismatches when no rounding of x·enc_b gives it
                bad_c = compared & ~on_grid
                bad_c[:, C:] = False
            elif sr and ev.n_bad and _same_scales(fixed_s, ours_s).all():
                explained = other_k(lambda kk: _reference(x32, sr_sch.replace(sr_bits=kk), ax, ref, seed)[1], k, cand_p)
                mode = None if explained else _deterministic(x32, sch, ax, ref, cand_p)
                if mode is not None:  # no random bits at all: the kernel rounds deterministically
                    hyps.append(Hypothesis(f"candidate = {mode} ({ROUNDINGS[mode]}), not stochastic rounding",
                                           "rounding mode"))
                    explained = [hyps[-1].name]
                    cidx = np.where(bad_c & (cidx == -1), len(hyps) - 1, cidx)
            # with a seed, "other random bits" needs away-roundings that a stochastic rounding could have made
            # round-to-nearest comparison: "stochastic rounding" only from a sample that can tell it from RNE
            stochastic = ((check.stochastic or bool(explained)) if sr and seed is not None
                          else sr or (check.stochastic and check.judged))
            cidx = sr_causes(cidx, bad_c, on_grid, compared, stochastic, sr)
            findings += rounding_findings(check, sr, seed, k, bool(explained))
        report = DiffReport(
            scheme=sch.name, n_elements=R * C, n_code_mismatches=int(bad_c.sum()), n_blocks=R * nb,
            n_scale_mismatches=int(bad_s.sum()),
            amax_ours=amax_ours.tolist() if sch.tensor_scale else None,
            amax_candidate=None if amax_cand is None else amax_cand.tolist(), amax_match=amax_match,
            findings=findings, explained_by=explained,
            hypotheses=[o.to_dict(ev.n_bad) for o in ranked], rounding="sr" if sr else "rne",
            seed=None if seed is None else int(seed), rounding_check=check,
        )
        sr_cause = "SR random bits" if sr else "stochastic rounding"
        rht_cause = None if alt is None else alt.cause
        causes: Counter = Counter()
        for kk, n in zip(*np.unique(cidx[bad_c], return_counts=True)):
            causes[_cause_name(int(kk), hyps, lay_c, sr_cause, rht_cause)] += int(n)
        for kk, n in zip(*np.unique(si[bad_s], return_counts=True)):
            causes[_cause_name(int(kk), hyps, lay_s, sr_cause, rht_cause)] += int(n)
        if alt is not None and amax_match is False and not ev.bad_a:  # the toggled reference's amax
            causes[alt.cause] += 1
        elif ev.bad_a and (alt is None or amax_match is False):
            # the amax: the cause of the best hypothesis that reproduces it, else its own (another amax)
            causes[next((o.hyp.cause for o in order if o.explains_amax), "tensor amax")] += 1
        report.causes = dict(causes)
        # the listings show fpsim's reference (x, scaled, ours) as asked; the cause says what explains the byte
        report.code_mismatches = _code_listing(ev0, sch, cidx, detail_own, hyps, bad_c, ours_p, ev0.cand_p if not
                                               layout_c.any() else _pad(cand, ours_p), show, moved, ax, sr_cause,
                                               lay_c, rht_cause)
        report.scale_mismatches = _scale_listing(ev0, sch, si, hyps, bad_s, ours_s, cand_s, show, lay_s, rht_cause)
        return report


@dataclass
class _RhtReference:
    """The toggled-RHT reference a candidate follows: its cause, finding, ``explained_by`` phrase and bytes."""

    cause: str
    finding: str
    name: str
    view: TensorView
    ours_p: np.ndarray
    ours_s: np.ndarray
    amax: np.ndarray


def _rht_input(x32: np.ndarray, ax: int, signs) -> np.ndarray:
    """The recipe's operand transform (:func:`fpsim.recipe.quantize_operand`): ``rht(x, 16, signs, axis)`` with
    BF16 rounding of its input and output (``bf16_in = bf16_out = True``, the defaults), in float32 (SPEC §7)."""
    return _rht(x32, RHT_SIZE, signs, axis=ax)


def _implied_signs(x32: np.ndarray, ax: int, cand: np.ndarray, sch: BlockScheme) -> np.ndarray:
    """The ±1 sign vector a candidate quantized from ``rht(x, 16, s)`` implies, from its element codes alone.

    A tile maps x to y = (x ∘ s)·H/4 and H·H = 16·I, so (y·H/4)_i = s_i·x_i: s_i is the sign of x_i·(v·H)_i with
    ``v`` the candidate's element values.  Tiles lie inside one block (16 divides every block width, both start at
    column 0), whose positive scale does not change that sign; the vote over every tile outweighs the rounding.
    """
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(-1, x32.shape[ax])
    with np.errstate(all="ignore"):
        v = np.nan_to_num(sch.element.decode_table()[cand], nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
        z = v.reshape(-1, RHT_SIZE) @ np.sign(hadamard_matrix(RHT_SIZE, "none")).astype(np.float32)
        vote = (np.sign(X.reshape(-1, RHT_SIZE)) * np.sign(z)).sum(axis=0, dtype=np.float64)
    return np.where(vote >= 0, 1.0, -1.0).astype(np.float32)


def _rht_reference(x32: np.ndarray, ax: int, asked: bool, sch: BlockScheme, ref: Convention, cand: np.ndarray,
                   cand_s: np.ndarray, ours_p: np.ndarray, ours_s: np.ndarray) -> _RhtReference | None:
    """The reference with the RHT toggled (applied where ``asked`` is False, removed where True), else the RHT with
    the signs the candidate implies (:func:`_implied_signs`), when it leaves fewer than half of the differing
    bytes (codes and scale bytes) of fpsim's reference ``ours_p`` / ``ours_s`` — the layout readings' test."""
    C = cand.shape[1]
    n_plain = int(np.count_nonzero(cand != ours_p[:, :C])) + int(np.count_nonzero(~_same_scales(cand_s, ours_s)))

    def fits(xr: np.ndarray):
        view, p, sc, amax = _reference(xr, sch, ax, ref)
        n = int(np.count_nonzero(cand != p[:, :C])) + int(np.count_nonzero(~_same_scales(cand_s, sc)))
        return (view, p, sc, amax, n_plain - n) if n < n_plain / 2 else None

    how = ("16-point tiles along the quantized axis, the recipe's sign vector, BF16 in and out")
    got = fits(x32 if asked else _rht_input(x32, ax, "recipe"))
    if got is not None:
        view, p, sc, amax, fixed = got
        if asked:
            finding = (f"random Hadamard transform: the candidate quantized x itself, not rht(x) as asked ({how}; "
                       f"SPEC §7): that reproduces {fixed} of the {n_plain} differing bytes")
            name = "candidate = fpsim's bytes of x without the random Hadamard transform"
        else:
            finding = (f"random Hadamard transform: the candidate quantized rht(x) ({how}; SPEC §7), as the NVFP4 "
                       f"recipe's Wgrad operands are, where fpsim quantized x (pass rht=True / --rht): that "
                       f"reproduces {fixed} of the {n_plain} differing bytes")
            name = "candidate = fpsim's bytes of rht(x) (16-point, the recipe's signs, BF16 in and out)"
        return _RhtReference("random Hadamard transform", finding, name, view, p, sc, amax)
    signs = _implied_signs(x32, ax, cand, sch)
    if np.array_equal(signs, RECIPE_SIGNS):
        return None
    got = fits(_rht_input(x32, ax, signs))
    if got is None:
        return None
    view, p, sc, amax, fixed = got
    text = " ".join("+" if v > 0 else "−" for v in signs)
    what = "no sign flips (signs='none')" if (signs > 0).all() else f"the sign vector [{text}]"
    finding = (f"RHT with other signs: the candidate quantized rht(x) with {what}, implied by its codes, instead "
               f"of the recipe's fixed vector (16-point tiles along the quantized axis, BF16 in and out; SPEC §7): "
               f"that reproduces {fixed} of the {n_plain} differing bytes")
    name = f"candidate = fpsim's bytes of rht(x) with {what}"
    return _RhtReference("RHT with other signs", finding, name, view, p, sc, amax)


def _deterministic(x32: np.ndarray, sch: BlockScheme, ax: int, ref: Convention, cand_p: np.ndarray) -> str | None:
    """The round-to-nearest or directed mode (:data:`ROUNDINGS` fpsim can run) whose codes are all the candidate's,
    or None: a kernel asked for stochastic rounding that does not round stochastically at all."""
    for mode in ("rne", "rtz", "rna", "rup", "rdown"):
        if np.array_equal(_reference(x32, sch.replace(rounding=mode), ax, ref)[1], cand_p):
            return mode
    return None


def _codes_layout(candidate_codes, ours_p, view: TensorView, sch: BlockScheme, packed: bool, what: str,
                  findings: list):
    """The candidate's codes as given, as compared (read back through the layout mistake of
    :func:`_code_readings` that fixes most of them, with a finding), the mask [R, nb·BC] of the codes the
    layout explains, and the layout's cause (None: the bytes are in fpsim's layout)."""
    C = view.C
    cand, readings = _candidate_codes(candidate_codes, view.R, C, view.nb, view.BC, sch.element, packed, what)
    ours = ours_p[:, :C]
    layout_c = np.zeros(ours_p.shape, bool)
    n_plain = int(np.count_nonzero(cand != ours))
    best = None
    for cause, note, read in readings if n_plain else ():
        alt, lost = read()
        # the codes a shift moves out of the stream count as mismatches: unknown, they cannot be credited to it
        n = int(np.count_nonzero((alt != ours) if lost is None else (alt != ours) | lost))
        # a layout mistake scrambles codes: it must fix most of them (at least half), and the best reading wins
        # (ties: the order above, nibble order first)
        if n < n_plain / 2 and (best is None or n < best[0]):
            best = (n, cause, note, alt, lost)
    if best is None:
        return cand, cand, layout_c, None
    _, cause, note, alt, lost = best
    findings.append(f"{cause}: {note}")
    fixed = (cand != ours) & (alt == ours)
    if lost is not None:  # the codes shifted out of the stream: the shift explains them, whatever they hold
        fixed |= (cand != ours) & lost
        alt = np.where(lost, ours, alt)
    layout_c[:, :C] = fixed
    return cand, alt, layout_c, cause


def _scales_layout(candidate_scales, ours_s, view: TensorView, sch: BlockScheme, swizzled: bool, what: str,
                   findings: list):
    """The candidate's scale bytes as given, as compared (the other layout where that matches, with a finding),
    the mask of the bytes the layout explains and the layout's cause (None: fpsim's layout)."""
    cand_s, alt_s, note = _candidate_scales(candidate_scales, view.R, view.nb, sch, ours_s, swizzled, what)
    if note is None:
        return cand_s, cand_s, np.zeros(ours_s.shape, bool), None
    findings.append(note)
    return cand_s, alt_s, (cand_s != ours_s) & (alt_s == ours_s), note.split(":")[0]


def _pad(cand: np.ndarray, like: np.ndarray) -> np.ndarray:
    out = like.copy()
    out[:, : cand.shape[1]] = cand
    return out


def _same_scales(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == np.float32:
        return a.view(np.uint32) == b.view(np.uint32)
    return a == b


def _diagnose(ev: Evaluator, sch: BlockScheme, ref: Convention, amax_ours, amax_cand):
    """Every hypothesis over the whole tensor (and pairs when none explains every byte): the outcomes that
    explain something, in the order causes are assigned, and the names of the full explanations."""
    if not ev.n_bad:
        return [], [], []
    sub = bool(subnormal_codes(ev.ours_p[ev.bad_c], sch.element).any()) if sch.element.subnormals else False
    hyps = generate(sch, ref, ev.view, ev.ours_s, ev.cand_s, amax_ours, amax_cand, bool(ev.bad_s.any()), sub)
    outs = [ev.evaluate(h, i) for i, h in enumerate(hyps)]
    full = lambda o: o.explains == ev.n_bad and o.breaks == 0  # noqa: E731
    if not any(full(o) for o in outs):  # the best that explains something (rank puts 0 explained, 0 broken first)
        best = next(iter(rank([o for o in outs if o.explains], ev.n_bad)), None)
        if best is not None and best.hyp.amax_range is not None:
            h = refine_amax(ev.view, sch, ref, ev.cand_p, ev.cand_s, best.hyp)
            if h is not None:
                outs.append(ev.evaluate(h, len(outs)))
    if not any(full(o) for o in outs):
        outs += [ev.evaluate(h, len(outs) + i) for i, h in enumerate(pairs(outs))]
    ranked = [o for o in rank(outs, ev.n_bad) if o.explains]
    explained = [o.hyp.name for o in ranked if full(o)]
    causal = [o for o in ranked if not o.breaks]  # a hypothesis that changes matching bytes names no cause
    if causal and causal[0].hyp.parts and full(causal[0]):  # two bugs: each byte gets the part that explains it
        causal = [o for o in outs if o.hyp in causal[0].hyp.parts] + causal
    return ranked, causal, explained


def _code_cause_index(ci: np.ndarray, si: np.ndarray, hyps: list[Hypothesis], BC: int):
    """Code cause indices, with "codes from the candidate's own scales" replaced by the cause of the block's
    scale byte where it has one; and the mask of the codes so replaced."""
    own = np.array([h.own_scales for h in hyps] + [False] * 5, bool)  # indices −5 … −1 read the tail
    is_own = own[ci]
    if not is_own.any():
        return ci, is_own
    blk = np.repeat(si, BC, axis=1)[:, : ci.shape[1]]
    take = is_own & (blk >= 0)
    out = np.where(take, blk, ci)
    return out, is_own


def _cause_name(k: int, hyps: list[Hypothesis], layout: str | None, sr_cause: str = "stochastic rounding",
                rht: str | None = None) -> str:
    if k == _RHT:
        return rht or "other"
    if k == SR_LIKE:
        return sr_cause
    if k == OFF_GRID:
        return "not a rounding of x·enc_b"
    if k == -2:  # the layout finding's cause (set only where a layout was found)
        return layout or "other"
    if k == -1:
        return "other"
    return hyps[k].cause


def _detail(k: int, own: bool, hyps: list[Hypothesis]) -> str:
    if own:
        return "element follows its block scale"
    return hyps[k].name if k >= 0 else ""


def _code_listing(ev: Evaluator, sch: BlockScheme, cidx, own, hyps, bad_c, ours_p, cand_p, show: int, moved, ax,
                  sr_cause: str = "stochastic rounding", layout: str | None = None, rht: str | None = None):
    rows, cols = np.nonzero(bad_c)
    rows, cols = rows[:show], cols[:show]
    BC = ev.view.BC
    table = sch.element.decode_table()
    x = ev.view.P3.reshape(ev.view.R, -1)[rows, cols]
    f = ev.ref_factor
    with np.errstate(all="ignore"):
        if ev.ref_op == "mul":
            y = (x * f[rows, cols // BC]).astype(np.float32)
        elif ev.ref_op == "div":
            y = (x / f[rows, cols // BC]).astype(np.float32)
        else:
            y = ((x * f[0][rows, cols // BC]).astype(np.float32) / f[1][rows, cols // BC]).astype(np.float32)
    out = []
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        o, k, kk = int(ours_p[r, c]), int(cand_p[r, c]), int(cidx[r, c])
        out.append({
            "index": _orig_index(r, c, moved, ax), "row": r, "col": c, "block": [r, c // BC],
            "x": float(x[i]), "x_hex": hex32(x[i]), "scaled": float(y[i]), "scaled_hex": hex32(y[i]),
            "ours": o, "ours_hex": f"0x{o:X}", "candidate": k, "candidate_hex": f"0x{k:X}",
            "ours_value": float(table[o]), "candidate_value": float(table[k]),
            "cause": _cause_name(kk, hyps, layout, sr_cause, rht),
            "detail": _detail(kk, bool(own[r, c]), hyps),
        })
    return out


def _scale_listing(ev: Evaluator, sch: BlockScheme, si, hyps, bad_s, ours_s, cand_s, show: int,
                   layout: str | None = None, rht: str | None = None):
    vmax = ev.view.vmax_bits(ev.ref.nan_amax, ev.ref.inf_amax).view(np.float32)
    fp32 = sch.kind is Kind.FP32
    hx = hex32 if fp32 else (lambda v: f"0x{int(v):02X}")
    out = []
    for r, j in zip(*(a[:show].tolist() for a in np.nonzero(bad_s))):
        o, k, kk = ours_s[r, j], cand_s[r, j], int(si[r, j])
        out.append({"block": [r, j], "vmax": float(vmax[r, j]), "vmax_hex": hex32(vmax[r, j]),
                    "ours": o.item(), "ours_hex": hx(o), "candidate": k.item(), "candidate_hex": hx(k),
                    "cause": _cause_name(kk, hyps, layout, rht=rht), "detail": _detail(kk, False, hyps)})
    return out
