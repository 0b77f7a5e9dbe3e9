"""Which cause each mismatching byte gets in :func:`fpsim.oracle.diff`: the cause index of every code and scale byte
(the first hypothesis that explains it, or −1 none, −2 the layout finding, :data:`~fpsim.oracle.rounding.SR_LIKE`,
:data:`~fpsim.oracle.rounding.OFF_GRID`, :data:`~fpsim.oracle.rhtcheck.RHT_ONLY`), its name, the counts of every
cause, and the listings of the first mismatches.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..schemes import BlockScheme, Kind
from .common import hex32
from .hypotheses import Evaluator, Hypothesis, Outcome
from .rhtcheck import RHT_ONLY
from .rounding import OFF_GRID, SR_LIKE

__all__ = ["assign", "cause_counts", "cause_name", "code_cause_index", "code_listing", "scale_listing"]


def assign(ev: Evaluator, order: list[Outcome], layout_c, layout_s,
           full: bool = False) -> tuple[np.ndarray, np.ndarray]:
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


def code_cause_index(ci: np.ndarray, si: np.ndarray, hyps: list[Hypothesis],
                     BC: int) -> tuple[np.ndarray, np.ndarray]:
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


def cause_name(k: int, hyps: list[Hypothesis], layout: str | None, sr_cause: str = "stochastic rounding",
               rht: str | None = None) -> str:
    """The cause (a key of :data:`~fpsim.oracle.diff.CAUSES`) that cause index ``k`` names."""
    if k == RHT_ONLY:
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


def code_listing(ev: Evaluator, sch: BlockScheme, cidx, own, hyps, bad_c, ours_p, cand_p, show: int, moved, ax,
                 sr_cause: str = "stochastic rounding", layout: str | None = None,
                 rht: str | None = None) -> list[dict]:
    """The first ``show`` mismatching codes: index, input, scaled value, both codes, cause and detail."""
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
            "cause": cause_name(kk, hyps, layout, sr_cause, rht),
            "detail": _detail(kk, bool(own[r, c]), hyps),
        })
    return out


def scale_listing(ev: Evaluator, sch: BlockScheme, si, hyps, bad_s, ours_s, cand_s, show: int,
                  layout: str | None = None, rht: str | None = None) -> list[dict]:
    """The first ``show`` mismatching scale bytes: block, block max, both bytes, cause and detail."""
    vmax = ev.view.vmax_bits(ev.ref.nan_amax, ev.ref.inf_amax).view(np.float32)
    fp32 = sch.kind is Kind.FP32
    hx = hex32 if fp32 else (lambda v: f"0x{int(v):02X}")
    out = []
    for r, j in zip(*(a[:show].tolist() for a in np.nonzero(bad_s))):
        o, k, kk = ours_s[r, j], cand_s[r, j], int(si[r, j])
        out.append({"block": [r, j], "vmax": float(vmax[r, j]), "vmax_hex": hex32(vmax[r, j]),
                    "ours": o.item(), "ours_hex": hx(o), "candidate": k.item(), "candidate_hex": hx(k),
                    "cause": cause_name(kk, hyps, layout, rht=rht), "detail": _detail(kk, False, hyps)})
    return out


def _orig_index(r: int, c: int, moved: tuple[int, ...], axis: int) -> list[int]:
    """The index in the input of row ``r``, column ``c`` of its 2-D view (``moved``: the view's shape before it)."""
    lead = [int(i) for i in np.unravel_index(r, moved[:-1])] if len(moved) > 1 else []
    return lead[:axis] + [int(c)] + lead[axis:]


def cause_counts(cidx: np.ndarray, si: np.ndarray, hyps: list[Hypothesis], lay_c: str | None, lay_s: str | None,
                 sr_cause: str, rht: str | None) -> Counter:
    """How many of the mismatching codes (cause indices ``cidx``) and scale bytes (``si``) each cause names."""
    causes: Counter = Counter()
    for kk, n in zip(*np.unique(cidx, return_counts=True)):
        causes[cause_name(int(kk), hyps, lay_c, sr_cause, rht)] += int(n)
    for kk, n in zip(*np.unique(si, return_counts=True)):
        causes[cause_name(int(kk), hyps, lay_s, sr_cause, rht)] += int(n)
    return causes
