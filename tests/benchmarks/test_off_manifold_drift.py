"""Smoke run of ``python -m benchmarks.off_manifold_drift --quick`` and the clean-video manifold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import off_manifold_drift
from sage_env.toy.gold import distance_to_world
from sage_env.toy.world import TOY_PROMPTS, render_video
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


@pytest.fixture(scope="module")
def manifold() -> off_manifold_drift.CleanManifold:
    return off_manifold_drift.CleanManifold.build()


def test_manifold_holds_every_start_position(manifold: off_manifold_drift.CleanManifold) -> None:
    # Start jitter of +-2 px along each axis: at most 25 distinct starts per prompt, all rendered.
    per_prompt = {prompt: manifold.prompts.count(prompt) for prompt in TOY_PROMPTS}
    assert all(1 < count <= 25 for count in per_prompt.values())
    clean = torch.stack([render_video(p, 12345) for p in TOY_PROMPTS[:3]])
    to_own, to_manifold = manifold.distances(clean, TOY_PROMPTS[:3])
    assert torch.equal(to_own, torch.zeros(3)) and torch.equal(to_manifold, torch.zeros(3))
    shifted = (clean + 0.1).clamp(0, 1)
    to_own, to_manifold = manifold.distances(shifted, TOY_PROMPTS[:3])
    assert (to_manifold <= to_own).all() and (to_own > 0).all()
    torch.testing.assert_close(to_own, distance_to_world(shifted, TOY_PROMPTS[:3]))  # the gold score


def test_quick_run_measures_every_configuration(tmp_path: Path) -> None:
    results = off_manifold_drift.main(quick_arguments(tmp_path))
    assert [(r.sde_type, r.eta) for r in results] == [("ode", 0.0), ("sage", 0.7), ("flow_grpo", 0.7)]
    assert results[0].injected_variance == 0 and results[1].injected_variance > 0
    for result in results:
        assert (result.to_manifold <= result.to_own + 1e-6).all()
        assert result.estimate_distance.shape == (10,)
    section = section_of(tmp_path / "benchmarks.md", "off_manifold_drift")
    assert "Ordered by distance to the manifold" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))
