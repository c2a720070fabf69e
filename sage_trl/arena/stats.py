"""The arena's statistics, after Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice" (the
``rliable`` package): the interquartile mean of per-run scores, stratified bootstrap confidence intervals,
the probability of improvement, performance profiles, and the smallest difference a grid can detect.

Beside them, the paired reading the rows' shared seeds allow: the mean per-seed difference from the baseline with
its Student t interval (Student's t distribution in closed form for whole degrees of freedom, so no scipy).

Written on numpy rather than taken from ``rliable``: the arena needs a few small functions, and ``rliable`` would
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
    "paired_difference",
    "performance_profile",
    "probability_of_improvement",
    "reach_interval",
    "t_quantile",
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


def _t_central_mass(t: float, dof: int) -> float:
    """P(|T| <= t) for Student's t with a whole number ``dof`` of degrees of freedom, in closed form (Abramowitz and
    Stegun 26.7.3-4): with theta = atan(t / sqrt(dof)), a finite series in cos(theta), odd and even dof apart."""
    theta = math.atan(t / math.sqrt(dof))
    cos_squared = math.cos(theta) ** 2
    if dof % 2 == 0:  # sin(theta) * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(dof-2))
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= cos_squared * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    term, total = math.cos(theta), 0.0  # 2/pi * (theta + sin(theta) * (cos + 2/3 cos^3 + ... up to cos^(dof-2)))
    for k in range(1, (dof - 1) // 2 + 1):
        total += term
        term *= cos_squared * (2 * k) / (2 * k + 1)
    return 2.0 / math.pi * (theta + math.sin(theta) * total)


def t_quantile(probability: float, dof: int) -> float:
    """The ``probability`` quantile (between 0.5 and 1) of Student's t with ``dof`` degrees of freedom (a positive
    whole number), by bisection of the closed-form distribution function: ``t_quantile(0.975, 11)`` is 2.201."""
    if not 0.5 <= probability < 1.0 or dof < 1 or int(dof) != dof:
        raise ValueError(f"t_quantile needs 0.5 <= probability < 1 and whole dof >= 1, got {probability}, {dof}.")
    dof, mass, low, high = int(dof), 2.0 * probability - 1.0, 0.0, 1.0
    while _t_central_mass(high, dof) < mass:
        high *= 2.0
    for _ in range(100):  # the bracket halves each time: far below float precision at the end
        middle = 0.5 * (low + high)
        low, high = (middle, high) if _t_central_mass(middle, dof) < mass else (low, middle)
    return 0.5 * (low + high)


def paired_difference(differences: Sequence[float]) -> tuple[float, float, float]:
    """The mean of per-seed differences (a row's score minus the baseline's, seed by seed) and its 95% Student t
    interval: the paired reading, which removes the spread the rows share through their seeds (a seed starts every
    row from the same random draws). NaN bounds with fewer than two seeds."""
    values = np.asarray(differences, dtype=np.float64)
    mean = float(values.mean()) if len(values) else math.nan
    if len(values) < 2:
        return mean, math.nan, math.nan
    half_width = t_quantile(0.975, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return mean, mean - half_width, mean + half_width
