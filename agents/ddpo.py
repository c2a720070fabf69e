"""DDPO (Black et al., 2023, "Training Diffusion Models with Reinforcement Learning"): PPO-clip over
denoising steps with per-prompt reward statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from agents.algorithm import PolicyGradientAlgorithm
from agents.config import AlgorithmConfig
from agents.objective import PerPromptStatTracker

__all__ = ["DDPOAgentConfig", "DDPOAlgorithm"]


@dataclass
class DDPOAgentConfig(AlgorithmConfig):
    """DDPO's defaults on a flow model: FlowGRPO's SDE with eta 0.7 for exploration, advantages normalised by
    each prompt's reward history (`PerPromptStatTracker`), no KL, no equalizer; PPO clip 1e-4 and advantage
    clip 5 as SAGE-GRPO.

    Besides the defaults it adds the two fields of the per-prompt statistics.
    """

    display_name: ClassVar[str] = "DDPO"
    summary: ClassVar[str | None] = "PPO over denoising steps with per-prompt reward statistics"

    sde: str = "flow_grpo"
    eta: float = 0.7
    equalizer: bool = False
    kl_strategy: str = "none"
    stat_buffer_size: int = field(
        default=16, metadata={"help": "DDPO: rewards kept per prompt for its statistics. Published: 16."}
    )
    stat_min_count: int = field(
        default=16,
        metadata={
            "help": "DDPO: below this many rewards of a prompt, the batch statistics are used. Published: 16."
        },
    )


class DDPOAlgorithm(PolicyGradientAlgorithm):
    """PPO-clip with `PerPromptStatTracker` advantages instead of group normalisation."""

    config_class = DDPOAgentConfig

    def __init__(self, config: DDPOAgentConfig | None = None) -> None:
        super().__init__(config)
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
