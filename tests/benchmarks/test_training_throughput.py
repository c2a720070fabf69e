"""Smoke run of ``python -m benchmarks.training_throughput --quick``."""

from __future__ import annotations

from pathlib import Path

from benchmarks import training_throughput
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_checks_that_micro_batching_keeps_the_gradients(tmp_path: Path) -> None:
    (result,) = training_throughput.main(quick_arguments(tmp_path))
    assert result.gradients_allclose
    assert result.gradient_max_difference <= 1e-3 * result.gradient_scale
    assert sorted(result.seconds) == [1, 4, 10]
    assert result.num_pairs == 2 * 5  # 2 videos x the 5 SDE steps of the toy schedule
    section = section_of(tmp_path / "benchmarks.md", "training_throughput")
    assert "per pair, as the official loop" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))
