"""Paired-seed statistics of the campaign: each arm against BF16 on the same seeds.

A seed fixes the initial weights and the data order, so arm and baseline differ only by the recipe (and, on a GPU,
by whatever the GPU does not repeat); the reported number is the mean over seeds of the per-seed difference (arm −
BF16 validation loss, nats) with a 95 % t-interval over the seeds, its two-sided paired t-test p-value, and the
smallest gap the comparison could detect at 80 % power (:func:`detectable`).  A family of comparisons (the recipe's
components) is corrected with Holm's step-down method (:func:`holm`); :func:`verdict` turns a gap and its
corrected p-value into the study's wording.

Power of the two-sided paired t-test at level α with n seeds whose differences have standard deviation s, for a
true mean gap δ:

    power(δ) = P(T > t) + P(T < −t),  T ~ noncentral t(n − 1 degrees of freedom, noncentrality δ·√n / s),
    t = the (1 − α/2) quantile of Student's t with n − 1 degrees of freedom.

:func:`detectable` solves power(δ) = 0.8 for δ at the observed n and s; :func:`seeds_for_power` finds the fewest n
with power(observed mean) ≥ 0.8 at the observed s.  Both take the observed s as the truth, so they are planning
figures, as uncertain as s from a few seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from fpsim.analysis import mean_ci95

__all__ = ["ALPHA", "POWER", "PairedGap", "paired_gap", "has_interval", "p_value", "holm", "power", "detectable",
           "seeds_for_power", "verdict"]

#: The level of every test and interval (95 % intervals), and the power of the planning figures.
ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class PairedGap:
    """Mean paired difference, its 95 % t-interval (NaN bounds with fewer than two seeds), the seeds used, and the
    sample standard deviation of the per-seed differences (NaN with one seed)."""

    mean: float
    lo: float
    hi: float
    seeds: tuple[int, ...]
    sd: float = math.nan

    @property
    def n(self) -> int:
        return len(self.seeds)


def paired_gap(arm: Mapping[int, float], base: Mapping[int, float]) -> PairedGap:
    """The paired gap over the seeds both arms ran (seed → final loss).  Identical differences give an interval
    of exactly zero width and a standard deviation of exactly 0 (the differences are taken about the first one)."""
    seeds = tuple(sorted(set(arm) & set(base)))
    if not seeds:
        raise ValueError("no seed in common between the arm and its baseline")
    d = np.array([arm[s] - base[s] for s in seeds], np.float64)
    if not np.isfinite(d).all():
        raise ValueError("a loss is not finite: the gap of a diverged run is not a number to average")
    mean, half = mean_ci95(d)  # NaN half-width for one seed, so NaN bounds
    sd = float(np.std(d - d[0], ddof=1)) if d.size > 1 else math.nan
    return PairedGap(mean, mean - half, mean + half, seeds, sd)


def has_interval(gap: PairedGap | None) -> bool:
    """Whether a paired gap (or None: no seed in common) has a t-interval, i.e. two or more seeds (:func:`paired_gap`
    gives NaN bounds exactly when it has one); only those can exclude zero, by chance or not."""
    return gap is not None and gap.n > 1


def p_value(gap: PairedGap) -> float:
    """Two-sided p-value of the paired t-test of mean 0 (t = mean·√n / sd, n − 1 degrees of freedom); NaN with one
    seed; with identical differences (sd 0) 0 for a non-zero mean, 1 for a zero one."""
    if not has_interval(gap):
        return math.nan
    if gap.sd == 0:
        return 0.0 if gap.mean != 0 else 1.0
    t = abs(gap.mean) * math.sqrt(gap.n) / gap.sd
    return float(2 * stats.t.sf(t, gap.n - 1))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests (Holm 1979): sorted ascending, the i-th smallest
    (from 0) is multiplied by (m − i), made non-decreasing along the order and capped at 1.  Rejecting the tests whose
    adjusted p is below α keeps the chance of any false rejection in the family at or below α.  NaN entries (tests
    without a p-value) stay NaN and do not count in m."""
    idx = [i for i, p in enumerate(ps) if not math.isnan(p)]
    m, out, run = len(idx), [math.nan] * len(ps), 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: ps[i])):
        run = max(run, min(1.0, (m - rank) * ps[i]))
        out[i] = run
    return out


