"""MixGRPO: the published sliding window, rollouts sampled only inside it, and training only its steps."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agents
import sage_env
from agents.mix_grpo import MixGRPOAlgorithm, sliding_window


def test_the_window_slides_as_published_and_rolls_back() -> None:
    # The authors' 25-step FLUX schedule: window 4, moved by 1 every 25 iterations (MixGRPO's launch script).
    assert sliding_window(0, 25, 4, 25, 1) == (0, 4)
    assert sliding_window(24, 25, 4, 25, 1) == (0, 4)
    assert sliding_window(25, 25, 4, 25, 1) == (1, 5)
    assert sliding_window(299, 25, 4, 25, 1) == (11, 15)  # their iteration 300 trains steps 11-14
    assert sliding_window(22 * 25, 25, 4, 25, 1) == (22, 24)  # cut before the last step
    assert sliding_window(23 * 25, 25, 4, 25, 1) == (23, 24)
    assert sliding_window(24 * 25, 25, 4, 25, 1) == (0, 4)  # rolled back
    assert sliding_window(10**6, 25, 4, 20, 0) == (0, 4)  # stride 0: MixGRPO-Flash*'s frozen window
    assert sliding_window(40, 10, 2, 10, 3) == (3, 5)  # starts 0, 3, 6, then back to 0
    assert sliding_window(50, 10, 2, 10, 3) == (6, 8)
    assert sliding_window(90, 10, 2, 10, 3) == (0, 2)
    with pytest.raises(ValueError, match="at least 2 denoising steps"):
        sliding_window(0, 1, 4, 25, 1)


def _rollout(envs: gym.Env, agent: agents.Agent, seed: int) -> sage_env.Trajectory:
    observation, _ = envs.reset(seed=seed, options=agent.rollout_options(envs))
    while True:
        observation, _, terminated, _, _ = envs.step(agent.act(observation))
        if terminated.all():
            return envs.unwrapped.trajectory


def test_rollouts_follow_the_window_and_only_its_steps_train() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=6, sde="flow_grpo", eta=0.7)
    agent = agents.make("mix_grpo", env=envs, sde_window_size=2, sde_window_shift_interval=1, learning_rate=1e-3)
    assert isinstance(agent.algorithm, MixGRPOAlgorithm)
    windows = []
    for seed in range(3):
        trajectory = _rollout(envs, agent, seed)
        stochastic = [index for index, kind in enumerate(trajectory.sde_types) if kind != "ode"]
        windows.append((stochastic[0], stochastic[-1] + 1))
        advantages, usable = agent.algorithm.advantages(trajectory)
        batch = agent.algorithm.training_batch(trajectory, advantages, usable, agent.policy)
        assert set(batch.step_index.tolist()) <= set(stochastic) and len(stochastic) == 2
        agent.update(trajectory)
    assert windows == [(0, 2), (1, 3), (2, 4)]  # one optimizer step per update, interval 1


def test_a_rollout_without_the_window_is_refused_with_the_fix() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=8, sde="flow_grpo", eta=0.7)
    agent = agents.make("mix_grpo", env=envs)
    observation, _ = envs.reset(seed=0)  # every step stochastic: not MixGRPO's rollout
    while not envs.step(agent.act(observation))[2].all():
        pass
    with pytest.raises(ValueError, match=r"options=agent.rollout_options\(env\)"):
        agent.update(envs.unwrapped.trajectory)


def test_the_published_defaults() -> None:
    config = agents.ALGORITHM_CONFIGS["mix_grpo"]()
    assert (config.sde, config.eta, config.kl_strategy, config.epsilon, config.adv_clip_max) == (
        "flow_grpo", 0.7, "none", 1e-4, 5.0,
    )  # fmt: skip
    assert (config.sde_window_size, config.sde_window_shift_interval, config.sde_window_stride) == (4, 25, 1)
