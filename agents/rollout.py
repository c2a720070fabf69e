"""What an algorithm sees of a rollout around its update: the shape it may ask the next one to take (`RolloutShape`,
given to `agents.Algorithm.rollout_options`) and the finished rollout with its advantages (`ScoredTrajectory`, what
drivers buffer and checkpoint between the rollout and the loss)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from sage_env.env import Trajectory

__all__ = ["RolloutShape", "ScoredTrajectory", "fraction_of_groups_without_spread", "samples_with_signal"]


@dataclass(frozen=True)
class RolloutShape:
    """What an algorithm shapes its next rollout from (`Algorithm.rollout_options`): the environment's schedule
    ``sigmas`` (``(T + 1,)``, 1 down to 0), ``group_size``, the samples per prompt, and ``sde_window``, the
    ``(start, end)`` steps the SDE samples (None: every step)."""

    sigmas: torch.Tensor
    group_size: int
    sde_window: tuple[int, int] | None = None

    @property
    def num_steps(self) -> int:
        """Steps ``T`` of the schedule."""
        return len(self.sigmas) - 1

    @property
    def stochastic_steps(self) -> tuple[int, int]:
        """``(start, end)``: the steps the SDE samples, ``sde_window`` or every step of the schedule."""
        return tuple(self.sde_window) if self.sde_window is not None else (0, self.num_steps)



@dataclass
class ScoredTrajectory:
    """A finished `sage_env.Trajectory` with the advantages its algorithm gave it: what a driver keeps between the
    rollout and the loss (`sage_trl.SageGRPOTrainer` buffers these, a slice per step, and checkpoints them).

    Args:
        trajectory: the rollouts (rewarded); its ``sde_types`` are the schedule they were sampled with.
        advantages: ``(N,)`` per sample, or ``(N, K)`` per sample and what the algorithm indexes by
            (BranchGRPO: the branch level); ``usable``: bool, same shape, the entries carrying a learning signal.
    """

    trajectory: Trajectory
    advantages: torch.Tensor
    usable: torch.Tensor

    def __len__(self) -> int:
        return len(self.trajectory)

    def select(self, index: torch.Tensor) -> ScoredTrajectory:
        """The samples ``index`` (in that order)."""
        return ScoredTrajectory(
            self.trajectory.select(index),
            self.advantages[index.to(self.advantages.device)],
            self.usable[index.to(self.usable.device)],
        )

    def state_dict(self) -> dict[str, Any]:
        """Tensors, strings and numbers (see `sage_env.Trajectory.state_dict`)."""
        return {
            "trajectory": self.trajectory.state_dict(),
            "advantages": self.advantages,
            "usable": self.usable,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ScoredTrajectory:
        """The inverse of `state_dict`."""
        return cls(Trajectory.from_state_dict(state["trajectory"]), state["advantages"], state["usable"])


def samples_with_signal(usable: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: the samples with a usable entry (``usable`` is ``(N,)``, or ``(N, K)`` per sample and level as
    BranchGRPO's, see `ScoredTrajectory`)."""
    return usable.reshape(len(usable), -1).any(1)


def fraction_of_groups_without_spread(total: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor) -> float:
    """The fraction of groups whose valid rewards are all equal (or that have fewer than two): whatever the
    algorithm makes of them, a group without reward spread carries no learning signal (``total``, ``valid`` and
    ``group_index`` are ``(N,)``)."""
    groups = int(group_index.max()) + 1 if len(group_index) else 0
    if groups == 0:
        return 1.0
    rewards = total.double()
    high = torch.full((groups,), -math.inf, dtype=torch.float64, device=total.device)
    low = torch.full((groups,), math.inf, dtype=torch.float64, device=total.device)
    high = high.scatter_reduce(0, group_index[valid], rewards[valid], "amax")
    low = low.scatter_reduce(0, group_index[valid], rewards[valid], "amin")
    count = torch.zeros(groups, device=total.device).index_add_(0, group_index[valid], torch.ones_like(rewards[valid]).float())
    return float(((count < 2) | (high == low)).float().mean())
