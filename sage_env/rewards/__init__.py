"""Reward functions for generated videos: the protocol, the weighted composite, VideoAlign, the toy reward.

The model-based rewards (VideoAlign, CLIP) are imported on first access: they pull in transformers, which
plain uses of the protocol and the composite do not need.
"""

from __future__ import annotations

import importlib
from typing import Any

from sage_env.rewards.base import (
    REWARD_PRESETS,
    REWARDS,
    CompositeReward,
    RewardFunction,
    RewardOutput,
    as_composite_reward,
    check_videos,
    load_reward,
    resolve_reward_weights,
)
from sage_env.rewards.monitor import RewardFailureError, RewardFailureMonitor

_LAZY_EXPORTS = {
    "ClipAlignmentReward": "sage_env.rewards.clip",
    "VideoAlignReward": "sage_env.rewards.videoalign",
    "VideoAlignModel": "sage_env.rewards.videoalign",
}

__all__ = [
    "REWARDS",
    "REWARD_PRESETS",
    "ClipAlignmentReward",
    "CompositeReward",
    "RewardFailureError",
    "RewardFailureMonitor",
    "RewardFunction",
    "RewardOutput",
    "VideoAlignModel",
    "VideoAlignReward",
    "as_composite_reward",
    "check_videos",
    "load_reward",
    "resolve_reward_weights",
]


def __getattr__(name: str) -> Any:
    """Import the model-based rewards on first access (PEP 562)."""
    if name in _LAZY_EXPORTS:
        return getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
