"""REINFORCE: plain policy gradient with a group-mean baseline."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.algorithm import AlgorithmConfig

__all__ = ["ReinforceAgentConfig"]


@dataclass
class ReinforceAgentConfig(AlgorithmConfig):
    """REINFORCE over denoising steps: advantage ``r - mean_G`` (no std scaling), no ratio clipping, no KL,
    no equalizer. The ``sage`` SDE by default."""

    scale_rewards: str = field(default="none", metadata={"help": "Group-mean baseline only."})
    epsilon: float | None = field(default=None, metadata={"help": "No clipping: plain policy gradient."})
    equalizer: bool = field(default=False, metadata={"help": "Plain REINFORCE weighs every step alike."})
    kl_strategy: str = field(default="none", metadata={"help": "No KL."})
