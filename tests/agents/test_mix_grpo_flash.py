"""MixGRPO-Flash: the published compressed schedule after the window, rollouts on it with DPM-Solver++, and training
only the window's steps, which the compression leaves as they were."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

import agents
from agents.mix_grpo_flash import MixGRPOFlashAlgorithm, compressed_schedule, schedule_at
from sage_env.sde import flow_match_sigmas, sigmas_from_scheduler

# MixGRPO's FLUX schedule, sigma_i = 3u / (1 + 2u), u = 1 - i/25, window [0..3], ratio 0.4: n = int(22 * 0.4) = 8
# points from u = 0.84 down to 0, shifted (the values by hand from the published formula).
PUBLISHED_POST = [0.940299, 0.885246, 0.818182, 0.734694, 0.627907, 0.486486, 0.290323, 0.0]


def test_the_compressed_schedule_is_the_published_one() -> None:
    sigmas = flow_match_sigmas(25, 3.0)
    flash = compressed_schedule(sigmas, 3, 0.4)
    assert torch.equal(flash[:4], sigmas[:4])  # the window's steps are untouched
    torch.testing.assert_close(flash[4:], torch.tensor(PUBLISHED_POST), rtol=0, atol=1e-6)
    assert len(flash) - 1 == 4 + 7  # 11 transformer calls per rollout instead of 25
    shifted = [3 * u / (1 + 2 * u) for u in (0.84, 0.56, 0.28, 0.0)]  # Flash*: ratio 0.2, n = int(22 * 0.2) = 4
    torch.testing.assert_close(compressed_schedule(sigmas, 3, 0.2)[4:], torch.tensor(shifted), rtol=0, atol=1e-6)
    assert torch.equal(compressed_schedule(sigmas, 24, 0.4), sigmas)  # nothing after the window to compress
    assert len(compressed_schedule(flow_match_sigmas(10, 3.0), 3, 0.1)) - 4 == 2  # at least one step, down to 0


def test_schedule_at_follows_any_schedule_through_its_own_steps() -> None:
    times = torch.tensor([0.93, 0.5, 0.111, 0.0], dtype=torch.float64)
    shifted = flow_match_sigmas(7, 5.0)  # evenly spaced in unshifted time: exact between its steps too
    torch.testing.assert_close(schedule_at(shifted, times), (5 * times / (1 + 4 * times)).float(), rtol=0, atol=1e-6)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)  # times 1 .. 1/1000, then 0: not evenly spaced
    scheduler.set_timesteps(20)
    sigmas = sigmas_from_scheduler(scheduler)
    grid = torch.linspace(1.0, 0.0, 21, dtype=torch.float64)
    torch.testing.assert_close(schedule_at(sigmas, grid), sigmas, rtol=0, atol=1e-6)
    between = schedule_at(sigmas, torch.linspace(1.0, 0.0, 201, dtype=torch.float64))
    assert (between[1:] < between[:-1]).all()


def test_rollouts_use_the_compressed_schedule_and_train_only_the_window() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=10, sde="flow_grpo", eta=0.7)
    agent = agents.make("mix_grpo_flash", env=envs, sde_window_size=2, sde_window_shift_interval=1)
    assert isinstance(agent.algorithm, MixGRPOFlashAlgorithm)
    options = agent.rollout_options(envs)
    assert options["sde_window"] == (0, 2) and options["ode_solver"] == "dpmsolver++"
    expected = compressed_schedule(envs.unwrapped.sigmas, 1, 0.4)  # n = int((10 - 1) * 0.4) = 3 points after
    assert torch.equal(options["sigmas"], expected) and len(expected) == 2 + 3
    observation, _ = envs.reset(seed=0, options=options)
    while not envs.step(agent.act(observation))[2].all():
        observation = envs.unwrapped._observation()
    trajectory = envs.unwrapped.trajectory
    assert trajectory.num_steps == 4 and trajectory.sde_types == ("flow_grpo", "flow_grpo", "ode", "ode")
    torch.testing.assert_close(trajectory.sigmas[0], expected)
    advantages, usable = agent.algorithm.advantages(trajectory)
    batch = agent.algorithm.training_batch(trajectory, advantages, usable, agent.policy)
    assert set(batch.step_index.tolist()) <= {0, 1}
    agent.update(trajectory)
    assert agent.rollout_options(envs)["sde_window"] == (1, 3)  # moved after one optimizer step


def test_the_published_defaults() -> None:
    config = agents.ALGORITHM_CONFIGS["mix_grpo_flash"]()
    assert (config.sde, config.eta, config.kl_strategy, config.epsilon) == ("flow_grpo", 0.7, "none", 1e-4)
    assert (config.sde_window_size, config.sde_window_shift_interval, config.sde_window_stride) == (4, 20, 1)
    assert config.post_window_compress_ratio == 0.4
    with pytest.raises(ValueError, match="post_window_compress_ratio"):
        agents.ALGORITHM_CONFIGS["mix_grpo_flash"](post_window_compress_ratio=0.0)
    # The window's interval is MixGRPO's field (its help and check) with Flash's published default.
    with pytest.raises(ValueError, match="sde_window_shift_interval"):
        agents.ALGORITHM_CONFIGS["mix_grpo_flash"](sde_window_shift_interval=0)
    help_texts = [
        {f.name: f.metadata["help"] for f in dataclasses.fields(agents.ALGORITHM_CONFIGS[name])}
        for name in ("mix_grpo", "mix_grpo_flash")
    ]
    assert help_texts[0]["sde_window_shift_interval"] == help_texts[1]["sde_window_shift_interval"]
