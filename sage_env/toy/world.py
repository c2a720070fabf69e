"""The toy text-to-video world: a small coloured object gliding across a flat grey background.

Every video is drawn by a deterministic renderer from a prompt of a three-word grammar and a seed:

* prompts read ``"a {colour} {shape} moving {direction}"`` with 4 colours x 2 shapes x 4 directions
  (`TOY_PROMPTS`, 32 prompts), split once into 24 training prompts (`TOY_TRAIN_PROMPTS`) and 8 held-out
  prompts (`TOY_EVAL_PROMPTS`);
* a video is `TOY_NUM_FRAMES` frames of `TOY_HEIGHT` x `TOY_WIDTH` pixels; the object is an
  `OBJECT_SIZE`-pixel square or disc (a square with its corners cut) of a saturated colour on a uniform
  grey background (`BACKGROUND_LEVEL`), moving `SPEED` pixel per frame in the prompt's direction;
* the seed only picks the start position: the trajectory centred in the frame, shifted by up to
  `START_JITTER` pixels along each axis (uniformly, always fully in view), so every frame position varies
  from video to video while the prompt still fixes where the object goes. (A first version drew the start
  uniformly over every position that keeps the object in view; the prior then had to learn a near-uniform
  conditional mean and did not learn direction in 30 minutes, see the model card of the shipped prior.)

What is *observable* in a rendered video: the colour and the direction. The shape is rendered, but a 4-pixel
disc differs from a 4-pixel square by four corner pixels, which a small generator blurs away; the toy reward
(`sage_env.rewards.toy`) therefore scores colour and direction only and says so. The held-out split pairs
every held-out prompt with a training prompt that differs only in the shape word, so "held-out" tests
generalisation over prompt text, not over unseen colour/direction combinations.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import torch

from sage_env.models import TOY_SAMPLING_DEFAULTS

__all__ = [
    "BACKGROUND_LEVEL",
    "OBJECT_SIZE",
    "SPEED",
    "START_JITTER",
    "TOY_COLOURS",
    "TOY_DIRECTIONS",
    "TOY_EVAL_PROMPTS",
    "TOY_HEIGHT",
    "TOY_NUM_FRAMES",
    "TOY_PROMPTS",
    "TOY_SHAPES",
    "TOY_TRAIN_PROMPTS",
    "TOY_WIDTH",
    "ToyPrompt",
    "object_mask",
    "parse_prompt",
    "render_at",
    "render_video",
    "render_videos",
    "start_positions",
]

TOY_COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0),
}
"""Colour name -> RGB in [0, 1] (saturated, far from the grey background and from each other)."""

TOY_SHAPES: tuple[str, ...] = ("square", "circle")
"""Shape names. The circle is the square with its four corner pixels removed."""

TOY_DIRECTIONS: dict[str, tuple[int, int]] = {
    "left": (0, -1),
    "right": (0, 1),
    "up": (-1, 0),
    "down": (1, 0),
}
"""Direction name -> unit step ``(dy, dx)`` in pixels (image rows grow downwards)."""

_TOY_DEFAULTS = TOY_SAMPLING_DEFAULTS
TOY_NUM_FRAMES: int = _TOY_DEFAULTS.num_frames
TOY_HEIGHT: int = _TOY_DEFAULTS.height
TOY_WIDTH: int = _TOY_DEFAULTS.width
"""The world's video size: the toy model's declared size (``sage_env.models.TOY_SAMPLING_DEFAULTS``)."""
OBJECT_SIZE = 4
"""Side of the object's bounding box, in pixels."""
SPEED = 1
"""Pixels the object moves per frame."""
BACKGROUND_LEVEL = 0.2
"""Grey level of the background (all three channels), away from 0 so that its noise is not clipped."""
START_JITTER = 2
"""Largest shift, in pixels along each axis, of a video's trajectory from the centred one."""

