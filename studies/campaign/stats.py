"""Paired-seed statistics of the campaign: each arm against BF16 on the same seeds (issue 20's protocol).

A seed fixes the initial weights and the data order, so arm and baseline differ only by the recipe; the
reported number is the mean over seeds of the per-seed difference (arm − BF16 validation loss, nats) with a
95 % t-interval over the seeds.  :func:`verdict` turns the interval into the study's wording.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

from fpsim.analysis import mean_ci95

__all__ = ["PairedGap", "paired_gap", "has_interval", "seeds_to_resolve", "verdict"]


@dataclass(frozen=True)
class PairedGap:
    """Mean paired difference, its 95 % t-interval (NaN bounds with fewer than two seeds), and the seeds used."""

    mean: float
    lo: float
    hi: float
    seeds: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.seeds)


def paired_gap(arm: Mapping[int, float], base: Mapping[int, float]) -> PairedGap:
    """The paired gap over the seeds both arms ran (seed → final loss).  Identical differences give an interval
    of exactly zero width (the differences are taken about the first one)."""
    seeds = tuple(sorted(set(arm) & set(base)))
    if not seeds:
        raise ValueError("no seed in common between the arm and its baseline")
    d = np.array([arm[s] - base[s] for s in seeds], np.float64)
    if not np.isfinite(d).all():
        raise ValueError("a loss is not finite: the gap of a diverged run is not a number to average")
    mean, half = mean_ci95(d)  # NaN half-width for one seed, so NaN bounds
    return PairedGap(mean, mean - half, mean + half, seeds)


def has_interval(gap: PairedGap | None) -> bool:
    """Whether a paired gap (or None: no seed in common) has a t-interval, i.e. two or more seeds (:func:`paired_gap`
    gives NaN bounds exactly when it has one); only those can exclude zero, by chance or not."""
    return gap is not None and gap.n > 1


def verdict(gap: PairedGap, claim: str) -> str:
    """The study's verdict on a component from ``gap = paired_gap(arm without it, arm with it)``.

    ``claim="helps"`` (the paper says the component lowers the loss, so removing it should raise it: gap > 0):
    ``"resolved"`` when the 95 % interval lies above 0, ``"contradicted"`` when it lies below 0, else
    ``"not resolved at this scale"`` with :func:`seeds_to_resolve`'s count, said to contradict the claim when the
    mean lies below 0.  ``claim="harmless"`` (the paper says it costs nothing, e.g. BF16 late in
    training): ``"consistent"`` when the interval contains 0, else ``"contradicted"``.
    """
    if not has_interval(gap):
        return "not resolved at this scale (fewer than two seeds)"
    above, below = gap.lo > 0, gap.hi < 0
    if claim == "helps":
        if above or below:
            return "resolved" if above else "contradicted"
        need = seeds_to_resolve(gap)
        if need is None:
            return "not resolved at this scale (the mean gap is exactly 0)"
        if gap.mean > 0:
            return f"not resolved at this scale (at this mean and seed spread, {need} seeds would exclude 0)"
        # more seeds at a mean below 0 would exclude 0 from below: they would contradict the claim, not resolve it
        return (f"not resolved at this scale (the mean is against the claim: at this mean and seed spread, {need} "
                f"seeds would exclude 0 from below, contradicting it)")
    if claim == "harmless":
        return "consistent" if not (above or below) else "contradicted"
    raise ValueError("claim must be 'helps' or 'harmless'")


def seeds_to_resolve(gap: PairedGap, most: int = 1000) -> int | str | None:
    """The fewest seeds whose 95 % t-interval would exclude 0 if the per-seed differences kept this gap's mean and
    sample standard deviation (a planning figure, not a power analysis); ``f"> {most}"`` beyond ``most``, None for a
    mean of exactly 0.  Needs at least two seeds."""
    if not has_interval(gap):
        raise ValueError("a seed spread needs at least two seeds")
    if gap.mean == 0:
        return None
    half = (gap.hi - gap.lo) / 2
    sd = half * math.sqrt(gap.n) / float(stats.t.ppf(0.975, gap.n - 1))
    for n in range(2, most + 1):
        if float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) < abs(gap.mean):
            return n
    return f"> {most}"
