"""The RHT check of :func:`fpsim.oracle.diff`: when most codes differ, the reference with the random Hadamard
transform toggled (applied where it was not asked for, removed where it was), else with the sign vector the
candidate's codes imply; and the bytes only that reference reproduces, attributed to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schemes import BlockScheme
from ..transforms import RECIPE_SIGNS, hadamard_matrix
from ..transforms import rht as _rht
from .model import Convention, TensorView
from .reference import reference, same_scales

__all__ = ["RHT_ONLY", "RHT_SIZE", "RHT_TRY_RATE", "RhtReference", "describe", "implied_signs", "rht_attribution",
           "rht_check", "rht_input", "rht_reference", "sign_votes"]

#: The recipe's Hadamard tile along the quantized axis (SPEC §7; fpsim.recipe: ``rht=16``, signs ``"recipe"``).
RHT_SIZE = 16
#: Code mismatch rate above which :func:`fpsim.oracle.diff` also compares with the RHT toggled (applied or removed).
RHT_TRY_RATE = 0.25
#: Cause index of the bytes that only the toggled-RHT reference reproduces (past the −3, −4 of rounding.py).
RHT_ONLY = -5


@dataclass
class RhtReference:
    """The toggled-RHT reference a candidate follows: its cause, finding, ``explained_by`` phrase and bytes."""

    cause: str
    finding: str
    name: str
    view: TensorView
    ours_p: np.ndarray
    ours_s: np.ndarray
    amax: np.ndarray


def rht_input(x32: np.ndarray, ax: int, signs) -> np.ndarray:
    """The recipe's operand transform (:func:`fpsim.recipe.quantize_operand`): ``rht(x, 16, signs, axis)`` with
    BF16 rounding of its input and output (``bf16_in = bf16_out = True``, the defaults), in float32 (SPEC §7)."""
    return _rht(x32, RHT_SIZE, signs, axis=ax)


def sign_votes(x32: np.ndarray, ax: int, cand: np.ndarray, sch: BlockScheme, sample: int | None = None) -> np.ndarray:
    """Per position of the 16-point tile, the share of tiles (−1 … 1) whose codes ``cand`` [R, C] vote for the sign
    +1 (:func:`implied_signs`); near ±1 where the codes were read right, near 0 where they are scrambled.
    ``sample``: vote on an even sample of at most that many tiles (every tile: None)."""
    X = np.ascontiguousarray(np.moveaxis(x32, ax, -1)).reshape(-1, RHT_SIZE)
    c = cand.reshape(-1, RHT_SIZE)
    if sample is not None and X.shape[0] > sample:
        pick = np.linspace(0, X.shape[0] - 1, sample).astype(np.int64)
        X, c = X[pick], c[pick]
    with np.errstate(all="ignore"):
        v = np.nan_to_num(sch.element.decode_table()[c], nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
        z = v @ np.sign(hadamard_matrix(RHT_SIZE, "none")).astype(np.float32)
        vote = (np.sign(X) * np.sign(z)).sum(axis=0, dtype=np.float64)
    return vote / max(1, X.shape[0])


def implied_signs(x32: np.ndarray, ax: int, cand: np.ndarray, sch: BlockScheme) -> np.ndarray:
    """The ±1 sign vector a candidate quantized from ``rht(x, 16, s)`` implies, from its element codes alone.

    A tile maps x to y = (x ∘ s)·H/4 and H·H = 16·I, so (y·H/4)_i = s_i·x_i: s_i is the sign of x_i·(v·H)_i with
    ``v`` the candidate's element values.  Tiles lie inside one block (16 divides every block width, both start at
    column 0), whose positive scale does not change that sign; the vote over every tile outweighs the rounding.
    """
    return np.where(sign_votes(x32, ax, cand, sch) >= 0, 1.0, -1.0).astype(np.float32)


def describe(asked: bool, signs: np.ndarray | None, got: tuple, n_plain: int, extra: str = "") -> RhtReference:
    """The :class:`RhtReference` of fpsim's bytes ``got`` = (view, codes, scales, amax, bytes fixed) of the toggled
    RHT (``signs`` None) or of the RHT with ``signs``; ``extra`` ends its finding (a layout read with it)."""
    view, p, sc, amax, fixed = got
    how = ("16-point tiles along the quantized axis, the recipe's sign vector, BF16 in and out")
    tail = f"that reproduces {fixed} of the {n_plain} differing bytes{extra}"
    if signs is None and asked:
        finding = (f"random Hadamard transform: the candidate quantized x itself, not rht(x) as asked ({how}; "
                   f"SPEC §7): {tail}")
        name = "candidate = fpsim's bytes of x without the random Hadamard transform"
    elif signs is None:
        finding = (f"random Hadamard transform: the candidate quantized rht(x) ({how}; SPEC §7), as the NVFP4 "
                   f"recipe's Wgrad operands are, where fpsim quantized x (pass rht=True / --rht): {tail}")
        name = "candidate = fpsim's bytes of rht(x) (16-point, the recipe's signs, BF16 in and out)"
    if signs is None:
        return RhtReference("random Hadamard transform", finding, name, view, p, sc, amax)
    text = " ".join("+" if v > 0 else "−" for v in signs)
    what = "no sign flips (signs='none')" if (signs > 0).all() else f"the sign vector [{text}]"
    finding = (f"RHT with other signs: the candidate quantized rht(x) with {what}, implied by its codes, instead "
               f"of the recipe's fixed vector (16-point tiles along the quantized axis, BF16 in and out; SPEC §7): "
               f"{tail}")
    name = f"candidate = fpsim's bytes of rht(x) with {what}"
    return RhtReference("RHT with other signs", finding, name, view, p, sc, amax)


def rht_reference(x32: np.ndarray, ax: int, asked: bool, sch: BlockScheme, ref: Convention, cand: np.ndarray,
                  cand_s: np.ndarray, ours_p: np.ndarray, ours_s: np.ndarray) -> RhtReference | None:
    """The reference with the RHT toggled (applied where ``asked`` is False, removed where True), else the RHT with
    the signs the candidate implies (:func:`implied_signs`), when it leaves fewer than half of the differing
    bytes (codes and scale bytes) of fpsim's reference ``ours_p`` / ``ours_s`` — the layout readings' test."""
    C = cand.shape[1]
    n_plain = int(np.count_nonzero(cand != ours_p[:, :C])) + int(np.count_nonzero(~same_scales(cand_s, ours_s)))

    def fits(xr: np.ndarray):
        view, p, sc, amax = reference(xr, sch, ax, ref)
        n = int(np.count_nonzero(cand != p[:, :C])) + int(np.count_nonzero(~same_scales(cand_s, sc)))
        return (view, p, sc, amax, n_plain - n) if n < n_plain / 2 else None

    got = fits(x32 if asked else rht_input(x32, ax, "recipe"))
    if got is not None:
        return describe(asked, None, got, n_plain)
    signs = implied_signs(x32, ax, cand, sch)
    if np.array_equal(signs, RECIPE_SIGNS):
        return None
    got = fits(rht_input(x32, ax, signs))
    return None if got is None else describe(asked, signs, got, n_plain)


def rht_check(x32: np.ndarray, ax: int, asked: bool, sch: BlockScheme, ref: Convention, cand: np.ndarray,
              cand_s: np.ndarray, ours_p: np.ndarray, ours_s: np.ndarray) -> RhtReference | None:
    """:func:`rht_reference` when the quantized axis is a multiple of :data:`RHT_SIZE` and more than
    :data:`RHT_TRY_RATE` of the candidate's codes ``cand`` [R, C] differ from fpsim's, else None."""
    R, C = cand.shape
    if C and C % RHT_SIZE == 0 and np.count_nonzero(cand != ours_p[:, :C]) > RHT_TRY_RATE * R * C:
        return rht_reference(x32, ax, asked, sch, ref, cand, cand_s, ours_p, ours_s)
    return None


def rht_attribution(alt: RhtReference, ci: np.ndarray, si: np.ndarray, explained: list[str], cand: np.ndarray,
                    cand_s: np.ndarray, ours_p: np.ndarray, ours_s: np.ndarray,
                    n_bad: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The code and scale cause indices with :data:`RHT_ONLY` for the bytes only the toggled-RHT reference ``alt``
    reproduces (but those a layout reading read with it moved), and the full explanations with its name first
    (``n_bad``: the bytes left against it)."""
    C = cand.shape[1]
    only = np.zeros(ours_p.shape, bool)
    only[:, :C] = (cand != ours_p[:, :C]) & (cand == alt.ours_p[:, :C])
    # a byte a layout reading moved (−2) keeps the layout's cause: the transform changed its value, the layout its place
    ci = np.where(only & (ci != -2), RHT_ONLY, ci)
    si = np.where(~same_scales(cand_s, ours_s) & same_scales(cand_s, alt.ours_s) & (si != -2), RHT_ONLY, si)
    explained = [f"{alt.name}; and {n}" for n in explained] or ([] if n_bad else [alt.name])
    return ci, si, explained
