"""How the toy rewards read a video: the object's weight, mass, centroid, spread and colour, frame by frame.

The background is the per-channel median over all pixels and frames of the video (the object covers ~6% of the
pixels). Each pixel gets an object weight ``w`` in [0, 1] from its colour distance to that background (0 below
``object_low``, 1 above ``object_high``, linear in between); per frame the object's mass is ``sum w``, its centroid
the ``w``-weighted mean position, its spread the ``w``-weighted RMS distance of its pixels to the centroid, and its
colour the ``w``-weighted mean colour over the video. Everything is differentiable in the pixels (almost
everywhere), so the rewards built on it can be attacked by gradient ascent in the tests.

The world's own values the toy reward compares with (`world_area`, `world_spread`, `world_start_box`) are derived
from the renderer (`sage_env.toy.world`), not restated.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sage_env.toy.world import (
    BACKGROUND_LEVEL,
    OBJECT_SIZE,
    TOY_COLOURS,
    TOY_DIRECTIONS,
    ToyPrompt,
    object_mask,
    start_positions,
)

__all__ = [
    "ObjectTrack",
    "read_object",
    "target_probability",
    "world_area",
    "world_spread",
    "world_start_box",
]

_EPS = 1e-6


@dataclass
class ObjectTrack:
    """What the rewards read from the pixels of each video (B videos, F frames)."""

    weight: torch.Tensor  # (B, F, H, W) object weight in [0, 1]
    mass: torch.Tensor  # (B, F)
    centroid: torch.Tensor  # (B, F, 2) in pixels (row, column)
    spread: torch.Tensor  # (B, F) RMS distance of the object's pixels to its centroid, in pixels
    colour: torch.Tensor  # (B, 3) mass-weighted mean colour over the whole video
    background_spread: torch.Tensor  # (B,) RMS colour distance of background pixels to the background median
    background_error: torch.Tensor  # (B,) RMS colour distance of background pixels to the world's grey
    palette_error: torch.Tensor  # (B,) weighted mean distance of object pixels to the nearest palette colour


def _sqrt(value: torch.Tensor) -> torch.Tensor:
    """``sqrt`` that is exactly 0 at 0 and has a finite gradient everywhere (attacks differentiate through it)."""
    return torch.where(value > 0, value.clamp(min=1e-12).sqrt(), torch.zeros_like(value))


def _positions(height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    rows = torch.arange(height, dtype=dtype).view(height, 1).expand(height, width)
    cols = torch.arange(width, dtype=dtype).view(1, width).expand(height, width)
    return torch.stack([rows, cols], dim=-1)  # (H, W, 2)


def read_object(videos: torch.Tensor, object_low: float, object_high: float) -> ObjectTrack:
    """Read `ObjectTrack` from ``videos`` ``(B, F, 3, H, W)`` float32 (keeps the graph when they require it)."""
    batch, _, _, height, width = videos.shape
    background = videos.permute(0, 2, 1, 3, 4).reshape(batch, 3, -1).median(dim=-1).values
    distance = (videos - background[:, None, :, None, None]).norm(dim=2)  # (B, F, H, W)
    weight = ((distance - object_low) / (object_high - object_low)).clamp(0.0, 1.0)
    mass = weight.sum(dim=(-2, -1))
    positions = _positions(height, width, videos.dtype)
    centroid = torch.einsum("bfhw,hwc->bfc", weight, positions) / mass.clamp(min=_EPS)[..., None]
    offsets = positions[None, None] - centroid[:, :, None, None, :]  # (B, F, H, W, 2)
    second_moment = (weight * (offsets**2).sum(dim=-1)).sum(dim=(-2, -1)) / mass.clamp(min=_EPS)
    colour = torch.einsum("bfhw,bfchw->bc", weight, videos) / mass.sum(dim=1).clamp(min=_EPS)[:, None]
    background_weight = 1.0 - weight
    total = background_weight.sum(dim=(1, 2, 3)).clamp(min=_EPS)
    spread = (background_weight * distance**2).sum(dim=(1, 2, 3)) / total
    grey = (videos - BACKGROUND_LEVEL).norm(dim=2)
    error = (background_weight * grey**2).sum(dim=(1, 2, 3)) / total
    return ObjectTrack(
        weight=weight,
        mass=mass,
        centroid=centroid,
        spread=_sqrt(second_moment),
        colour=colour,
        background_spread=_sqrt(spread),
        background_error=_sqrt(error),
        palette_error=_palette_error(videos, weight),
    )


def _palette_error(videos: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted mean over object pixels of the colour distance to the nearest palette colour, ``(B,)``."""
    palette = torch.tensor(list(TOY_COLOURS.values()), dtype=videos.dtype)  # (K, 3)
    pixels = videos.permute(0, 1, 3, 4, 2).unsqueeze(-2)  # (B, F, H, W, 1, 3)
    nearest = (pixels - palette).norm(dim=-1).min(dim=-1).values  # (B, F, H, W)
    return (weight * nearest).sum(dim=(1, 2, 3)) / weight.sum(dim=(1, 2, 3)).clamp(min=_EPS)


def target_probability(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probability of the target class, and whether it is the most likely class."""
    probability = logits.softmax(dim=-1).gather(1, target[:, None]).squeeze(1)
    return probability.float(), logits.argmax(dim=-1) == target


@functools.cache
def _shape_geometry(shape: str) -> tuple[float, float]:
    """``(area, spread)`` of the world's object of ``shape``: its pixels, and their RMS distance to its centre."""
    pixels = object_mask(shape).nonzero().float()
    return float(len(pixels)), float(((pixels - pixels.mean(dim=0)) ** 2).sum(dim=1).mean().sqrt())


@functools.cache
def _start_box(direction: str, num_frames: int, height: int, width: int) -> tuple[tuple[float, ...], ...]:
    corners = torch.tensor(start_positions(direction, num_frames, height, width), dtype=torch.float32)
    centres = corners + (OBJECT_SIZE - 1) / 2
    return tuple(centres.min(dim=0).values.tolist()), tuple(centres.max(dim=0).values.tolist())


def world_area(attributes: Sequence[ToyPrompt]) -> torch.Tensor:
    """``(B,)`` pixels the world's object of each prompt covers per frame (16 for a square, 12 for a circle)."""
    return torch.tensor([_shape_geometry(a.shape)[0] for a in attributes])


def world_spread(attributes: Sequence[ToyPrompt]) -> torch.Tensor:
    """``(B,)`` RMS distance of the world's object pixels to their centroid (1.58 px square, 1.35 px circle)."""
    return torch.tensor([_shape_geometry(a.shape)[1] for a in attributes])


def world_start_box(
    attributes: Sequence[ToyPrompt], num_frames: int, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)``, each ``(B, 2)``: the box of first-frame object centres the world draws for each prompt."""
    boxes = [_start_box(a.direction, num_frames, height, width) for a in attributes]
    return torch.tensor([low for low, _ in boxes]), torch.tensor([high for _, high in boxes])


def direction_units() -> torch.Tensor:
    """``(4, 2)`` the unit step ``(dy, dx)`` of each direction, in `TOY_DIRECTIONS` order."""
    return torch.tensor(list(TOY_DIRECTIONS.values()), dtype=torch.float32)
