"""Compare another implementation's codes and scales with fpsim's, and rank the conventions that explain them.

:func:`diff` quantizes the input with fpsim (the reference), finds every mismatching code, scale byte and
amax, then tests every hypothesis of :mod:`fpsim.oracle.hypotheses` — another scale rule or operation order,
encode multiplier, tie rule, NaN / inf policy, dropped tensor scale, block shape, amax, clamp, … — against
the whole tensor, vectorised, and reports all that explain every byte (simplest first), or the best partial
ones, with pairs of them for two bugs at once.  Each mismatch then gets the cause of the best hypothesis
that explains it.

The steps live beside it: :mod:`~fpsim.oracle.reference` (fpsim's bytes), :mod:`~fpsim.oracle.layout` (the layout
readings of the candidate's bytes), :mod:`~fpsim.oracle.rhtcheck` (the reference with the RHT toggled),
:mod:`~fpsim.oracle.rounding` (the neighbour check) and :mod:`~fpsim.oracle.attribution` (each byte's cause).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._arrays import as_float32
from ..codecs import Rounding
from ..io import to_json
from ..schemes import BlockScheme, Kind, get_scheme
from .attribution import assign, cause_counts, code_cause_index, code_listing, scale_listing
from .common import DiagnosisError, f32_class, internal_errors
from .hypotheses import Evaluator, Hypothesis, Outcome, generate, pairs, rank, refine_amax
from .model import ROUNDINGS, Convention, subnormal_codes
from .producers import NOT_EXPLAINED, ConventionDiff, applies, diagnose
from .readings import read_candidate, rht_readings
from .reference import reference, same_scales
from .rhtcheck import RHT_SIZE, RHT_TRY_RATE, RhtReference, rht_attribution, rht_input
from .rounding import NeighbourCheck, check_blocks, other_k, rounding_findings, sr_causes

__all__ = ["CAUSES", "DiagnosisError", "DiffReport", "diff", "RHT_SIZE", "RHT_TRY_RATE"]


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
    "shifted scales": "the candidate's scale bytes are ours shifted by one byte (an off-by-one offset) or by another "
    "offset up to one row of blocks (the finding names it)",
    "transposed code layout": "the candidate's codes are ours with rows and columns transposed",
    "shifted codes": "the candidate's codes are ours shifted along the row-major stream: by one element, one byte or "
    "one row (an off-by-one offset), or by another offset up to one row of blocks (the finding names it)",
    "quantized along the wrong axis": "the candidate formed its blocks down the columns of the quantized [R, C] "
    "view instead of along its rows (fpsim's rules applied to the transpose), its bytes stored in the view's "
    "orientation or in the transpose's layout",
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
    "global scale": "the candidate forms the NVFP4 global scale with another formula or precision (compressed-tensors: "
    "fl(fl(1/amax)·2688), in bfloat16 for bfloat16 inputs; SPEC §4.1)",
    "zero-block rule": "the candidate gives a zero block another scale (compressed-tensors 0.125, ModelOpt 1.0)",
    "NaN codes": "the candidate writes NaN block scales or elements with other bytes (torchao, ModelOpt on x86)",
    "stored global scale": "the candidate stores another global scale (G ≈ 2688/amax or amax/2688, not the amax)",
    "decode order": "the candidate decodes the same bytes with another FP32 order (e.g. Transformer Engine's "
    "fl(e·fl(fl(s·amax)·fl(1/2688))))",
    "decode rounding": "the candidate rounds its decoded values (compressed-tensors: to bfloat16)",
    NOT_EXPLAINED: "producer conventions explain the candidate's other bytes, but not this one alone (two equally "
    "small sets of parts reproduce it with different causes, or none does)",
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
    conventions: ConventionDiff | None = None

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
        if self.conventions is not None:  # the decoded values and the stored global scale too
            same = same and not self.conventions.counts().get("values") and not self.conventions.global_cause
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
            "conventions": None if self.conventions is None else self.conventions.to_dict(),
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
        bytes_differ = self.n_code_mismatches or self.n_scale_mismatches or self.amax_match is False
        if not self.identical and bytes_differ and (self.explained_by or self.rounding == "rne"):
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
        if self.conventions is not None and not self.identical:
            lines += self.conventions.lines()
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


@dataclass(frozen=True)
class _Inputs:
    """The checked arguments of :func:`diff`: the input, its axis, the reference convention and the schemes."""

    x32: np.ndarray
    ax: int
    ref: Convention
    sch: BlockScheme  # round-to-nearest: the hypotheses' and the listings' scheme (the scales are the same)
    bits_sch: BlockScheme  # the scheme of fpsim's reference codes (stochastic rounding with a seed)
    sr: bool
    k: int
    seed: int | None
    sr_sch: BlockScheme | None


def _inputs(x, axis: int, scheme, rounding: str, seed, sr_bits, scale_min, nan_amax: str, rht: bool) -> _Inputs:
    """The checked arguments of :func:`diff` (``ValueError`` for unusable ones)."""
    sch, sr, k, rne_sch, sr_sch = _schemes(scheme, rounding, seed, sr_bits, scale_min, nan_amax)
    ref = Convention(nan_amax=nan_amax, scale_min=None if scale_min is None else float(scale_min))
    x32 = as_float32(x)
    if x32.ndim == 0:
        raise ValueError("x needs at least one axis")
    if not -x32.ndim <= axis < x32.ndim:
        raise ValueError(f"axis {axis} out of range for shape {x32.shape}")
    ax = axis % x32.ndim
    if rht and x32.shape[ax] % RHT_SIZE:
        raise ValueError(f"rht: the quantized axis has {x32.shape[ax]} elements, not a multiple of the Hadamard "
                         f"size {RHT_SIZE}")
    bits_sch = sr_sch if sr and seed is not None else rne_sch
    return _Inputs(x32, ax, ref, rne_sch, bits_sch, sr, k, seed, sr_sch)


def _compare_amax(candidate_amax, amax_ours: np.ndarray, sch: BlockScheme,
                  findings: list[str]) -> tuple[np.ndarray | None, bool | None]:
    """The candidate's tensor amax shaped as fpsim's and whether they match (None, None: none to compare)."""
    amax_cand = amax_match = None
    if candidate_amax is not None and sch.tensor_scale:
        if np.size(candidate_amax) != amax_ours.size:
            raise ValueError(f"candidate amax has {np.size(candidate_amax)} values, expected {amax_ours.size}")
        amax_cand = np.asarray(candidate_amax, np.float32).reshape(amax_ours.shape)
        amax_match = bool(np.all((amax_cand == amax_ours) | (np.isnan(amax_cand) & np.isnan(amax_ours))))
        if not amax_match:
            findings.append(f"tensor amax differs: ours {amax_ours.tolist()}, candidate {amax_cand.tolist()}")
    return amax_cand, amax_match


def _against_rht(alt: RhtReference, a: _Inputs, fixed: np.ndarray, fixed_s: np.ndarray, amax_cand) -> Evaluator:
    """The evaluator of the candidate's bytes (as read) against the toggled-RHT reference ``alt``."""
    return Evaluator(alt.view, a.sch, a.ref, alt.ours_p, alt.ours_s, _pad(fixed, alt.ours_p), fixed_s, alt.amax,
                     amax_cand)