def power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` seeds whose differences have standard
    deviation ``sd``, for a true mean gap ``effect`` (the module's formula)."""
    if n < 2:
        return math.nan
    t = float(stats.t.ppf(1 - alpha / 2, n - 1))
    if sd == 0:
        return 1.0 if effect != 0 else alpha
    nc = abs(effect) * math.sqrt(n) / sd
    # P(T < −t) as P(T' > t) with the noncentrality negated: scipy's nct.cdf far in the lower tail returns NaN
    return float(stats.nct.sf(t, n - 1, nc) + stats.nct.sf(t, n - 1, -nc))


def detectable(gap: PairedGap, alpha: float = ALPHA, pw: float = POWER) -> float:
    """The smallest true |mean gap| that the two-sided paired t-test at level ``alpha`` would detect with power
    ``pw`` at this gap's seed count and standard deviation (solves the module's power(δ) = ``pw``); NaN with one
    seed, 0 with identical differences."""
    if not has_interval(gap):
        return math.nan
    if gap.sd == 0:
        return 0.0
    hi = gap.sd
    while power(hi, gap.sd, gap.n, alpha) < pw:
        hi *= 2
    return float(optimize.brentq(lambda e: power(e, gap.sd, gap.n, alpha) - pw, 0.0, hi, xtol=1e-12 * hi))


def seeds_for_power(gap: PairedGap, alpha: float = ALPHA, pw: float = POWER, most: int = 1_000_000) -> int | str | None:
    """The fewest seeds n (≥ 2) at which the two-sided paired t-test at level ``alpha`` has power ``pw`` for a true
    gap equal to this gap's mean, its differences' standard deviation this gap's (the module's formula; a planning
    figure); ``f"> {most}"`` beyond ``most``, None for a mean of exactly 0.  Needs at least two seeds."""
    if not has_interval(gap):
        raise ValueError("a seed spread needs at least two seeds")
    if gap.mean == 0:
        return None
    if power(gap.mean, gap.sd, most, alpha) < pw:
        return f"> {most}"
    lo, hi = 1, 2  # power(lo) < pw <= power(hi), power rising with n
    while power(gap.mean, gap.sd, hi, alpha) < pw:
        lo, hi = hi, min(2 * hi, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if power(gap.mean, gap.sd, mid, alpha) < pw else (lo, mid)
    return hi


def _seeds_text(gap: PairedGap, family: int) -> str:
    """``"28 seeds in a paired t-test at α = 0.05 and 44 at α = 0.05/6, Holm's strictest step"``: 80 % power at this
    gap's mean and spread, unadjusted and, in a family, at the Holm correction's strictest level."""
    text = f"{seeds_for_power(gap, ALPHA)} seeds in a paired t-test at α = {ALPHA:g}"
    if family > 1:
        text += f" and {seeds_for_power(gap, ALPHA / family)} at α = {ALPHA:g}/{family}, Holm's strictest step"
    return text


def verdict(gap: PairedGap, claim: str, p_adjusted: float | None = None, family: int = 1) -> str:
    """The study's verdict on a component from ``gap = paired_gap(arm without it, arm with it)``.

    ``p_adjusted``: the gap's p-value corrected over its family of ``family`` comparisons (:func:`holm`); None: a
    comparison on its own, judged by its own :func:`p_value`.  ``claim="helps"`` (removing the component should
    raise the loss: gap > 0): ``"resolved"`` when the p-value is below :data:`ALPHA` and the mean above 0,
    ``"contradicted"`` when it is below :data:`ALPHA` and the mean below 0, else ``"not resolved at this scale"``
    with the seeds :func:`seeds_for_power` needs for 80 % power at level ALPHA (and, in a family, at ALPHA /
    ``family``, Holm's strictest step, enough for the corrected test), said to contradict the claim when the mean
    lies below 0.  ``claim="harmless"`` (the paper says it costs nothing, e.g. BF16 late in training):
    ``"consistent"`` unless the p-value is below ALPHA (``"contradicted"``).
    """
    if not has_interval(gap):
        return "not resolved at this scale (fewer than two seeds)"
    own = p_value(gap)
    p = own if p_adjusted is None else p_adjusted
    if claim == "helps":
        if p < ALPHA:
            return "resolved" if gap.mean > 0 else "contradicted"
        if gap.mean == 0:
            return "not resolved at this scale (the mean gap is exactly 0)"
        corrected = (f"p {own:.2g} alone, {p:.2g} after the Holm correction over {family} components; "
                     if own < ALPHA and family > 1 else "")
        if gap.mean > 0:
            return (f"not resolved at this scale ({corrected}80 % power to exclude 0 at this mean and seed spread "
                    f"needs {_seeds_text(gap, family)})")
        # more seeds at a mean below 0 would exclude 0 from below: they would contradict the claim, not resolve it
        return (f"not resolved at this scale ({corrected}the mean is against the claim: more seeds would exclude 0 "
                f"from below, contradicting it; 80 % power for that at this mean and seed spread needs "
                f"{_seeds_text(gap, family)})")
    if claim == "harmless":
        return "consistent" if not p < ALPHA else "contradicted"
    raise ValueError("claim must be 'helps' or 'harmless'")
