"""Coefficients-Preserving Sampling (Wang and Yu, 2025, arXiv 2509.05952)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.config import AlgorithmConfig

__all__ = ["CPSAgentConfig"]


@dataclass
class CPSAgentConfig(AlgorithmConfig):
    """CPS: the DDIM-like ``cps`` step (std ``sigma' sin(eta pi/2)``) scored as published with
    ``-mean((x' - mean)^2)`` (no variance, no constants), PPO clip 1e-4, no KL, no equalizer.

    Only defaults change (``defaults``); every field's meaning is `agents.config.AlgorithmConfig`'s.
    """

    display_name: ClassVar[str] = "CPS"
    summary: ClassVar[str | None] = "coefficients-preserving sampling"

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "cps",
        "log_prob_kind": "cps",
        "equalizer": False,
        "kl_strategy": "none",
    }
