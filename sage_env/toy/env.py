"""``sage_env/Toy-v0``: the denoising environment of the toy world with its defaults filled in.

``gymnasium.make("sage_env/Toy-v0")`` and ``gymnasium.make_vec("sage_env/Toy-v0", num_envs=8, group_size=4)``
need no arguments: the shipped prior (``backbone="toy"``), the analytic `sage_env.rewards.toy.ToyReward`, the
24 training prompts, the toy model's declared size and schedule (``sage_env.models.TOY_SAMPLING_DEFAULTS``:
8 frames of 16 x 16 pixels, 10 steps at shift 3), and the SDE of the toy RL runs (SAGE with eta 0.7 on the
first half of the steps, the ODE after). Every argument of
`sage_env.DenoisingVectorEnv` can be overridden as a keyword (e.g. ``render_mode="rgb_array"``,
``array_mode="torch"``). Being offline and fast, it is the id to try gymnasium's checker and wrappers on.
"""

from __future__ import annotations

from typing import Any

from sage_env.env import DenoisingEnv, DenoisingVectorEnv
from sage_env.models import TOY_SAMPLING_DEFAULTS
from sage_env.rewards.toy import ToyReward
from sage_env.toy.world import TOY_TRAIN_PROMPTS

__all__ = ["TOY_ENV_DEFAULTS", "make_toy_env", "make_toy_vector_env"]

_MODEL = TOY_SAMPLING_DEFAULTS

TOY_ENV_DEFAULTS: dict[str, Any] = {
    "backbone": "toy",
    "prompts": TOY_TRAIN_PROMPTS,
    **_MODEL.env_kwargs(),
    "sde": "sage",
    "eta": 0.7,
    "sde_window": (0, _MODEL.num_steps // 2),
}
"""Defaults of ``sage_env/Toy-v0`` (the reward defaults to a fresh `ToyReward`)."""


def _with_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    settings = {**TOY_ENV_DEFAULTS, **kwargs}
    if settings.get("reward_fn") is None:
        settings["reward_fn"] = ToyReward()
    return settings


def make_toy_env(**kwargs: Any) -> DenoisingEnv:
    """One-video toy environment (`DenoisingEnv`); keywords override `TOY_ENV_DEFAULTS`."""
    return DenoisingEnv(**_with_defaults(kwargs))


def make_toy_vector_env(num_envs: int = 1, group_size: int = 1, **kwargs: Any) -> DenoisingVectorEnv:
    """Batched toy environment (`DenoisingVectorEnv`); keywords override `TOY_ENV_DEFAULTS`."""
    return DenoisingVectorEnv(num_envs=num_envs, group_size=group_size, **_with_defaults(kwargs))
