"""The toy world's gold score: how far a video is from the world's own videos of its prompt. No model, no reward.

The world draws every video itself (`sage_env.toy.world.render_video`), so for a prompt its clean videos are known
exactly: the renders at every start position the world draws (`sage_env.toy.world.start_positions`, 25 at
8 x 16 x 16). A generated video's **distance to the world** is the RMS pixel distance to the nearest of them: 0 for
a clean render, about 0.1 for the shipped prior's samples, and it grows with any departure from the world a reward
might tolerate or even favour: a larger or smaller object, a blurred or misshapen one, flicker, a wrong colour,
speed or direction, a noisy, shifted or darkened background.

`gold_report` adds what says *how* a video departs, each against the world's own value: the object's area per
frame (a pixel counts as object when its colour is nearer the object's than the background grey), and its ratio to
the area of the prompt's shape (1 for the world).

The distance is reported beside the reward wherever a toy result is shown (the end-of-run evaluation, summary.md,
the README, the benchmarks): the reward is what the policy optimises; the distance is what a better toy model is.
A reward can be gamed; this cannot, because it is the world.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from sage_env.toy.world import (
    BACKGROUND_LEVEL,
    TOY_COLOURS,
    object_mask,
    parse_prompt,
    render_at,
    start_positions,
)

__all__ = [
    "ToyGoldReport",
    "clean_renders",
    "distance_to_world",
    "gold_report",
    "rms_distances",
    "world_object_area",
]

_OBJECT_FRACTION = 0.5
"""A pixel is object when its colour is farther from the background grey than this fraction of the distance from
the grey to the nearest palette colour (the midpoint between background and object)."""


@functools.cache
def _clean_renders(prompt: str, num_frames: int, height: int, width: int) -> torch.Tensor:
    attributes = parse_prompt(prompt)
    positions = start_positions(attributes.direction, num_frames, height, width)
    size = {"num_frames": num_frames, "height": height, "width": width}
    return torch.stack([render_at(attributes, top, left, **size) for top, left in positions])


def clean_renders(prompt: str, num_frames: int, height: int, width: int) -> torch.Tensor:
    """Every clean video of ``prompt`` at this size, one per start position: ``(K, F, 3, H, W)`` (cached)."""
    return _clean_renders(parse_prompt(prompt).text, num_frames, height, width)


def rms_distances(flat_videos: torch.Tensor, flat_renders: torch.Tensor) -> torch.Tensor:
    """``(B, M)`` RMS pixel distance between each of ``B`` flattened videos and each of ``M`` flattened renders."""
    # Exact differences, not |x|^2 + |y|^2 - 2xy: a video's distance must not depend on its batch.
    exact = torch.cdist(flat_videos, flat_renders, compute_mode="donot_use_mm_for_euclid_dist")
    return exact / flat_videos.shape[1] ** 0.5


def distance_to_world(videos: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
    """``(B,)`` RMS pixel distance of each video ``(B, F, 3, H, W)`` to the nearest clean render of its prompt."""
    if isinstance(prompts, str) or len(prompts) != videos.shape[0]:
        raise ValueError(f"Pass one prompt per video: {videos.shape[0]} videos, got {prompts!r}.")
    size = tuple(videos.shape[1:2]) + tuple(videos.shape[3:5])
    flat = videos.detach().float().cpu().flatten(1)
    distances = torch.empty(len(prompts))
    for prompt in set(prompts):
        rows = torch.tensor([p == prompt for p in prompts])
        renders = clean_renders(prompt, *size).flatten(1)
        distances[rows] = rms_distances(flat[rows], renders).min(dim=1).values
    return distances


def world_object_area(prompt: str) -> float:
    """Pixels per frame the world's object of ``prompt`` covers (16 for a square, 12 for a circle)."""
    return float(object_mask(parse_prompt(prompt).shape).sum())


def _object_pixels(videos: torch.Tensor) -> torch.Tensor:
    """``(B, F, H, W)`` bool: pixels nearer an object's colour than the background grey (`_OBJECT_FRACTION`)."""
    grey = torch.full((3,), BACKGROUND_LEVEL)
    palette = torch.tensor(list(TOY_COLOURS.values()))
    threshold = _OBJECT_FRACTION * float((palette - grey).norm(dim=1).min())
    distance = (videos.detach().float().cpu() - grey.view(1, 1, 3, 1, 1)).norm(dim=2)
    return distance > threshold


@dataclass
class ToyGoldReport:
    """What the world says of a batch of videos; every field ``(B,)`` float32.

    Args:
        distance: RMS pixel distance to the nearest clean render of the prompt (`distance_to_world`); 0 is the
            world, lower is better.
        object_area: mean pixels per frame that are object (`_object_pixels`).
        area_ratio: ``object_area`` over the world's area for the prompt's shape (1 for the world).
    """

    distance: torch.Tensor
    object_area: torch.Tensor
    area_ratio: torch.Tensor

    def means(self) -> dict[str, float]:
        """The mean of every field over the batch."""
        return {item.name: float(getattr(self, item.name).mean()) for item in fields(self)}


def gold_report(videos: torch.Tensor, prompts: Sequence[str]) -> ToyGoldReport:
    """The gold measurements of ``videos`` ``(B, F, 3, H, W)`` in [0, 1], one prompt of the toy grammar each."""
    area = _object_pixels(videos).float().sum(dim=(-2, -1)).mean(dim=1)
    world = torch.tensor([world_object_area(prompt) for prompt in prompts])
    return ToyGoldReport(
        distance=distance_to_world(videos, prompts), object_area=area, area_ratio=area / world
    )
