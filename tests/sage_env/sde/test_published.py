"""Each SDE unit against its published implementation, written out here in float64 Python from the formulas of
the code each unit's ``reference`` names (another algebraic form than ours, so an error cannot cancel)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sage_env import sde
from sage_env.sde import flow_match_sigmas

ETA = 0.7


def published_flow_grpo(x, v, sigma, sigma_prev, sigma_max, eta):
    """yifan123/flow_grpo sd3_sde_with_logprob.py (54809b5), sde_type='sde'."""
    std_dev_t = math.sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma))) * eta
    dt = sigma_prev - sigma
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, std_dev_t * math.sqrt(-dt)


def published_sage(x, v, sigma, sigma_next, eta):
    """Tencent-Hunyuan/SAGE-GRPO scheduling_flow_match_discrete.py (c868869), sde_type='sage_grpo', sde_solver."""
    dt, delta = sigma_next - sigma, sigma - sigma_next
    clamped = min(sigma, 1 - 3e-3)
    variance = eta**2 * (-delta + math.log((1 - sigma_next) / (1 - clamped)))
    x0 = x - sigma * v
    score = -(x - x0 * (1 - sigma)) / sigma**2
    return x + dt * v + 0.5 * variance * score, math.sqrt(variance)


def published_dance(x, v, sigma, sigma_next, eta):
    """DanceGRPO's flux_step with sde_solver=True (fork hokindeng/DanceGRPO at c7c70f96)."""
    dsigma = sigma_next - sigma
    x0 = x - sigma * v
    score = -(x - x0 * (1 - sigma)) / sigma**2
    return x + dsigma * v + (-0.5 * eta**2 * score) * dsigma, eta * math.sqrt(sigma - sigma_next)


def published_cps(x, v, sigma, sigma_prev, eta):
    """yifan123/flow_grpo sd3_sde_with_logprob.py (54809b5), sde_type='cps'."""
    std = sigma_prev * math.sin(eta * math.pi / 2)
    x0, noise = x - sigma * v, x + v * (1 - sigma)
    return x0 * (1 - sigma_prev) + noise * math.sqrt(sigma_prev**2 - std**2), std


def published_grad_norm(sde_type, sigma, next_sigma, sigma_max, eta):
    """SAGE-GRPO's compute_log_prob_grad_norms (c868869, sde_solver=True): |d mean / d v| / std."""
    dt = next_sigma - sigma
    if sde_type == "sage":
        std_sq = eta**2 * (-(sigma - next_sigma) + math.log((1 - next_sigma) / (1 - min(sigma, 1 - 3e-3))))
        return abs(dt - 0.5 * std_sq * (1 - sigma) / sigma) / math.sqrt(std_sq)
    if sde_type == "dance_grpo":
        return abs(dt * (1 + 0.5 * eta**2 * (1 - sigma) / sigma)) / (eta * math.sqrt(-dt))
    if sde_type == "flow_grpo":
        std_dev_t = math.sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma))) * eta
        return abs(dt * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma))) / (std_dev_t * math.sqrt(-dt))
    std = next_sigma * math.sin(eta * math.pi / 2)
    jacobian = -sigma * (1 - next_sigma) + (1 - sigma) * math.sqrt(next_sigma**2 - std**2)
    return abs(jacobian) / std


def ours(sde_type, x, v, sigma, sigma_next):
    out = sde.sde_step(
        sde_type,
        torch.tensor([[x]]),
        torch.tensor([[v]]),
        torch.tensor([sigma]),
        torch.tensor([sigma_next]),
        ETA,
        x_next=torch.tensor([[0.0]]),
    )
    return out.mean.item(), out.std.item()


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "cps"])
def test_every_step_of_a_schedule_matches_the_published_code(sde_type: str) -> None:
    sigmas = flow_match_sigmas(20, shift=5.0).double().tolist()
    rng = np.random.default_rng(0)
    for index in range(len(sigmas) - 2):  # the last step (sigma' = 0) is checked separately
        sigma, sigma_next = sigmas[index], sigmas[index + 1]
        x, v = rng.normal(), rng.normal()
        if sde_type == "flow_grpo":
            expected = published_flow_grpo(x, v, sigma, sigma_next, sigmas[1], ETA)
        else:
            rule = {"sage": published_sage, "dance_grpo": published_dance, "cps": published_cps}[sde_type]
            expected = rule(x, v, sigma, sigma_next, ETA)
        np.testing.assert_allclose(ours(sde_type, x, v, sigma, sigma_next), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "cps"])
def test_gradient_scales_match_the_official_equalizer(sde_type: str) -> None:
    sigmas = flow_match_sigmas(20, shift=5.0)
    steps = range(19)  # cps's last step is deterministic: no gradient scale (the loss never trains it)
    expected = [
        published_grad_norm(sde_type, sigmas[t].item(), sigmas[t + 1].item(), sigmas[1].item(), ETA)
        for t in steps
    ]
    actual = sde.gradient_scale(sde_type, sigmas[:-2], sigmas[1:-1], ETA)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=2e-3)


def test_the_equalizer_median_is_torch_median_like_the_official_code() -> None:
    scales = sde.gradient_scale("sage", (sigmas := flow_match_sigmas(20, shift=5.0))[:-1], sigmas[1:], ETA)
    assert scales.numel() % 2 == 0  # an even count: the conventions differ
    official = torch.median(scales) / scales  # compute_grad_balancing_factors (no eps)
    torch.testing.assert_close(sde.equalizer_weights(scales), official, rtol=1e-6, atol=0)
    averaged = sde.equalizer_weights(scales, median="mean")
    assert (averaged > official).all() and (averaged / official).max() > 1.01


def test_cps_scores_the_deterministic_last_step_as_published() -> None:
    latents, velocity, x_next = torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    out = sde.sde_step("cps", latents, velocity, 0.2, 0.0, 0.5, x_next=x_next, log_prob_kind="cps")
    expected = -((x_next - out.mean) ** 2).mean(dim=(1, 2))
    torch.testing.assert_close(out.log_prob, expected)  # -mse like every other step, not 0
    assert not out.trainable.any()  # and still outside the policy loss
    gaussian = sde.sde_step("cps", latents, velocity, 0.2, 0.0, 0.5, x_next=x_next)
    assert torch.equal(gaussian.log_prob, torch.zeros(2))  # the Gaussian density has no value at std = 0
