"""Environment ids registered with gymnasium when `sage_env` is imported (gymnasium has no plugin loading).

| id | model | defaults |
|---|---|---|
| ``sage_env/Wan-v0`` | diffusers ``WanPipeline`` (pass ``backbone=<path or Hub id>``) | ``sampling_defaults("WanPipeline")`` |
| ``sage_env/HunyuanVideo15-v0`` | diffusers ``HunyuanVideo15Pipeline`` (``backbone=...``) | ``sampling_defaults("HunyuanVideo15Pipeline")`` |
| ``sage_env/Toy-v0`` | the built-in toy world (no arguments needed) | see `sage_env.toy.env` |

The video size, number of steps and fps of each id are the model's `sage_env.models.SamplingDefaults`; the
schedule is the pipeline's own (its scheduler as shipped: flow shift 3 for Wan 2.1 T2V, 5 for HunyuanVideo 1.5
480p). ``gymnasium.make(id, ...)`` returns a `DenoisingEnv`; ``gymnasium.make_vec(id, num_envs=...,
group_size=...)`` returns the natively batched `DenoisingVectorEnv` through ``vector_entry_point``. Every
argument of the environments can be overridden as a keyword.
"""

from __future__ import annotations

import gymnasium as gym

from sage_env.models import sampling_defaults

__all__ = ["ENV_IDS", "register_envs"]


def _pipeline_env(pipeline_class: str) -> dict:
    return {
        "entry_point": "sage_env.env:DenoisingEnv",
        "vector_entry_point": "sage_env.env:DenoisingVectorEnv",
        "kwargs": {"pipeline_class": pipeline_class, **sampling_defaults(pipeline_class).env_kwargs()},
    }


ENV_IDS: dict[str, dict] = {
    "sage_env/Wan-v0": _pipeline_env("WanPipeline"),
    # The paper's base model (Sec. 4.1).
    "sage_env/HunyuanVideo15-v0": _pipeline_env("HunyuanVideo15Pipeline"),
    "sage_env/Toy-v0": {
        "entry_point": "sage_env.toy.env:make_toy_env",
        "vector_entry_point": "sage_env.toy.env:make_toy_vector_env",
        "kwargs": {},
    },
}


def register_envs() -> None:
    """Register every id of `ENV_IDS` (idempotent)."""
    for env_id, spec in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, **spec)
