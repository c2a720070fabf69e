"""The arena's statistics (sage_trl.arena.stats) against values worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sage_trl.arena import stats


def test_the_interquartile_mean_drops_a_quarter_of_the_runs_at_each_end() -> None:
    assert stats.iqm([1, 2, 3, 4, 100, 5, 6, 7]) == 4.5  # 1, 2 and 7, 100 cut; mean of 3..6
    assert stats.iqm([3.0]) == 3.0 and stats.iqm([1.0, 2.0, 3.0]) == 2.0  # fewer than four runs: nothing cut


def test_the_stratified_bootstrap_keeps_each_tasks_share_and_repeats() -> None:
    # Two tasks, constant within each: every stratified resample has three runs of each, so the mean is 5 exactly;
    # resampling the six runs together would draw other mixes.
    assert stats.bootstrap_interval([[0, 0, 0], [10, 10, 10]], np.mean) == (5.0, 5.0)
    scores = [[0.1, 0.4, 0.2, 0.9, 0.3]]
    low, high = stats.bootstrap_interval(scores, stats.iqm)
    assert low < stats.iqm(scores[0]) < high
    assert stats.bootstrap_interval(scores, stats.iqm) == (low, high)  # seeded: the same cells, the same interval


def test_the_probability_of_improvement_counts_pairs_and_ties_half() -> None:
    assert stats.probability_of_improvement([[2, 3, 4]], [[0, 1]]) == (1.0, 1.0, 1.0)
    assert stats.probability_of_improvement([[1, 1]], [[1, 1]])[0] == 0.5
    # P(X > Y) over the 4 pairs: (1 > 0) and (1 = 1, half) and (3 > 0) and (3 > 1): 3.5 / 4; two tasks averaged.
    point, low, high = stats.probability_of_improvement([[1, 3], [0]], [[0, 1], [1]])
    assert point == pytest.approx((3.5 / 4 + 0.0) / 2) and low <= point <= high


def test_the_detectable_difference_is_the_two_sample_power_formula() -> None:
    groups = [[0.0, 2.0], [1.0, 3.0]]  # each a per-seed standard deviation of sqrt(2), two seeds
    expected = (1.959964 + 0.841621) * math.sqrt(2 / 2) * math.sqrt(2)
    assert stats.detectable_difference(groups) == pytest.approx(expected)
    assert math.isnan(stats.detectable_difference([[1.0], [2.0]]))  # one seed: no spread to pool
    # Four times the seeds, half the detectable difference.
    assert stats.detectable_difference([[0.0, 2.0] * 4, [1.0, 3.0] * 4]) < expected / 2 * 1.2


def test_performance_profiles_fall_with_the_threshold() -> None:
    profile = stats.performance_profile([0.1, 0.2, 0.3, 0.4], np.array([0.0, 0.15, 0.35, 0.5]))
    assert profile.tolist() == [1.0, 0.75, 0.25, 0.0]


def test_the_compute_to_reach_a_score_interpolates_and_says_never() -> None:
    flops = np.array([0.0, 10.0, 20.0])
    curves = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    assert stats.reach_interval(flops, curves, 1.5) == (15.0, 15.0, 15.0)
    assert stats.reach_interval(flops, curves, 5.0) == (math.inf, math.inf, math.inf)
    point, low, high = stats.reach_interval(flops, np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]]), 0.9)
    assert point == 18.0 and low == 9.0 and high == math.inf  # a resample of the flat seed alone never gets there


def test_the_t_quantile_is_the_tables() -> None:
    # Student's t, two-sided 95% (0.975) and 80% (0.9), from the printed tables, odd and even dof.
    table = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 7): 2.365, (0.975, 11): 2.201, (0.975, 30): 2.042,
             (0.9, 1): 3.078, (0.9, 10): 1.372, (0.5, 4): 0.0}  # fmt: skip
    for (probability, dof), value in table.items():
        assert stats.t_quantile(probability, dof) == pytest.approx(value, abs=5e-4)
    assert stats.t_quantile(0.975, 10_000) == pytest.approx(1.960, abs=5e-4)  # the normal's, in the limit
    with pytest.raises(ValueError, match="whole dof >= 1"):
        stats.t_quantile(0.975, 0)


def test_the_paired_difference_is_the_mean_with_its_t_interval() -> None:
    # Differences 1, 2, 3: mean 2, standard deviation 1, three seeds: 2 -+ t(0.975, 2) / sqrt(3).
    mean, low, high = stats.paired_difference([1.0, 2.0, 3.0])
    half_width = 4.302653 / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half_width, 2.0 + half_width))
    assert stats.paired_difference([0.5, 0.5]) == (0.5, 0.5, 0.5)  # no spread: no width
    mean, low, high = stats.paired_difference([0.25])
    assert mean == 0.25 and math.isnan(low) and math.isnan(high)  # one seed: no interval