def _rounding_check(a: _Inputs, ev: Evaluator, fixed_s: np.ndarray, bad_c: np.ndarray, cidx: np.ndarray,
                    hyps: list[Hypothesis], explained: list[str],
                    findings: list[str]) -> tuple[NeighbourCheck, np.ndarray, np.ndarray, list[str]]:
    """The neighbour check of the codes (:mod:`fpsim.oracle.rounding`), the code mismatches and cause indices after
    it, and the full explanations (another K, a deterministic mode, appended to ``hyps``); adds its findings."""
    C, cand_p = ev.view.C, ev.cand_p
    check, compared, on_grid = check_blocks(ev, same_scales(fixed_s, ev.ours_s), cand_p, ev.ours_p, a.k)
    if a.sr and a.seed is None:  # no bits to compare: a code mismatches when no rounding of x·enc_b gives it
        bad_c = compared & ~on_grid
        bad_c[:, C:] = False
    elif a.sr and ev.n_bad and same_scales(fixed_s, ev.ours_s).all():  # with sr, ev is fpsim's reference
        explained = other_k(lambda kk: reference(a.x32, a.sr_sch.replace(sr_bits=kk), a.ax, a.ref, a.seed)[1], a.k,
                            cand_p)
        mode = None if explained else _deterministic(a.x32, a.sch, a.ax, a.ref, cand_p)
        if mode is not None:  # no random bits at all: the kernel rounds deterministically
            hyps.append(Hypothesis(f"candidate = {mode} ({ROUNDINGS[mode]}), not stochastic rounding",
                                   "rounding mode"))
            explained = [hyps[-1].name]
            cidx = np.where(bad_c & (cidx == -1), len(hyps) - 1, cidx)
    # with a seed, "other random bits" needs away-roundings that a stochastic rounding could have made
    # round-to-nearest comparison: "stochastic rounding" only from a sample that can tell it from RNE
    stochastic = ((check.stochastic or bool(explained)) if a.sr and a.seed is not None
                  else a.sr or (check.stochastic and check.judged))
    cidx = sr_causes(cidx, bad_c, on_grid, compared, stochastic, a.sr)
    findings += rounding_findings(check, a.sr, a.seed, a.k, bool(explained))
    return check, bad_c, cidx, explained


