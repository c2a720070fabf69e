"""Timing on a shared, noisy CPU: interleaved repeats, medians, paired ratios and power-law fits.

Other jobs share the machine's cores, so an absolute time says little. Candidates are therefore timed in the
same process, interleaved (the order rotates every repeat so that slow phases of the machine hit each
candidate alike), and compared by the median of per-repeat ratios.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["fit_line", "fit_power_law", "interleaved_times", "median", "paired_ratio", "time_call"]


def time_call(function: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call of ``function``."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def interleaved_times(
    candidates: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds of ``repeats`` calls of each candidate, interleaved with a rotating order.

    Args:
        candidates: ``{name: zero-argument callable}``; each call is one measured unit of work.
        repeats: measured calls per candidate (>= 1).
        warmup: unmeasured calls per candidate first (caches, allocator, lazy initialisation).

    Returns:
        ``{name: [seconds of each repeat]}``, repeat ``r`` of every candidate taken in the same round.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"Need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}.")
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(time_call(candidates[name]))
    return times


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median of the per-repeat ratios ``numerator[r] / denominator[r]`` (same-round measurements)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("paired_ratio needs two non-empty sequences of equal length.")
    return median([a / b for a, b in zip(numerator, denominator)])


def fit_power_law(sizes: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``value = c * size ** k`` in log space; returns ``(k, r2)``.

    ``k = 1`` is linear scaling, ``k = 2`` quadratic; ``r2`` is the coefficient of determination of the
    log-log line (1: a clean power law).
    """
    if len(sizes) != len(values) or len(sizes) < 2:
        raise ValueError("fit_power_law needs at least two (size, value) pairs.")
    if min(sizes) <= 0 or min(values) <= 0:
        raise ValueError("fit_power_law needs positive sizes and values.")
    x = torch.tensor([math.log(s) for s in sizes], dtype=torch.float64)
    y = torch.tensor([math.log(v) for v in values], dtype=torch.float64)
    design = torch.stack([x, torch.ones_like(x)], dim=1)
    solution = torch.linalg.lstsq(design, y[:, None]).solution[:, 0]
    residual = y - design @ solution
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - float((residual**2).sum() / total) if total > 0 else 1.0
    return float(solution[0]), r2


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``y = slope * x + intercept``; returns ``(slope, intercept)``."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("fit_line needs at least two (x, y) pairs.")
    x = torch.tensor([float(v) for v in xs], dtype=torch.float64)
    y = torch.tensor([float(v) for v in ys], dtype=torch.float64)
    design = torch.stack([x, torch.ones_like(x)], dim=1)
    solution = torch.linalg.lstsq(design, y[:, None]).solution[:, 0]
    return float(solution[0]), float(solution[1])
