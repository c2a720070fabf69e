"""Flow-matching sigma schedules: the shifted linear one, or whatever a diffusers scheduler sets."""

from __future__ import annotations

import math

import torch

__all__ = ["flow_match_sigmas", "sigmas_from_scheduler", "validate_sigma_schedule"]


def flow_match_sigmas(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """Return the shifted flow-matching schedule ``sigma = s*u / (1 + (s-1)*u)``, ``u = linspace(1, 0, N+1)``.

    Args:
        num_steps: number of denoising steps ``N`` (>= 1).
        shift: the time shift ``s`` (> 0); 1 gives the uniform schedule, larger spends more steps at
            high noise (HunyuanVideo 1.5 uses 5).

    Returns:
        float32 tensor of shape ``(N + 1,)`` from exactly 1 down to exactly 0.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    if (
        isinstance(shift, bool)
        or not isinstance(shift, (int, float))
        or not math.isfinite(shift)
        or shift <= 0
    ):
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}.")
    u = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    sigmas = shift * u / (1.0 + (shift - 1.0) * u)
    return sigmas.to(torch.float32)


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
    sigmas = sigmas.detach().to("cpu", torch.float32).clone()
    validate_sigma_schedule(sigmas)
    return sigmas


def validate_sigma_schedule(sigmas: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``sigmas`` is a finite, strictly decreasing schedule in [0, 1] ending at 0."""
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
        shape = tuple(sigmas.shape) if isinstance(sigmas, torch.Tensor) else type(sigmas).__name__
        raise ValueError(f"A sigma schedule must be a 1-D tensor with at least 2 entries, got {shape}.")
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
