"""GRPO-Guard: the normalised ratio and the reweighted step loss against values worked by hand from the authors'
formulas; the means it needs recorded at the rollout, and asked for through ``rollout_options``."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import agents
import sage_env  # noqa: F401  (registers the ids)
from agents import objective
from sage_env.sde import gaussian_log_prob


def test_the_normalised_ratio_and_step_loss_match_the_hand_computed_values() -> None:
    # One latent element: noise std s_t 0.5 x sqrt(-dt) 0.2 = 0.1, mu_old 0, mu 0.01, x' = 0.1 (eps = 1).
    x_next, std = torch.tensor([[0.1]]), torch.tensor([0.1])
    old_mean, mean = torch.tensor([[0.0]]), torch.tensor([[0.01]])
    old_log_prob, log_prob = gaussian_log_prob(x_next, old_mean, std), gaussian_log_prob(x_next, mean, std)
    assert (old_log_prob.item(), log_prob.item()) == pytest.approx((0.883647, 0.978647), abs=1e-6)
    log_ratio = objective.normalized_log_ratio(log_prob, old_log_prob, mean, old_mean, std)
    assert torch.exp(log_ratio).item() == pytest.approx(1.010050167, abs=1e-7)  # vanilla: exp(0.095) = 1.0997
    weights = torch.tensor([1.0 / 0.04])  # 1 / |dt|
    for advantage, expected in ((1.0, -25.00005), (-1.0, 25.25125418)):
        per_pair, _ = objective.clipped_policy_loss(
            log_ratio, torch.zeros(1), torch.tensor([advantage]), weights, 2e-6
        )
        assert per_pair.item() == pytest.approx(expected, abs=1e-4)


def test_the_rollout_records_the_means_it_asks_for_and_trains_off_policy_too() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=4, sde="flow_grpo", eta=0.7, sde_window=None)
    agent = agents.make("grpo_guard", env=envs, learning_rate=1e-3, num_iterations=2)
    assert agent.config.ratio_norm and agent.rollout_options(envs) == {"record_means": True}
    observation, _ = envs.reset(seed=0, options=agent.rollout_options(envs))
    while not envs.step(agent.act(observation))[2].all():
        pass
    trajectory = envs.unwrapped.trajectory
    assert trajectory.means.shape == trajectory.latents[:, 1:].shape
    before = [p.detach().clone() for p in agent.parameters]
    metrics = agent.update(trajectory)  # the second pass is off-policy: it uses the recorded means
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters))
    assert torch.isfinite(torch.tensor(metrics["policy_loss"]))
    observation, _ = envs.reset(seed=1)  # without the options: no means
    while not envs.step(agent.act(observation))[2].all():
        pass
    assert envs.unwrapped.trajectory.means is None
    with pytest.raises(ValueError, match="record_means"):
        agent.update(envs.unwrapped.trajectory)
