"""The SAGE-GRPO precise manifold-aware SDE (paper Eq. 5-7, App. A.1-A.2)."""

from __future__ import annotations

import torch

from sage_env.sde.base import SDE

__all__ = ["SAGE_SIGMA_MAX", "SageSDE"]

SAGE_SIGMA_MAX: float = 1.0 - 3e-3
"""Largest sigma used inside the logarithm of the variance, which diverges at ``sigma = 1`` (App. A.2,
regime (b): ``(1 - sigma) >= 3e-3``)."""


class SageSDE(SDE):
    """``std^2 = eta^2 (log((1 - sigma') / (1 - sigma)) - d)`` (Eq. 5-6), mean Eq. 7.

    The variance is the integral of ``eta^2 s / (1 - s)`` over ``[sigma', sigma]``: the exact noise of the
    reverse SDE over the step, where first-order rules (Table 1) use the integrand at one end. ``sigma`` is
    clamped to `SAGE_SIGMA_MAX` inside the logarithm, as the official release does for the current sigma.
    """

    name = "sage"
    notes = "manifold-aware variance, Eq. 5-7 of the paper"
    reference = (
        "Tencent-Hunyuan/SAGE-GRPO, hyvideo/schedulers/scheduling_flow_match_discrete.py, "
        "sde_step_with_logprob(sde_type='sage_grpo', sde_solver=True), commit c86886938386c4ae521cb08ac3d9f34928fbb7ae"
    )

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        # Clamp inside the log only; log1p keeps precision near sigma = 0.
        log_term = torch.log1p(-sigma_next.clamp(max=SAGE_SIGMA_MAX)) - torch.log1p(
            -sigma.clamp(max=SAGE_SIGMA_MAX)
        )
        return (eta**2 * (log_term - (sigma - sigma_next))).clamp(min=0.0)
