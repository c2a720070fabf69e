"""FlowGRPO (Liu et al., 2025, arXiv 2505.05470): first-order SDE noise, fixed KL to the initial model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.config import AlgorithmConfig

__all__ = ["FlowGRPOAgentConfig"]


@dataclass
class FlowGRPOAgentConfig(AlgorithmConfig):
    """FlowGRPO's published defaults: the ``flow_grpo`` SDE (std ``eta*sqrt(sigma/(1-sigma) d)``, Table 1) with
    noise level 0.7, a fixed KL to the initial model with a constant coefficient (beta 0.04 in its KL configs),
    no equalizer, lr 3e-4 (its LoRA runs); PPO clip 1e-4 and advantage clip 5 as SAGE-GRPO.

    Only defaults change (``defaults``); every field's meaning is `agents.config.AlgorithmConfig`'s.
    """

    display_name: ClassVar[str] = "Flow-GRPO"
    summary: ClassVar[str | None] = "the Flow-GRPO baseline"

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "flow_grpo",
        "eta": 0.7,
        "equalizer": False,
        "kl_strategy": "fixed",
        "kl_coef_schedule": "constant",
        "beta": 0.04,
        "learning_rate": 3e-4,
    }
