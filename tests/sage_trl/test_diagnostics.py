"""Diagnostic metrics of a training step (docs/runs.md, "What the metrics mean"): the training forward's
log-probabilities against the rollout's, the importance ratio where it must be 1, and the clip fractions by side."""

from __future__ import annotations

from pathlib import Path

import pytest
from peft import LoraConfig

from sage_trl import SageGRPOTrainer
from tests.doubles import LinearBackbone, mean_brightness
from tests.sage_trl.tiny_trainer import PROMPTS, make_args


def train(tmp_path: Path, lora_dropout: float = 0.0, **settings) -> list[dict]:
    lora = LoraConfig(
        r=2, lora_alpha=4, target_modules=["mix", "prompt_proj", "sigma_proj"], init_lora_weights="gaussian",
        lora_dropout=lora_dropout,
    )  # fmt: skip
    trainer = SageGRPOTrainer(
        LinearBackbone(), mean_brightness, args=make_args(tmp_path, **settings), train_dataset=PROMPTS, peft_config=lora
    )
    trainer.train()
    return [record for record in trainer.state.log_history if "loss" in record]


def test_the_on_policy_ratio_is_one_unless_dropout_is_left_on(tmp_path: Path) -> None:
    clean = train(tmp_path / "clean")
    # Each rollout is trained on-policy first (gradient_accumulation_steps 2 = steps_per_generation x iterations).
    assert all(record["diagnostics/on_policy_ratio_deviation"] < 1e-5 for record in clean)
    assert all(record["diagnostics/log_prob_gap"] < 1e-5 for record in clean)
    assert all(record["diagnostics/invalid_reward_fraction"] == 0 for record in clean)
    dropout = train(tmp_path / "dropout", lora_dropout=0.5)  # the training forward drops, the rollout did not
    # (Not at the first step: LoRA's B starts at zero, so the adapter adds nothing to drop until it has trained.)
    assert dropout[-1]["diagnostics/on_policy_ratio_deviation"] > 1e-3


def test_clip_fractions_split_by_side_and_off_policy_steps_show_their_gap(tmp_path: Path) -> None:
    # Four steps per rollout (two iterations x two steps): the later ones run after updates, off-policy.
    records = train(tmp_path, max_steps=4, num_iterations=2, gradient_accumulation_steps=1, learning_rate=0.5)
    for record in records:
        assert record["clip_fraction"] == pytest.approx(record["clip_fraction_high"] + record["clip_fraction_low"])
    off_policy = [r for r in records if "diagnostics/on_policy_ratio_deviation" not in r]
    assert off_policy and max(r["diagnostics/log_prob_gap"] for r in off_policy) > 1e-4
    assert any(r["clip_fraction"] > 0 for r in off_policy)


def test_the_log_prob_gap_is_logged_per_denoising_step(tmp_path: Path) -> None:
    records = train(tmp_path, max_steps=3, num_iterations=2, gradient_accumulation_steps=1, learning_rate=0.5)
    for record in records:
        steps = {name: value for name, value in record.items() if name.startswith("diagnostics/step_")}
        assert steps and all(name.endswith("/log_prob_gap") for name in steps)  # the shares are not logged
        # Every step's mean over its own pairs: the overall gap lies between the smallest and the largest.
        assert min(steps.values()) - 1e-9 <= record["diagnostics/log_prob_gap"] <= max(steps.values()) + 1e-9
    assert any(max(r[n] for n in r if n.startswith("diagnostics/step_")) > 1e-4 for r in records)  # off-policy steps
