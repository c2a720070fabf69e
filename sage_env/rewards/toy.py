"""The toy world's analytic reward: VideoAlign's three heads (VQ, MQ, TA) computed from decoded pixels.

`ToyReward` follows the reward protocol of `sage_env.rewards.base`: ``videos (B, F, 3, H, W)`` in [0, 1] and
one prompt of the toy grammar (`sage_env.toy.world`) per video -> ``{"vq", "mq", "ta"}``, each ``(B,)`` in
[0, 1]. It is deterministic, needs no model, and scores a batch exactly as it scores each video alone.

How a video is read. The background is the per-channel median over all pixels and frames of the video (the
object covers ~6% of the pixels), so nothing depends on the background's *level*: an earlier version that
penalised any deviation from a reference grey was gamed by RL, which darkened the background (docs/design.md,
"The toy world"). Each pixel gets an object weight ``w`` in [0, 1] from its colour distance to that
background (0 below `ToyReward.object_low`, 1 above `ToyReward.object_high`); per frame the object's mass is
``sum w``, its centroid the ``w``-weighted mean position and its colour the ``w``-weighted mean colour.

The heads, each the mean of its terms (every term in [0, 1], 1 for a clean rendered video):

* ``vq`` (visual quality): *clean background* ``exp(-spread / spread_scale)`` with ``spread`` the RMS colour
  distance of background pixels to the background median over the whole video (noise and flicker, not the
  level); *crisp object* ``sum w^2 / sum w`` (1 when every pixel is plainly object or background, lower for
  blurred halos), times presence; *on-palette object* ``exp(-e / palette_scale)`` with ``e`` the mean colour
  distance of object pixels to the nearest palette colour (washed-out or mixed colours are off the manifold).
* ``mq`` (motion quality): *smooth track* ``exp(-a / acceleration_scale)`` with ``a`` the mean norm of the
  centroid's second difference (jitter); *persistent object* ``presence * exp(-cv / persistence_scale)``
  with ``cv`` the coefficient of variation of the mass over frames (flicker, vanishing, growing);
  *steady speed* ``exp(-|s - SPEED| / speed_scale)`` with ``s`` the median centroid speed (the world moves
  objects 1 px/frame).
* ``ta`` (text alignment): ``presence * (p_colour + p_direction) / 2``. ``p_colour`` is the softmax
  probability of the prompt's colour among the palette, from the squared distance of the object's mean colour
  (temperature `ToyReward.colour_temperature`); ``p_direction`` the softmax probability of the prompt's
  direction among the four, from the displacement along each direction of the least-squares centroid track
  over the video (temperature `ToyReward.direction_temperature` pixels).

``presence = min(1, mean mass / min_area)``: a video without an object scores 0 on the terms that need one.
The shape word is *not* scored: at 4 pixels a disc and a square differ by four corner pixels, which the
generator does not resolve reliably (see `sage_env.toy.world`). ``fps`` is accepted and ignored: the world's
motion is defined per frame.

`toy_overall_score` is the plain mean of the three heads, the single number summaries report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from sage_env.rewards.base import check_videos
from sage_env.toy.world import OBJECT_SIZE, SPEED, TOY_COLOURS, TOY_DIRECTIONS, object_mask, parse_prompt

__all__ = ["ToyReward", "ToyRewardDetails", "toy_overall_score"]

_EPS = 1e-6


@dataclass
class ToyRewardDetails:
    """Every term of the toy reward for a batch, each ``(B,)`` float32 (see the module docstring).

    The three heads are ``vq``, ``mq`` and ``ta``; ``colour_correct`` / ``direction_correct`` (bool) say
    whether the most likely colour / direction read from the video is the prompt's.
    """

    vq: torch.Tensor
    mq: torch.Tensor
    ta: torch.Tensor
    clean_background: torch.Tensor
    crisp_object: torch.Tensor
    on_palette: torch.Tensor
    smooth_track: torch.Tensor
    persistent_object: torch.Tensor
    steady_speed: torch.Tensor
    colour_probability: torch.Tensor
    direction_probability: torch.Tensor
    presence: torch.Tensor
    colour_correct: torch.Tensor
    direction_correct: torch.Tensor

    def heads(self) -> dict[str, torch.Tensor]:
        """``{"vq", "mq", "ta"}``: what the reward protocol returns."""
        return {"vq": self.vq, "mq": self.mq, "ta": self.ta}

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Every term by name."""
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass
class _ObjectTrack:
    """What the reward reads from the pixels of each video (B videos, F frames)."""

    weight: torch.Tensor  # (B, F, H, W) object weight in [0, 1]
    mass: torch.Tensor  # (B, F)
    centroid: torch.Tensor  # (B, F, 2) in pixels (row, column)
    colour: torch.Tensor  # (B, 3) mass-weighted mean colour over the whole video
    background_spread: torch.Tensor  # (B,)
    palette_error: torch.Tensor  # (B,)


