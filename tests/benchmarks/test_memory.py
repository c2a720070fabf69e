"""Smoke run of ``python -m benchmarks.memory --quick`` (child processes, and the traced full-size table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import memory
from tests.benchmarks.markdown_sections import quick_arguments, section_of


@pytest.mark.slow
def test_quick_run_measures_lora_and_full_fine_tuning_in_subprocesses(tmp_path: Path) -> None:
    results = memory.main(quick_arguments(tmp_path))
    (lora_case, lora), (full_case, full) = results
    assert (lora_case.mode, full_case.mode) == ("lora", "full")
    assert full["trainable_parameters"] == full["total_parameters"] > 10 * lora["trainable_parameters"]
    # Dual KL anchors: an fp32 copy of the trainable parameters, nothing more.
    assert full["anchor_bytes"] == 4 * full["trainable_parameters"]
    assert lora["anchor_bytes"] == 4 * lora["trainable_parameters"]
    # AdamW keeps two fp32 moments per trainable parameter (plus a step counter each).
    assert full["optimizer_bytes"] >= 8 * full["trainable_parameters"]
    assert all(m["train_peak"] >= m["baseline"] > 0 for m in (lora, full))
    section = section_of(tmp_path / "benchmarks.md", "memory")
    assert "Full size, traced (not measured on a GPU)" in section and "| training micro-step |" in section
    assert "Projection" not in section
