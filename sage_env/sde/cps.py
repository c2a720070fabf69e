"""Coefficients-Preserving Sampling (Wang and Yu, 2025, arXiv 2509.05952)."""

from __future__ import annotations

import math

import torch

from sage_env.sde.base import SDE, per_sample

__all__ = ["CPSSDE"]


class CPSSDE(SDE):
    """``std = sigma' sin(eta pi / 2)``; ``mean = (1 - sigma') x0_hat + sqrt(sigma'^2 - std^2) eps_hat``.

    A DDIM-like step whose coefficients of ``x0_hat`` and of the noise keep the flow's marginal coefficients.
    The published code scores a transition as ``-mean((x' - mean)^2)`` (no variance, no constants), also at
    the last step where ``sigma' = 0`` makes it deterministic; that step never enters the policy loss.
    """

    name = "cps"
    default_log_prob_kind = "cps"
    notes = "coefficients-preserving sampling"
    reference = (
        "yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py, sde_step_with_logprob(sde_type='cps'), "
        "commit 54809b5fcf4d3930d2a17fa553928704bd0b719e"
    )

    max_eta = 1.0
    """``std = sigma' sin(eta pi / 2)`` may not exceed ``sigma'``: ``eta`` lies in [0, 1]."""

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return (sigma_next * math.sin(eta * math.pi / 2.0)) ** 2

    def std(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return sigma_next * math.sin(eta * math.pi / 2.0)

    def mean(
        self,
        latents: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        std: torch.Tensor,
    ) -> torch.Tensor:
        s, s_next, sd = (per_sample(t, latents) for t in (sigma, sigma_next, std))
        x0_hat, eps_hat = latents - s * velocity, latents + (1.0 - s) * velocity
        return (1.0 - s_next) * x0_hat + (s_next**2 - sd**2).clamp(min=0.0).sqrt() * eps_hat

    def sensitivity(self, sigma: torch.Tensor, sigma_next: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``mean = (1 - sigma')(x - sigma v) + c (x + (1 - sigma) v)``, ``c = sqrt(sigma'^2 - std^2)``."""
        coefficient = (sigma_next**2 - std**2).clamp(min=0.0).sqrt()
        return (coefficient * (1.0 - sigma) - sigma * (1.0 - sigma_next)).abs()
