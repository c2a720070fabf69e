"""Flow-GRPO's first-order SDE (Liu et al., 2025, arXiv 2505.05470; paper Table 1)."""

from __future__ import annotations

import torch

from sage_env.sde.base import SDE

__all__ = ["FlowGRPOSDE"]


class FlowGRPOSDE(SDE):
    """``std^2 = eta^2 sigma / (1 - sigma) d`` (Table 1), mean Eq. 7.

    At ``sigma = 1`` the original puts the next sigma into the denominator only
    (``sigma / (1 - where(sigma == 1, sigmas[1], sigma))``), so its first-step std is exactly ``eta``; the
    published mean ``x (1 + std_t^2/(2 sigma) dt) + v (1 + std_t^2 (1 - sigma)/(2 sigma)) dt`` with
    ``dt = -d`` is Eq. 7 written another way.
    """

    name = "flow_grpo"
    notes = "Flow-GRPO's first-order variance"
    reference = (
        "yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py, sde_step_with_logprob(sde_type='sde'), "
        "commit 54809b5fcf4d3930d2a17fa553928704bd0b719e"
    )

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        denominator_sigma = torch.where(sigma >= 1.0, sigma_next, sigma)
        ratio = sigma / (1.0 - denominator_sigma).clamp(min=torch.finfo(torch.float32).tiny)
        return eta**2 * ratio * (sigma - sigma_next)
