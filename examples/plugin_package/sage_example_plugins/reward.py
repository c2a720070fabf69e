"""A reward: how colourful a video is (the mean spread between each pixel's strongest and weakest channel)."""

from __future__ import annotations

from typing import Any

import torch


def colourfulness(videos: torch.Tensor, prompts: list[str], **kwargs: Any) -> torch.Tensor:
    """``(B,)`` in [0, 1] for videos ``(B, F, 3, H, W)`` in [0, 1] (the reward protocol: ``fps`` and other keywords
    are accepted and ignored)."""
    return (videos.amax(dim=2) - videos.amin(dim=2)).mean(dim=(1, 2, 3))
