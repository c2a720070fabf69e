"""Smoke run of ``python -m benchmarks.sde_noise_std --quick`` and the App. A.2 claims it checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import sde_noise_std
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_writes_its_section_and_plot(tmp_path: Path) -> None:
    table = sde_noise_std.main(quick_arguments(tmp_path))
    section = section_of(tmp_path / "benchmarks.md", "sde_noise_std")
    assert "Regime (a)" in section and "Regime (c)" in section
    assert all(image.is_file() for image in linked_images(section, tmp_path))
    assert set(table) == {"a", "b", "c"}


def test_regimes_reproduce_the_closed_forms() -> None:
    table = sde_noise_std.std_table(20, 5.0, 1.0)
    sigmas = sde_noise_std.flow_match_sigmas(20, 5.0)
    # (a): sage's first step runs from sigma_max to sigma_max, an empty integral.
    assert table["a"]["sage"][0] == 0
    # (b): FlowGRPO's sigma / (1 - sigma) with 1 - sigma clamped to 3e-3.
    clamped = 1 - 3e-3
    expected = (clamped / (1 - clamped) * (clamped - sigmas[1].item())) ** 0.5
    assert table["b"]["flow_grpo"][0].item() == pytest.approx(expected, rel=1e-4)
    # (c): FlowGRPO's first-step std is eta, sage stays below FlowGRPO on most steps.
    assert table["c"]["flow_grpo"][0].item() == pytest.approx(1.0)
    assert int((table["c"]["sage"] < table["c"]["flow_grpo"]).sum()) > 10
    assert all(
        line.endswith("agrees.") or "agrees qualitatively" in line
        for line in sde_noise_std.claim_verdicts(table, 1.0)
    )
    assert torch.equal(table["a"]["ode"], torch.zeros(20))
