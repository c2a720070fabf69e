"""Smoke run of ``python -m benchmarks.kl_ablation --quick`` and the grids it covers."""

from __future__ import annotations

import math
from pathlib import Path

from agents import KL_STRATEGIES
from benchmarks import kl_ablation
from tests.benchmarks.markdown_sections import linked_images, quick_arguments, section_of


def test_quick_run_trains_and_measures_the_kl_gradient(tmp_path: Path) -> None:
    results = kl_ablation.main(quick_arguments(tmp_path))
    ((config, (run,)),) = results.items()
    assert config == ("setting_b", "sage", "dual", kl_ablation.PAPER_KL)
    assert run.spec.reward_preset == "setting_b" and run.spec.kl_strategy == "dual"
    share = run.inspection["kl_gradient_share"]
    assert math.isnan(share) or share >= 0
    section = section_of(tmp_path / "benchmarks.md", "kl_ablation")
    assert "The prior before training" in section and section.count("| distance to world |") == 2
    assert all(image.is_file() for image in linked_images(section, tmp_path))


def test_grids_cover_the_paper_ablations() -> None:
    setting_b_sage = {c[2] for c in kl_ablation.DEFAULT_GRID if c[:2] == ("setting_b", "sage")}
    assert setting_b_sage == set(KL_STRATEGIES)
    assert {c[0] for c in kl_ablation.DEFAULT_GRID} == {"setting_a", "setting_b"}
    assert len(kl_ablation.FULL_GRID) == 2 * 4 * len(KL_STRATEGIES)
    assert all(c[3] == kl_ablation.STRONG_KL and c[2] != "none" for c in kl_ablation.STRONG_GRID)
