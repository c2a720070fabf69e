"""MixGRPO (Li et al., 2025, "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed ODE-SDE", arXiv 2507.21802):
the SDE only inside a window of denoising steps that slides over training, the ODE elsewhere; only the window's
steps are trained, so a rollout's training costs ``window / steps`` of Flow-GRPO's.

Written from the paper and the authors' code (Tencent-Hunyuan/MixGRPO at e5cdd6a, ``fastvideo/utils/grpo_states.py``
and ``scripts/finetune/finetune_flux_grpo_MixGRPO.sh``): window of 4 steps, moved by 1 step every 25 training
iterations (its "progressive" strategy with overlap), back to the first step after the last (``--roll_back``);
Flow-GRPO's SDE with eta 0.7 inside the window, Euler outside; PPO clip 1e-4, advantage clip 5, no KL.

Differences from that code, on purpose: the window is indexed by optimizer steps (one per rollout in its scripts,
so the same count there); its last start is ``num_steps - 2`` as there, but where its window would be empty for
25 iterations before rolling back (start ``num_steps - 2`` with its ``max_timesteps`` exclusive), ours keeps one
step. MixGRPO-Flash (a compressed DPM-Solver++ schedule after the window) is `agents.mix_grpo_flash`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.algorithm import PolicyGradientAlgorithm
from agents.config import AlgorithmConfig
from agents.rollout import RolloutShape
from sage_env import sde
from sage_env.checks import Integer, hyperparameter
from sage_env.env import Trajectory

__all__ = ["MixGRPOAgentConfig", "MixGRPOAlgorithm", "sliding_window"]


@dataclass
class MixGRPOAgentConfig(AlgorithmConfig):
    """MixGRPO's published defaults: Flow-GRPO's SDE (eta 0.7) inside a sliding window of 4 steps, no KL, no
    equalizer, lr 1e-5 (its full fine-tuning of FLUX.1-dev); PPO clip 1e-4 and advantage clip 5 as SAGE-GRPO.

    Besides its ``defaults`` it declares the window's three fields.
    """

    display_name: ClassVar[str] = "MixGRPO"
    summary: ClassVar[str | None] = (
        "the SDE and training only inside a window of steps that slides over training"
    )

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "flow_grpo",
        "eta": 0.7,
        "equalizer": False,
        "kl_strategy": "none",
        "learning_rate": 1e-5,
    }

    sde_window_size: int = hyperparameter(
        4,
        "MixGRPO: consecutive denoising steps sampled with the SDE and trained per rollout (the others use the "
        "ODE and are not trained). Training cost grows linearly with it; smaller explores less per rollout. "
        "Published: 4 (arXiv 2507.21802, Sec. 4.1).",
        Integer(1, 10**4),
    )
    sde_window_shift_interval: int = hyperparameter(
        25,
        "MixGRPO: optimizer steps before the window moves by sde_window_stride. Shorter moves the training "
        "focus sooner from the early (high-noise) steps to later ones. Published: 25 (MixGRPO-Flash: 20).",
        Integer(1, 10**6),
    )
    sde_window_stride: int = hyperparameter(
        1,
        "MixGRPO: steps the window moves each time; 0 keeps it at the first steps (MixGRPO-Flash*). "
        "Published: 1.",
        Integer(0, 10**4),
    )


def sliding_window(
    optimizer_steps: int, num_steps: int, size: int, shift_interval: int, stride: int
) -> tuple[int, int]:
    """MixGRPO's SDE window ``(start, end)`` after ``optimizer_steps`` on a schedule of ``num_steps`` steps.

    The start moves by ``stride`` every ``shift_interval`` steps over ``0 .. num_steps - 2`` and rolls back to 0
    after the last; the window is cut at ``num_steps - 1`` (the final step to sigma 0 is never stochastic).
    """
    if num_steps < 2:
        raise ValueError(f"MixGRPO needs at least 2 denoising steps for its window, got {num_steps}.")
    last_start = num_steps - 2
    moves = optimizer_steps // shift_interval
    start = 0 if stride == 0 else (moves % (last_start // stride + 1)) * stride
    return start, min(start + size, num_steps - 1)


class MixGRPOAlgorithm(PolicyGradientAlgorithm):
    """The policy gradient of Flow-GRPO on the window's steps, the window chosen per rollout (`rollout_options`)."""

    config_class = MixGRPOAgentConfig

    def window(self, num_steps: int) -> tuple[int, int]:
        """The SDE window of the next rollout (`sliding_window` at this algorithm's optimizer-step count)."""
        cfg = self.config
        return sliding_window(
            self.optimizer_steps,
            num_steps,
            cfg.sde_window_size,
            cfg.sde_window_shift_interval,
            cfg.sde_window_stride,
        )

    def rollout_options(self, shape: RolloutShape) -> dict[str, Any]:
        """``{"sde_window": (start, end)}``: the next rollout samples with the SDE only there."""
        return {**super().rollout_options(shape), "sde_window": self.window(shape.num_steps)}

    def check_trajectory(self, trajectory: Trajectory) -> None:
        """Also refuse a rollout with more SDE steps than the window: it was not sampled with `rollout_options`."""
        super().check_trajectory(trajectory)
        stochastic = sum(sde.get_sde(t).stochastic for t in trajectory.sde_types)
        if stochastic > self.config.sde_window_size:
            raise ValueError(
                f"The trajectory has {stochastic} SDE steps but MixGRPO samples only its window of "
                f"{self.config.sde_window_size}: reset the environment with options=agent.rollout_options(env)."
            )
