"""Interleaved timing, paired ratios and power-law fits."""

from __future__ import annotations

import pytest

from benchmarks import timing


def test_interleaved_times_rotates_the_order_and_counts_calls() -> None:
    calls: list[str] = []
    candidates = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = timing.interleaved_times(candidates, repeats=3, warmup=1)
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    with pytest.raises(ValueError, match="repeats"):
        timing.interleaved_times(candidates, repeats=0)


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    assert timing.paired_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 1.0]) == 3.0
    with pytest.raises(ValueError):
        timing.paired_ratio([1.0], [1.0, 2.0])


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0])
def test_fit_power_law_recovers_the_exponent(exponent: float) -> None:
    sizes = [1.0, 2.0, 4.0, 8.0, 16.0]
    fitted, r2 = timing.fit_power_law(sizes, [3.0 * s**exponent for s in sizes])
    assert fitted == pytest.approx(exponent, abs=1e-9)
    assert r2 == pytest.approx(1.0)


def test_fit_line_recovers_slope_and_intercept() -> None:
    slope, intercept = timing.fit_line([1, 2, 3, 4], [5.0, 7.0, 9.0, 11.0])
    assert slope == pytest.approx(2.0)
    assert intercept == pytest.approx(3.0)
