"""`TrainerStateMixin`: what `sage_trl.SageGRPOTrainer` keeps of its own in a checkpoint, and how it restores it.

Saved and loaded by `sage_trl.checkpoints` (tensors, numbers and strings: no pickle). The shared state (algorithm
counters, the moving anchor, the step, the rollout buffer, reward-failure counts) is written once; each process's
own state (its buffered rollouts, its timestep generator, the KL values of an unfinished accumulation) is written
by every process, so that resuming mid-rollout is exact.
"""

from __future__ import annotations

from typing import Any

from agents import ScoredTrajectory

__all__ = ["TrainerStateMixin"]


class TrainerStateMixin:
    """The trainer's own checkpoint state (see the module docstring); mixed into `sage_trl.SageGRPOTrainer`."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The trainer's own state in a checkpoint (tensors, numbers, strings: saved without pickle)."""
        return {
            "algorithm": self.algorithm.state_dict(),
            "anchor": self.references.anchor.state_dict() if self.references.anchor is not None else None,
            "step": self._step,
            "generation_round": self._generation_round,
            "buffered_inputs": self._buffered_state(),
            "kl_values": list(self._kl_values),
            "reward_failures": self.reward_failures.state_dict(),
            "resolved_reward_weights": dict(self.resolved_reward_weights),
        }

    def process_state(self) -> dict[str, Any]:
        """What differs between the processes of a multi-process run: each saves its own (rollouts it buffered,
        the timestep generator its batches drew from, the KL values of an unfinished accumulation)."""
        return {
            "buffered_inputs": self._buffered_state(),
            "kl_values": list(self._kl_values),
            "generator": self.algorithm.generator.get_state(),
        }

    def _buffered_state(self) -> list[dict[str, Any]] | None:
        if self._buffered_inputs is None:
            return None
        return [rollout.state_dict() for rollout in self._buffered_inputs]

    def _load_buffered_state(self, state: list[dict[str, Any]] | None) -> None:
        if state is not None and any("trajectory" not in rollout for rollout in state):
            raise ValueError(
                "This checkpoint's buffered rollout has the layout of an earlier sage-grpo version (a dict of "
                "tensors); resume it with the version that wrote it, or start a new run from its saved model."
            )
        self._buffered_inputs = (
            None if state is None else [ScoredTrajectory.from_state_dict(s) for s in state]
        )

    def load_process_state(self, state: dict[str, Any]) -> None:
        """Restore `process_state`."""
        self._load_buffered_state(state["buffered_inputs"])
        self._kl_values = state["kl_values"]
        self.algorithm.generator.set_state(state["generator"])

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore `checkpoint_state`."""
        self.algorithm.load_state_dict(state["algorithm"])
        if self.references.anchor is not None:
            self.references.anchor.load_state_dict(state["anchor"])
        self._step, self._generation_round = state["step"], state["generation_round"]
        self._load_buffered_state(state["buffered_inputs"])
        self._kl_values = state["kl_values"]
        self.reward_failures.load_state_dict(state["reward_failures"])
        self.resolved_reward_weights = dict(state["resolved_reward_weights"])
