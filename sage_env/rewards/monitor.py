"""`RewardFailureMonitor`: a run whose rewards keep failing stops, instead of ending looking successful.

A single batch in which every reward failed (a reward server restarting, a transient out-of-memory) is
tolerated: its samples are invalid, the update learns nothing from them and the failure is counted. When every
sample's reward is invalid for ``max_consecutive`` rollouts in a row, the reward itself is broken: the monitor
raises `RewardFailureError` with the last reason (which names the reward and its exception).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RewardFailureError", "RewardFailureMonitor"]


class RewardFailureError(RuntimeError):
    """Every sample's reward failed for several rollouts in a row."""


class RewardFailureMonitor:
    """Counts consecutive rollouts in which no sample had a valid reward.

    Args:
        max_consecutive: how many such rollouts in a row stop the run (>= 1).
    """

    def __init__(self, max_consecutive: int) -> None:
        if isinstance(max_consecutive, bool) or not isinstance(max_consecutive, int) or max_consecutive < 1:
            raise ValueError(f"max_consecutive_reward_failures must be an integer >= 1, got {max_consecutive!r}.")
        self.max_consecutive = max_consecutive
        self.consecutive = 0

    def observe(self, num_valid: int, num_samples: int, errors: Sequence[str | None]) -> None:
        """Record one rollout (``num_valid`` of ``num_samples`` rewards valid, ``errors`` the local reasons).

        Raises `RewardFailureError` on the ``max_consecutive``-th rollout in a row without a valid reward.
        """
        if num_samples == 0 or num_valid > 0:
            self.consecutive = 0
            return
        self.consecutive += 1
        if self.consecutive < self.max_consecutive:
            return
        last = next((reason for reason in reversed(errors) if reason), "no reason recorded")
        raise RewardFailureError(
            f"The reward failed for every sample in {self.consecutive} consecutive rollouts; the run stops "
            f"instead of training on nothing. Last error: {last}. Fix the reward (try it on a few videos by "
            "hand), then resume from the last checkpoint; max_consecutive_reward_failures sets how many "
            "failed rollouts in a row are tolerated."
        )

    def state_dict(self) -> dict[str, Any]:
        """The running count, for checkpoints."""
        return {"consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self.consecutive = int(state["consecutive"])
