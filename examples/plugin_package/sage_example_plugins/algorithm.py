"""An algorithm: SAGE-GRPO with its advantages scaled by a hyperparameter of its own, ``advantage_scale``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from agents import AlgorithmConfig, PolicyGradientAlgorithm
from sage_env.checks import Real, hyperparameter


class ScaledGRPOAlgorithm(PolicyGradientAlgorithm):
    """Group-normalised advantages (Eq. 10) times ``advantage_scale``."""

    def compute_advantages(self, prompts, rewards, valid, group_index) -> tuple[torch.Tensor, torch.Tensor]:
        advantages, usable = super().compute_advantages(prompts, rewards, valid, group_index)
        return advantages * self.config.advantage_scale, usable


@dataclass
class ScaledGRPOConfig(AlgorithmConfig):
    """SAGE-GRPO's defaults but a moving KL only, and one field of its own (``sage-train --advantage_scale``)."""

    display_name: ClassVar[str] = "Scaled-GRPO"
    summary: ClassVar[str | None] = "SAGE-GRPO with scaled advantages"
    algorithm_class: ClassVar[type] = ScaledGRPOAlgorithm
    defaults: ClassVar[dict[str, object]] = {"kl_strategy": "moving"}  # merged over SAGE-GRPO's

    advantage_scale: float = hyperparameter(
        1.0,
        "Multiplies every advantage: larger takes larger policy steps per update (as a larger learning rate "
        "would, but only on the policy term, not on the KL). Recommended: 1.",
        Real(0.0, 10.0, low_open=True),
    )
