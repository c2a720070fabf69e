"""Every registered agent learns against the same environment; the registry errors clearly."""

from __future__ import annotations

import math

import pytest
import torch

import agents
from agents import ALGORITHM_CONFIGS, Agent
from sage_env.env import DenoisingVectorEnv
from tests.doubles import LinearBackbone, mean_brightness

SIZE = {"num_frames": 2, "height": 4, "width": 4}


def env_for(agent: agents.AlgorithmAgent, backbone: LinearBackbone) -> DenoisingVectorEnv:
    cfg = agent.config
    return DenoisingVectorEnv(
        backbone,
        mean_brightness,
        ["a", "b", "c"],
        num_envs=8,
        group_size=4,
        num_steps=4,
        sde=cfg.sde,
        eta=cfg.eta,
        log_prob_kind=cfg.log_prob_kind,
        **SIZE,
    )


def run_episode(env: DenoisingVectorEnv, agent: Agent, seed: int):
    observation, _ = env.reset(seed=seed, options=agent.rollout_options(env))
    while True:
        observation, _, terminated, _, _ = env.step(agent.act(observation))
        if terminated.all():
            return env.trajectory


@pytest.mark.parametrize("name", sorted(ALGORITHM_CONFIGS))
def test_every_registered_agent_updates_its_parameters(name: str) -> None:
    backbone = LinearBackbone()
    agent = agents.make(name, policy=backbone, learning_rate=1e-2, micro_batch_size=8)
    env = env_for(agent, backbone)
    before = [p.detach().clone() for p in backbone.transformer.parameters()]
    metrics = [agent.update(run_episode(env, agent, seed)) for seed in (0, 1)]
    changed = [not torch.equal(b, p) for b, p in zip(before, backbone.transformer.parameters())]
    assert all(changed), f"{name} left parameters unchanged"
    for step_metrics in metrics:
        assert all(torch.isfinite(torch.tensor(v)) for v in step_metrics.values())
        assert {"reward/total", "policy_loss", "grad_norm", "kl/coef"} <= set(step_metrics)


def test_num_iterations_makes_the_ratio_and_clipping_act() -> None:
    backbone = LinearBackbone()
    agent = agents.make("sage_grpo", policy=backbone, learning_rate=5e-2, num_iterations=3, epsilon=1e-4)
    metrics = agent.update(run_episode(env_for(agent, backbone), agent, 0))
    assert metrics["clip_fraction"] > 0  # later passes are off-policy and get clipped
    assert metrics["ratio_std"] > 0


def test_agent_with_no_usable_group_does_not_update() -> None:
    backbone = LinearBackbone()
    agent = agents.make("sage_grpo", policy=backbone)

    def constant(videos, prompts, **kwargs):
        return torch.ones(videos.shape[0])

    env = DenoisingVectorEnv(backbone, constant, ["a"], num_envs=4, group_size=4, num_steps=3, **SIZE)
    before = [p.detach().clone() for p in backbone.transformer.parameters()]
    metrics = agent.update(run_episode(env, agent, 0))
    assert all(torch.equal(b, p) for b, p in zip(before, backbone.transformer.parameters()))
    assert metrics["usable_fraction"] == 0.0


def test_registry_errors_and_custom_registration() -> None:
    with pytest.raises(ValueError, match=r"Unknown agent 'ppo'.*sage_grpo"):
        agents.make("ppo", policy=LinearBackbone())
    with pytest.raises(ValueError, match="already registered"):
        agents.register("sage_grpo", lambda policy, **config: None)
    with pytest.raises(ValueError, match="Unknown option"):
        agents.make("flow_grpo", policy=LinearBackbone(), temperature=1.0)

    class Idle(Agent):
        def act(self, observation):
            return torch.zeros_like(torch.as_tensor(observation["latents"]))

        def update(self, trajectory):
            return {"reward/total": float(trajectory.rewards.total.mean())}

    agents.register("idle_for_test", lambda policy, **config: Idle(policy), overwrite=True)
    try:
        assert "idle_for_test" in agents.list_agents()
        assert isinstance(agents.make("idle_for_test", policy=LinearBackbone()), Idle)
    finally:
        agents.AGENT_REGISTRY.pop("idle_for_test")


