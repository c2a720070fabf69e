"""SAGE-GRPO (arXiv 2603.21872): precise log-corrected SDE, temporal gradient equalizer, dual moving KL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agents.config import AlgorithmConfig

__all__ = ["SageGRPOAgentConfig"]


@dataclass
class SageGRPOAgentConfig(AlgorithmConfig):
    """SAGE-GRPO with the paper's / official defaults: ``sage`` SDE with eta 0.5 (Eq. 5-7), equalizer on
    (Eq. 9), dual KL (moving anchor every 10 optimizer steps, beta_pos 1.0, beta_vel 0.1; Eq. 14) with the
    adaptive coefficient 1e-7 -> 1e-5 over 100 steps (App. A.6), clip 1e-4, advantage clip 5, lr 1e-5.

    Every field and its help string is `agents.config.AlgorithmConfig`'s, whose defaults are SAGE-GRPO's.
    """

    display_name: ClassVar[str] = "SAGE-GRPO"
    summary: ClassVar[str | None] = "manifold-aware SDE, temporal gradient equalizer, dual moving KL"
