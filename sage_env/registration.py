"""Environment ids registered with gymnasium when `sage_env` is imported (gymnasium has no plugin loading).

| id | model | defaults |
|---|---|---|
| ``sage_env/Wan-v0`` | diffusers ``WanPipeline`` (pass ``backbone=<path or Hub id>``) | 81 frames, 480x832, 20 steps, shift 3 |
| ``sage_env/HunyuanVideo15-v0`` | diffusers ``HunyuanVideo15Pipeline`` (``backbone=...``) | 81 frames, 480x848, 20 steps, shift 5 |
| ``sage_env/Toy-v0`` | the built-in toy world (no arguments needed) | see `sage_env.toy` |

``gymnasium.make(id, ...)`` returns a `DenoisingEnv`; ``gymnasium.make_vec(id, num_envs=..., group_size=...)``
returns the natively batched `DenoisingVectorEnv` through ``vector_entry_point``. Every argument of the
environments can be overridden as a keyword.
"""

from __future__ import annotations

import gymnasium as gym

__all__ = ["ENV_IDS", "register_envs"]

ENV_IDS: dict[str, dict] = {
    # Wan 2.1 480p: 81 frames at 16 fps, flow shift 3.0 (the diffusers recommendation for 480p).
    "sage_env/Wan-v0": {
        "entry_point": "sage_env.env:DenoisingEnv",
        "vector_entry_point": "sage_env.env:DenoisingVectorEnv",
        "kwargs": {
            "pipeline_class": "WanPipeline",
            "num_frames": 81,
            "height": 480,
            "width": 832,
            "num_steps": 20,
            "shift": 3.0,
        },
    },
    # The paper's setting: HunyuanVideo 1.5, 81 frames, 20 sampling steps, shift 5 (Sec. 4.1, project page).
    "sage_env/HunyuanVideo15-v0": {
        "entry_point": "sage_env.env:DenoisingEnv",
        "vector_entry_point": "sage_env.env:DenoisingVectorEnv",
        "kwargs": {
            "pipeline_class": "HunyuanVideo15Pipeline",
            "num_frames": 81,
            "height": 480,
            "width": 848,
            "num_steps": 20,
            "shift": 5.0,
        },
    },
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
