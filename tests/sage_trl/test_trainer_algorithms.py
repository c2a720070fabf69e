"""SageGRPOTrainer drives any `agents.Algorithm`: one that chooses its rollout schedule (MixGRPO), one with no
transition likelihood (DiffusionNFT); the rollout travels as one `agents.ScoredTrajectory` and checkpoints as one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents import ScoredTrajectory
from sage_trl.run_folder import load_state, save_state
from tests.doubles import mean_brightness
from tests.sage_trl.tiny_trainer import make_trainer


def test_mix_grpo_rolls_out_inside_its_moving_window(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path,
        algorithm="mix_grpo",
        algorithm_args={"sde_window_size": 2, "sde_window_shift_interval": 1},
        max_steps=3,
        gradient_accumulation_steps=1,
    )
    schedules = []
    rollout = trainer._rollout

    def recording_rollout(prompts, seeds):
        trajectory = rollout(prompts, seeds)
        schedules.append(trajectory.sde_types)
        return trajectory

    trainer._rollout = recording_rollout
    trainer.train()
    # 4 steps, window 2 over starts 0..2, moved after every optimizer step (one per rollout here).
    assert schedules == [
        ("flow_grpo", "flow_grpo", "ode", "ode"),
        ("ode", "flow_grpo", "flow_grpo", "ode"),
        ("ode", "ode", "flow_grpo", "ode"),
    ]
    assert isinstance(trainer._buffered_inputs[0], ScoredTrajectory)


def _brightness_change(tmp_path: Path, algorithm: str, sign: float) -> float:
    def reward(videos, prompts, **kwargs):
        return sign * mean_brightness(videos, prompts)

    trainer = make_trainer(
        tmp_path, reward, peft=False, algorithm=algorithm, max_steps=30, gradient_accumulation_steps=1,
        learning_rate=1e-2,
    )  # fmt: skip
    trainer.train()
    brightness = [sign * h["reward/total"] for h in trainer.state.log_history if "reward/total" in h]
    return sum(brightness[-6:]) / 6 - sum(brightness[:6]) / 6


@pytest.mark.parametrize("algorithm", ["diffusion_nft", "awm"])
def test_likelihood_free_algorithms_train_in_the_rewards_direction(tmp_path: Path, algorithm: str) -> None:
    # ODE rollouts: no transition has a log-probability; the reward alone steers the flow-matching loss.
    assert _brightness_change(tmp_path / "up", algorithm, +1.0) > 0.05
    assert _brightness_change(tmp_path / "down", algorithm, -1.0) < -0.05


def test_a_scored_trajectory_checkpoints_without_pickle_and_comes_back_whole(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.train()
    rollout = trainer._buffered_inputs[0]
    save_state({"buffered": [rollout.state_dict()]}, tmp_path / "state.json", tmp_path / "state.safetensors")
    loaded = ScoredTrajectory.from_state_dict(
        load_state(tmp_path / "state.json", tmp_path / "state.safetensors")["buffered"][0]
    )
    assert loaded.trajectory.prompts == rollout.trajectory.prompts
    assert loaded.trajectory.sde_types == rollout.trajectory.sde_types
    assert loaded.trajectory.rewards.errors == rollout.trajectory.rewards.errors
    for name in ("latents", "sigmas", "log_probs", "trainable", "seeds"):
        assert torch.equal(getattr(loaded.trajectory, name), getattr(rollout.trajectory, name)), name
    assert torch.equal(loaded.trajectory.rewards.total, rollout.trajectory.rewards.total)
    assert torch.equal(loaded.advantages, rollout.advantages) and torch.equal(loaded.usable, rollout.usable)


def test_a_checkpoint_with_the_earlier_rollout_layout_is_refused_with_what_to_do(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    earlier = {"latents": torch.zeros(2, 3), "advantages": torch.zeros(2), "prompt": ["a", "b"]}
    with pytest.raises(ValueError, match="earlier sage-grpo version"):
        trainer.load_process_state({"buffered_inputs": [earlier], "kl_values": [], "generator": None})