_PROMPT_PATTERN = re.compile(r"^\s*(?:an?\s+)?(\w+)\s+(\w+)\s+moving\s+(\w+)\s*\.?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ToyPrompt:
    """The attributes of one toy prompt; ``str(prompt)`` is its canonical text."""

    colour: str
    shape: str
    direction: str

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("colour", self.colour, TOY_COLOURS),
            ("shape", self.shape, TOY_SHAPES),
            ("direction", self.direction, TOY_DIRECTIONS),
        ):
            if value not in allowed:
                raise ValueError(f"Unknown toy {name} {value!r}; choose one of {', '.join(allowed)}.")

    @property
    def text(self) -> str:
        """The canonical prompt, e.g. ``"a red square moving left"``."""
        return f"a {self.colour} {self.shape} moving {self.direction}"

    def __str__(self) -> str:
        return self.text


def parse_prompt(prompt: str | ToyPrompt) -> ToyPrompt:
    """Read the attributes back from a prompt of the toy grammar (case and extra spaces do not matter).

    Raises ``ValueError`` naming the grammar when the text is not a toy prompt.
    """
    if isinstance(prompt, ToyPrompt):
        return prompt
    match = _PROMPT_PATTERN.match(prompt) if isinstance(prompt, str) else None
    if match is None:
        raise ValueError(
            f"{prompt!r} is not a toy-world prompt; write 'a <colour> <shape> moving <direction>' with colour in "
            f"{list(TOY_COLOURS)}, shape in {list(TOY_SHAPES)}, direction in {list(TOY_DIRECTIONS)}."
        )
    colour, shape, direction = (word.lower() for word in match.groups())
    return ToyPrompt(colour, shape, direction)


def _is_held_out(colour_index: int, shape_index: int, direction_index: int) -> bool:
    # A Latin-square split: each (colour, shape) pair holds out exactly one direction, so the held-out set has
    # every colour twice, every direction twice, every shape four times, and each held-out prompt's
    # (colour, direction) pair appears in training with the other shape.
    return (colour_index + shape_index + direction_index) % len(TOY_DIRECTIONS) == 0


def _split_prompts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    train, held_out = [], []
    indexed = product(enumerate(TOY_COLOURS), enumerate(TOY_SHAPES), enumerate(TOY_DIRECTIONS))
    for (c, colour), (s, shape), (d, direction) in indexed:
        text = ToyPrompt(colour, shape, direction).text
        (held_out if _is_held_out(c, s, d) else train).append(text)
    return tuple(train), tuple(held_out)


TOY_TRAIN_PROMPTS, TOY_EVAL_PROMPTS = _split_prompts()
"""The fixed split: 24 prompts the prior is trained on (and RL samples from), 8 held out for evaluation."""

TOY_PROMPTS: tuple[str, ...] = TOY_TRAIN_PROMPTS + TOY_EVAL_PROMPTS
"""All 32 prompts of the grammar."""


def object_mask(shape: str, size: int = OBJECT_SIZE) -> torch.Tensor:
    """Boolean ``(size, size)`` footprint of a shape: a full square, or a disc (square minus its corners)."""
    if shape not in TOY_SHAPES:
        raise ValueError(f"Unknown toy shape {shape!r}; choose one of {', '.join(TOY_SHAPES)}.")
    mask = torch.ones(size, size, dtype=torch.bool)
    if shape == "circle":
        for row, col in ((0, 0), (0, size - 1), (size - 1, 0), (size - 1, size - 1)):
            mask[row, col] = False
    return mask


def _start_offsets(step: int, num_frames: int, extent: int) -> list[int]:
    """Every start coordinate along one axis: the centred trajectory moved by up to `START_JITTER` pixels."""
    travel = abs(step) * SPEED * (num_frames - 1)
    span = OBJECT_SIZE + travel
    centred = (extent - span) // 2
    low, high = max(0, centred - START_JITTER), min(extent - span, centred + START_JITTER)
    # Objects moving towards negative coordinates start at the far end of their span.
    return [offset + travel if step < 0 else offset for offset in range(low, high + 1)]


