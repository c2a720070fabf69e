"""Deterministic multistep ODE solvers for the steps no learner trains (MixGRPO-Flash's steps after its SDE window).

`dpm_solver_2m_correction` is the second-order term of multistep DPM-Solver++ in data prediction, midpoint form
(Lu et al., 2022, "DPM-Solver++", arXiv 2211.01095, Alg. 2; diffusers ``DPMSolverMultistepScheduler`` with
``algorithm_type="dpmsolver++"``, ``solver_order=2``, ``solver_type="midpoint"``, as MixGRPO's
``sampling_utils.run_sample_step`` uses it). For flow matching, ``alpha = 1 - sigma`` and ``lambda = log(alpha /
sigma)``; the first-order update, ``x_t = (sigma_t / sigma_s) x_s - alpha_t (e^{-h} - 1) x0_s``, is exactly the
Euler step ``x_s - (sigma_s - sigma_t) v`` (with ``x0 = x - sigma v``), so the second-order step is the Euler step
plus ``-0.5 alpha_t (e^{-h} - 1) D1``, ``D1 = (x0_s - x0_prev) / r0``, ``r0 = (lambda_s - lambda_prev) / h``.
"""

from __future__ import annotations

import torch

from sage_env.sde.base import per_sample

__all__ = ["ODE_SOLVERS", "dpm_solver_2m_correction", "half_log_snr"]

ODE_SOLVERS = ("euler", "dpmsolver++")
"""How deterministic steps after an episode's last SDE step are solved: ``euler`` (one model call, first order, as
diffusers' flow-matching pipelines) or ``dpmsolver++`` (second-order multistep from the previous step's data
prediction, as MixGRPO-Flash; the last step, to sigma 0, stays first order, diffusers' ``lower_order_final``)."""


def half_log_snr(sigma: torch.Tensor) -> torch.Tensor:
    """``lambda = log((1 - sigma) / sigma)`` (float32; ``-inf`` at sigma 1, ``+inf`` at 0)."""
    sigma = sigma.to(torch.float32)
    return torch.log1p(-sigma) - torch.log(sigma)


def dpm_solver_2m_correction(
    data_prediction: torch.Tensor,
    previous_data_prediction: torch.Tensor,
    sigma_previous: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
) -> torch.Tensor:
    """What the second-order multistep DPM-Solver++ step adds to the Euler step from ``sigma`` to ``sigma_next``.

    Args:
        data_prediction: ``x0 = x - sigma v`` at this step; ``previous_data_prediction``: at the previous step,
            whose noise level was ``sigma_previous``.
        sigma_previous, sigma, sigma_next: ``(B,)`` float32, with ``sigma_previous > sigma > sigma_next > 0``.

    Returns:
        ``-0.5 alpha_t (e^{-h} - 1) (x0 - x0_prev) / r0``, float32; 0 where ``sigma_previous`` is 1 (no finite
        ``lambda``: the first-order step, as a solver without history takes).
    """
    lam_prev, lam, lam_next = half_log_snr(sigma_previous), half_log_snr(sigma), half_log_snr(sigma_next)
    h = lam_next - lam
    ratio = (lam - lam_prev) / h
    has_history = torch.isfinite(lam_prev)
    # -alpha_t (e^{-h} - 1) = 1 - sigma_t / sigma_s, the Euler step's weight of x0 (module docstring).
    weight = torch.where(has_history, 0.5 * (1 - sigma_next / sigma) / ratio, torch.zeros_like(sigma))
    difference = data_prediction.to(torch.float32) - previous_data_prediction.to(torch.float32)
    return per_sample(weight, difference) * difference
