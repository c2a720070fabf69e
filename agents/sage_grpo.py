"""SAGE-GRPO (arXiv 2603.21872): precise log-corrected SDE, temporal gradient equalizer, dual moving KL."""

from __future__ import annotations

from dataclasses import dataclass

from agents.algorithm import AlgorithmConfig

__all__ = ["SageGRPOAgentConfig"]


@dataclass
class SageGRPOAgentConfig(AlgorithmConfig):
    """SAGE-GRPO with the paper's / official defaults: ``sage`` SDE with eta 0.5 (Eq. 5-7), equalizer on
    (Eq. 9), dual KL (moving anchor every 10 optimizer steps, beta_pos 1.0, beta_vel 0.1; Eq. 14) with the
    adaptive coefficient 1e-7 -> 1e-5 over 100 steps (App. A.6), clip 1e-4, advantage clip 5, lr 1e-5.

    Every field and its help string is inherited from `agents.algorithm.AlgorithmConfig`, whose defaults
    are SAGE-GRPO's.
    """
