"""The bad-input sweep through the environment: its constructor, ``reset`` and ``step`` name the argument or
the problem."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sage_env.env import DenoisingVectorEnv
from tests.doubles import LinearBackbone, mean_brightness


def _env(**overrides: Any) -> DenoisingVectorEnv:
    values = {
        "num_envs": 4,
        "group_size": 2,
        "num_frames": 2,
        "height": 4,
        "width": 4,
        "num_steps": 3,
        "shift": 1.0,
    }
    values.update(overrides)
    backbone = values.pop("backbone", LinearBackbone())
    reward = values.pop("reward_fn", mean_brightness)
    prompts = values.pop("prompts", ["a", "b"])
    return DenoisingVectorEnv(backbone, reward, prompts, **values)


ENV_CASES: list[tuple[dict[str, Any], str]] = [
    ({"num_envs": 0}, "num_envs"),
    ({"group_size": 3}, "group_size"),
    ({"array_mode": "jax"}, "array_mode"),
    ({"render_mode": "human"}, "render_mode"),
    ({"sde": "langevin"}, "langevin"),
    ({"eta": -1.0}, "eta"),
    ({"eta": float("nan")}, "eta"),
    ({"eta": 1e30}, "eta"),
    ({"log_prob_kind": "laplace"}, "log_prob_kind"),
    ({"sde_window": (2, 1)}, "sde_window"),
    ({"sde_window": (0, 99)}, "sde_window"),
    ({"num_steps": 0}, "num_steps"),
    ({"shift": 0.0}, "shift"),
    ({"sigmas": torch.tensor([1.0, 0.5, 0.7, 0.0])}, "decreasing"),
    ({"sigmas": torch.tensor([1.0, 0.5, 0.1])}, "end at sigma = 0"),
    ({"prompts": "a cat"}, "prompts"),
    ({"prompts": ["a", ""]}, "prompt"),
    ({"reward_fn": None}, "reward_fn"),
    ({"num_frames": 0}, "num_frames"),
    ({"fps": 0.0}, "fps"),
    ({"fps": -8.0}, "fps"),
    ({"backbone": "{missing}"}, "{missing}"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"num_envs": True}, "num_envs"),
    ({"group_size": 0}, "group_size"),
    ({"eta": 11.0}, "eta"),
    ({"sde_window": (0,)}, "sde_window"),
    ({"sigmas": torch.tensor([1.0, float("nan"), 0.0])}, "sigma"),
    ({"fps": float("inf")}, "fps"),
    ({"prompts": ["a", "b\x00c"]}, "NUL"),
    ({"prompts": ["a", 3]}, "prompt"),
]


@pytest.mark.parametrize(("kwargs", "words"), ENV_CASES, ids=[str(c[0]) for c in ENV_CASES])
def test_the_environment_names_the_argument(
    kwargs: dict[str, Any], words: str, files: dict[str, Path], no_model_loads: None
) -> None:
    kwargs = {k: v.format(**files) if isinstance(v, str) and "{" in v else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=words.format(**files)):
        _env(**kwargs)


STEP_CASES: list[tuple[Callable[[DenoisingVectorEnv], Any], str]] = [
    (lambda env: env.step(torch.zeros(4, 3, 2, 4, 4)), "reset"),
    (lambda env: (env.reset(seed=0), env.step(torch.zeros(3, 3, 2, 4, 4))), "shape"),
    (lambda env: (env.reset(seed=0), env.step(torch.full((4, 3, 2, 4, 4), math.nan))), "NaN"),
    (lambda env: (env.reset(seed=0), env.step("velocity")), "action"),
    (lambda env: env.reset(options={"temperature": 1.0}), "temperature"),
    (lambda env: env.reset(options={"seeds": [1, 2]}), "seeds"),
    (lambda env: env.reset(options={"seeds": [-1, 2, 3, 4]}), "seed"),
    (lambda env: env.reset(options={"prompts": ["a"]}), "prompts"),
    (lambda env: env.reset(options={"prompts": "ab"}), "prompts"),
    (lambda env: env.reset(options={"seeds": [0, 1, 2, 2**40]}), "seeds"),
    (lambda env: (env.reset(seed=0), env.step(torch.zeros(4, 3, 2, 4, 4, dtype=torch.long))), "float"),
    (lambda env: (env.reset(seed=0), env.step(torch.full((4, 3, 2, 4, 4), 1e5))), "bound"),
]


@pytest.mark.parametrize(("action", "words"), STEP_CASES, ids=[w for _, w in STEP_CASES])
def test_reset_and_step_name_the_problem(action: Callable[[DenoisingVectorEnv], Any], words: str) -> None:
    with pytest.raises((ValueError, RuntimeError), match=words):
        action(_env(array_mode="torch"))
