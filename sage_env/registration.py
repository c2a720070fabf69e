"""Environment ids registered with gymnasium when `sage_env` is imported (gymnasium has no plugin loading).

| id | model | defaults |
|---|---|---|
| ``sage_env/Wan-v0`` | diffusers ``WanPipeline`` (pass ``backbone=<path or Hub id>``) | ``WanBackbone.sampling_defaults`` |
| ``sage_env/HunyuanVideo15-v0`` | diffusers ``HunyuanVideo15Pipeline`` (``backbone=...``) | ``HunyuanVideo15Backbone.sampling_defaults`` |
| ``sage_env/Toy-v0`` | the built-in toy world (no arguments needed) | see `sage_env.toy.env` |
| ``sage_env/<name>-v0`` | every backbone an installed package declares (entry-point group ``sage_grpo.backbones``) | its class's ``sampling_defaults`` |

The video size, number of steps and fps of each id are the backbone class's `sage_env.models.SamplingDefaults`,
read when the environment is made (registering imports no backbone); the schedule is the pipeline's own (its
scheduler as shipped: flow shift 3 for Wan 2.1 T2V, 5 for HunyuanVideo 1.5 480p). ``gymnasium.make(id, ...)``
returns a `DenoisingEnv`; ``gymnasium.make_vec(id, num_envs=..., group_size=...)`` returns the natively batched
`DenoisingVectorEnv` through ``vector_entry_point``. Every argument of the environments can be overridden as a
keyword. A package installed after `sage_env` was imported gets its ids from `register_envs`.
"""

from __future__ import annotations

import gymnasium as gym

from sage_env.backbones import BACKBONES
from sage_env.plugins import own_names

__all__ = ["ENV_IDS", "plugin_env_ids", "register_envs"]


def _pipeline_env(pipeline_class: str) -> dict:
    return {
        "entry_point": "sage_env.env:DenoisingEnv",
        "vector_entry_point": "sage_env.env:DenoisingVectorEnv",
        "kwargs": {"pipeline_class": pipeline_class},
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


def plugin_env_ids() -> dict[str, dict]:
    """``sage_env/<name>-v0`` for every backbone an installed package declares (none is imported)."""
    built_in = set(own_names("backbones"))
    return {f"sage_env/{name}-v0": _pipeline_env(name) for name in BACKBONES.names() if name not in built_in}


def register_envs() -> None:
    """Register every id of `ENV_IDS` and of `plugin_env_ids` not registered yet (idempotent)."""
    for env_id, spec in {**ENV_IDS, **plugin_env_ids()}.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, **spec)
