"""FlowGRPO (Liu et al., 2025, arXiv 2505.05470): first-order SDE noise, fixed KL to the initial model."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.algorithm import AlgorithmConfig

__all__ = ["FlowGRPOAgentConfig"]


@dataclass
class FlowGRPOAgentConfig(AlgorithmConfig):
    """FlowGRPO's published defaults: ``flow_grpo`` SDE (std ``eta*sqrt(sigma/(1-sigma) d)``, Table 1) with
    noise level 0.7, PPO clip 1e-4, advantage clip 5, a fixed KL to the initial model with a constant
    coefficient (beta 0.04 in its KL configs), no equalizer, lr 3e-4 (LoRA)."""

    sde: str = field(default="flow_grpo", metadata={"help": "FlowGRPO's SDE (Table 1)."})
    eta: float = field(default=0.7, metadata={"help": "FlowGRPO's noise_level. Published: 0.7."})
    equalizer: bool = field(default=False, metadata={"help": "FlowGRPO has no equalizer."})
    kl_strategy: str = field(default="fixed", metadata={"help": "FlowGRPO: KL to the initial model."})
    kl_coef_schedule: str = field(default="constant", metadata={"help": "FlowGRPO uses a constant beta."})
    kl_coef_max: float = field(default=0.04, metadata={"help": "FlowGRPO's beta in its KL configs: 0.04."})
    learning_rate: float = field(default=3e-4, metadata={"help": "FlowGRPO's LoRA learning rate: 3e-4."})
