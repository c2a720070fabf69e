"""REINFORCE: plain policy gradient with a group-mean baseline."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.config import AlgorithmConfig

__all__ = ["ReinforceAgentConfig"]


@dataclass
class ReinforceAgentConfig(AlgorithmConfig):
    """REINFORCE over denoising steps: advantage ``r - mean_G`` (no std scaling), no ratio clipping, no KL,
    no equalizer, on the ``sage`` SDE.

    Only defaults change (``defaults``); every field's meaning is `agents.config.AlgorithmConfig`'s.
    """

    display_name: ClassVar[str] = "REINFORCE"
    summary: ClassVar[str | None] = "plain policy gradient with a group-mean baseline"

    defaults: ClassVar[Mapping[str, Any]] = {
        "scale_rewards": "none",
        "epsilon": math.inf,
        "equalizer": False,
        "kl_strategy": "none",
    }
