"""The arena's statistics, after Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice" (the
``rliable`` package): the interquartile mean of per-run scores, stratified bootstrap confidence intervals,
the probability of improvement, performance profiles, and the smallest difference a grid can detect.

Written on numpy rather than taken from ``rliable``: the arena needs five small functions, and ``rliable`` would
bring its own pinned dependencies (arch, scipy) into every install; each function below cites what it follows.
Every bootstrap draws from a seeded generator, so the same cells give the same intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "BOOTSTRAP_REPS",
    "bootstrap_interval",
    "detectable_difference",
    "iqm",
    "performance_profile",
    "probability_of_improvement",
    "reach_interval",
]

BOOTSTRAP_REPS = 2000
"""Bootstrap resamples of every interval (rliable's default is 2000 for intervals of aggregates)."""

_Z_975, _Z_80 = 1.959964, 0.841621
"""Standard normal quantiles: two-sided 5% level, 80% power."""


def iqm(scores: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of the scores (a quarter of them, rounded down, cut from
    each end, as ``scipy.stats.trim_mean(scores, 0.25)``). Robust to an outlying run, less noisy than the median."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    cut = int(0.25 * len(ordered))
    return float(ordered[cut : len(ordered) - cut].mean())


def bootstrap_interval(
    strata: Sequence[Sequence[float]],
    statistic: Callable[[np.ndarray], float],
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> tuple[float, float]:
    """95% percentile interval of ``statistic`` over the runs of all ``strata`` (one per task), resampling the
    runs with replacement within each stratum (the stratified bootstrap: every resample keeps each task's share)."""
    generator = np.random.default_rng(seed)
    arrays = [np.asarray(s, dtype=np.float64) for s in strata]
    values = np.empty(reps)
    for rep in range(reps):
        values[rep] = statistic(np.concatenate([a[generator.integers(0, len(a), len(a))] for a in arrays]))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def _improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) for one task: the Mann-Whitney U statistic over all pairs, ties counted half."""
    greater = (x[:, None] > y[None, :]).mean()
    ties = (x[:, None] == y[None, :]).mean()
    return float(greater + 0.5 * ties)


def probability_of_improvement(
    algorithm: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]], reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> tuple[float, float, float]:
    """P(a run of the algorithm scores above a run of the baseline on the same task), averaged over the tasks
    (one sequence of per-seed scores per task in each argument), with its 95% stratified bootstrap interval
    (Agarwal et al. 2021, Sec. 4.3). 0.5: no difference."""
    xs = [np.asarray(a, dtype=np.float64) for a in algorithm]
    ys = [np.asarray(b, dtype=np.float64) for b in baseline]
    point = float(np.mean([_improvement(x, y) for x, y in zip(xs, ys)]))
    generator = np.random.default_rng(seed)
    values = np.empty(reps)
    for rep in range(reps):
        values[rep] = np.mean(
            [_improvement(x[generator.integers(0, len(x), len(x))], y[generator.integers(0, len(y), len(y))])
             for x, y in zip(xs, ys)]
        )  # fmt: skip
    low, high = np.percentile(values, [2.5, 97.5])
    return point, float(low), float(high)


def performance_profile(scores: Sequence[float], thresholds: np.ndarray) -> np.ndarray:
    """The fraction of runs scoring above each threshold (the run-score distribution of Agarwal et al. 2021,
    Sec. 4.2): a whole curve instead of one number; a curve above another everywhere dominates it."""
    values = np.asarray(scores, dtype=np.float64)
    return (values[None, :] > np.asarray(thresholds)[:, None]).mean(axis=1)


def detectable_difference(per_algorithm: Sequence[Sequence[float]]) -> float:
    """The smallest difference of mean scores between two algorithms that the grid detects (a two-sided 5% test
    at 80% power): ``(z_0.975 + z_0.8) * sqrt(2 / n) * s``, with ``s`` the per-seed standard deviation pooled over
    the algorithms and ``n`` their seeds (the smallest count). NaN with fewer than two seeds."""
    groups = [np.asarray(g, dtype=np.float64) for g in per_algorithm if len(g) >= 2]
    if not groups:
        return math.nan
    pooled = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / sum(len(g) - 1 for g in groups))
    seeds = min(len(g) for g in groups)
    return (_Z_975 + _Z_80) * math.sqrt(2.0 / seeds) * pooled


def _first_reach(flops: np.ndarray, mean_curve: np.ndarray, target: float) -> float:
    """The compute at which ``mean_curve`` first reaches ``target`` (linear between evaluations), inf if never."""
    above = np.nonzero(mean_curve >= target)[0]
    if not len(above):
        return math.inf
    index = int(above[0])
    if index == 0:
        return float(flops[0])
    x0, x1, y0, y1 = flops[index - 1], flops[index], mean_curve[index - 1], mean_curve[index]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def reach_interval(
    flops: np.ndarray, curves: np.ndarray, target: float, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> tuple[float, float, float]:
    """The training compute at which the mean of the seeds' score curves (``curves``: seeds x evaluations, at the
    evaluations' compute ``flops``) first reaches ``target``, with a 95% bootstrap interval over seeds; inf where
    the mean curve never reaches it."""
    point = _first_reach(flops, curves.mean(axis=0), target)
    generator = np.random.default_rng(seed)
    values = np.array(
        [_first_reach(flops, curves[generator.integers(0, len(curves), len(curves))].mean(axis=0), target)
         for _ in range(reps)]
    )  # fmt: skip
    # No interpolation: a resample that never reaches the target is inf, and inf - inf is not a number.
    low, high = np.percentile(values, 2.5, method="lower"), np.percentile(values, 97.5, method="higher")
    return point, float(low), float(high)
