"""Coefficients-Preserving Sampling (Wang and Yu, 2025, arXiv 2509.05952)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.algorithm import AlgorithmConfig

__all__ = ["CPSAgentConfig"]


@dataclass
class CPSAgentConfig(AlgorithmConfig):
    """CPS: the DDIM-like ``cps`` step (std ``sigma' sin(eta pi/2)``) scored as published with
    ``-mean((x' - mean)^2)`` (no variance, no constants), PPO clip 1e-4, no KL, no equalizer."""

    sde: str = field(default="cps", metadata={"help": "Coefficient-preserving sampling."})
    eta: float = field(default=0.5, metadata={"help": "CPS noise level in [0, 1]."})
    log_prob_kind: str = field(default="cps", metadata={"help": "Published CPS' -mse transition score."})
    equalizer: bool = field(default=False, metadata={"help": "CPS has no equalizer."})
    kl_strategy: str = field(default="none", metadata={"help": "CPS trains without KL."})
