"""Smoke run of ``python -m benchmarks.gradient_norms --quick``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import gradient_norms
from sage_env import sde
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_measures_gradients_through_the_backbone(tmp_path: Path) -> None:
    results = gradient_norms.main(quick_arguments(tmp_path))
    assert [r.sde_type for r in results] == ["sage", "flow_grpo"]
    for result in results:
        assert len(result.steps) == 3
        # d log pi / d v = lambda_t (x' - mean) / (std^2 D): its norm follows N_t up to the noise's norm.
        correlation, _ = result.fit("velocity_norm", result.column("scale"))
        assert correlation > 0.99
        assert all(step.parameter_norm > 0 for step in result.steps)
        # The equalizer weights are S_t = median(N) / N_t of the schedule.
        scales = result.column("scale")
        assert torch.allclose(result.column("weight"), scales.median() / scales, rtol=1e-4)
    section = section_of(tmp_path / "benchmarks.md", "gradient_norms")
    assert "spread with equalizer" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))


def test_spread_and_fit_on_known_values() -> None:
    steps = [
        gradient_norms.StepGradients(
            sigma=s, std=1.0, scale=n, weight=2.0 / n, velocity_norm=3 * n, parameter_norm=n
        )
        for s, n in ((0.9, 1.0), (0.5, 2.0), (0.1, 4.0))
    ]
    result = gradient_norms.SDEGradients("sage", steps)
    assert result.spread("parameter_norm") == pytest.approx(4.0)
    assert result.spread("parameter_norm", equalized=True) == pytest.approx(1.0)
    correlation, residual = result.fit("velocity_norm", result.column("scale"))
    assert correlation == pytest.approx(1.0)
    assert residual == pytest.approx(0.0, abs=1e-12)
    assert sde.SDE_TYPES  # the module under test uses the library's SDE types
