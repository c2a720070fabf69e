"""DiffusionNFT: its loss against values worked by hand from the authors' formulas, the old policy's soft update,
and training with no transition likelihood (ODE rollouts) in the gymnasium loop."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import agents
import sage_env  # noqa: F401  (registers the ids)
from agents.diffusion_nft import DiffusionNFTAlgorithm, nft_loss
from agents.likelihood_free import soft_update_decay
from agents.references import ParameterSnapshot


def _hand_case(beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One row, two latent elements: x0=[1,0], eps=[-1,2], t=0.5, v_old=[-1,1], v=[-1.5,2], A=2.5 (r=0.75)."""
    clean, noise, t = torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, 2.0]]), torch.tensor([0.5])
    velocity = torch.tensor([[-1.5, 2.0]], requires_grad=True)
    noisy = (1 - t[:, None]) * clean + t[:, None] * noise
    per_row = nft_loss(velocity, torch.tensor([[-1.0, 1.0]]), noisy, clean, t, torch.tensor([0.75]), beta)
    return per_row, velocity


def test_the_loss_matches_the_hand_computed_values() -> None:
    per_row, velocity = _hand_case(beta=1.0)
    assert per_row.item() == pytest.approx(0.410714286, abs=1e-6)  # (r L+ + (1 - r) L-) / beta
    kl = 1e-4 * ((velocity - torch.tensor([[-1.0, 1.0]])) ** 2).mean()  # the reference is v_old here
    loss = 5.0 * per_row.sum() + kl  # adv_clip_max x policy loss + KL coefficient x KL
    assert loss.item() == pytest.approx(2.053633929, abs=1e-6)
    loss.backward()  # the adaptive weights are constants (no gradient), as in the authors' code
    torch.testing.assert_close(velocity.grad, torch.tensor([[3.214236, 0.714386]]), atol=1e-6, rtol=0)
    assert _hand_case(beta=0.1)[0].item() == pytest.approx(4.815761, abs=1e-6)


def test_the_old_policy_decays_as_published() -> None:
    assert [soft_update_decay(s, 0.001, 0.5, 0) for s in (0, 100, 500, 600)] == pytest.approx([0, 0.1, 0.5, 0.5])
    ocr = [soft_update_decay(s, 0.0075, 0.999, 75) for s in (74, 75, 100, 208, 209)]
    assert ocr == pytest.approx([0, 0, 0.1875, 0.9975, 0.999])


def test_blend_moves_a_snapshot_toward_the_live_weights() -> None:
    module = torch.nn.Linear(2, 2)
    snapshot = ParameterSnapshot(module)
    old = {name: value.clone() for name, value in snapshot.values.items()}
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(1.0)
    snapshot.blend(0.25)
    for name, parameter in module.named_parameters():
        torch.testing.assert_close(snapshot.values[name], 0.25 * old[name] + 0.75 * parameter.detach())


def test_it_trains_on_ode_rollouts_without_any_transition_likelihood() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=4, sde="ode", sde_window=None)
    agent = agents.make("diffusion_nft", env=envs, learning_rate=1e-3)
    assert isinstance(agent.algorithm, DiffusionNFTAlgorithm) and agent.config.guidance_scale == 1.0
    observation, _ = envs.reset(seed=0, options=agent.rollout_options(envs))
    while not envs.step(agent.act(observation))[2].all():
        pass
    trajectory = envs.unwrapped.trajectory
    assert not trajectory.trainable.any()  # no stochastic step: a policy gradient would have nothing
    before = [p.detach().clone() for p in agent.parameters]
    old_before = {n: v.clone() for n, v in agent.references.anchor.values.items()}
    metrics = agent.update(trajectory)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters))
    assert metrics["policy_loss"] > 0 and 0 <= metrics["optimality_mean"] <= 1
    # After step 1 the decay is 0.001: the old policy moved almost all the way to the policy.
    moved = agent.references.anchor.values
    assert any(not torch.equal(moved[n], old_before[n]) for n in moved)


def test_a_kl_that_needs_log_probabilities_is_refused() -> None:
    with pytest.raises(ValueError, match="needs transition log-probabilities"):
        agents.ALGORITHM_CONFIGS["diffusion_nft"](kl_strategy="dual")
    config = agents.ALGORITHM_CONFIGS["diffusion_nft"]()
    assert (config.sde, config.beta, config.nft_beta, config.learning_rate) == ("ode", 1e-4, 1.0, 3e-4)
