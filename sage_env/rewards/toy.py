"""The toy world's analytic rewards: VideoAlign's three heads (VQ, MQ, TA) computed from decoded pixels.

Both follow the reward protocol of `sage_env.rewards.base`: ``videos (B, F, 3, H, W)`` in [0, 1] and one prompt of
the toy grammar (`sage_env.toy.world`) per video -> ``{"vq", "mq", "ta"}``, each ``(B,)`` in [0, 1]. They are
deterministic, need no model, and score a batch exactly as they score each video alone. How a video is read
(object weight, mass, centroid, spread, colour) is `sage_env.rewards.toy_reading`.

* `ToyReward` (``reward: toy``, the default): every term is 1 for the world's own videos and lower for any video
  off the world. Its optimum is the world: gradient ascent on the pixels, from clean renders or from the prior's
  samples, stays within a stated distance of the world's videos (tests/sage_env/rewards/test_toy_attacks.py).
* `HackableToyReward` (``reward: toy_hackable``): the toy reward this library shipped as ``toy`` until the gold
  score exposed it, kept as a named proxy that can be gamed. Nothing in it scores the object's size or the background's level, so RL learned to draw
  objects up to three times the world's size (a bigger blob reads as a more "persistent object") while its score
  rose. The arena's hackable task and the diagnostics' alarms use it, judged by the gold score
  (`sage_env.toy.gold`), which no reward can fool.

The heads of `ToyReward`, each the mean of its terms (every term in [0, 1], 1 for a clean rendered video):

* ``vq`` (visual quality): *clean background* ``exp(-e / spread_scale)`` with ``e`` the RMS colour distance of
  background pixels to the world's grey (noise, flicker, and a darkened or brightened background all raise it);
  *crisp object* ``sum w^2 / sum w`` times presence (1 when every pixel is plainly object or background);
  *on-palette object* ``exp(-p / palette_scale)`` times presence, with ``p`` the mean colour distance of object
  pixels to the nearest palette colour; *object size* ``exp(-|m - A| / (size_scale A))`` averaged over frames,
  with ``m`` the frame's object mass and ``A`` the world's area for the prompt's shape; *compact shape*
  ``exp(-|r - r0| / shape_scale)`` averaged over frames, with ``r`` the object's spread (RMS distance of its
  pixels to the centroid) and ``r0`` the world's for the shape (both times presence).
* ``mq`` (motion quality): *smooth track* ``exp(-a / acceleration_scale)`` with ``a`` the mean norm of the
  centroid's second difference; *steady area* ``presence * exp(-(std(m) / A) / persistence_scale)`` with
  ``std(m)`` the spread of the object's mass over frames (flicker, vanishing, growing) measured against the
  world's area ``A``, so that a larger object is not steadier; *steady speed* ``exp(-|s - SPEED| / speed_scale)`` with ``s``
  the median centroid speed; *start in range* ``exp(-d / position_scale)`` times presence, with ``d`` how far the
  first frame's centroid lies outside the box of start positions the world draws for the prompt (its direction
  decides the side: an object moving right starts on the left).
* ``ta`` (text alignment): ``presence * (p_colour + p_direction) / 2``: the softmax probability of the prompt's
  colour among the palette (from the squared distance of the object's mean colour, temperature
  ``colour_temperature``) and of its direction among the four (from the displacement of the least-squares
  centroid track, temperature ``direction_temperature`` pixels).

``presence = min(1, mean mass / min_area)``: a video without an object scores 0 on the terms that need one. The
shape word is read through the object's size and spread (a circle is the square without its corners); ``fps`` is
accepted and ignored: the world's motion is defined per frame.

`toy_overall_score` is the plain mean of the three heads, the single number summaries report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from sage_env.rewards.base import check_videos
from sage_env.rewards.toy_reading import (
    ObjectTrack,
    direction_units,
    read_object,
    target_probability,
    world_area,
    world_spread,
    world_start_box,
)
from sage_env.toy.world import OBJECT_SIZE, SPEED, TOY_COLOURS, TOY_DIRECTIONS, object_mask, parse_prompt

__all__ = ["HackableToyReward", "ToyReward", "ToyRewardDetails", "toy_overall_score"]

_EPS = 1e-6


@dataclass
class ToyRewardDetails:
    """Every term of a toy reward for a batch, each ``(B,)`` float32 (see the module docstring).

    The three heads are ``vq``, ``mq`` and ``ta``; which terms enter them is the reward's ``HEAD_TERMS``.
    ``colour_correct`` / ``direction_correct`` (bool) say whether the most likely colour / direction read from the
    video is the prompt's.
    """

    vq: torch.Tensor
    mq: torch.Tensor
    ta: torch.Tensor
    clean_background: torch.Tensor
    level_free_background: torch.Tensor
    crisp_object: torch.Tensor
    on_palette: torch.Tensor
    object_size: torch.Tensor
    compact_shape: torch.Tensor
    smooth_track: torch.Tensor
    persistent_object: torch.Tensor
    steady_area: torch.Tensor
    steady_speed: torch.Tensor
    start_in_range: torch.Tensor
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


class ToyReward:
    """Analytic VQ / MQ / TA reward of the toy world whose optimum is the world's own videos (module docstring).

    Args:
        object_low, object_high: colour distance to the background below which a pixel is background
            (weight 0) and above which it is object (weight 1); linear in between.
        spread_scale: background RMS colour error at which the clean-background term is ``1/e``.
        palette_scale: mean distance of object pixels to the palette at which the on-palette term is ``1/e``.
        size_scale: relative error of the object's area at which the object-size term is ``1/e``.
        shape_scale: error of the object's spread, in pixels, at which the compact-shape term is ``1/e``.
        acceleration_scale: mean centroid jitter (px/frame^2) at which the smooth-track term is ``1/e`` (default:
            a jitter as large as the world's speed, 1 px/frame).
        persistence_scale: coefficient of variation of the object mass at which persistence is ``1/e``.
        speed_scale: deviation from the world's speed (px/frame) at which the steady-speed term is ``1/e``.
        position_scale: pixels outside the world's start box at which the start-in-range term is ``1/e``.
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
        "vq": "visual quality: the world's background, a crisp on-palette object of the world's size and shape",
        "mq": "motion quality: smooth track, persistent object, the world's speed and start positions",
        "ta": "text alignment: the prompt's colour and direction",
    }
    """What each returned score measures (the optional attribute of the reward protocol)."""
    HEAD_TERMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "vq": ("clean_background", "crisp_object", "on_palette", "object_size", "compact_shape"),
        "mq": ("smooth_track", "steady_area", "steady_speed", "start_in_range"),
    }
    """The terms whose mean is each head (``ta`` is the colour and direction alignment for both rewards)."""

    def __init__(
        self,
        *,
        object_low: float = 0.15,
        object_high: float = 0.6,
        spread_scale: float = 0.05,
        palette_scale: float = 0.2,
        size_scale: float = 0.25,
        shape_scale: float = 0.5,
        acceleration_scale: float = 1.0,
        persistence_scale: float = 0.25,
        speed_scale: float = 0.5,
        position_scale: float = 1.0,
        colour_temperature: float = 0.05,
        direction_temperature: float = 1.0,
        min_area: float | None = None,
    ) -> None:
        scales = {
            "spread_scale": spread_scale,
            "palette_scale": palette_scale,
            "size_scale": size_scale,
            "shape_scale": shape_scale,
            "acceleration_scale": acceleration_scale,
            "persistence_scale": persistence_scale,
            "speed_scale": speed_scale,
            "position_scale": position_scale,
            "colour_temperature": colour_temperature,
            "direction_temperature": direction_temperature,
        }
        for name, value in scales.items():
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
            setattr(self, name, float(value))
        if not 0 <= object_low < object_high:
            raise ValueError(f"Need 0 <= object_low < object_high, got {object_low} and {object_high}.")
        self.object_low, self.object_high = float(object_low), float(object_high)
        default_area = 0.75 * float(object_mask("circle", OBJECT_SIZE).sum())
        self.min_area = default_area if min_area is None else float(min_area)
        if self.min_area <= 0:
            raise ValueError(f"min_area must be > 0, got {min_area!r}.")

    def __call__(
        self, videos: torch.Tensor, prompts: Sequence[str], *, fps: float | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """``{"vq", "mq", "ta"}``, each ``(B,)`` float32 in [0, 1] (``fps`` is ignored: motion is per frame)."""
        return self.evaluate(videos, prompts).heads()

    def evaluate(
        self, videos: torch.Tensor, prompts: Sequence[str], *, differentiable: bool = False
    ) -> ToyRewardDetails:
        """Every term of the reward (see `ToyRewardDetails`); ``differentiable`` keeps the graph to the pixels."""
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list with one prompt per video, not a single string.")
        check_videos(videos.detach(), len(prompts))
        if videos.shape[1] < 3:
            raise ValueError(
                f"The toy reward needs at least 3 frames to judge motion, got {videos.shape[1]}."
            )
        attributes = [parse_prompt(prompt) for prompt in prompts]
        pixels = videos.float().cpu() if differentiable else videos.detach().float().cpu()
        with torch.set_grad_enabled(differentiable):
            track = read_object(pixels, self.object_low, self.object_high)
            return self._score(track, attributes, tuple(videos.shape[1:2] + videos.shape[3:5]))

    # -- scoring -----------------------------------------------------------------------------------

    def _score(self, track: ObjectTrack, attributes: list, size: tuple[int, int, int]) -> ToyRewardDetails:
        presence = (track.mass.mean(dim=1) / self.min_area).clamp(max=1.0)
        weight = track.weight.flatten(1)
        colour_probability, colour_correct = self._colour_alignment(track.colour, attributes)
        direction_probability, direction_correct = self._direction_alignment(track.centroid, attributes)
        terms = {
            "clean_background": torch.exp(-track.background_error / self.spread_scale),
            "level_free_background": torch.exp(-track.background_spread / self.spread_scale),
            "crisp_object": (weight**2).sum(dim=1) / weight.sum(dim=1).clamp(min=_EPS) * presence,
            "on_palette": torch.exp(-track.palette_error / self.palette_scale) * presence,
            **{name: term * presence for name, term in self._world_terms(track, attributes, size).items()},
            **self._motion_terms(track, presence),
            "colour_probability": colour_probability,
            "direction_probability": direction_probability,
        }
        heads = {name: sum(terms[t] for t in parts) / len(parts) for name, parts in self.HEAD_TERMS.items()}
        ta = presence * (colour_probability + direction_probability) / 2
        return ToyRewardDetails(
            **heads, ta=ta, presence=presence, colour_correct=colour_correct,
            direction_correct=direction_correct, **terms,
        )  # fmt: skip

    def _world_terms(self, track: ObjectTrack, attributes: list, size: tuple[int, int, int]) -> dict:
        """Size, shape and start position against the world's own values for each prompt."""
        area, spread = world_area(attributes)[:, None], world_spread(attributes)[:, None]
        low, high = world_start_box(attributes, *size)
        start = track.centroid[:, 0]
        outside = ((low - start).clamp(min=0) + (start - high).clamp(min=0)).norm(dim=-1)
        # The mass's frame-to-frame spread relative to the world's area, not to the mass itself: a coefficient of
        # variation falls as the object grows, which is how the hackable reward paid for larger objects.
        steady_area = track.mass.std(dim=1, unbiased=False) / area[:, 0]
        return {
            "steady_area": torch.exp(-steady_area / self.persistence_scale),
            "object_size": torch.exp(-(track.mass - area).abs() / (self.size_scale * area)).mean(dim=1),
            "compact_shape": torch.exp(-(track.spread - spread).abs() / self.shape_scale).mean(dim=1),
            "start_in_range": torch.exp(-outside / self.position_scale),
        }

    def _motion_terms(self, track: ObjectTrack, presence: torch.Tensor) -> dict[str, torch.Tensor]:
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
        return target_probability(logits, target)

    def _direction_alignment(
        self, centroid: torch.Tensor, attributes: list
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Least-squares velocity of the track (robust to a wobbly first or last frame), times the video's
        # duration: the displacement a straight track would make.
        num_frames = centroid.shape[1]
        time = torch.arange(num_frames, dtype=centroid.dtype)
        time = time - time.mean()
        velocity = (time[None, :, None] * centroid).sum(dim=1) / (time**2).sum()  # (B, 2)
        displacement = velocity @ direction_units().T * (num_frames - 1)
        target = torch.tensor([list(TOY_DIRECTIONS).index(a.direction) for a in attributes])
        return target_probability(displacement / self.direction_temperature, target)


class HackableToyReward(ToyReward):
    """The toy reward shipped as ``toy`` until the gold score exposed it, kept as a named proxy that RL can game
    (module docstring).

    Its heads leave out what `ToyReward` added: the background is judged around its own median (any level
    passes), neither the object's size, its shape nor its start position is scored, and persistence is the mass's
    coefficient of variation, which falls as the object grows: a larger blob scores as high as the world's object,
    and higher on persistence. Use it where over-optimisation must show (the
    arena's hackable task, the diagnostics' alarms), judged by `sage_env.toy.gold`.
    """

    reward_model_description = (
        "the toy world's hackable proxy reward (sage_env.rewards.toy.HackableToyReward): it does not score the "
        "object's size, and RL games it"
    )
    component_descriptions: ClassVar[dict[str, str]] = {
        "vq": "visual quality: a background without noise around its own level, a crisp on-palette object",
        "mq": "motion quality: smooth track, persistent object, steady speed",
        "ta": "text alignment: the prompt's colour and direction",
    }
    HEAD_TERMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "vq": ("level_free_background", "crisp_object", "on_palette"),
        "mq": ("smooth_track", "persistent_object", "steady_speed"),
    }


def toy_overall_score(components: Mapping[str, torch.Tensor] | ToyRewardDetails) -> torch.Tensor:
    """The single summary number of the toy world: ``(vq + mq + ta) / 3`` per video, in [0, 1]."""
    heads = components.heads() if isinstance(components, ToyRewardDetails) else components
    missing = [name for name in ("vq", "mq", "ta") if name not in heads]
    if missing:
        raise ValueError(f"toy_overall_score needs the components vq, mq and ta; missing {missing}.")
    return (heads["vq"] + heads["mq"] + heads["ta"]) / 3
