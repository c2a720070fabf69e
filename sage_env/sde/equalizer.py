"""The temporal gradient equalizer (paper Eq. 9, App. A.5): per-step gradient scales and their weights."""

from __future__ import annotations

import math

import torch

from sage_env.sde.base import get_sde

__all__ = ["MEDIAN_KINDS", "equalizer_weights", "gradient_scale", "mean_velocity_sensitivity", "noise_std"]

MEDIAN_KINDS: tuple[str, ...] = ("lower", "mean")
"""``lower``: ``torch.median`` (the lower middle value for an even count), as the official code computes
``Median(N)``; ``mean``: the average of the two middle values."""


def noise_std(sde_type: str, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
    """Per-sample noise std of one step (Table 1 of the paper, CPS, and 0 for ``ode``)."""
    return get_sde(sde_type).std(sigma, sigma_next, eta)


def mean_velocity_sensitivity(
    sde_type: str, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float
) -> torch.Tensor:
    """``lambda_t = |d mean / d v|``: the solver's sensitivity of the step mean to the velocity (App. A.5)."""
    unit = get_sde(sde_type)
    return unit.sensitivity(sigma, sigma_next, unit.std(sigma, sigma_next, eta))


def gradient_scale(
    sde_type: str, sigma: torch.Tensor | float, sigma_next: torch.Tensor | float, eta: float
) -> torch.Tensor:
    """The per-step gradient-norm proxy ``N_t = lambda_t / std_t`` (Eq. 38); ``inf`` where ``std = 0``.

    For a Gaussian step ``d log_prob / d mean = (x' - mean) / std^2`` has norm ~ ``1 / std`` (Eq. 31 and 37),
    and the chain rule through the solver multiplies it by ``lambda_t``.
    """
    unit = get_sde(sde_type)
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    sigma_next = torch.as_tensor(sigma_next, dtype=torch.float32)
    std = unit.std(sigma, sigma_next, eta)
    sensitivity = unit.sensitivity(sigma, sigma_next, std)
    safe_std = torch.where(std > 0, std, torch.ones_like(std))
    return torch.where(std > 0, sensitivity / safe_std, torch.full_like(std, math.inf))


def equalizer_weights(scales: torch.Tensor, eps: float = 1e-8, median: str = "lower") -> torch.Tensor:
    """Temporal gradient equalizer ``S_t = median(N) / (N_t + eps)`` (Eq. 9 / Eq. 39).

    Args:
        scales: gradient scales ``N_t`` of shape ``(..., T)`` (see `gradient_scale`); ``inf`` marks a
            deterministic step.
        eps: the small constant of Eq. 9.
        median: ``"lower"`` (default: ``torch.median``'s lower middle value, as the official code) or
            ``"mean"`` (the average of the two middle values for an even count).

    Returns:
        Weights of the same shape. The median runs over the finite entries of the last dimension
        (the stochastic steps of one trajectory); deterministic steps get weight 0 (untrainable), never
        inf or NaN. A row without any stochastic step is all zeros.
    """
    if not eps > 0:
        raise ValueError(f"equalizer_eps must be > 0, got {eps}.")
    if median not in MEDIAN_KINDS:
        raise ValueError(f"equalizer_median must be one of {MEDIAN_KINDS}, got {median!r}.")
    scales = scales.to(torch.float32)
    finite = torch.isfinite(scales)
    interpolation = "lower" if median == "lower" else "midpoint"
    masked = torch.where(finite, scales, torch.nan)
    middle = torch.nanquantile(masked, 0.5, dim=-1, keepdim=True, interpolation=interpolation)
    weights = middle / (scales + eps)
    return torch.where(finite & torch.isfinite(weights), weights, torch.zeros_like(weights))
