"""`DenoisingEnv`: the single-video `gymnasium.Env`, a view of a one-sample `DenoisingVectorEnv`."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from sage_env.backbones import VideoBackbone
from sage_env.env.trajectory import Trajectory
from sage_env.env.vector import DenoisingVectorEnv

__all__ = ["DenoisingEnv"]


class DenoisingEnv(gym.Env):
    """Denoising of one video by a flow-matching text-to-video model, one SDE step per `step`.

    ## Description

    The single-video view of `DenoisingVectorEnv` (same arguments, without ``num_envs``/``group_size``): each
    step moves the video from noise level ``sigma_t`` to ``sigma_{t+1}`` with the chosen SDE; after the last
    step the video is decoded and scored. ``check_env``-clean, and works under gymnasium's wrappers
    (``TimeLimit``, ``RecordEpisodeStatistics``, ``RecordVideo``, ``FlattenObservation``).

    ## Action Space

    ``Box(-1e4, 1e4, latent_shape, float32)``: the predicted velocity for the current latents (after CFG); a
    numpy array or a torch tensor. NaN, inf and values beyond the bound are rejected.

    ## Observation Space

    ``Dict(latents=Box(-f32max, f32max, latent_shape, float32), sigma=Box(0, 1, (), float32),
    step=Discrete(num_steps + 1), prompt=PromptSpace())``: numpy values (new arrays at every call) with
    ``array_mode="numpy"`` (default), torch tensors with ``array_mode="torch"``; the prompt is a str.
    ``FlattenObservation`` turns it into one float64 vector: latents, sigma, one-hot step, then the prompt's
    Unicode code points padded with 0 to 8192 (`PromptSpace`); ``gymnasium.spaces.utils.unflatten`` with the
    unwrapped observation space restores the dict, prompt included.

    ## Rewards

    0 before the last step; then the composite reward of the decoded video (NaN with
    ``info["reward_valid"] = False`` when the reward failed).

    ## Starting State

    Gaussian noise at ``sigma = 1`` from a generator seeded by ``reset(seed=...)`` (or ``options["seed"]``);
    the prompt is drawn from ``prompts`` (or given as ``options["prompt"]``).

    ## Episode End

    ``terminated`` after ``num_steps`` steps; never truncated by the environment itself (``TimeLimit`` may
    truncate earlier). `step` after the end raises.

    ## Information

    ``log_prob``, ``std``, ``mean``, ``sde_type`` each step; ``reward_components``, ``reward_valid``,
    ``reward_errors`` at the end. `DenoisingEnv.trajectory` holds the recorded `Trajectory`.

    ## Rendering

    ``render_mode="rgb_array"``: `render` returns the first frame of the current latents decoded, an
    ``(H, W, 3)`` uint8 image (``RecordVideo`` films the denoising, one image per step); `render_video` returns
    the whole current video ``(F, H, W, 3)`` uint8 in any render mode (after the last step: the generated
    video).

    ## Arguments

    See `DenoisingVectorEnv`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(
        self, backbone: VideoBackbone | str, reward_fn: Any, prompts: Any = None, **kwargs: Any
    ) -> None:
        for key in ("num_envs", "group_size"):
            if key in kwargs:
                raise ValueError(f"DenoisingEnv denoises one video; {key} belongs to DenoisingVectorEnv.")
        self._vector = DenoisingVectorEnv(backbone, reward_fn, prompts, num_envs=1, group_size=1, **kwargs)
        self.observation_space = self._vector.single_observation_space
        self.action_space = self._vector.single_action_space
        self.render_mode = self._vector.render_mode

    @property
    def trajectory(self) -> Trajectory | None:
        """The recorded trajectory of the finished episode (None before the end)."""
        return self._vector.trajectory

    @property
    def backbone(self) -> VideoBackbone:
        """The video model whose latents this environment denoises."""
        return self._vector.backbone

    @property
    def num_steps(self) -> int:
        """Denoising steps of an episode."""
        return self._vector.num_steps

    @property
    def sigmas(self) -> torch.Tensor:
        """The schedule of an episode (``(num_steps + 1,)``, 1 down to 0)."""
        return self._vector.sigmas

    @property
    def group_size(self) -> int:
        """Videos per prompt in an episode: 1 (make GRPO groups with `Trajectory.concat` of several episodes)."""
        return 1

    @property
    def sde(self) -> str:
        """The SDE type of the stochastic steps (see `DenoisingVectorEnv`)."""
        return self._vector.sde

    @property
    def eta(self) -> float:
        """The exploration scale of the SDE."""
        return self._vector.eta

    @property
    def log_prob_kind(self) -> str:
        """How transitions are scored."""
        return self._vector.log_prob_kind

    @property
    def sde_window(self) -> tuple[int, int] | None:
        """The steps that use the SDE (None: all)."""
        return self._vector.sde_window

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new video; ``options`` may carry ``{"prompt": str, "seed": int}`` and the schedule options
        ``sigmas``, ``sde_window``, ``ode_solver``, ``record_means`` (see `DenoisingVectorEnv.reset`)."""
        super().reset(seed=seed)
        options = dict(options or {})
        passed_on = ("sigmas", "sde_window", "ode_solver", "record_means")
        unknown = set(options) - {"prompt", "seed", *passed_on}
        if unknown:
            raise ValueError(
                f"Unknown reset options {sorted(unknown)}; allowed: 'prompt', 'seed', "
                f"{', '.join(map(repr, passed_on))}."
            )
        vector_options = {key: options[key] for key in passed_on if key in options}
        if "prompt" in options:
            vector_options["prompts"] = [options["prompt"]]
        if "seed" in options:
            vector_options["seeds"] = [options["seed"]]
        observation, info = self._vector.reset(seed=seed, options=vector_options)
        return self._unbatch(observation), self._unbatch_info(info)

    def step(self, action: torch.Tensor | np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        """Apply one SDE step with the velocity ``action`` (shape ``latent_shape``)."""
        if not isinstance(action, (torch.Tensor, np.ndarray)):
            raise ValueError(
                f"The action must be a torch.Tensor or numpy array of velocities, got {type(action).__name__}."
            )
        observation, reward, terminated, truncated, info = self._vector.step(action[None])
        return (
            self._unbatch(observation),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            self._unbatch_info(info),
        )

    def render(self) -> np.ndarray | None:
        """``rgb_array``: the first frame of the current latents decoded, ``(H, W, 3)`` uint8."""
        frames = self._vector.render()
        return None if frames is None else frames[0]

    def render_video(self) -> np.ndarray:
        """The current latents decoded, ``(F, H, W, 3)`` uint8 (after the last step: the generated video)."""
        return self._vector.render_video()[0]

    def _unbatch(self, observation: dict[str, Any]) -> dict[str, Any]:
        unbatched = {key: value[0] for key, value in observation.items()}
        if self._vector.array_mode == "numpy":
            # Indexing gives numpy scalars; gymnasium expects a 0-d array for Box(()) and np.int64 for Discrete.
            unbatched["sigma"] = np.asarray(unbatched["sigma"], dtype=np.float32)
            unbatched["step"] = np.int64(unbatched["step"])
        return unbatched

    def _unbatch_info(self, info: dict[str, Any]) -> dict[str, Any]:
        return {
            key: self._unbatch_info(value)
            if isinstance(value, dict)
            else value[0]
            if isinstance(value, (torch.Tensor, np.ndarray, tuple))
            else value
            for key, value in info.items()
        }
