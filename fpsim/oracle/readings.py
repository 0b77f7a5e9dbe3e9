"""How :func:`fpsim.oracle.diff` reads a candidate's bytes before it diagnoses them: the layout readings
(:mod:`~fpsim.oracle.layout`), the wrong-axis reading (:mod:`~fpsim.oracle.axischeck`), and the random Hadamard
transform (:mod:`~fpsim.oracle.rhtcheck`) together with a layout reading of the bytes against the transformed
reference (a kernel that applies the RHT and also swaps its nibbles or transposes its scales).

Cheap checks come first: the layout readings compare the candidate's bytes with fpsim's; the wrong-axis reading
and the RHT references each cost one quantization and run only where many bytes differ (or where the candidate's
sizes fit only the wrong axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schemes import BlockScheme
from ..transforms import RECIPE_SIGNS
from .axischeck import WRONG_AXIS, WRONG_AXIS_RATE, axis_reading
from .common import internal_errors
from .layout import code_readings, codes_layout, scales_layout
from .model import Convention, TensorView
from .reference import reference, same_scales
from .rhtcheck import RHT_SIZE, RHT_TRY_RATE, RhtReference, describe, rht_input, sign_votes

__all__ = ["DECISIVE_VOTE", "Readings", "read_candidate", "rht_readings"]

#: The smallest share of tiles |vote| every position of a sign vector needs before a code reading's implied signs
#: are tried (a reading that scrambles the codes votes near 0; the right one near 1).
DECISIVE_VOTE = 0.25
#: With fpsim's sizes, the wrong-axis reading is taken only when it leaves at most this share of the differing bytes
#: (a kernel with a second bug besides the axis keeps fpsim's reading and the hypotheses).
AXIS_LEFT = 0.01
#: The other code readings vote on an even sample of at most this many 16-point tiles (the vote is a share).
VOTE_SAMPLE = 8192


@dataclass
class Readings:
    """The candidate's codes [R, C] and scales [R, nb] as given (``cand``, ``cand_s``) and as compared (``fixed``,
    ``fixed_s``), the masks of the bytes a reading explains and its cause (None: read as fpsim's layout)."""

    cand: np.ndarray
    fixed: np.ndarray
    layout_c: np.ndarray
    lay_c: str | None
    cand_s: np.ndarray
    fixed_s: np.ndarray
    layout_s: np.ndarray
    lay_s: str | None

    def left(self, ours_p: np.ndarray, ours_s: np.ndarray) -> int:
        """The bytes that still differ from ``ours_p`` / ``ours_s`` read this way."""
        C = self.fixed.shape[1]
        return int(np.count_nonzero(self.fixed != ours_p[:, :C])) + int(np.count_nonzero(
            ~same_scales(self.fixed_s, ours_s)))


def _layouts(candidate_codes, candidate_scales, ours_p, ours_s, view: TensorView, sch: BlockScheme, packed: bool,
             swizzled: bool, what: str, findings: list) -> Readings:
    return Readings(*codes_layout(candidate_codes, ours_p, view, sch, packed, what, findings),
                    *scales_layout(candidate_scales, ours_s, view, sch, swizzled, what, findings))


def read_candidate(candidate_codes, candidate_scales, view: TensorView, sch: BlockScheme, ref: Convention,
                   packed: bool, swizzled: bool, what: str, ours_p: np.ndarray, ours_s: np.ndarray,
                   axis_seed: int | None, try_axis: bool, findings: list) -> Readings:
    """The layout readings, or the wrong-axis reading (tried, with ``try_axis``, when more than
    :data:`WRONG_AXIS_RATE` of the codes or scales differ and the layouts leave bytes unexplained, or when the sizes
    fit only it; ``axis_seed``: stochastic rounding's seed) where the sizes fit only it or it leaves at most
    :data:`AXIS_LEFT` of the bytes the layouts leave.  ``ValueError`` for unusable bytes."""
    found: list[str] = []
    try:
        rd, err = _layouts(candidate_codes, candidate_scales, ours_p, ours_s, view, sch, packed, swizzled, what,
                           found), None
    except ValueError as e:
        rd, err = None, e
    if try_axis and view.R > 1 and (rd is None or _worth(rd, ours_p, ours_s)):
        with internal_errors():
            ax = axis_reading(candidate_codes, candidate_scales, view.X, sch, ref, packed, swizzled, ours_p, ours_s,
                              axis_seed)
        # with fpsim's sizes the reading must explain nearly every byte: a partial one would pre-empt a hypothesis
        # that explains all (16×16 tiles read as 16×1 column blocks agree on most bytes of rows of unequal size)
        if ax is not None and (rd is None or ax.n_left <= AXIS_LEFT * rd.left(ours_p, ours_s)):
            findings.append(ax.finding)
            return Readings(ax.cand, ax.fixed, ax.layout_c, WRONG_AXIS, ax.cand_s, ax.fixed_s, ax.layout_s,
                            WRONG_AXIS)
    if rd is None:
        raise err
    findings += found
    return rd


def _worth(rd: Readings, ours_p: np.ndarray, ours_s: np.ndarray) -> bool:
    """Whether the wrong-axis reading is worth its quantization: many codes or scales differ, and the layout
    readings leave some unexplained."""
    R, C = rd.cand.shape
    many = (np.count_nonzero(rd.cand != ours_p[:, :C]) > WRONG_AXIS_RATE * R * C
            or np.count_nonzero(~same_scales(rd.cand_s, ours_s)) > WRONG_AXIS_RATE * rd.cand_s.size)
    return many and rd.left(ours_p, ours_s) > 0


def rht_readings(rd: Readings, x32: np.ndarray, ax: int, asked: bool, sch: BlockScheme, ref: Convention,
                 candidate_codes, candidate_scales, view: TensorView, packed: bool, swizzled: bool, what: str,
                 ours_p: np.ndarray, ours_s: np.ndarray, findings: list) -> tuple[Readings, RhtReference | None]:
    """The RHT check (:mod:`~fpsim.oracle.rhtcheck`) with layout readings against each transformed reference.

    When the quantized axis is a multiple of 16 and more than :data:`RHT_TRY_RATE` of the codes differ: the
    reference with the RHT toggled, then with the signs the codes as given imply, then with those of the code
    reading (nibble order, offsets, transposes) whose vote is decisive.  Each is compared with the candidate's bytes
    as read (``rd``) and through the layout readings against it; the first that leaves fewer than half of the bytes
    differing from fpsim's is the finding (a layout found against it is a second finding, and the bytes it moved
    keep the layout's cause).  Returns the readings to diagnose and the reference (None: no RHT)."""
    R, C = rd.cand.shape
    if not (C and C % RHT_SIZE == 0 and np.count_nonzero(rd.cand != ours_p[:, :C]) > RHT_TRY_RATE * R * C):
        return rd, None
    n_plain = rd.left(ours_p, ours_s)
    for signs in _sign_vectors(x32, ax, rd.cand, sch, candidate_codes, view, packed, what):
        xr = (x32 if asked else rht_input(x32, ax, "recipe")) if signs is None else rht_input(x32, ax, signs)
        v, p, sc, amax = reference(xr, sch, ax, ref)
        found: list[str] = []
        lay = _layouts(candidate_codes, candidate_scales, p, sc, v, sch, packed, swizzled, what, found)
        best = lay if found else rd
        n = best.left(p, sc)
        if n * 2 < n_plain:
            extra = "; read with " + " and ".join(f.split(":")[0] for f in found) + " (below)" if found else ""
            alt = describe(asked, signs, (v, p, sc, amax, n_plain - n), n_plain, extra)
            findings.insert(0, alt.finding)
            findings[1:1] = found
            return best, alt
    return rd, None


def _sign_vectors(x32, ax, cand, sch, candidate_codes, view, packed, what):
    """The sign vectors to try, in order (None: the toggled RHT with the recipe's signs): the toggled RHT, the
    signs the codes as given imply, and those of the code reading (nibble order, offsets, transposes) with the most
    decisive vote (computed only when the others did not fit)."""
    yield None
    tried = [RECIPE_SIGNS]

    def new(v):
        signs = np.where(v >= 0, 1.0, -1.0).astype(np.float32)
        if any(np.array_equal(signs, t) for t in tried):
            return None
        tried.append(signs)
        return signs

    signs = new(sign_votes(x32, ax, cand, sch))
    if signs is not None:
        yield signs
    votes = [sign_votes(x32, ax, c, sch, VOTE_SAMPLE)
             for c in code_readings(candidate_codes, view, sch, packed, what)[1:]]
    v = max(votes, key=lambda a: np.abs(a).min(), default=None)
    if v is not None and np.abs(v).min() >= DECISIVE_VOTE:
        signs = new(v)
        if signs is not None:
            yield signs