def start_positions(
    direction: str, num_frames: int = TOY_NUM_FRAMES, height: int = TOY_HEIGHT, width: int = TOY_WIDTH
) -> list[tuple[int, int]]:
    """Every ``(top, left)`` the world starts an object moving in ``direction`` at (a seed picks one)."""
    _check_size(num_frames, height, width)
    step = TOY_DIRECTIONS[direction]
    rows, cols = _start_offsets(step[0], num_frames, height), _start_offsets(step[1], num_frames, width)
    return [(top, left) for top in rows for left in cols]


def _start_position(
    direction: tuple[int, int], seed: int, num_frames: int, height: int, width: int
) -> tuple[int, int]:
    generator = torch.Generator().manual_seed(int(seed))
    rows = _start_offsets(direction[0], num_frames, height)
    top = rows[int(torch.randint(len(rows), (1,), generator=generator))]
    cols = _start_offsets(direction[1], num_frames, width)
    left = cols[int(torch.randint(len(cols), (1,), generator=generator))]
    return top, left


def _check_size(num_frames: int, height: int, width: int) -> None:
    for name, value in (("num_frames", num_frames), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    travel = SPEED * (num_frames - 1)
    if min(height, width) < OBJECT_SIZE + travel:
        raise ValueError(
            f"A {num_frames}-frame toy video needs height and width >= {OBJECT_SIZE + travel} so a "
            f"{OBJECT_SIZE}-pixel object moving {SPEED} px/frame stays in view; got {height} x {width}."
        )


def render_video(
    prompt: str | ToyPrompt,
    seed: int,
    *,
    num_frames: int = TOY_NUM_FRAMES,
    height: int = TOY_HEIGHT,
    width: int = TOY_WIDTH,
) -> torch.Tensor:
    """Render the video of ``prompt`` for ``seed``: float32 ``(F, 3, H, W)`` in [0, 1].

    The same prompt and seed always give the same video; the seed picks the start position only.
    """
    _check_size(num_frames, height, width)
    attributes = parse_prompt(prompt)
    top, left = _start_position(TOY_DIRECTIONS[attributes.direction], seed, num_frames, height, width)
    return render_at(attributes, top, left, num_frames=num_frames, height=height, width=width)


def render_at(
    prompt: str | ToyPrompt,
    top: int,
    left: int,
    *,
    num_frames: int = TOY_NUM_FRAMES,
    height: int = TOY_HEIGHT,
    width: int = TOY_WIDTH,
) -> torch.Tensor:
    """The video of ``prompt`` whose object starts at ``(top, left)`` (one of `start_positions`): ``(F, 3, H, W)``."""
    attributes = parse_prompt(prompt)
    direction = TOY_DIRECTIONS[attributes.direction]
    background = torch.full((3, height, width), BACKGROUND_LEVEL)
    colour = torch.tensor(TOY_COLOURS[attributes.colour]).view(3, 1)
    footprint = object_mask(attributes.shape)
    frames = []
    for frame_index in range(num_frames):
        frame = background.clone()
        row = top + direction[0] * SPEED * frame_index
        col = left + direction[1] * SPEED * frame_index
        patch = frame[:, row : row + OBJECT_SIZE, col : col + OBJECT_SIZE]
        patch[:, footprint] = colour
        frames.append(frame)
    return torch.stack(frames)


def render_videos(
    prompts: Sequence[str | ToyPrompt],
    seeds: Sequence[int],
    *,
    num_frames: int = TOY_NUM_FRAMES,
    height: int = TOY_HEIGHT,
    width: int = TOY_WIDTH,
) -> torch.Tensor:
    """Render one video per (prompt, seed): float32 ``(B, F, 3, H, W)`` in [0, 1]."""
    if isinstance(prompts, str):
        raise ValueError("render_videos takes a list of prompts; use render_video for a single one.")
    if len(prompts) != len(seeds):
        raise ValueError(f"Need one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds.")
    size = {"num_frames": num_frames, "height": height, "width": width}
    return torch.stack([render_video(prompt, seed, **size) for prompt, seed in zip(prompts, seeds)])
