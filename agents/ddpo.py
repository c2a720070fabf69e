"""DDPO (Black et al., 2023, "Training Diffusion Models with Reinforcement Learning"): PPO-clip over
denoising steps with per-prompt reward statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents.algorithm import PolicyGradientAlgorithm
from agents.config import AlgorithmConfig
from agents.objective import PerPromptStatTracker
from sage_env.checks import Integer, hyperparameter

__all__ = ["DDPOAgentConfig", "DDPOAlgorithm"]


@dataclass
class DDPOAgentConfig(AlgorithmConfig):
    """DDPO's defaults on a flow model: FlowGRPO's SDE with eta 0.7 for exploration, advantages normalised by
    each prompt's reward history (`PerPromptStatTracker`), no KL, no equalizer; PPO clip 1e-4 and advantage
    clip 5 as SAGE-GRPO.

    Besides its ``defaults`` it declares the two fields of the per-prompt statistics.
    """

    display_name: ClassVar[str] = "DDPO"
    summary: ClassVar[str | None] = "PPO over denoising steps with per-prompt reward statistics"

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "flow_grpo",
        "eta": 0.7,
        "equalizer": False,
        "kl_strategy": "none",
    }

    stat_buffer_size: int = hyperparameter(
        16,
        "DDPO: rewards kept per prompt for its per-prompt statistics; larger smooths the baseline but reacts "
        "more slowly as the policy improves. Published: 16.",
        Integer(1, 10**6),
    )
    stat_min_count: int = hyperparameter(
        16,
        "DDPO: below this many rewards of a prompt, the batch's statistics are used instead of the prompt's. "
        "Published: 16.",
        Integer(1, 10**6),
    )


class DDPOAlgorithm(PolicyGradientAlgorithm):
    """PPO-clip with `PerPromptStatTracker` advantages instead of group normalisation."""

    config_class = DDPOAgentConfig

    def __init__(self, config: DDPOAgentConfig | None = None, seed: int = 0) -> None:
        super().__init__(config, seed)
        self.stat_tracker = PerPromptStatTracker(self.config.stat_buffer_size, self.config.stat_min_count)

    def compute_advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each reward normalised by its prompt's recent history (or the batch while the history is short)."""
        return self.stat_tracker.advantages(prompts, rewards, valid)

    def state_dict(self) -> dict[str, Any]:
        """Base state plus the per-prompt history."""
        return {**super().state_dict(), "stat_tracker": self.stat_tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        super().load_state_dict(state)
        self.stat_tracker.load_state_dict(state["stat_tracker"])