class ToyReward:
    """Analytic VQ / MQ / TA reward of the toy world (see the module docstring for every term).

    Args:
        object_low, object_high: colour distance to the background below which a pixel is background
            (weight 0) and above which it is object (weight 1); linear in between.
        spread_scale: background RMS noise (colour distance) at which the clean-background term is ``1/e``.
        palette_scale: mean distance of object pixels to the palette at which the on-palette term is ``1/e``.
        acceleration_scale: mean centroid jitter (px/frame^2) at which the smooth-track term is ``1/e`` (default:
            a jitter as large as the world's speed, 1 px/frame; the shipped prior jitters ~1.5 px/frame^2, so
            the term still has slope there for RL).
        persistence_scale: coefficient of variation of the object mass at which persistence is ``1/e``.
        speed_scale: deviation from the world's speed (px/frame) at which the steady-speed term is ``1/e``.
        colour_temperature: softmax temperature on squared colour distances.
        direction_temperature: softmax temperature on displacements, in pixels.
        min_area: object mass (pixels) below which presence drops (default: 3/4 of the disc's area).

    Example:
        ```python
        from sage_env.rewards.toy import ToyReward, toy_overall_score
        from sage_env.toy.world import render_videos

        reward = ToyReward()
        scores = reward(render_videos(["a red square moving left"], [0]), ["a red square moving left"])
        toy_overall_score(scores)  # tensor([1.])
        ```
    """

    reward_model_description = "the toy world's analytic reward (sage_env.rewards.toy.ToyReward)"
    """What the model card names as the reward (the optional attribute of the reward protocol)."""
    component_descriptions: ClassVar[dict[str, str]] = {
        "vq": "visual quality: clean background, crisp object, on-palette colours",
        "mq": "motion quality: smooth track, persistent object, steady speed",
        "ta": "text alignment: the prompt's colour and direction",
    }
    """What each returned score measures (the optional attribute of the reward protocol)."""

    def __init__(
        self,
        *,
        object_low: float = 0.15,
        object_high: float = 0.6,
        spread_scale: float = 0.05,
        palette_scale: float = 0.2,
        acceleration_scale: float = 1.0,
        persistence_scale: float = 0.25,
        speed_scale: float = 0.5,
        colour_temperature: float = 0.05,
        direction_temperature: float = 1.0,
        min_area: float | None = None,
    ) -> None:
        scales = {
            "spread_scale": spread_scale,
            "palette_scale": palette_scale,
            "acceleration_scale": acceleration_scale,
            "persistence_scale": persistence_scale,
            "speed_scale": speed_scale,
            "colour_temperature": colour_temperature,
            "direction_temperature": direction_temperature,
        }
        for name, value in scales.items():
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
        if not 0 <= object_low < object_high:
            raise ValueError(f"Need 0 <= object_low < object_high, got {object_low} and {object_high}.")
        self.object_low, self.object_high = float(object_low), float(object_high)
        for name, value in scales.items():
            setattr(self, name, float(value))
        default_area = 0.75 * float(object_mask("circle", OBJECT_SIZE).sum())
        self.min_area = default_area if min_area is None else float(min_area)
        if self.min_area <= 0:
            raise ValueError(f"min_area must be > 0, got {min_area!r}.")

    def __call__(
        self, videos: torch.Tensor, prompts: Sequence[str], *, fps: float | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """``{"vq", "mq", "ta"}``, each ``(B,)`` float32 in [0, 1] (``fps`` is ignored: motion is per frame)."""
        return self.evaluate(videos, prompts).heads()

    def evaluate(self, videos: torch.Tensor, prompts: Sequence[str]) -> ToyRewardDetails:
        """Every term of the reward (see `ToyRewardDetails`)."""
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list with one prompt per video, not a single string.")
        check_videos(videos, len(prompts))
        if videos.shape[1] < 3:
            raise ValueError(
                f"The toy reward needs at least 3 frames to judge motion, got {videos.shape[1]}."
            )
        attributes = [parse_prompt(prompt) for prompt in prompts]
        with torch.no_grad():
            track = self._read_object(videos.detach().float().cpu())
            return self._score(track, attributes, num_frames=videos.shape[1])

    # -- reading the video -------------------------------------------------------------------------

    def _read_object(self, videos: torch.Tensor) -> _ObjectTrack:
        batch, _, _, height, width = videos.shape
        # The object covers a few percent of the pixels, so the median is the background (level-free).
        background = videos.permute(0, 2, 1, 3, 4).reshape(batch, 3, -1).median(dim=-1).values
        distance = (videos - background[:, None, :, None, None]).norm(dim=2)  # (B, F, H, W)
        weight = ((distance - self.object_low) / (self.object_high - self.object_low)).clamp(0.0, 1.0)
        mass = weight.sum(dim=(-2, -1))
        rows = torch.arange(height, dtype=videos.dtype).view(height, 1).expand(height, width)
        cols = torch.arange(width, dtype=videos.dtype).view(1, width).expand(height, width)
        positions = torch.stack([rows, cols], dim=-1)  # (H, W, 2)
        centroid = torch.einsum("bfhw,hwc->bfc", weight, positions) / mass.clamp(min=_EPS)[..., None]
        colour = torch.einsum("bfhw,bfchw->bc", weight, videos) / mass.sum(dim=1).clamp(min=_EPS)[:, None]
        background_weight = 1.0 - weight
        spread = (background_weight * distance**2).sum(dim=(1, 2, 3)) / background_weight.sum(dim=(1, 2, 3))
        return _ObjectTrack(
            weight=weight,
            mass=mass,
            centroid=centroid,
            colour=colour,
            background_spread=spread.clamp(min=0.0).sqrt(),
            palette_error=self._palette_error(videos, weight),
        )

    @staticmethod
    def _palette_error(videos: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Weighted mean over object pixels of the colour distance to the nearest palette colour, ``(B,)``."""
        palette = torch.tensor(list(TOY_COLOURS.values()), dtype=videos.dtype)  # (K, 3)
        pixels = videos.permute(0, 1, 3, 4, 2).unsqueeze(-2)  # (B, F, H, W, 1, 3)
        nearest = (pixels - palette).norm(dim=-1).min(dim=-1).values  # (B, F, H, W)
        return (weight * nearest).sum(dim=(1, 2, 3)) / weight.sum(dim=(1, 2, 3)).clamp(min=_EPS)

    # -- scoring -----------------------------------------------------------------------------------

    def _score(self, track: _ObjectTrack, attributes: list, num_frames: int) -> ToyRewardDetails:
        presence = (track.mass.mean(dim=1) / self.min_area).clamp(max=1.0)
        clean_background = torch.exp(-track.background_spread / self.spread_scale)
        weight = track.weight.flatten(1)
        crispness = (weight**2).sum(dim=1) / weight.sum(dim=1).clamp(min=_EPS)
        on_palette = torch.exp(-track.palette_error / self.palette_scale) * presence
        motion = self._motion_terms(track, presence)
        colour_probability, colour_correct = self._colour_alignment(track.colour, attributes)
        direction_probability, direction_correct = self._direction_alignment(
            track.centroid, attributes, num_frames
        )
        terms = {
            "clean_background": clean_background,
            "crisp_object": crispness * presence,
            "on_palette": on_palette,
            **motion,
            "colour_probability": colour_probability,
            "direction_probability": direction_probability,
        }
        vq = (terms["clean_background"] + terms["crisp_object"] + terms["on_palette"]) / 3
        mq = (terms["smooth_track"] + terms["persistent_object"] + terms["steady_speed"]) / 3
        ta = presence * (colour_probability + direction_probability) / 2
        return ToyRewardDetails(
            vq=vq, mq=mq, ta=ta, presence=presence, colour_correct=colour_correct,
            direction_correct=direction_correct, **terms,
        )  # fmt: skip

    def _motion_terms(self, track: _ObjectTrack, presence: torch.Tensor) -> dict[str, torch.Tensor]:
        centroid = track.centroid
        acceleration = (centroid[:, 2:] - 2 * centroid[:, 1:-1] + centroid[:, :-2]).norm(dim=-1).mean(dim=1)
        speed = (centroid[:, 1:] - centroid[:, :-1]).norm(dim=-1).median(dim=1).values
        mass = track.mass
        variation = mass.std(dim=1, unbiased=False) / mass.mean(dim=1).clamp(min=_EPS)
        return {
            "smooth_track": torch.exp(-acceleration / self.acceleration_scale) * presence,
            "persistent_object": torch.exp(-variation / self.persistence_scale) * presence,
            "steady_speed": torch.exp(-(speed - SPEED).abs() / self.speed_scale) * presence,
        }

    def _colour_alignment(self, colour: torch.Tensor, attributes: list) -> tuple[torch.Tensor, torch.Tensor]:
        palette = torch.tensor(list(TOY_COLOURS.values()), dtype=colour.dtype)
        logits = -((colour[:, None, :] - palette) ** 2).sum(dim=-1) / self.colour_temperature
        target = torch.tensor([list(TOY_COLOURS).index(a.colour) for a in attributes])
        return _target_probability(logits, target)

    def _direction_alignment(
        self, centroid: torch.Tensor, attributes: list, num_frames: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Least-squares velocity of the track (robust to a wobbly first or last frame), times the video's
        # duration: the displacement a straight track would make.
        time = torch.arange(num_frames, dtype=centroid.dtype)
        time = time - time.mean()
        velocity = (time[None, :, None] * centroid).sum(dim=1) / (time**2).sum()  # (B, 2)
        units = torch.tensor(list(TOY_DIRECTIONS.values()), dtype=centroid.dtype)  # (4, 2) as (dy, dx)
        displacement = velocity @ units.T * (num_frames - 1)
        target = torch.tensor([list(TOY_DIRECTIONS).index(a.direction) for a in attributes])
        return _target_probability(displacement / self.direction_temperature, target)


def _target_probability(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probability of the target class, and whether it is the most likely class."""
    probability = logits.softmax(dim=-1).gather(1, target[:, None]).squeeze(1)
    return probability.float(), logits.argmax(dim=-1) == target


def toy_overall_score(components: Mapping[str, torch.Tensor] | ToyRewardDetails) -> torch.Tensor:
    """The single summary number of the toy world: ``(vq + mq + ta) / 3`` per video, in [0, 1]."""
    heads = components.heads() if isinstance(components, ToyRewardDetails) else components
    missing = [name for name in ("vq", "mq", "ta") if name not in heads]
    if missing:
        raise ValueError(f"toy_overall_score needs the components vq, mq and ta; missing {missing}.")
    return (heads["vq"] + heads["mq"] + heads["ta"]) / 3
