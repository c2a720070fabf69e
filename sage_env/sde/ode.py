"""The deterministic Euler step of the probability-flow ODE: what diffusers' flow-matching pipelines do."""

from __future__ import annotations

import torch

from sage_env.sde.base import SDE, per_sample

__all__ = ["ODE"]


class ODE(SDE):
    """``x' = x - d v`` (``FlowMatchEulerDiscreteScheduler.step``); no noise, never trained."""

    name = "ode"
    stochastic = False
    notes = "deterministic Euler step"
    reference = "diffusers FlowMatchEulerDiscreteScheduler.step (diffusers 0.42.1)"

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return torch.zeros_like(sigma)

    def mean(
        self,
        latents: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        std: torch.Tensor,
    ) -> torch.Tensor:
        return latents - per_sample(sigma - sigma_next, latents) * velocity

    def sensitivity(self, sigma: torch.Tensor, sigma_next: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        return sigma - sigma_next
