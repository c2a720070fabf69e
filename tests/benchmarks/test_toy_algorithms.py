"""Smoke run of ``python -m benchmarks.toy_algorithms --quick``: cells through ``sage-train``, FLOPs counted, a
finished cell kept on a rerun; and the t interval against a textbook value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import toy_algorithms
from tests.benchmarks.markdown_sections import quick_arguments, section_of


def test_the_t_interval_matches_the_textbook() -> None:
    low, high = toy_algorithms.t_interval([1.0, 2.0, 3.0])  # mean 2, std 1, t(0.975, 2) = 4.303
    assert (low, high) == pytest.approx((2 - 4.303 / 3**0.5, 2 + 4.303 / 3**0.5))
    with pytest.raises(ValueError, match="2 to 11 values"):
        toy_algorithms.t_interval([1.0])


@pytest.mark.slow
def test_quick_grid_counts_flops_and_keeps_finished_cells(tmp_path: Path) -> None:
    arguments = [*quick_arguments(tmp_path), "--algorithms", "sage_grpo,diffusion_nft", "--seeds", "0,1"]
    arguments += ["--runs", str(tmp_path / "runs")]
    toy_algorithms.main(arguments)
    section = section_of(tmp_path / "benchmarks.md", "toy_algorithms")
    assert "| `sage_grpo` | 2 |" in section and "| `diffusion_nft` | 2 |" in section
    cell = json.loads((tmp_path / "runs" / "diffusion_nft-seed0" / "benchmark.json").read_text())
    # Its training forwards (with gradient) and its rollouts, old-policy and reference forwards (without) counted.
    assert cell["flops"]["total"] > cell["flops"]["train"] > cell["flops"]["grad"] > 0  # evaluations counted apart
    stamp = (tmp_path / "runs" / "sage_grpo-seed0" / "benchmark.json").stat().st_mtime_ns
    toy_algorithms.main(arguments)  # every cell finished: none runs again
    assert (tmp_path / "runs" / "sage_grpo-seed0" / "benchmark.json").stat().st_mtime_ns == stamp
