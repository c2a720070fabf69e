"""Smoke run of ``python -m benchmarks.memory --quick`` (child processes) and the projection's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import memory
from tests.benchmarks.markdown_sections import quick_arguments, section_of


@pytest.mark.slow
def test_quick_run_measures_lora_and_full_fine_tuning_in_subprocesses(tmp_path: Path) -> None:
    results, fit = memory.main(quick_arguments(tmp_path))
    (lora_case, lora), (full_case, full) = results
    assert (lora_case.mode, full_case.mode) == ("lora", "full")
    assert full["trainable_parameters"] == full["total_parameters"] > 10 * lora["trainable_parameters"]
    # Dual KL anchors: an fp32 copy of the trainable parameters, nothing more.
    assert full["anchor_bytes"] == 4 * full["trainable_parameters"]
    assert lora["anchor_bytes"] == 4 * lora["trainable_parameters"]
    # AdamW keeps two fp32 moments per trainable parameter (plus a step counter each).
    assert full["optimizer_bytes"] >= 8 * full["trainable_parameters"]
    assert all(m["train_peak"] >= m["baseline"] > 0 for m in (lora, full))
    assert len(fit.points) == 2
    section = section_of(tmp_path / "benchmarks.md", "memory")
    assert "Projection (not a measurement)" in section


def test_activation_fit_separates_layers_from_the_checkpointed_inputs() -> None:
    case = memory.MemoryCase("x", "lora", "dual", num_videos=2, sde_steps=1)  # 2 pairs per micro-batch
    layers, width, layer_bytes, input_bytes = 4, 8, 100.0, 4.0
    measured = []
    for height in (8, 16, 24):
        sized = memory.MemoryCase("x", "lora", "dual", height=height, width=height, num_videos=2, sde_steps=1)
        tokens = sized.micro_batch * sized.tokens_per_video
        plain = {"setup": 1000, "train_peak": 1000 + 50 + layer_bytes * layers * width * tokens}
        checkpointed = {
            "setup": 1000,
            "train_peak": 1000 + 50 + (input_bytes * layers + layer_bytes) * width * tokens,
        }
        measured.append((sized, plain, checkpointed))
    fit = memory.fit_activations(measured, layers, width)
    assert fit.layer_bytes == pytest.approx(layer_bytes)
    assert fit.input_bytes == pytest.approx(input_bytes)
    assert fit.activation_bytes(10, 54, 16, checkpointing=True) == pytest.approx((4.0 * 54 + 100.0) * 10 * 16)
    assert case.micro_batch == 2