def _amax_cause(ev: Evaluator, order: list[Outcome], alt: RhtReference | None, amax_match: bool | None) -> str | None:
    """The cause of a differing tensor amax, or None where it is not counted as a mismatch."""
    if alt is not None and amax_match is False and not ev.bad_a:  # the toggled reference's amax
        return alt.cause
    if ev.bad_a and (alt is None or amax_match is False):
        # the amax: the cause of the best hypothesis that reproduces it, else its own (another amax)
        return next((o.hyp.cause for o in order if o.explains_amax), "tensor amax")
    return None


def diff(candidate_codes, candidate_scales, x, scheme="nvfp4", axis: int = -1, candidate_amax=None,
         packed: bool = True, swizzled: bool = False, show: int = 10, nan_amax: str = "propagate",
         scale_min: float | None = None, rounding: str = "rne", seed: int | None = None,
         sr_bits: int | None = None, rht: bool = False, candidate_global=None,
         candidate_values=None) -> DiffReport:
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

    candidate_global, candidate_values
        NVFP4: the stored FP32 global scale and the decoded values (x's shape), compared too (``report.conventions``:
        the producer conventions' parts, :func:`fpsim.oracle.producers.diagnose`; a bfloat16 ``x`` is bfloat16 input).

    Returns
    -------
    DiffReport (``ValueError`` for unusable inputs; :class:`DiagnosisError` for a failure of fpsim's own)
    """
    a = _inputs(x, axis, scheme, rounding, seed, sr_bits, scale_min, nan_amax, rht)
    sch, ref, sr = a.sch, a.ref, a.sr
    x_ref = rht_input(a.x32, a.ax, "recipe") if rht else a.x32
    view, ours_p, ours_s, amax_ours = reference(x_ref, a.bits_sch, a.ax, ref, seed if sr else None)
    R, C, BC, nb = view.R, view.C, view.BC, view.nb
    moved = tuple(a.x32.shape[:a.ax] + a.x32.shape[a.ax + 1:] + (a.x32.shape[a.ax],))
    what = f"x of shape {a.x32.shape} along axis {a.ax}"
    findings: list[str] = []
    rd = read_candidate(candidate_codes, candidate_scales, view, a.bits_sch, ref, packed, swizzled, what, ours_p,
                        ours_s, seed if sr else None, not sr or seed is not None, findings)
    amax_cand, amax_match = _compare_amax(candidate_amax, amax_ours, sch, findings)
    with internal_errors():  # the inputs are checked: from here on an exception is fpsim's bug (DiagnosisError)
        cd, alt = _producers(x, a, rd, R, C, rht, nan_amax, scale_min, candidate_global, candidate_values), None
        if not sr and rd.lay_c is None and rd.lay_s is None and not (cd is not None and cd.explained_by):
            rd, alt = rht_readings(rd, a.x32, a.ax, rht, sch, ref, candidate_codes, candidate_scales, view, packed,
                                   swizzled, what, ours_p, ours_s, findings)
        cand, fixed, layout_c, lay_c = rd.cand, rd.fixed, rd.layout_c, rd.lay_c
        cand_s, fixed_s, layout_s, lay_s = rd.cand_s, rd.fixed_s, rd.layout_s, rd.lay_s
        ev = ev0 = Evaluator(view, sch, ref, ours_p, ours_s, _pad(fixed, ours_p), fixed_s, amax_ours, amax_cand)
        if alt is not None:  # the rest is diagnosed against the toggled-RHT reference (as after a layout finding)
            ev = _against_rht(alt, a, fixed, fixed_s, amax_cand)
        ranked, order, explained = ([], [], []) if sr else _diagnose(ev, sch, ref, ev.amax_ours, amax_cand)
        if not ev.n_bad and (layout_c.any() or layout_s.any()):
            explained = [c for c in (lay_c, lay_s) if c is not None]
        ci, si = assign(ev, order, layout_c, layout_s, bool(explained))
        if alt is not None:  # the bytes only the toggled reference reproduces are its cause's
            ci, si, explained = rht_attribution(alt, ci, si, explained, fixed, fixed_s, ours_p, ours_s, ev.n_bad)
        bad_c = np.zeros(ours_p.shape, bool)
        bad_c[:, :C] = cand != ours_p[:, :C]
        bad_s = ~same_scales(cand_s, ours_s)
        hyps = [o.hyp for o in order]
        cidx, detail_own = code_cause_index(ci, si, hyps, BC)
        check = None
        if sr or (ev.bad_c.any() and not explained and not (cd is not None and cd.explained_by)):
            check, bad_c, cidx, explained = _rounding_check(a, ev, fixed_s, bad_c, cidx, hyps, explained, findings)
        report = DiffReport(
            scheme=sch.name, n_elements=R * C, n_code_mismatches=int(bad_c.sum()), n_blocks=R * nb,
            n_scale_mismatches=int(bad_s.sum()), amax_ours=amax_ours.tolist() if sch.tensor_scale else None,
            amax_candidate=None if amax_cand is None else amax_cand.tolist(), amax_match=amax_match,
            findings=findings, explained_by=explained, hypotheses=[o.to_dict(ev.n_bad) for o in ranked],
            rounding="sr" if sr else "rne", seed=None if seed is None else int(seed), rounding_check=check)
        sr_cause = "SR random bits" if sr else "stochastic rounding"
        rht_cause = None if alt is None else alt.cause
        causes = cause_counts(cidx[bad_c], si[bad_s], hyps, lay_c, lay_s, sr_cause, rht_cause)
        amax_cause = _amax_cause(ev, order, alt, amax_match)
        if amax_cause is not None:
            causes[amax_cause] += 1
        report.causes = dict(causes)
        # the listings show fpsim's reference (x, scaled, ours) as asked; the cause says what explains the byte
        report.code_mismatches = code_listing(ev0, sch, cidx, detail_own, hyps, bad_c, ours_p, ev0.cand_p if not
                                              layout_c.any() else _pad(cand, ours_p), show, moved, a.ax, sr_cause,
                                              lay_c, rht_cause)
        report.scale_mismatches = scale_listing(ev0, sch, si, hyps, bad_s, ours_s, cand_s, show, lay_s, rht_cause)
        _with_conventions(report, cd if alt is None else None)
        return report


def _producers(x, a: _Inputs, rd, R: int, C: int, rht: bool, nan_amax: str, scale_min, glob,
               values) -> ConventionDiff | None:
    """The producer-convention diagnosis of the candidate as read (NVFP4 as the producers write it), or None; where
    producer parts explain the bytes, :func:`diff` tries no toggled RHT (with a layout read against it)."""
    if (not applies(a.sch) or a.sr or rht or rd.lay_c is not None or rd.lay_s is not None or nan_amax != "propagate"
            or scale_min is not None):
        return None
    vals = None if values is None else _values(values, a, R, C)
    return diagnose(np.moveaxis(a.x32, a.ax, -1).reshape(R, C), rd.cand, rd.cand_s, bf16=_is_bf16(x),
                    candidate_global=glob, candidate_values=vals)


def _is_bf16(x) -> bool:
    """Whether ``x`` is a bfloat16 array or tensor (the producers then round their intermediates to bfloat16)."""
    return str(getattr(x, "dtype", "")).replace("torch.", "") == "bfloat16"


def _values(v, a: _Inputs, R: int, C: int) -> np.ndarray:
    """The candidate's decoded values in the [R, C] view of the input (ValueError if their shape is not x's)."""
    v32 = as_float32(v)
    if v32.shape != a.x32.shape:
        raise ValueError(f"candidate values have shape {v32.shape}, the input {a.x32.shape}")
    return np.moveaxis(v32, a.ax, -1).reshape(R, C)


def _with_conventions(report: DiffReport, cd: ConventionDiff) -> None:
    """Put the producer-convention diagnosis into ``report``; where it reproduces every differing byte, its causes
    are the report's (the other hypotheses' for these bytes could name another library's arithmetic)."""
    if cd is None:
        return
    report.conventions = cd
    has_ne = NOT_EXPLAINED in cd.counts().get("codes", {}) or NOT_EXPLAINED in cd.counts().get("scales", {})
    if not cd.explained_by or (has_ne and report.explained_by):
        return  # no producer parts explain the bytes, or they tie where another hypothesis explains every byte
    counts: dict = {}
    for what in ("codes", "scales", "global"):
        for k, n in cd.counts().get(what, {}).items():
            counts[k] = counts.get(k, 0) + n
    report.causes = {}
    for k, n in counts.items():  # by CAUSES category; the parts themselves are each listed mismatch's detail
        report.causes[cd.category(k)] = report.causes.get(cd.category(k), 0) + n
    for m, c in [(m, cd.code_causes[m["row"], m["col"]]) for m in report.code_mismatches] + [
            (m, cd.scale_causes[m["block"][0], m["block"][1]]) for m in report.scale_mismatches]:
        if cd.category(str(c)) != m["cause"]:  # where the other hypotheses name the same cause, their detail stays
            m["cause"], m["detail"] = cd.category(str(c)), "" if c == NOT_EXPLAINED else str(c)
    report.explained_by = [] if has_ne else [" + ".join(e) for e in cd.explained_by]


def _deterministic(x32: np.ndarray, sch: BlockScheme, ax: int, ref: Convention, cand_p: np.ndarray) -> str | None:
    """The round-to-nearest or directed mode (:data:`ROUNDINGS` fpsim can run) whose codes are all the candidate's,
    or None: a kernel asked for stochastic rounding that does not round stochastically at all."""
    for mode in ("rne", "rtz", "rna", "rup", "rdown"):
        if np.array_equal(reference(x32, sch.replace(rounding=mode), ax, ref)[1], cand_p):
            return mode
    return None


def _pad(cand: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A copy of ``like`` (codes [R, nb·BC]) with the candidate's codes ``cand`` [R, C] in its first columns."""
    out = like.copy()
    out[:, : cand.shape[1]] = cand
    return out


def _diagnose(ev: Evaluator, sch: BlockScheme, ref: Convention, amax_ours,
              amax_cand) -> tuple[list[Outcome], list[Outcome], list[str]]:
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
