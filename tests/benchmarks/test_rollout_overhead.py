"""Smoke run of ``python -m benchmarks.rollout_overhead --quick``."""

from __future__ import annotations

from pathlib import Path

from benchmarks import rollout_overhead
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_times_both_loops_on_the_same_rollout(tmp_path: Path) -> None:
    results = rollout_overhead.main(quick_arguments(tmp_path))
    assert [r.case.backbone for r in results] == ["prior", "wan"]
    for result in results:
        # The hand-written loop and the env produce the same final latents: they do the same work.
        assert result.max_latent_difference < 1e-3
        assert result.ratio > 0 and result.model_share > 0
    section = section_of(tmp_path / "benchmarks.md", "rollout_overhead")
    assert "env+agent / hand loop" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))
