"""Reward functions for generated videos: the protocol, the weighted composite, VideoAlign, the toy reward."""

from sage_env.rewards.base import (
    REWARD_PRESETS,
    CompositeReward,
    RewardFunction,
    RewardOutput,
    as_composite_reward,
    check_videos,
    resolve_reward_weights,
)

__all__ = [
    "REWARD_PRESETS",
    "CompositeReward",
    "RewardFunction",
    "RewardOutput",
    "as_composite_reward",
    "check_videos",
    "resolve_reward_weights",
]