def test_published_defaults_of_the_built_in_algorithms() -> None:
    configs = {name: config_class() for name, config_class in ALGORITHM_CONFIGS.items()}
    sage, flow, dance, cps = configs["sage_grpo"], configs["flow_grpo"], configs["dance_grpo"], configs["cps"]
    assert (sage.sde, sage.eta, sage.kl_strategy, sage.equalizer, sage.epsilon) == (
        "sage",
        0.5,
        "dual",
        True,
        1e-4,
    )
    assert (sage.beta_pos, sage.beta_vel, sage.anchor_update_steps, sage.kl_coef_min, sage.beta) == (
        1.0,
        0.1,
        10,
        1e-7,
        1e-5,
    )
    assert (flow.sde, flow.eta, flow.kl_strategy, flow.epsilon) == ("flow_grpo", 0.7, "fixed", 1e-4)
    assert (dance.sde, dance.kl_strategy, dance.timestep_fraction) == ("dance_grpo", "none", 0.6)
    assert (cps.sde, cps.log_prob_kind) == ("cps", "cps")
    # inf: no clipping
    assert configs["reinforce"].epsilon == math.inf and configs["ddpo"].stat_buffer_size == 16


# -- env and agent agree on the SDE by construction --------------------------------------------------------


REGISTERED_ENVS = ("sage_env/Toy-v0", "sage_env/Wan-v0", "sage_env/HunyuanVideo15-v0")


def make_registered(env_id: str, request: pytest.FixtureRequest):
    import gymnasium as gym

    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    if env_id == "sage_env/Toy-v0":
        return gym.make_vec(env_id, num_envs=4, group_size=2)
    path = request.getfixturevalue("tiny_wan_path" if "Wan" in env_id else "tiny_hunyuan_path")
    return gym.make_vec(
        env_id, num_envs=2, group_size=2, backbone=str(path), reward_fn=mean_brightness, prompts=["a"],
        num_steps=2, **TINY_VIDEO_SIZE,
    )  # fmt: skip


@pytest.mark.parametrize("env_id", REGISTERED_ENVS)
def test_an_agent_made_for_an_env_takes_its_sde_settings(env_id: str, request: pytest.FixtureRequest) -> None:
    envs = make_registered(env_id, request)
    for name in ALGORITHM_CONFIGS:
        agent = agents.make(name, env=envs)
        assert agents.rollout_settings(envs) == {k: getattr(agent.config, k) for k in agents.ROLLOUT_SETTINGS}
        assert agent.policy is envs.unwrapped.backbone
    explicit = agents.make("flow_grpo", env=envs, eta=0.2)  # explicit values win...
    assert explicit.config.eta == 0.2


def test_the_readme_loop_trains_every_algorithm_on_the_toy_env() -> None:
    import gymnasium as gym

    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2)
    for name in sorted(ALGORITHM_CONFIGS):
        agent = agents.make(name, env=envs, learning_rate=3e-3, micro_batch_size=64)
        observation, _ = envs.reset(seed=0, options=agent.rollout_options(envs))
        while True:
            observation, _, terminated, _, _ = envs.step(agent.act(observation))
            if terminated.all():
                break
        assert "policy_loss" in agent.update(envs.unwrapped.trajectory), name


def test_a_genuine_mismatch_is_still_refused() -> None:
    import gymnasium as gym

    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2)
    agent = agents.make("sage_grpo", env=envs, eta=0.3)  # ...and a trajectory sampled otherwise is refused
    observation, _ = envs.reset(seed=0)
    while True:
        observation, _, terminated, _, _ = envs.step(agent.act(observation))
        if terminated.all():
            break
    with pytest.raises(ValueError, match=r"eta=0.7.*expects.*eta=0.3"):
        agent.update(envs.unwrapped.trajectory)
