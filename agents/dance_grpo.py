"""DanceGRPO (Xue et al., 2025, arXiv 2505.07818): sqrt(d) SDE noise, no KL, random timestep subsets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.config import AlgorithmConfig

__all__ = ["DanceGRPOAgentConfig"]


@dataclass
class DanceGRPOAgentConfig(AlgorithmConfig):
    """DanceGRPO's defaults: the ``dance_grpo`` SDE (std ``eta*sqrt(d)``, Table 1) with eta 0.3, no KL, a random
    per-sample subset of 60% of the timesteps each update; PPO clip 1e-4 and advantage clip 5 as SAGE-GRPO.

    Only defaults change (``defaults``); every field's meaning is `agents.config.AlgorithmConfig`'s.
    """

    display_name: ClassVar[str] = "DanceGRPO"
    summary: ClassVar[str | None] = "the DanceGRPO baseline"

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "dance_grpo",
        "eta": 0.3,
        "equalizer": False,
        "kl_strategy": "none",
        "timestep_fraction": 0.6,
    }
