"""agents.objective against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from agents import objective


def test_group_advantages_population_std_by_hand() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 12.0, 8.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    advantages, usable = objective.group_advantages(rewards, groups, eps=0.0 + 1e-12)
    first = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected_first = (first - 2.5) / math.sqrt(((first - 2.5) ** 2).mean().item())
    torch.testing.assert_close(advantages[:4], expected_first)
    second = torch.tensor([10.0, 10.0, 12.0, 8.0])
    torch.testing.assert_close(advantages[4:], (second - 10.0) / math.sqrt(2.0))
    assert usable.all()


def test_invalid_samples_are_excluded_from_their_group() -> None:
    rewards = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    valid = torch.tensor([True, False, True, True])
    advantages, usable = objective.group_advantages(
        rewards, torch.zeros(4, dtype=torch.long), valid, eps=1e-12
    )
    kept = torch.tensor([1.0, 3.0, 5.0])
    expected = (kept - 3.0) / kept.std(unbiased=False)
    torch.testing.assert_close(advantages[[0, 2, 3]], expected)
    assert advantages[1] == 0 and usable.tolist() == [True, False, True, True]


def test_groups_without_signal_contribute_nothing() -> None:
    rewards = torch.tensor([2.0, 2.0, 1.0, float("nan"), 0.5, 0.7])
    valid = torch.tensor([True, True, True, False, True, True])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    advantages, usable = objective.group_advantages(rewards, groups, valid)
    assert torch.isfinite(advantages).all()
    assert advantages[:4].eq(0).all() and usable.tolist() == [False, False, False, False, True, True]


def test_scale_rewards_batch_and_none() -> None:
    rewards = torch.tensor([0.0, 2.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1])
    none, _ = objective.group_advantages(rewards, groups, scale_rewards="none")
    torch.testing.assert_close(none, torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    batch, _ = objective.group_advantages(rewards, groups, scale_rewards="batch", eps=1e-12)
    torch.testing.assert_close(batch, none / rewards.std(unbiased=False))
    with pytest.raises(ValueError, match="scale_rewards"):
        objective.group_advantages(rewards, groups, scale_rewards="token")


def test_valid_nan_reward_is_refused() -> None:
    with pytest.raises(ValueError, match="mark it invalid"):
        objective._validate_group_inputs(
            torch.tensor([float("nan")]), torch.zeros(1, dtype=torch.long), torch.tensor([True])
        )


def test_clipped_policy_loss_by_hand() -> None:
    log_prob = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.5]))
    old = torch.zeros(4)
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    weights = torch.tensor([1.0, 2.0, 1.0, 0.5])
    per_pair, stats = objective.clipped_policy_loss(log_prob, old, advantages, weights, epsilon=0.2)
    # ratio 1 -> -1; 1.5 with A>0 -> clipped at 1.2 -> -1.2*2; 0.5 with A<0 -> max(0.5, 0.8) = 0.8; 1.5, A<0 -> 1.5
    torch.testing.assert_close(per_pair, torch.tensor([-1.0, -2.4, 0.8, 0.75]))
    assert stats["clipped"].tolist() == [False, True, True, False]
    unclipped, _ = objective.clipped_policy_loss(log_prob, old, advantages, weights, epsilon=None)
    torch.testing.assert_close(unclipped, -advantages * torch.exp(log_prob) * weights)


def test_on_policy_gradient_is_advantage_weighted_score() -> None:
    log_prob = torch.tensor([-0.3, -1.2], requires_grad=True)
    per_pair, _ = objective.clipped_policy_loss(
        log_prob, log_prob.detach(), torch.tensor([2.0, -1.0]), torch.tensor([0.5, 3.0]), epsilon=1e-4
    )
    per_pair.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([-1.0, 3.0]))


def test_position_and_stepwise_kl() -> None:
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    reference = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    std = torch.tensor([1.0, 0.5])
    torch.testing.assert_close(
        objective.position_kl(mean, reference, std), torch.tensor([2.5 / 2, 1.0 / 0.5])
    )
    torch.testing.assert_close(
        objective.stepwise_kl(torch.tensor([-1.0]), torch.tensor([-0.5])), torch.tensor([0.5])
    )


def test_adaptive_kl_controller_follows_the_schedule() -> None:
    controller = objective.AdaptiveKLController(
        coef_min=1e-7, coef_max=1e-5, warmup_steps=4, target=1e-3, history=2
    )
    assert controller.coef == 1e-7
    warm = [controller.observe(1.0) for _ in range(4)]
    expected = [1e-7 + (1e-5 - 1e-7) * k / 4 for k in (1, 2, 3, 4)]
    assert warm == pytest.approx(expected)
    assert controller.observe(1.0) == pytest.approx(0.9e-5)  # KL far above target: relax (paper's direction)
    state = controller.state_dict()
    assert controller.observe(1e-3) == pytest.approx(0.81e-5)  # mean of last 2 = 0.5005 > 1.5e-3
    assert controller.observe(1e-3) == pytest.approx(0.81e-5)  # mean 1e-3 in [0.5, 1.5] x target
    assert controller.observe(1e-6) == pytest.approx(0.81e-5)  # mean ~5e-4 = 0.5 x target: still inside
    assert controller.observe(1e-6) == pytest.approx(0.891e-5)  # below 0.5 x target: tighten
    for _ in range(30):
        controller.observe(1e-9)
    assert controller.coef == pytest.approx(1e-5)  # clipped at lambda_max
    restored = objective.AdaptiveKLController(1e-7, 1e-5, 4, 1e-3, 2)
    restored.load_state_dict(state)
    assert restored.observe(1e-3) == pytest.approx(0.81e-5)


def test_constant_kl_schedule() -> None:
    controller = objective.AdaptiveKLController(coef_max=0.04, adaptive=False)
    assert controller.coef == 0.04 and controller.observe(100.0) == 0.04


def test_select_timesteps_skips_deterministic_steps_and_permutes() -> None:
    trainable = torch.tensor([[True, True, True, True, False], [False, True, True, False, False]])
    samples, steps = objective.select_timesteps(trainable, 0.5, torch.Generator().manual_seed(0))
    assert samples.tolist() == [0, 0, 1]
    assert set(steps[:2].tolist()) <= {0, 1, 2, 3} and steps[2].item() in (1, 2)
    all_samples, all_steps = objective.select_timesteps(trainable, 1.0, permute=False)
    assert all_steps.tolist() == [0, 1, 2, 3, 1, 2] and all_samples.tolist() == [0, 0, 0, 0, 1, 1]
    orders = {
        tuple(objective.select_timesteps(trainable[:1], 1.0, torch.Generator().manual_seed(s))[1].tolist())
        for s in range(6)
    }
    assert len(orders) > 1
    with pytest.raises(ValueError, match="timestep_fraction"):
        objective.select_timesteps(trainable, 0.0)


def test_equalizer_matrix_zero_outside_the_sde_window() -> None:
    sigmas = torch.linspace(1, 0, 6).expand(2, 6)
    weights = objective.equalizer_matrix(sigmas, ("ode", "sage", "sage", "sage", "ode"), 0.5)
    assert weights[:, [0, 4]].eq(0).all() and (weights[:, 1:4] > 0).all()
    assert weights[0, 1:4].median() == pytest.approx(1.0, rel=1e-5)
    flat = objective.equalizer_matrix(sigmas, ("ode", "sage", "sage", "sage", "ode"), 0.5, enabled=False)
    assert flat[0].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_per_prompt_stat_tracker() -> None:
    tracker = objective.PerPromptStatTracker(buffer_size=4, min_count=2)
    advantages, usable = tracker.advantages(
        ["a", "a", "b", "b"], torch.tensor([1.0, 3.0, 0.0, 0.0]), torch.ones(4, dtype=torch.bool)
    )
    torch.testing.assert_close(advantages[:2], torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)
    assert usable.tolist() == [True, True, False, False]  # prompt b: zero spread
    advantages, _ = tracker.advantages(["a", "a"], torch.tensor([5.0, 7.0]), torch.ones(2, dtype=torch.bool))
    history = torch.tensor([1.0, 3.0, 5.0, 7.0])
    torch.testing.assert_close(
        advantages, (torch.tensor([5.0, 7.0]) - 4.0) / history.std(unbiased=False), atol=1e-5, rtol=0
    )
    restored = objective.PerPromptStatTracker(4, 2)
    restored.load_state_dict(tracker.state_dict())
    assert list(restored.history["a"]) == [1.0, 3.0, 5.0, 7.0]
