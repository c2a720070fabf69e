"""Diagnostic metrics of a training step (docs/runs.md, "What the metrics mean"): the training forward's
log-probabilities against the rollout's, the importance ratio where it must be 1, the clip fractions by side and
the gradient norm per denoising step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig

from agents.diagnostics import per_step_gradient_norms
from sage_trl import SageGRPOTrainer
from sage_trl.gradient_probe import SPREAD_METRIC, GradientProbe
from tests.doubles import LinearBackbone, mean_brightness
from tests.sage_trl.tiny_trainer import PROMPTS, lora, make_args, make_trainer, named_params


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


def test_the_gradient_norm_per_denoising_step_is_measured_without_changing_training(tmp_path: Path) -> None:
    probed = SageGRPOTrainer(
        LinearBackbone(), mean_brightness, args=make_args(tmp_path / "probed", max_steps=3, gradient_norm_steps=2),
        train_dataset=PROMPTS, peft_config=lora(),
    )  # fmt: skip
    probed.train()
    plain = SageGRPOTrainer(
        LinearBackbone(), mean_brightness, args=make_args(tmp_path / "plain", max_steps=3),
        train_dataset=PROMPTS, peft_config=lora(),
    )  # fmt: skip
    plain.train()
    for name, value in named_params(probed.backbone.transformer).items():  # the probe only reads gradients
        assert torch.equal(value, named_params(plain.backbone.transformer)[name]), name
    records = {r["step"]: r for r in probed.state.log_history if "loss" in r}
    norms = {step: {n: v for n, v in r.items() if n.endswith("/grad_norm")} for step, r in records.items()}
    assert norms[1] and norms[3] and not norms[2]  # optimizer steps 1 and 3 (global_step 0 and 2 when computed)
    assert all(value > 0 for value in norms[1].values())
    assert records[1][SPREAD_METRIC] == pytest.approx(max(norms[1].values()) / min(norms[1].values()))


def test_each_steps_gradient_norm_is_the_norm_of_that_steps_loss_gradient(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    batches = []
    trainer._gradient_probe = batches.append  # keep the training batches the trainer built
    trainer.train()
    batch = batches[-1]
    parameters = [p for p in trainer.backbone.transformer.parameters() if p.requires_grad]
    # Micro-batches of one pair: the per-step gradient is accumulated over them.
    norms = per_step_gradient_norms(trainer.algorithm, trainer.backbone, batch, trainer.references, parameters, 1)
    assert sorted(norms) == sorted(set(batch.step_index.tolist()))
    for step, norm in norms.items():
        trainer.backbone.transformer.zero_grad()
        rows = batch.select(torch.nonzero(batch.step_index == step).flatten())
        trainer.algorithm.loss(trainer.backbone, rows, trainer.references)[0].backward()
        expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
        assert norm == pytest.approx(float(expected), rel=1e-5)


def test_the_gradient_probe_refuses_sharded_weights() -> None:
    trainer = SimpleNamespace(args=SimpleNamespace(gradient_norm_steps=5), is_fsdp_enabled=True, is_deepspeed_enabled=False)
    with pytest.raises(ValueError, match="gradient_norm_steps 0"):
        GradientProbe(trainer)
