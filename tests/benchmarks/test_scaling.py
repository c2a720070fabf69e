"""Smoke run of ``python -m benchmarks.scaling --quick``."""

from __future__ import annotations

from pathlib import Path

from benchmarks import scaling
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_sweeps_each_axis_and_fits_exponents(tmp_path: Path) -> None:
    results = scaling.main(quick_arguments(tmp_path))
    assert set(results) == {"frames", "group size"}
    frames = results["frames"]
    assert [r.size for r in frames] == [4 * 8 * 8, 8 * 8 * 8]  # tokens per video at 16 x 16, patch 2 x 2
    assert [r.size for r in results["group size"]] == [2, 4]  # videos: 1 prompt x G
    assert all(r.rollout_seconds > 0 and r.train_seconds > 0 for rs in results.values() for r in rs)
    section = section_of(tmp_path / "benchmarks.md", "scaling")
    assert "time = c * size^k" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))


def test_axis_sizes() -> None:
    point = scaling.ScalingPoint(num_frames=16, resolution=32, group_size=8, num_steps=20, num_prompts=2)
    assert scaling.axis_size("resolution", point) == 16 * 16 * 16
    assert scaling.axis_size("group size", point) == 16
    assert scaling.axis_size("denoising steps", point) == 20
