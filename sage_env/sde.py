"""Stochastic and deterministic steps of a rectified-flow sampler: pure tensor math, no model.

Notation (paper "Manifold-Aware Exploration for Reinforcement Learning in Video Generation",
arXiv 2603.21872, Sec. 3.1-3.2 and App. A): the rectified-flow path is ``x = (1 - sigma) x0 + sigma z``
and the network predicts the velocity ``v = z - x0`` (the diffusers convention, where the Euler step
is ``x + (sigma' - sigma) v``). A denoising step goes from ``sigma`` to the smaller ``sigma'``
(``sigma_next``) with ``d = sigma - sigma' >= 0``. From one velocity we read

* the clean estimate ``x0_hat = x - sigma v`` and the noise estimate ``eps_hat = x + (1 - sigma) v``,
* the score estimate ``s = -eps_hat / sigma`` (App. A.1).

Every stochastic step is a Gaussian ``x' = mean + std * noise``. The SDE types differ in ``std`` and in
how the mean compensates for the injected noise:

============  ==========================================================  ===============================
type          std (Table 1 and peers)                                     mean
============  ==========================================================  ===============================
sage          ``eta * sqrt(log((1-sigma')/(1-sigma)) - d)`` (Eq. 5-6)     ``x - d v + std^2/2 * s`` (Eq. 7)
flow_grpo     ``eta * sqrt(sigma/(1-sigma) * d)``                         same form as sage
dance_grpo    ``eta * sqrt(d)``                                           same form as sage
cps           ``sigma' * sin(eta * pi / 2)``                              ``(1-sigma') x0_hat +
                                                                          sqrt(sigma'^2 - std^2) eps_hat``
ode           ``0``                                                       ``x - d v`` (plain Euler)
============  ==========================================================  ===============================

``sage`` clamps sigma to at most ``1 - 3e-3`` inside the logarithm, which diverges at ``sigma = 1``
(App. A.2, regime (b)). ``flow_grpo`` follows the original at ``sigma = 1``: only the denominator of
``sigma / (1 - sigma)`` uses the next sigma, so its first-step std is exactly ``eta``.

All math runs in float32 whatever the input dtype (diffusers schedulers do the same), with per-sample
sigmas of shape ``(B,)`` and optional per-sample ``torch.Generator`` objects so that a rollout is
reproducible from its seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from diffusers.utils import BaseOutput

__all__ = [
    "LOG_PROB_KINDS",
    "SAGE_SIGMA_MAX",
    "SDE_TYPES",
    "SDEStepOutput",
    "equalizer_weights",
    "flow_match_sigmas",
    "gaussian_log_prob",
    "gradient_scale",
    "mean_velocity_sensitivity",
    "noise_std",
    "sample_noise",
    "sde_step",
    "sigmas_from_scheduler",
    "validate_eta",
    "validate_sde_type",
    "validate_sigma_schedule",
]

SDE_TYPES: tuple[str, ...] = ("sage", "flow_grpo", "dance_grpo", "cps", "ode")
"""The SDE types a step can apply."""

SAGE_SIGMA_MAX: float = 1.0 - 3e-3
"""Largest sigma used inside the logarithm of the sage variance (App. A.2, regime (b))."""

LOG_PROB_KINDS: tuple[str, ...] = ("gaussian", "cps")
"""``gaussian``: the exact Gaussian log-density; ``cps``: published CPS' ``-mean((x' - mean)^2)``."""

SDEType = Literal["sage", "flow_grpo", "dance_grpo", "cps", "ode"]
LogProbKind = Literal["gaussian", "cps"]

_COMPUTE_DTYPE = torch.float32
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class SDEStepOutput(BaseOutput):
    """Result of one denoising step.

    Args:
        x_next (`torch.Tensor`): the next latents, shape of the input latents, float32.
        mean (`torch.Tensor`): the mean of the Gaussian transition, same shape, float32.
        std (`torch.Tensor`): the per-sample noise std, shape ``(B,)``.
        log_prob (`torch.Tensor`): per-sample log-probability of ``x_next`` under ``N(mean, std^2)``,
            averaged over all non-batch dimensions, shape ``(B,)``. Zero for deterministic samples.
        trainable (`torch.Tensor`): boolean ``(B,)``; ``False`` where ``std == 0`` (the step is
            deterministic and has no log-probability: exclude it from the policy loss).
    """

    x_next: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor
    trainable: torch.Tensor


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


def flow_match_sigmas(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """Return the shifted flow-matching schedule ``sigma = s*u / (1 + (s-1)*u)``, ``u = linspace(1, 0, N+1)``.

    Args:
        num_steps: number of denoising steps ``N`` (>= 1).
        shift: the time shift ``s`` (> 0); 1 gives the uniform schedule, larger spends more steps at
            high noise (HunyuanVideo 1.5 and Wan use 5).

    Returns:
        float32 tensor of shape ``(N + 1,)`` from exactly 1 down to exactly 0.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    if not math.isfinite(shift) or shift <= 0:
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}.")
    u = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    sigmas = shift * u / (1.0 + (shift - 1.0) * u)
    return sigmas.to(_COMPUTE_DTYPE)


