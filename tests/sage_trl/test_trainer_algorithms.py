"""SageGRPOTrainer drives any `agents.Algorithm`: one that chooses its rollout schedule (MixGRPO), one with no
transition likelihood (DiffusionNFT); the rollout travels as one `agents.ScoredTrajectory` and checkpoints as one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents import ScoredTrajectory
from agents.mix_grpo_flash import compressed_schedule
from sage_env import Trajectory
from sage_trl import SageGRPOTrainer
from sage_trl.run_folder import load_state, save_state
from tests.doubles import mean_brightness
from tests.sage_trl.tiny_trainer import PROMPTS, LinearBackbone, lora, make_args, make_trainer


def _train_recording_rollouts(trainer) -> list[Trajectory]:
    """Train, keeping every rollout the trainer samples."""
    rollouts, rollout = [], trainer._rollout

    def recording_rollout(prompts, seeds):
        rollouts.append(rollout(prompts, seeds))
        return rollouts[-1]

    trainer._rollout = recording_rollout
    trainer.train()
    return rollouts


def test_mix_grpo_rolls_out_inside_its_moving_window(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path,
        algorithm="mix_grpo",
        algorithm_args={"sde_window_size": 2, "sde_window_shift_interval": 1},
        max_steps=3,
        gradient_accumulation_steps=1,
    )
    schedules = [trajectory.sde_types for trajectory in _train_recording_rollouts(trainer)]
    # 4 steps, window 2 over starts 0..2, moved after every optimizer step (one per rollout here).
    assert schedules == [
        ("flow_grpo", "flow_grpo", "ode", "ode"),
        ("ode", "flow_grpo", "flow_grpo", "ode"),
        ("ode", "ode", "flow_grpo", "ode"),
    ]
    assert isinstance(trainer._buffered_inputs[0], ScoredTrajectory)


def test_mix_grpo_flash_rolls_out_on_its_compressed_schedule(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path,
        algorithm="mix_grpo_flash",
        algorithm_args={"sde_window_size": 2, "sde_window_shift_interval": 1},
        max_steps=2,
        gradient_accumulation_steps=1,
    )
    rollouts = _train_recording_rollouts(trainer)
    base = trainer.env.sigmas  # 4 steps; window [0, 2) then [1, 3): int((4 - l) * 0.4) points after, at least 2
    assert [t.sde_types for t in rollouts] == [
        ("flow_grpo", "flow_grpo", "ode"),
        ("ode", "flow_grpo", "flow_grpo", "ode"),
    ]
    torch.testing.assert_close(rollouts[0].sigmas[0], compressed_schedule(base, 1, 0.4))
    assert torch.equal(rollouts[1].sigmas[0], base)  # after the window [1, 3) only sigma_3 and 0 remain: unchanged


def test_branch_grpo_rolls_out_each_group_as_a_tree(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, algorithm="branch_grpo", max_steps=2, gradient_accumulation_steps=1)
    rollouts = _train_recording_rollouts(trainer)
    for trajectory in rollouts:  # 4 prompts' worth of one group of 4 each: splits at 0 and 3 of 4 steps
        assert trajectory.branch_steps == (0, 3) and len(set(trajectory.prompts)) == 1
        latents = trajectory.latents
        assert all(torch.equal(latents[0, 1], latents[k, 1]) for k in range(2))  # node A after the split
        assert torch.equal(latents[2, 3], latents[3, 3]) and not torch.equal(latents[0, 1], latents[2, 1])
        assert len({latents[k, 4].numpy().tobytes() for k in range(4)}) == 4
    buffered = trainer._buffered_inputs[0]
    assert buffered.advantages.shape == (len(buffered), 4)  # root, after 1 split, after 2, after the last split
    assert trainer.state.global_step == 2


def test_branch_grpo_splits_inside_a_few_step_window(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path, algorithm="branch_grpo", max_steps=1, gradient_accumulation_steps=1, sde_window=[0, 2]
    )
    rollouts = _train_recording_rollouts(trainer)
    assert [t.branch_steps for t in rollouts] == [(0, 1)]  # the published 3 steps apart do not fit in 2
    assert trainer.state.global_step == 1


def test_branch_steps_beyond_the_environments_schedule_are_refused_before_training(tmp_path: Path) -> None:
    # The config checks the splits against the schedule it knows; the environment's (the model's own step count, for
    # a model not resolved at config time) is checked again when the trainer builds it.
    args = make_args(tmp_path, algorithm="branch_grpo", algorithm_args={"branch_steps": [0, 3]})
    args.num_inference_steps = 2
    with pytest.raises(ValueError, match=r"splits at steps \[0, 3\], but only steps 0\.\.1 are stochastic"):
        SageGRPOTrainer(LinearBackbone(), mean_brightness, args=args, train_dataset=PROMPTS, peft_config=lora())


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
