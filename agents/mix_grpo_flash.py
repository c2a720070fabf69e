"""MixGRPO-Flash (Li et al., 2025, arXiv 2507.21802, Sec. 3.4): MixGRPO whose steps after the SDE window are fewer and
of higher order: the rest of the schedule is compressed to ``post_window_compress_ratio`` of its points and solved with
second-order multistep DPM-Solver++ (`sage_env.sde.multistep`), so a rollout costs fewer transformer calls. Training
is MixGRPO's: only the window's steps, which are untouched.

Written from the paper and the authors' code (Tencent-Hunyuan/MixGRPO at e5cdd6a, ``fastvideo/utils/sampling_utils.py``
``run_sample_step`` and ``scripts/finetune/finetune_flux_grpo_MixGRPO_Flash.sh``): after the window's last step
``l`` of a ``T``-step schedule, ``n = int((T - l) * ratio)`` points evenly spaced in the unshifted time from step
``l + 1``'s to 0, shifted as the schedule is; DPM-Solver++ 2M (midpoint) with the data predictions of the window's
steps as its history and a first-order last step; window moved every 20 iterations (Flash), ratio 0.4; Flash* is
``sde_window_stride 0`` with ratio 0.2.

Differences on purpose: at least 2 points after the window (theirs allows 1, which would not reach sigma 0); the
compressed points are found on the environment's own schedule (`schedule_at`): exact for the toy's shifted schedule,
as theirs is for FLUX's; interpolated between its steps for a diffusers scheduler's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents.mix_grpo import MixGRPOAgentConfig, MixGRPOAlgorithm
from agents.rollout import RolloutShape
from sage_env.checks import Real, hyperparameter, with_default

__all__ = ["MixGRPOFlashAgentConfig", "MixGRPOFlashAlgorithm", "compressed_schedule", "schedule_at"]


@dataclass
class MixGRPOFlashAgentConfig(MixGRPOAgentConfig):
    """MixGRPO-Flash's published defaults: MixGRPO's, the window moved every 20 steps, and the schedule after it
    compressed to 0.4 of its points, solved with DPM-Solver++ 2M."""

    display_name: ClassVar[str] = "MixGRPO-Flash"
    summary: ClassVar[str | None] = (
        "MixGRPO with fewer, second-order ODE steps after the window: cheaper rollouts"
    )

    sde_window_shift_interval: int = with_default(MixGRPOAgentConfig, "sde_window_shift_interval", 20)
    post_window_compress_ratio: float = hyperparameter(
        0.4,
        "MixGRPO-Flash: the share of the schedule's points after the SDE window that the rollout keeps (solved "
        "with second-order DPM-Solver++). Smaller rollouts cost fewer transformer calls and drift further from "
        "the full schedule's videos: on a short schedule (the toy's 10 steps) 0.4 leaves a single jump to sigma 0 "
        "and scored below sage_grpo in 12 of 12 seeds; 0.8 there is not told apart from it (docs/arena.md). "
        "Published: 0.4 for 25 steps (Flash), 0.2 (Flash*, with sde_window_stride 0).",
        Real(0.0, 1.0, low_open=True),
    )


def schedule_at(sigmas: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """A schedule's noise level at unshifted times ``times`` in [0, 1] (``sigmas[i]`` sits at ``1 - i / T``).

    A shifted flow-matching schedule ``sigma = s u / (1 + (s - 1) u)`` has ``logit(sigma) - logit(u) = log s`` at
    every step; that difference is interpolated linearly in ``u`` between the schedule's own steps. That is exact for
    a shifted schedule whose steps are evenly spaced in ``u`` (`sage_env.sde.flow_match_sigmas`: the toy's, and
    FLUX's in MixGRPO); any other schedule (a diffusers scheduler's, whose times run from 1 to 1/1000 before the
    final 0) is followed through its own steps and interpolated smoothly between them.
    """
    grid = torch.linspace(1.0, 0.0, len(sigmas), dtype=torch.float64)
    sigmas64, times64 = sigmas.to(torch.float64), times.to(torch.float64)
    interior = slice(1, len(sigmas) - 1)
    if len(sigmas) < 3:  # no interior step: the uniform schedule
        return times.to(torch.float32)
    offset = torch.logit(sigmas64[interior]) - torch.logit(grid[interior])
    # np.interp-like on a decreasing grid: flip both to increasing u.
    u_points, offset_points = grid[interior].flip(0), offset.flip(0)
    index = torch.searchsorted(u_points, times64.clamp(u_points[0], u_points[-1])).clamp(1, len(u_points) - 1)
    low, high = u_points[index - 1], u_points[index]
    fraction = ((times64.clamp(u_points[0], u_points[-1]) - low) / (high - low).clamp(min=1e-300)).clamp(0, 1)
    interpolated = offset_points[index - 1] + fraction * (offset_points[index] - offset_points[index - 1])
    result = torch.sigmoid(torch.logit(times64) + interpolated)
    return torch.where(times64 <= 0, 0.0, torch.where(times64 >= 1, 1.0, result)).to(torch.float32)


def compressed_schedule(sigmas: torch.Tensor, last_window_step: int, ratio: float) -> torch.Tensor:
    """MixGRPO-Flash's schedule: ``sigmas`` up to step ``last_window_step + 1``, then ``max(int((T - l) * ratio), 2)``
    points evenly spaced in unshifted time down to 0 (the first of them is step ``l + 1``'s own level)."""
    num_steps = len(sigmas) - 1
    if last_window_step + 1 >= num_steps:
        return sigmas.clone()
    count = max(int((num_steps - last_window_step) * ratio), 2)
    start = 1.0 - (last_window_step + 1) / num_steps
    post = schedule_at(sigmas, torch.linspace(start, 0.0, count, dtype=torch.float64))
    post[0], post[-1] = sigmas[last_window_step + 1], 0.0
    return torch.cat([sigmas[: last_window_step + 1].to(torch.float32), post])


class MixGRPOFlashAlgorithm(MixGRPOAlgorithm):
    """MixGRPO, each rollout on the compressed schedule (`rollout_options`)."""

    config_class = MixGRPOFlashAgentConfig

    def rollout_options(self, shape: RolloutShape) -> dict[str, Any]:
        """MixGRPO's window, plus ``{"sigmas": compressed, "ode_solver": "dpmsolver++"}``."""
        options = super().rollout_options(shape)
        _, end = options["sde_window"]
        sigmas = compressed_schedule(shape.sigmas.cpu(), end - 1, self.config.post_window_compress_ratio)
        return {**options, "sigmas": sigmas, "ode_solver": "dpmsolver++"}