def sigmas_from_scheduler(scheduler: object) -> torch.Tensor:
    """Return the sigma schedule of a diffusers flow-matching scheduler after ``set_timesteps``.

    Works with ``FlowMatchEulerDiscreteScheduler`` (and any scheduler exposing a ``sigmas`` tensor
    that ends with the terminal sigma 0), so an environment reproduces exactly the steps a diffusers
    pipeline takes.

    Returns:
        float32 CPU tensor of shape ``(N + 1,)``, strictly decreasing, ending with 0.
    """
    sigmas = getattr(scheduler, "sigmas", None)
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1:
        raise ValueError(
            f"{type(scheduler).__name__} has no 1-D `sigmas` tensor; use a flow-matching scheduler such as "
            "diffusers.FlowMatchEulerDiscreteScheduler and call `scheduler.set_timesteps(num_steps)` first."
        )
    sigmas = sigmas.detach().to("cpu", _COMPUTE_DTYPE).clone()
    validate_sigma_schedule(sigmas)
    return sigmas


def validate_sigma_schedule(sigmas: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``sigmas`` is a finite, strictly decreasing schedule in [0, 1] ending at 0."""
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(
            f"A sigma schedule must be 1-D with at least 2 entries, got shape {tuple(sigmas.shape)}."
        )
    if not torch.isfinite(sigmas).all():
        raise ValueError("The sigma schedule contains NaN or inf.")
    if sigmas.min() < 0 or sigmas.max() > 1:
        raise ValueError(f"Sigmas must lie in [0, 1], got range [{sigmas.min():.4g}, {sigmas.max():.4g}].")
    if not (sigmas[1:] < sigmas[:-1]).all():
        raise ValueError("Sigmas must be strictly decreasing (from noise to data).")
    if sigmas[-1] != 0:
        raise ValueError(
            f"The schedule must end at sigma = 0 (the clean sample), got {sigmas[-1].item():.4g}; append a 0."
        )


# ----------------------------------------------------------------------------------------------
# Validation of step inputs
# ----------------------------------------------------------------------------------------------


def validate_sde_type(sde_type: str) -> None:
    """Raise ``ValueError`` naming the allowed SDE types when ``sde_type`` is unknown."""
    if sde_type not in SDE_TYPES:
        raise ValueError(f"Unknown SDE type {sde_type!r}; choose one of {', '.join(SDE_TYPES)}.")


def validate_eta(sde_type: str, eta: float) -> None:
    """Raise ``ValueError`` unless ``eta`` is a valid exploration scale for ``sde_type``."""
    if not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
        raise ValueError(f"eta must be a finite number >= 0, got {eta!r}.")
    if sde_type == "cps" and eta > 1:
        raise ValueError(f"For the cps SDE eta must lie in [0, 1] (std = sigma' * sin(eta*pi/2)), got {eta}.")


def _as_sigma(value: torch.Tensor | float, name: str, batch_size: int, device: torch.device) -> torch.Tensor:
    sigma = torch.as_tensor(value, dtype=_COMPUTE_DTYPE, device=device)
    if sigma.ndim == 0:
        sigma = sigma.expand(batch_size)
    if sigma.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or have shape ({batch_size},) (one per sample), got {tuple(sigma.shape)}."
        )
    if not torch.isfinite(sigma).all():
        raise ValueError(f"{name} contains NaN or inf.")
    if sigma.min() < 0 or sigma.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1], got range [{sigma.min():.4g}, {sigma.max():.4g}].")
    return sigma


def _check_sigma_pair(sigma: torch.Tensor, sigma_next: torch.Tensor) -> None:
    if (sigma <= 0).any():
        raise ValueError("sigma must be > 0 for a denoising step (sigma = 0 is already the clean sample).")
    if (sigma_next > sigma).any():
        raise ValueError(
            "sigma_next must not exceed sigma: a denoising step goes from noise (1) to data (0)."
        )


def _check_tensor(tensor: torch.Tensor, name: str, shape: torch.Size) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the latents have shape {tuple(shape)}.")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}.")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains NaN or inf; check the model output / stored trajectory.")


# ----------------------------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------------------------


def _sage_variance(sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
    # Eq. 5: Sigma_t = eta^2 [log((1-sigma')/(1-sigma)) - (sigma - sigma')], the integral of
    # eta^2 * s/(1-s) over [sigma', sigma]. The log diverges at sigma = 1: clamp inside it (App. A.2).
    log_term = torch.log1p(-sigma_next.clamp(max=SAGE_SIGMA_MAX)) - torch.log1p(
        -sigma.clamp(max=SAGE_SIGMA_MAX)
    )
    return (eta**2 * (log_term - (sigma - sigma_next))).clamp(min=0.0)


def _flow_grpo_variance(sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
    # Table 1: eta^2 * sigma/(1-sigma) * d. At sigma = 1 FlowGRPO puts the next sigma into the
    # denominator only, which makes the first-step std exactly eta.
    denominator_sigma = torch.where(sigma >= 1.0, sigma_next, sigma)
    ratio = sigma / (1.0 - denominator_sigma).clamp(min=torch.finfo(_COMPUTE_DTYPE).tiny)
    return eta**2 * ratio * (sigma - sigma_next)


def noise_std(sde_type: SDEType, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
    """Per-sample noise std of one step (Table 1 of the paper, CPS, and 0 for ``ode``).

    Args:
        sde_type: one of `SDE_TYPES`.
        sigma, sigma_next: float32 tensors of equal shape, ``sigma_next <= sigma``.
        eta: the exploration scale.
    """
    validate_sde_type(sde_type)
    if sde_type == "sage":
        return _sage_variance(sigma, sigma_next, eta).sqrt()
    if sde_type == "flow_grpo":
        return _flow_grpo_variance(sigma, sigma_next, eta).sqrt()
    if sde_type == "dance_grpo":
        return eta * (sigma - sigma_next).clamp(min=0.0).sqrt()
    if sde_type == "cps":
        return sigma_next * math.sin(eta * math.pi / 2.0)
    return torch.zeros_like(sigma)


def mean_velocity_sensitivity(
    sde_type: SDEType, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float
) -> torch.Tensor:
    """``lambda_t = |d mean / d v|``: the solver's sensitivity of the step mean to the velocity (App. A.5).

    Every mean is affine in ``v`` with a per-sample scalar slope, so this is exact:

    * sage / flow_grpo / dance_grpo: ``mean = x - d v - std^2/(2 sigma) (x + (1 - sigma) v)``, so
      ``lambda = d + std^2 (1 - sigma) / (2 sigma)``;
    * cps: ``mean = (1-sigma')(x - sigma v) + c (x + (1-sigma) v)`` with ``c = sqrt(sigma'^2 - std^2)``, so
      ``lambda = |c (1 - sigma) - sigma (1 - sigma')|``;
    * ode: ``lambda = d``.
    """
    std = noise_std(sde_type, sigma, sigma_next, eta)
    if sde_type == "cps":
        coefficient = (sigma_next**2 - std**2).clamp(min=0.0).sqrt()
        return (coefficient * (1.0 - sigma) - sigma * (1.0 - sigma_next)).abs()
    if sde_type == "ode":
        return sigma - sigma_next
    return (sigma - sigma_next) + std**2 * (1.0 - sigma) / (2.0 * sigma)


def gradient_scale(
    sde_type: SDEType, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float
) -> torch.Tensor:
    """The per-step gradient-norm proxy ``N_t = lambda_t / std_t`` (Eq. 38); ``inf`` where ``std = 0``.

    For a Gaussian step ``d log_prob / d mean = (x' - mean) / std^2`` has norm ~ ``1 / std`` (Eq. 31 and 37),
    and the chain rule through the solver multiplies it by ``lambda_t``.
    """
    sigma = torch.as_tensor(sigma, dtype=_COMPUTE_DTYPE)
    sigma_next = torch.as_tensor(sigma_next, dtype=_COMPUTE_DTYPE)
    std = noise_std(sde_type, sigma, sigma_next, eta)
    sensitivity = mean_velocity_sensitivity(sde_type, sigma, sigma_next, eta)
    safe_std = torch.where(std > 0, std, torch.ones_like(std))
    return torch.where(std > 0, sensitivity / safe_std, torch.full_like(std, math.inf))


def equalizer_weights(scales: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Temporal gradient equalizer ``S_t = median(N) / (N_t + eps)`` (Eq. 9 / Eq. 39).

    Args:
        scales: gradient scales ``N_t`` of shape ``(..., T)`` (see `gradient_scale`); ``inf`` marks a
            deterministic step.
        eps: the small constant of Eq. 9.

    Returns:
        Weights of the same shape. The median runs over the finite entries of the last dimension
        (the stochastic steps of one trajectory); deterministic steps get weight 0 (untrainable), never
        inf or NaN. A row without any stochastic step is all zeros.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}.")
    scales = scales.to(_COMPUTE_DTYPE)
    finite = torch.isfinite(scales)
    median = torch.nanquantile(torch.where(finite, scales, torch.nan), 0.5, dim=-1, keepdim=True)
    weights = median / (scales + eps)
    return torch.where(finite & torch.isfinite(weights), weights, torch.zeros_like(weights))


# ----------------------------------------------------------------------------------------------
# Sampling and scoring
# ----------------------------------------------------------------------------------------------


def sample_noise(
    shape: torch.Size | Sequence[int],
    generator: torch.Generator | Sequence[torch.Generator] | None,
    device: torch.device | str,
) -> torch.Tensor:
    """Standard normal float32 noise; with a list of generators each sample uses its own.

    Each per-sample draw happens on its generator's device and is then moved, so the same seed gives the
    same noise regardless of the batch it is part of.
    """
    shape = tuple(shape)
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        return torch.randn(shape, generator=generator, device=gen_device, dtype=_COMPUTE_DTYPE).to(device)
    generators = list(generator)
    if len(generators) != shape[0]:
        raise ValueError(f"Got {len(generators)} generators for a batch of {shape[0]}; pass one per sample.")
    draws = [torch.randn(shape[1:], generator=g, device=g.device, dtype=_COMPUTE_DTYPE) for g in generators]
    return torch.stack(draws).to(device)


def _broadcast(per_sample: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return per_sample.reshape(per_sample.shape[0], *([1] * (like.ndim - 1)))


def gaussian_log_prob(
    x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, kind: LogProbKind = "gaussian"
) -> torch.Tensor:
    """Per-sample log-probability averaged over non-batch dimensions; 0 where ``std == 0``.

    ``kind="gaussian"``: ``-(x'-mean)^2 / (2 std^2) - log std - log(2 pi)/2`` per element (the form every
    peer averages, hence clip ranges of ~1e-4). ``kind="cps"``: published CPS scores ``-(x'-mean)^2``.
    Gradients stay finite at ``std == 0`` because the division uses a safe std there.
    """
    if kind not in LOG_PROB_KINDS:
        raise ValueError(f"Unknown log-prob kind {kind!r}; choose one of {', '.join(LOG_PROB_KINDS)}.")
    reduce_dims = tuple(range(1, x_next.ndim))
    trainable = std > 0
    squared_error = (x_next.to(_COMPUTE_DTYPE) - mean.to(_COMPUTE_DTYPE)) ** 2
    if kind == "cps":
        log_prob = -squared_error.mean(dim=reduce_dims)
    else:
        safe_std = torch.where(trainable, std, torch.ones_like(std)).to(_COMPUTE_DTYPE)
        per_element = -squared_error / (2.0 * _broadcast(safe_std, x_next) ** 2)
        log_prob = per_element.mean(dim=reduce_dims) - torch.log(safe_std) - _HALF_LOG_2PI
    return torch.where(trainable, log_prob, torch.zeros_like(log_prob))


def _step_mean(
    sde_type: str,
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    s, s_next, sd = (_broadcast(t, latents) for t in (sigma, sigma_next, std))
    if sde_type == "ode":
        return latents - (s - s_next) * velocity
    eps_hat = latents + (1.0 - s) * velocity
    if sde_type == "cps":
        x0_hat = latents - s * velocity
        return (1.0 - s_next) * x0_hat + (s_next**2 - sd**2).clamp(min=0.0).sqrt() * eps_hat
    # Eq. 7: x - d v + (std^2 / 2) * score, with score = -eps_hat / sigma (App. A.1).
    return latents - (s - s_next) * velocity - sd**2 / (2.0 * s) * eps_hat


def sde_step(
    sde_type: SDEType,
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    eta: float = 0.0,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    x_next: torch.Tensor | None = None,
    log_prob_kind: LogProbKind = "gaussian",
) -> SDEStepOutput:
    """Apply one denoising step of the chosen SDE, or score a stored transition.

    Args:
        sde_type: ``"sage" | "flow_grpo" | "dance_grpo" | "cps" | "ode"``.
        latents: current latents ``x`` of shape ``(B, ...)``.
        velocity: predicted velocity ``v`` (after classifier-free guidance), same shape. Gradients flow
            through it into ``mean`` and ``log_prob``.
        sigma: current noise level, a scalar or per-sample ``(B,)`` tensor, in (0, 1].
        sigma_next: next noise level, scalar or ``(B,)``, in [0, sigma].
        eta: exploration scale (ignored by ``ode``).
        generator: one generator for the batch or one per sample; only used when ``x_next`` is None.
        x_next: a stored next state to score instead of sampling a new one (for recomputing log-probs).
        log_prob_kind: ``"gaussian"`` (default) or ``"cps"`` (see `gaussian_log_prob`).

    Returns:
        `SDEStepOutput` with float32 ``x_next``, ``mean``, per-sample ``std``, ``log_prob`` and ``trainable``.

    Raises:
        ValueError: unknown SDE type, sigmas outside [0, 1] or increasing, mismatched shapes, or non-finite
            inputs.
    """
    validate_sde_type(sde_type)
    validate_eta(sde_type, eta)
    _check_tensor(latents, "latents", latents.shape)
    _check_tensor(velocity, "velocity", latents.shape)
    if latents.ndim < 2:
        raise ValueError(
            f"latents must have a batch dimension and at least one more, got shape {tuple(latents.shape)}."
        )
    batch_size, device = latents.shape[0], latents.device
    sigma = _as_sigma(sigma, "sigma", batch_size, device)
    sigma_next = _as_sigma(sigma_next, "sigma_next", batch_size, device)
    _check_sigma_pair(sigma, sigma_next)

    latents32, velocity32 = latents.to(_COMPUTE_DTYPE), velocity.to(_COMPUTE_DTYPE)
    std = noise_std(sde_type, sigma, sigma_next, eta)
    mean = _step_mean(sde_type, latents32, velocity32, sigma, sigma_next, std)
    if x_next is None and not (std > 0).any():
        x_next = mean.detach()  # deterministic (ode, cps at sigma' = 0): draw no noise
    elif x_next is None:
        noise = sample_noise(latents.shape, generator, device)
        x_next = mean.detach() + _broadcast(std, latents) * noise
    else:
        _check_tensor(x_next, "x_next", latents.shape)
        x_next = x_next.to(_COMPUTE_DTYPE)
    log_prob = gaussian_log_prob(x_next, mean, std, kind=log_prob_kind)
    return SDEStepOutput(x_next=x_next, mean=mean, std=std, log_prob=log_prob, trainable=std > 0)
