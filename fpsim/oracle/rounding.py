"""What a candidate's element codes say about its rounding when fpsim cannot reproduce its random bits.

A stochastically rounded code of a scaled value y = x · enc_b is one of y's two neighbours on the element grid:
the code toward zero (lo) or the next one away from zero (hi).  With unbounded random bits it goes away with
probability p = (|y| − |lo|) / (|hi| − |lo|); fpsim's K-bit rounding (SPEC §3: t = fl(|y| + r · ulp/2^K), r
uniform in [0, 2^K), then truncation) goes away with p_K = (2^K − ⌈(|hi| − |y|) · 2^K / ulp⌉) / 2^K, a little
less (by under 2^−K), and any K′ ≥ K lies between the two.

:func:`neighbour_check` takes the elements of the blocks whose scale bytes are fpsim's and counts the codes that
are neither neighbour (no rounding of y gives them), then tests the away-roundings of the inexact elements in
eight strata (the sign of y × four ranges of p): in each, the observed count against the interval [Σp_K, Σp]
with the binomial standard deviation √Σp(1−p).  A round-to-nearest candidate fails the p < 1/2 strata, a
directed one the strata of one sign, a K-bit rounding with fewer bits than K the upper ones.  Under a stochastic
rounding with at least K random bits each stratum's |z| ≤ :data:`Z_LIMIT` except with probability below 10⁻⁵.

A pass says something only when the sample could have failed: :attr:`NeighbourCheck.judged` is whether
round-to-nearest codes of the same elements would fail a stratum (about 40 inexact elements with p in [¼, ½) of one
sign suffice).  Where they would not — e.g. when nearly every block's scale differs from fpsim's and only a handful
of blocks are compared — the round-to-nearest comparison makes no stochastic-rounding claim ("too few blocks to
judge").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .model import round_codes

__all__ = ["NeighbourCheck", "neighbour_check", "check_blocks", "other_k", "rounding_findings", "sr_causes",
           "Z_LIMIT", "SR_LIKE", "OFF_GRID"]

#: Cause indices of :func:`fpsim.oracle.diff` for a code that is the other neighbour of x·enc_b, and for one that
#: is neither (past its −1 "none" and −2 "layout").
SR_LIKE, OFF_GRID = -3, -4

#: |z| above this in any stratum says the away-roundings are not those of a stochastic rounding.
Z_LIMIT = 5.0
_P_EDGES = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class NeighbourCheck:
    """Counts of :func:`neighbour_check` (elements of blocks whose scale bytes match fpsim's, finite y only)."""

    elements: int
    inexact: int  #: y strictly between two codes
    off_grid: int  #: candidate codes that are neither neighbour of y
    differ: int  #: candidate codes that differ from fpsim's
    away: int  #: inexact elements the candidate rounded away from zero
    expected_away: tuple[float, float]  #: [Σp_K, Σp] over the inexact elements
    sd_away: float  #: √Σp(1−p)
    k: int  #: the K of p_K
    worst: dict | None = None  #: the stratum with the largest |z|: sign, p range, away, expected, sd, z
    z_nearest: float | None = None  #: the largest |z| (signed) round-to-nearest codes of the same elements get

    @property
    def z(self) -> float | None:
        """The largest |z| of the strata, signed; None without an inexact element with 0 < p < 1."""
        return None if self.worst is None else self.worst["z"]

    @property
    def judged(self) -> bool:
        """Whether the sample can tell a stochastic rounding from round-to-nearest: RNE codes of the same elements
        fail a stratum (|z| > :data:`Z_LIMIT`).  Without that, a pass is no evidence of stochastic rounding."""
        return self.z_nearest is not None and abs(self.z_nearest) > Z_LIMIT

    @property
    def stochastic(self) -> bool:
        """Every code a neighbour of its y and every stratum within :data:`Z_LIMIT`."""
        return self.elements > 0 and self.off_grid == 0 and self.z is not None and abs(self.z) <= Z_LIMIT

    def to_dict(self) -> dict:
        return {"elements": self.elements, "inexact": self.inexact, "off_grid": self.off_grid,
                "differ": self.differ, "away": self.away, "expected_away": list(self.expected_away),
                "sd_away": self.sd_away, "k": self.k, "worst_stratum": self.worst, "z": self.z,
                "z_limit": Z_LIMIT, "stochastic": self.stochastic, "z_nearest": self.z_nearest,
                "judged": self.judged}

    def summary(self) -> str:
        lo, hi = self.expected_away
        head = (f"{self.off_grid} of {self.elements} codes in blocks with fpsim's scales are neither neighbour of "
                f"x·enc_b; {self.away} of {self.inexact} inexact elements rounded away from zero, {lo:.1f}–{hi:.1f} "
                f"± {self.sd_away:.1f} expected of a stochastic rounding with ≥ {self.k} random bits")
        if self.worst is None:
            return head + " (no stratum to test)"
        w = self.worst
        verdict = "passes" if abs(w["z"]) <= Z_LIMIT else "fails"
        weak = ("" if self.judged or verdict == "fails" else
                "; too few elements to judge: round-to-nearest would pass as well")
        return (head + f"; worst stratum (y {w['sign']}, p in [{w['p'][0]:g}, {w['p'][1]:g})): {w['away']} away, "
                f"{w['expected'][0]:.1f}–{w['expected'][1]:.1f} ± {w['sd']:.1f} expected, z = {w['z']:+.2f} "
                f"({verdict} |z| ≤ {Z_LIMIT:g}){weak}")


def _z(obs: int, lo: float, hi: float, sd: float) -> float:
    """Distance of ``obs`` from the interval [lo, hi] in standard deviations (0 inside)."""
    d = obs - min(max(obs, lo), hi)
    return 0.0 if d == 0 else (d / sd if sd > 0 else math.copysign(math.inf, d))


def neighbour_check(y: np.ndarray, el, compare: np.ndarray, cand: np.ndarray, ours: np.ndarray, k: int):
    """Check ``cand`` against the neighbours of the scaled values ``y`` (float32, fpsim's factors, any shape).

    ``compare``: the elements to count (inside the tensor, in blocks whose scale bytes match fpsim's);
    ``cand`` / ``ours``: the candidate's and fpsim's codes (one code per byte), all of ``y``'s shape; ``k``: the
    fewest random bits per element a passing stochastic rounding may use.  Returns the :class:`NeighbourCheck`,
    the mask of the compared elements (finite y) and the mask of those whose candidate code is a neighbour of y.
    """
    fin = compare & np.isfinite(y)
    yv = y[fin]
    up, down = (round_codes(yv, el, m, True) for m in ("rup", "rdown"))
    neg = np.signbit(yv)
    lo, hi = np.where(neg, up, down), np.where(neg, down, up)  # toward zero, away from zero
    c = cand[fin]
    off = (c != lo) & (c != hi)
    inexact = lo != hi
    # float32 is exact here: adjacent grid values differ by a power of two (ulp), and |y| − |lo|, |hi| − |y| are
    # exact by Sterbenz (or |y| itself where lo = 0); only the sums below are taken in float64
    table = np.abs(el.decode_table().astype(np.float32))
    a = np.abs(yv[inexact])
    vlo, vhi = table[lo[inexact]], table[hi[inexact]]
    ulp = vhi - vlo
    p = (a - vlo) / ulp
    scale = np.float32(2 ** int(k))
    pk = np.clip(scale - np.ceil((vhi - a) * (scale / ulp)), 0, scale) / scale
    went = c[inexact] == hi[inexact]
    # round-to-nearest codes of the same elements: the test's power (a pass means something only if they fail)
    went_rne = round_codes(yv[inexact], el, "rne", True) == hi[inexact]
    sgn, pbin = neg[inexact], np.searchsorted(_P_EDGES, p, side="right")
    worst = z_rne = None
    edges = (0.0, *_P_EDGES, 1.0)
    for s in (False, True):
        for b in range(len(edges) - 1):
            m = (sgn == s) & (pbin == b)
            if not m.any():
                continue
            sd = math.sqrt(float((p[m] * (1 - p[m])).sum(dtype=np.float64)))
            e = (float(pk[m].sum(dtype=np.float64)), float(p[m].sum(dtype=np.float64)))
            z = _z(int(went[m].sum()), *e, sd)
            zr = _z(int(went_rne[m].sum()), *e, sd)
            if z_rne is None or abs(zr) > abs(z_rne):
                z_rne = zr
            if worst is None or abs(z) > abs(worst["z"]):
                worst = {"sign": "< 0" if s else "> 0", "p": [edges[b], edges[b + 1]], "away": int(went[m].sum()),
                         "expected": list(e), "sd": sd, "z": z}
    on = np.zeros(y.shape, bool)
    on[fin] = ~off
    check = NeighbourCheck(
        elements=int(fin.sum()), inexact=int(inexact.sum()), off_grid=int(off.sum()),
        differ=int((c != ours[fin]).sum()), away=int(went.sum()),
        expected_away=(float(pk.sum(dtype=np.float64)), float(p.sum(dtype=np.float64))),
        sd_away=float(math.sqrt(float((p * (1 - p)).sum(dtype=np.float64)))), k=int(k), worst=worst, z_nearest=z_rne)
    return check, fin, on


def check_blocks(ev, same_blocks: np.ndarray, cand_p: np.ndarray, ours_p: np.ndarray, k: int):
    """:func:`neighbour_check` over the blocks whose scale bytes are fpsim's (``same_blocks`` [R, nb]) of a
    :class:`fpsim.oracle.hypotheses.Evaluator`'s view: what :func:`neighbour_check` returns, its masks [R, nb·BC]."""
    same = np.repeat(same_blocks, ev.view.BC, axis=1) & ev.valid
    return neighbour_check(ev.y_ref().reshape(same.shape), ev.sch.element, same, cand_p, ours_p, k)


def sr_causes(cidx: np.ndarray, bad: np.ndarray, on_grid: np.ndarray, compared: np.ndarray, stochastic: bool,
              sr: bool) -> np.ndarray:
    """Cause indices with :data:`SR_LIKE` for the mismatching codes no hypothesis explains that are a neighbour
    of x·enc_b (where the candidate rounds stochastically), and with ``sr`` :data:`OFF_GRID` for those that
    are neither neighbour."""
    free = bad & (cidx == -1)
    if stochastic:
        cidx = np.where(free & on_grid, SR_LIKE, cidx)
    if sr:
        cidx = np.where(free & compared & ~on_grid, OFF_GRID, cidx)
    return cidx


def other_k(codes_for_k, k: int, cand_p: np.ndarray) -> list[str]:
    """The K (random bits per element, 1–24) other than ``k`` whose fpsim bits for the seed are the candidate's
    codes; ``codes_for_k(K)``: fpsim's codes in the candidate's layout."""
    return [f"candidate = fpsim's stochastic rounding with K = {kk} random bits per element (here K = {k})"
            for kk in range(1, 25) if kk != k and np.array_equal(codes_for_k(kk), cand_p)]


def rounding_findings(check: NeighbourCheck, sr: bool, seed, k: int, explained: bool) -> list[str]:
    """What the neighbour check says, in words (:func:`fpsim.oracle.diff`'s findings)."""
    if not sr:
        if check.stochastic and check.judged:
            return ["stochastic rounding: fpsim compared round-to-nearest, and every differing code is the other "
                    "neighbour of x·enc_b, the away-roundings those of a stochastic rounding; compare with "
                    "--rounding sr (and --seed if the candidate draws fpsim's Philox stream, SPEC §3)"]
        if check.stochastic:
            return [f"rounding: too few blocks to judge whether the candidate rounds stochastically ({check.inexact} "
                    f"inexact of {check.elements} elements in the blocks whose scale bytes are fpsim's; "
                    "round-to-nearest would pass the test as well): no claim"]
        return []
    if seed is None or explained or not check.differ:
        return []
    if check.stochastic:
        return [f"the candidate rounds stochastically, but not with fpsim's random bits for seed {seed} and K = {k} "
                "(SPEC §3: Philox4x32-10, one counter range per block, K bits per element, low bits first)"]
    if check.z is not None:  # biased away-roundings: the differing codes are not another stream's draws
        return ["the candidate's away-roundings are not those of a stochastic rounding (see the rounding check): "
                "it does not round stochastically, or not only"]
    return []
