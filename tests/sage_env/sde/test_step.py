"""The SDE core against independent computations (closed forms, torch.distributions, quadrature)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from benchmarks.sde_marginals import DATA_MEAN, DATA_STD, sample_final_moments
from sage_env import sde
from sage_env.sde import SAGE_SIGMA_MAX, SDE_TYPES, flow_match_sigmas, sde_step


def random_sigma_pairs(count: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (sigma, sigma_next) pairs inside (0, 0.99), sigma_next < sigma."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.rand(count, generator=generator, dtype=torch.float64) * 0.98 + 0.01
    b = torch.rand(count, generator=generator, dtype=torch.float64) * 0.98 + 0.01
    return torch.maximum(a, b).float(), torch.minimum(a, b).float()


def expected_std(sde_type: str, sigma: float, sigma_next: float, eta: float) -> float:
    """Table 1 of the paper and the CPS rule, written out element-wise in float64."""
    d = sigma - sigma_next
    if sde_type == "sage":
        return eta * math.sqrt(max(math.log((1 - sigma_next) / (1 - sigma)) - d, 0.0))
    if sde_type == "flow_grpo":
        return eta * math.sqrt(sigma / (1 - sigma) * d)
    if sde_type == "dance_grpo":
        return eta * math.sqrt(d)
    if sde_type == "cps":
        return sigma_next * math.sin(eta * math.pi / 2)
    return 0.0


# ------------------------------------------------------------------------------------------
# Schedules
# ------------------------------------------------------------------------------------------


def test_flow_match_sigmas_closed_form() -> None:
    sigmas = flow_match_sigmas(20, shift=5.0)
    assert sigmas.shape == (21,) and sigmas.dtype == torch.float32
    u = np.linspace(1, 0, 21)
    np.testing.assert_allclose(sigmas.numpy(), 5 * u / (1 + 4 * u), rtol=1e-6, atol=1e-7)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0


def test_sigmas_from_scheduler_matches_diffusers() -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    scheduler.set_timesteps(12)
    sigmas = sde.sigmas_from_scheduler(scheduler)
    assert torch.equal(sigmas, scheduler.sigmas.float())
    assert sigmas.shape == (13,) and sigmas[-1] == 0


def test_sigmas_from_scheduler_rejects_non_flow_scheduler() -> None:
    with pytest.raises(ValueError, match="set_timesteps"):
        sde.sigmas_from_scheduler(object())


@pytest.mark.parametrize(("num_steps", "shift"), [(0, 1.0), (3, 0.0), (3, float("nan"))])
def test_flow_match_sigmas_rejects_bad_arguments(num_steps: int, shift: float) -> None:
    with pytest.raises(ValueError):
        flow_match_sigmas(num_steps, shift)


# ------------------------------------------------------------------------------------------
# Standard deviations and log-probabilities
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sde_type", SDE_TYPES)
@pytest.mark.parametrize("eta", [0.3, 0.7, 1.0])
def test_std_matches_closed_forms(sde_type: str, eta: float) -> None:
    sigma, sigma_next = random_sigma_pairs()
    latents = torch.randn(len(sigma), 3, 2)
    out = sde_step(
        sde_type,
        latents,
        torch.randn_like(latents),
        sigma,
        sigma_next,
        eta,
        generator=torch.Generator().manual_seed(1),
    )
    expected = [
        expected_std(sde_type, s, n, eta)
        for s, n in zip(sigma.double().tolist(), sigma_next.double().tolist())
    ]
    np.testing.assert_allclose(out.std.numpy(), expected, rtol=2e-4, atol=1e-6)
    assert out.std.shape == (len(sigma),)


def test_flow_grpo_first_step_std_is_eta() -> None:
    sigma_next = torch.tensor([0.99, 0.9, 0.5])
    std = sde.noise_std("flow_grpo", torch.ones(3), sigma_next, 0.7)
    np.testing.assert_allclose(std.numpy(), [0.7, 0.7, 0.7], rtol=1e-5)


def test_sage_first_step_is_finite_thanks_to_the_clamp() -> None:
    std = sde.noise_std("sage", torch.tensor([1.0]), torch.tensor([0.95]), 1.0)
    expected = math.sqrt(math.log((1 - 0.95) / (1 - SAGE_SIGMA_MAX)) - 0.05)
    assert torch.isfinite(std).all()
    assert std.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "cps"])
def test_log_prob_matches_torch_normal(sde_type: str) -> None:
    sigma, sigma_next = random_sigma_pairs(16, seed=3)
    latents = torch.randn(16, 4, 5, dtype=torch.float64)
    velocity = torch.randn_like(latents)
    x_next = torch.randn_like(latents)
    out = sde_step(sde_type, latents, velocity, sigma, sigma_next, 0.6, x_next=x_next)
    normal = torch.distributions.Normal(out.mean.double(), out.std.double().reshape(16, 1, 1))
    expected = normal.log_prob(x_next).mean(dim=(1, 2))
    torch.testing.assert_close(out.log_prob.double(), expected, rtol=1e-4, atol=1e-4)


def test_cps_log_prob_kind_is_negative_mse() -> None:
    sigma, sigma_next = random_sigma_pairs(8, seed=4)
    latents, velocity, x_next = (torch.randn(8, 6) for _ in range(3))
    out = sde_step("cps", latents, velocity, sigma, sigma_next, 0.5, x_next=x_next, log_prob_kind="cps")
    torch.testing.assert_close(out.log_prob, -((x_next - out.mean) ** 2).mean(dim=1))


def test_sage_variance_equals_numerical_integral() -> None:
    # Eq. 5: Sigma_t is the integral of eta^2 u / (1 - u) du over [sigma', sigma] (trapezoid, float64).
    eta = 0.8
    sigma, sigma_next = random_sigma_pairs(32, seed=5)
    variance = sde.noise_std("sage", sigma, sigma_next, eta).double() ** 2
    for s, n, v in zip(sigma.double().tolist(), sigma_next.double().tolist(), variance.tolist()):
        grid = np.linspace(n, s, 20001)
        integral = np.trapezoid(eta**2 * grid / (1 - grid), grid)
        assert v == pytest.approx(integral, rel=1e-3, abs=1e-6)


# ------------------------------------------------------------------------------------------
# Means
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo"])
def test_sde_mean_is_euler_plus_score_correction(sde_type: str) -> None:
    # Eq. 7 with s = -(x + (1 - sigma) v) / sigma, written independently of the implementation.
    sigma, sigma_next = torch.tensor([0.8, 0.4]), torch.tensor([0.7, 0.1])
    x, v = torch.randn(2, 3), torch.randn(2, 3)
    out = sde_step(sde_type, x, v, sigma, sigma_next, 0.9, generator=torch.Generator().manual_seed(0))
    var = (out.std**2)[:, None]
    s, n = sigma[:, None], sigma_next[:, None]
    score = -(x + (1 - s) * v) / s
    torch.testing.assert_close(out.mean, x + (n - s) * v + var / 2 * score)


def test_ode_is_the_euler_step_of_diffusers() -> None:
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(5)
    x, v = torch.randn(1, 4, 3), torch.randn(1, 4, 3)
    expected = scheduler.step(v, scheduler.timesteps[1], x, return_dict=False)[0]
    sigmas = scheduler.sigmas
    out = sde_step("ode", x, v, sigmas[1], sigmas[2])
    torch.testing.assert_close(out.x_next, expected)
    assert not out.trainable.any() and out.log_prob.eq(0).all()


def test_cps_mean_and_last_step_deterministic() -> None:
    x, v = torch.randn(2, 5), torch.randn(2, 5)
    sigma, sigma_next = torch.tensor([0.6, 0.2]), torch.tensor([0.3, 0.0])
    out = sde_step("cps", x, v, sigma, sigma_next, 0.5, generator=torch.Generator().manual_seed(0))
    s, n = sigma[:, None], sigma_next[:, None]
    noise_level = n * math.sin(0.5 * math.pi / 2)
    expected = (1 - n) * (x - s * v) + torch.sqrt(n**2 - noise_level**2) * (x + (1 - s) * v)
    torch.testing.assert_close(out.mean, expected)
    assert out.trainable.tolist() == [True, False]
    assert torch.isfinite(out.log_prob).all()
    torch.testing.assert_close(out.x_next[1], out.mean[1])


def test_fp32_math_for_half_inputs() -> None:
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    out = sde_step("sage", x, torch.randn_like(x), 0.5, 0.4, 0.5, generator=torch.Generator().manual_seed(0))
    assert out.x_next.dtype == out.mean.dtype == out.log_prob.dtype == torch.float32


# ------------------------------------------------------------------------------------------
# Paper App. A.2 regimes
# ------------------------------------------------------------------------------------------


def test_regime_b_flow_grpo_first_step_explodes_under_the_clamp() -> None:
    # Both formulas evaluated with sigma clamped so that 1 - sigma >= 3e-3.
    sigmas = flow_match_sigmas(20, shift=5.0).clamp(max=SAGE_SIGMA_MAX)
    sigma, sigma_next = sigmas[:1], sigmas[1:2]
    flow = sde.noise_std("flow_grpo", sigma, sigma_next, 1.0).item()
    sage = sde.noise_std("sage", sigma, sigma_next, 1.0).item()
    assert flow > 1.4 * sage
    assert 0.5 < sage < 1.5


def test_regime_c_sage_std_below_flow_grpo_after_first_step() -> None:
    sigmas = flow_match_sigmas(20, shift=5.0)
    sage = sde.noise_std("sage", sigmas[:-1], sigmas[1:], 0.5)
    flow = sde.noise_std("flow_grpo", sigmas[:-1], sigmas[1:], 0.5)
    assert (sage[1:] < flow[1:]).all()
    assert torch.isfinite(sage).all() and torch.isfinite(flow).all()


# ------------------------------------------------------------------------------------------
# Marginal preservation on Gaussian data (exact velocity known in closed form)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "ode"])
def test_marginals_preserved_on_fine_schedule(sde_type: str) -> None:
    mean, variance = sample_final_moments(sde_type, num_steps=200, eta=0.7)
    assert mean == pytest.approx(DATA_MEAN, rel=0.01)
    assert variance == pytest.approx(DATA_STD**2, rel=0.03)


def test_cps_preserves_the_mean_and_the_variance_only_for_small_eta() -> None:
    """CPS re-noises a fixed fraction sin(eta*pi/2) of sigma' at every step, so with a posterior-mean
    predictor each step loses (1 - cos(eta*pi/2))^2 of the conditional variance, however fine the
    schedule: the mean is preserved at any eta, the variance only as eta -> 0 (benchmarks/sde_marginals)."""
    mean, variance = sample_final_moments("cps", num_steps=200, eta=0.7)
    assert mean == pytest.approx(DATA_MEAN, rel=0.01)
    assert variance < 0.8 * DATA_STD**2
    _, small_eta_variance = sample_final_moments("cps", num_steps=200, eta=0.1)
    assert small_eta_variance == pytest.approx(DATA_STD**2, rel=0.03)


# ------------------------------------------------------------------------------------------
# Equalizer (Eq. 9, App. A.5) and the Fig. 4 relation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "cps"])
def test_empirical_gradient_norm_is_proportional_to_scale(sde_type: str) -> None:
    sigmas = flow_match_sigmas(20, shift=5.0)
    scales = sde.gradient_scale(sde_type, sigmas[:-1], sigmas[1:], 0.5)
    weights = sde.equalizer_weights(scales)
    generator = torch.Generator().manual_seed(0)
    norms = []
    for index in range(20):
        latents = torch.randn(1, 4096, generator=generator)
        velocity = torch.randn(1, 4096, generator=generator).requires_grad_(True)
        out = sde_step(
            sde_type, latents, velocity, sigmas[index], sigmas[index + 1], 0.5, generator=generator
        )
        (grad,) = torch.autograd.grad(out.log_prob.sum(), velocity, allow_unused=True)
        norms.append(0.0 if grad is None else grad.norm().item())
    norms = torch.tensor(norms)
    stochastic = torch.isfinite(scales)
    ratio = norms[stochastic] / scales[stochastic]
    assert ratio.max() / ratio.min() < 1.1  # proportional to N_t (E||noise|| / sqrt(D) ~ const)
    raw = norms[stochastic]
    equalized = (norms * weights)[stochastic]
    assert equalized.max() / equalized.min() < 2.0
    if sde_type != "cps":
        assert raw.max() / raw.min() > 4 * equalized.max() / equalized.min()


def test_equalizer_flags_deterministic_steps() -> None:
    sigmas = flow_match_sigmas(10, shift=3.0)
    scales = sde.gradient_scale("cps", sigmas[:-1], sigmas[1:], 0.5)  # last step: sigma' = 0, std = 0
    weights = sde.equalizer_weights(scales)
    assert torch.isinf(scales[-1]) and weights[-1] == 0
    assert torch.isfinite(weights).all() and (weights[:-1] > 0).all()
    finite = scales[:-1]  # 9 stochastic steps: the median is the middle value
    torch.testing.assert_close(weights[:-1], finite.median() / (finite + 1e-8))
    assert torch.equal(
        sde.equalizer_weights(sde.gradient_scale("ode", sigmas[:-1], sigmas[1:], 0.5)), torch.zeros(10)
    )


def test_equalizer_weights_batch_median() -> None:
    scales = torch.tensor([[1.0, 2.0, 4.0, math.inf], [3.0, 3.0, 3.0, 3.0]])
    weights = sde.equalizer_weights(scales, eps=1e-8)
    torch.testing.assert_close(weights[0], torch.tensor([2.0, 1.0, 0.5, 0.0]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(weights[1], torch.ones(4), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Reproducibility and errors
# ------------------------------------------------------------------------------------------


def test_same_generators_give_bit_identical_steps() -> None:
    x, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)

    def run() -> torch.Tensor:
        gens = [torch.Generator().manual_seed(s) for s in (7, 8, 9)]
        return sde_step("sage", x, v, 0.7, 0.6, 0.5, generator=gens).x_next

    first, second = run(), run()
    assert torch.equal(first, second)
    single = sde_step(
        "sage", x[1:2], v[1:2], 0.7, 0.6, 0.5, generator=[torch.Generator().manual_seed(8)]
    ).x_next
    assert torch.equal(single[0], first[1])  # a sample's noise does not depend on its batch
    other = sde_step(
        "sage", x, v, 0.7, 0.6, 0.5, generator=[torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    )
    assert not torch.equal(other.x_next, first)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sde_type": "euler"}, "Unknown SDE type"),
        ({"sigma": 1.5}, r"\[0, 1\]"),
        ({"sigma_next": 0.9}, "must not exceed sigma"),
        ({"sigma": torch.tensor([0.5, 0.4])}, "shape"),
        ({"velocity": torch.randn(2, 3)}, "shape"),
        ({"velocity": torch.full((3, 4), float("nan"))}, "NaN or inf"),
        ({"x_next": torch.full((3, 4), float("inf"))}, "NaN or inf"),
        ({"eta": -1.0}, "eta"),
        ({"sde_type": "cps", "eta": 1.5}, "eta"),
        ({"sigma": 0.0, "sigma_next": 0.0}, "sigma must be > 0"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs: dict, message: str) -> None:
    arguments = {
        "sde_type": "sage",
        "latents": torch.randn(3, 4),
        "velocity": torch.randn(3, 4),
        "sigma": 0.5,
        "sigma_next": 0.3,
        "eta": 0.5,
    }
    arguments.update(kwargs)
    sde_type = arguments.pop("sde_type")
    with pytest.raises(ValueError, match=message):
        sde_step(sde_type, **arguments)


def test_generator_count_must_match_batch() -> None:
    with pytest.raises(ValueError, match="one per sample"):
        sde_step("sage", torch.randn(3, 4), torch.randn(3, 4), 0.5, 0.3, 0.5, generator=[torch.Generator()])


@pytest.mark.parametrize(
    "schedule", [[1.0, 0.5, 0.6, 0.0], [1.0, 0.5, 0.1], [1.2, 0.5, 0.0], [float("nan"), 0.0]]
)
def test_validate_sigma_schedule(schedule: list[float]) -> None:
    with pytest.raises(ValueError):
        sde.validate_sigma_schedule(torch.tensor(schedule))
