"""DanceGRPO (Xue et al., 2025, arXiv 2505.07818): sqrt(d) SDE noise, no KL, random timestep subsets."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.algorithm import AlgorithmConfig

__all__ = ["DanceGRPOAgentConfig"]


@dataclass
class DanceGRPOAgentConfig(AlgorithmConfig):
    """DanceGRPO's defaults: ``dance_grpo`` SDE (std ``eta*sqrt(d)``, Table 1) with eta 0.3, no KL, PPO clip
    1e-4, advantage clip 5, and a random per-sample subset of 60% of the timesteps each update."""

    sde: str = field(default="dance_grpo", metadata={"help": "DanceGRPO's SDE (Table 1)."})
    eta: float = field(default=0.3, metadata={"help": "DanceGRPO's eta. Published: 0.3."})
    equalizer: bool = field(default=False, metadata={"help": "DanceGRPO has no equalizer."})
    kl_strategy: str = field(default="none", metadata={"help": "DanceGRPO trains without KL."})
    timestep_fraction: float = field(default=0.6, metadata={"help": "DanceGRPO's timestep_fraction: 0.6."})
