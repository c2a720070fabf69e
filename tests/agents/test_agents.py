"""Every registered agent learns against the same environment; the registry errors clearly."""

from __future__ import annotations

import pytest
import torch

import agents
from agents import ALGORITHM_CONFIGS, Agent
from sage_env.env import DenoisingVectorEnv
from tests.doubles import LinearBackbone, mean_brightness

SIZE = {"num_frames": 2, "height": 4, "width": 4}


def env_for(agent: agents.PolicyGradientAgent, backbone: LinearBackbone) -> DenoisingVectorEnv:
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
    observation, _ = env.reset(seed=seed)
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
        assert {"reward/total", "train/policy_loss", "train/grad_norm", "kl/coef"} <= set(step_metrics)


def test_num_iterations_makes_the_ratio_and_clipping_act() -> None:
    backbone = LinearBackbone()
    agent = agents.make("sage_grpo", policy=backbone, learning_rate=5e-2, num_iterations=3, epsilon=1e-4)
    metrics = agent.update(run_episode(env_for(agent, backbone), agent, 0))
    assert metrics["train/clip_fraction"] > 0  # later passes are off-policy and get clipped
    assert metrics["train/ratio_std"] > 0


def test_agent_with_no_usable_group_does_not_update() -> None:
    backbone = LinearBackbone()
    agent = agents.make("sage_grpo", policy=backbone)

    def constant(videos, prompts, **kwargs):
        return torch.ones(videos.shape[0])

    env = DenoisingVectorEnv(backbone, constant, ["a"], num_envs=4, group_size=4, num_steps=3, **SIZE)
    before = [p.detach().clone() for p in backbone.transformer.parameters()]
    metrics = agent.update(run_episode(env, agent, 0))
    assert all(torch.equal(b, p) for b, p in zip(before, backbone.transformer.parameters()))
    assert metrics["train/usable_fraction"] == 0.0


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
    assert (sage.beta_pos, sage.beta_vel, sage.anchor_update_steps, sage.kl_coef_min, sage.kl_coef_max) == (
        1.0,
        0.1,
        10,
        1e-7,
        1e-5,
    )
    assert (flow.sde, flow.eta, flow.kl_strategy, flow.epsilon) == ("flow_grpo", 0.7, "fixed", 1e-4)
    assert (dance.sde, dance.kl_strategy, dance.timestep_fraction) == ("dance_grpo", "none", 0.6)
    assert (cps.sde, cps.log_prob_kind) == ("cps", "cps")
    assert configs["reinforce"].epsilon is None and configs["ddpo"].stat_buffer_size == 16
