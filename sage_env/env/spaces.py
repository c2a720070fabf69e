"""The spaces of the denoising environments: latents, velocities, noise level, step and `PromptSpace`."""

from __future__ import annotations

import string
import sys
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from numpy.typing import NDArray

__all__ = ["LATENT_BOUND", "MAX_PROMPT_LENGTH", "VELOCITY_BOUND", "PromptSpace", "denoising_spaces"]

LATENT_BOUND = float(np.finfo(np.float32).max)
"""Latents may take any finite float32 value (gymnasium's idiom for an unbounded Box, as in CartPole)."""

VELOCITY_BOUND = 1e4
"""Largest accepted velocity magnitude. A velocity is ``z - x0`` (noise minus clean sample), of order 1-10
for the normalized latents of video VAEs even after classifier-free guidance; the bound leaves three orders
of magnitude of headroom while keeping every step's float32 arithmetic finite for any action of the space."""

MAX_PROMPT_LENGTH = 8192
"""Longest prompt, in characters."""

_PADDING = 0  # code point that pads a flattened prompt; NUL is not allowed in a prompt


class PromptSpace(spaces.Text):
    """A prompt: any non-empty string of at most ``max_length`` characters, in any script, without NUL.

    A `gymnasium.spaces.Text` whose character set is all of Unicode: gymnasium's `Text` needs an explicit
    character set, which would have to grow with every new prompt and would change the flattened layout
    under a wrapper that already read it. `sample` draws printable ASCII.

    Flattened (`gymnasium.spaces.utils.flatten`, hence ``FlattenObservation``) a prompt is its Unicode code
    points padded with 0 to ``max_length``: ``Box(0, 0x10FFFF, (max_length,), int32)``; `unflatten` gives the
    string back.
    """

    def __init__(self, max_length: int = MAX_PROMPT_LENGTH, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=1, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a non-empty string of at most ``max_length`` characters without NUL."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and "\x00" not in x

    def __repr__(self) -> str:
        return f"PromptSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PromptSpace) and other.max_length == self.max_length


@flatten.register(PromptSpace)
def _flatten_prompt(space: PromptSpace, x: str) -> NDArray[np.int32]:
    codes = np.full(space.max_length, _PADDING, dtype=np.int32)
    codes[: len(x)] = [ord(character) for character in x]
    return codes


@unflatten.register(PromptSpace)
def _unflatten_prompt(space: PromptSpace, x: NDArray[np.integer]) -> str:
    # A flattened Dict is float64 (gymnasium promotes the dtypes of its parts): code points are exact there.
    return "".join(chr(code) for code in np.asarray(x).astype(np.int64).tolist() if code != _PADDING)


@flatten_space.register(PromptSpace)
def _flatten_prompt_space(space: PromptSpace) -> spaces.Box:
    return spaces.Box(_PADDING, sys.maxunicode, (space.max_length,), np.int32)


def denoising_spaces(latent_shape: tuple[int, ...], num_steps: int) -> tuple[spaces.Dict, spaces.Box]:
    """The observation and action spaces of one video: ``(Dict(latents, sigma, step, prompt), Box)``."""
    observation_space = spaces.Dict(
        {
            "latents": spaces.Box(-LATENT_BOUND, LATENT_BOUND, latent_shape, np.float32),
            "sigma": spaces.Box(0.0, 1.0, (), np.float32),
            "step": spaces.Discrete(num_steps + 1),
            "prompt": PromptSpace(),
        }
    )
    action_space = spaces.Box(-VELOCITY_BOUND, VELOCITY_BOUND, latent_shape, np.float32)
    return observation_space, action_space


def prompt_list(prompts: Any) -> list[str]:
    """Accept a list of strings or a dataset with a ``prompt`` column; every prompt must fit `PromptSpace`."""
    if prompts is None:
        return []
    if isinstance(prompts, str):
        raise ValueError(
            "prompts must be a list of strings (or a dataset with a 'prompt' column), not one string."
        )
    if hasattr(prompts, "column_names"):
        if "prompt" not in prompts.column_names:
            raise ValueError(f"The prompt dataset needs a 'prompt' column, it has {prompts.column_names}.")
        prompts = prompts["prompt"]
    prompts = list(prompts)
    space = PromptSpace()
    for prompt in prompts:
        if not space.contains(prompt):
            raise ValueError(
                f"Every prompt must be a non-empty string of at most {space.max_length} characters without "
                f"NUL, got {str(prompt)[:80]!r} ({type(prompt).__name__})."
            )
    return prompts
