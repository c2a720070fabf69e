"""GRPO-Guard (Wang et al., 2025, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via Regulated
Clipping", arXiv 2510.22319): Flow-GRPO with the ratio of each denoising step normalised and each step's gradient
reweighted (``ratio_norm``, a regulariser any policy-gradient algorithm can switch on).

Written from the paper and the authors' code in flow_grpo (commits 2e2f712 and 9745241, ``scripts/train_sd3_GRPO_Guard.py``
and ``config/grpo_guard.py``, read through a fork that carries them): per transition the log-ratio is ``S (log p -
log p_old + mean_d (mu - mu_old)^2 / (2 S^2))`` with ``S`` the transition's noise std, and the step's loss is divided
by ``|dt|``. Defaults as published for GenEval and OCR: Flow-GRPO's SDE with noise level 0.7, every step stochastic,
PPO clip 2e-6 (4e-6 for PickScore), no KL, lr 1e-4, advantages from each group's mean and std, clipped to 5.

Difference on purpose: ``S`` is each transition's own std (theirs is the mean over a micro-batch, whose samples all
share one step there, so the same value); ours mixes steps in a micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.config import AlgorithmConfig

__all__ = ["GRPOGuardAgentConfig"]


@dataclass
class GRPOGuardAgentConfig(AlgorithmConfig):
    """GRPO-Guard's published defaults: Flow-GRPO's SDE (eta 0.7) with ``ratio_norm``, PPO clip 2e-6, no KL, no
    equalizer, lr 1e-4. Only defaults change (``defaults``)."""

    display_name: ClassVar[str] = "GRPO-Guard"
    summary: ClassVar[str | None] = "Flow-GRPO with each step's ratio normalised and its gradient reweighted"

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "flow_grpo",
        "eta": 0.7,
        "ratio_norm": True,
        "epsilon": 2e-6,
        "equalizer": False,
        "kl_strategy": "none",
        "learning_rate": 1e-4,
    }
