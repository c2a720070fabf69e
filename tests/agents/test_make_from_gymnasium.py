"""The user's paths into agents: ``agents.make(name, env=...)`` on what gymnasium's own ``make`` and ``make_vec`` return.

Every registered id with a single environment from ``gym.make`` (the tiny Wan and HunyuanVideo 1.5 pipelines stand
in for the real checkpoints), every built-in algorithm, and gymnasium's sync and async vector environments; each
update must change the trained weights.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest
import torch

import agents
import sage_env
from tests.doubles import mean_brightness
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

PROMPT = "a red square moving left"


def _episodes(env: gym.Env, agent: agents.Agent, count: int) -> list[sage_env.Trajectory]:
    """``count`` single-video episodes of one prompt (a GRPO group), as a user runs them."""
    episodes = []
    for seed in range(count):
        observation, _ = env.reset(seed=seed, options={"prompt": PROMPT, **agent.rollout_options(env)})
        done = False
        while not done:
            observation, _, terminated, truncated, _ = env.step(agent.act(observation))
            done = terminated or truncated
        episodes.append(env.unwrapped.trajectory)
    return episodes


def _trains(agent: agents.Agent, trajectories) -> bool:
    before = [p.detach().clone() for p in agent.parameters]
    agent.update(trajectories)
    return any(not torch.equal(a, b) for a, b in zip(before, agent.parameters))


def _make_env(env_id: str, request: pytest.FixtureRequest) -> gym.Env:
    if env_id == "sage_env/Toy-v0":
        return gym.make(env_id, num_steps=4, sde_window=(0, 2))
    path = request.getfixturevalue("tiny_wan_path" if "Wan" in env_id else "tiny_hunyuan_path")
    return gym.make(env_id, backbone=str(path), reward_fn=mean_brightness, num_steps=2, **TINY_VIDEO_SIZE)


TREES = {"branch_grpo"}
"""Algorithms whose group is one tree of rollouts: a vector environment's group, never single-video episodes."""


@pytest.mark.parametrize("env_id", sorted(sage_env.ENV_IDS))
def test_every_algorithm_trains_on_a_single_environment_of_every_registered_id(
    env_id: str, request: pytest.FixtureRequest
) -> None:
    env = _make_env(env_id, request)
    for name in sorted(set(agents.list_agents()) - TREES):
        agent = agents.make(name, env=env, learning_rate=1e-2, guidance_scale=1.0)
        assert _trains(agent, _episodes(env, agent, 2)), name


def test_an_episode_whose_reward_failed_is_left_out_and_the_others_train() -> None:
    """A reward that raised on one single-video episode (its output then has no components) stopped the update
    of the episodes together with 'Reward outputs with different components cannot be concatenated'."""
    calls = {"count": 0}

    def flaky(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        calls["count"] += 1
        if calls["count"] == 2:
            raise ConnectionError("reward server restarting")
        return mean_brightness(videos, prompts)

    env = gym.make("sage_env/Toy-v0", num_steps=4, sde_window=(0, 2), reward_fn=flaky)
    agent = agents.make("sage_grpo", env=env, learning_rate=1e-2)
    episodes = _episodes(env, agent, 3)
    assert [bool(e.rewards.valid.all()) for e in episodes] == [True, False, True]
    assert _trains(agent, episodes)


@pytest.mark.parametrize("name", sorted(TREES))
def test_a_tree_algorithm_refuses_a_single_environment_with_the_fix(name: str) -> None:
    with pytest.raises(ValueError, match=r"num_generations 1 \(the environment's group_size\) is not a power"):
        agents.make(name, env=gym.make("sage_env/Toy-v0"))


@pytest.mark.parametrize("name", sorted(set(agents.list_agents()) - TREES))
def test_an_agent_takes_a_single_environments_sde_settings(name: str) -> None:
    env = gym.make("sage_env/Toy-v0", sde="flow_grpo", eta=0.6)
    agent = agents.make(name, env=env)
    assert (agent.config.sde, agent.config.eta) == ("flow_grpo", 0.6)
    assert agent.act(env.reset(seed=0)[0]).shape == env.observation_space["latents"].shape


def test_gymnasiums_sync_vector_environment_trains_an_agent() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=3, vectorization_mode="sync")
    agent = agents.make("sage_grpo", env=envs, learning_rate=1e-2)
    observation, _ = envs.reset(seed=0, options={"prompt": PROMPT})
    while True:
        observation, _, terminated, _, _ = envs.step(agent.act(observation))
        if terminated.all():
            break
    assert _trains(agent, envs.get_attr("trajectory"))
    envs.close()


ASYNC_SCRIPT = textwrap.dedent(
    """
    import gymnasium as gym, torch, agents, sage_env
    # A rollout in the parent first: torch's thread pool is then live when gymnasium forks its workers.
    native = gym.make_vec("sage_env/Toy-v0", num_envs=2, group_size=2)
    warm = agents.make("sage_grpo", env=native)
    observation, _ = native.reset(seed=0)
    while not native.step(warm.act(observation))[2].all():
        pass
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=2, vectorization_mode="async")
    agent = agents.make("sage_grpo", env=envs, learning_rate=1e-2)
    before = [p.detach().clone() for p in agent.parameters]
    observation, _ = envs.reset(seed=0, options={"prompt": "a red square moving left"})
    while True:
        observation, reward, terminated, truncated, info = envs.step(agent.act(observation))
        if terminated.all():
            break
    agent.update(envs.get_attr("trajectory"))
    print("trained", any(not torch.equal(a, b) for a, b in zip(before, agent.parameters)))
    envs.close()
    """
)


@pytest.mark.multiprocess
def test_gymnasiums_async_vector_environment_does_not_hang_after_a_rollout_in_the_parent() -> None:
    """Without `sage_env.forking` the forked workers wait forever on torch's thread pool (found: 9.5 min, killed)."""
    done = subprocess.run(
        [sys.executable, "-c", ASYNC_SCRIPT], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained True" in done.stdout
