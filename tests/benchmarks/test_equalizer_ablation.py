"""Smoke run of ``python -m benchmarks.equalizer_ablation --quick`` (the library's training path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import equalizer_ablation
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_trains_with_and_without_the_equalizer(tmp_path: Path) -> None:
    results = equalizer_ablation.main(quick_arguments(tmp_path))
    assert set(results) == {("sage", True), ("sage", False)}
    for (_, equalizer), (run,) in results.items():
        assert run.spec.equalizer is equalizer
        assert len(run.curves["reward/total"]) == run.spec.num_updates == 1
        assert {"vq", "mq", "ta", "total", "overall", "world_distance", "object_area_ratio"} <= set(run.after)
        assert run.after["overall"] == pytest.approx(
            (run.after["vq"] + run.after["mq"] + run.after["ta"]) / 3
        )
    section = section_of(tmp_path / "benchmarks.md", "equalizer_ablation")
    assert "equalizer" in section and "| distance to world after |" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))
