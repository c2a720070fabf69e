"""Denoising of a flow-matching video model as gymnasium environments.

`DenoisingVectorEnv` is natively batched: B prompts x ``group_size`` generations advance together, latents
stay torch tensors on the model's device, and the policy (an agent wrapping a `VideoBackbone`) makes one
batched call per step. `DenoisingEnv` is the single-video `gymnasium.Env` built on the same code.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sage_env import sde
from sage_env.backbones import VideoBackbone, load_backbone
from sage_env.rewards import CompositeReward, RewardOutput, as_composite_reward

__all__ = ["BackbonePolicy", "DenoisingEnv", "DenoisingVectorEnv", "Trajectory", "run_episode"]

_MAX_PROMPT_LENGTH = 8192
_SEED_BOUND = 2**31 - 1


@dataclass
class Trajectory:
    """Everything a learner needs to recompute log-probabilities of a batch of rollouts.

    Tensors are batch-first (``N`` samples, ``T`` steps) and live on the environment's device.

    Args:
        prompts: the prompt of each sample.
        group_index: ``(N,)`` index of each sample's group (samples of a group share the prompt).
        seeds: ``(N,)`` per-sample seeds: initial noise and every step's noise come from them.
        sigmas: ``(N, T + 1)`` noise levels, from 1 down to 0.
        latents: ``(N, T + 1, *latent_shape)`` float32 latents before each step and the final ones.
        log_probs: ``(N, T)`` rollout-phase log-probability of each transition (0 where deterministic).
        stds: ``(N, T)`` noise std of each transition.
        trainable: ``(N, T)`` bool, True where the step was stochastic (std > 0): only these have a policy
            gradient.
        sde_types: the SDE type applied at each of the ``T`` steps (``"ode"`` outside the SDE window).
        eta: exploration scale of the stochastic steps.
        log_prob_kind: how log-probabilities were computed (see `sage_env.sde.gaussian_log_prob`).
        rewards: the `RewardOutput` of the final videos (None until the episode ends).
        videos: the decoded final videos ``(N, F, 3, H, W)`` in [0, 1] (None until the episode ends).
    """

    prompts: tuple[str, ...]
    group_index: torch.Tensor
    seeds: torch.Tensor
    sigmas: torch.Tensor
    latents: torch.Tensor
    log_probs: torch.Tensor
    stds: torch.Tensor
    trainable: torch.Tensor
    sde_types: tuple[str, ...]
    eta: float
    log_prob_kind: str = "gaussian"
    rewards: RewardOutput | None = None
    videos: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_steps(self) -> int:
        """Number of denoising steps ``T``."""
        return self.log_probs.shape[1]

    def select(self, index: torch.Tensor | Sequence[int]) -> Trajectory:
        """The samples ``index`` (in that order) as a new trajectory."""
        index = torch.as_tensor(index, dtype=torch.long)
        values = {}
        for field_ in fields(self):
            value = getattr(self, field_.name)
            if isinstance(value, torch.Tensor):
                value = value[index.to(value.device)]
            elif field_.name == "prompts":
                value = tuple(value[i] for i in index.tolist())
            elif isinstance(value, RewardOutput):
                value = _select_rewards(value, index)
            values[field_.name] = value
        return replace(self, **values)


def _select_rewards(rewards: RewardOutput, index: torch.Tensor) -> RewardOutput:
    return RewardOutput(
        total=rewards.total[index],
        components={name: scores[index] for name, scores in rewards.components.items()},
        valid=rewards.valid[index],
        errors=[rewards.errors[i] for i in index.tolist()],
        weights=dict(rewards.weights),
    )


def _prompt_list(prompts: Any) -> list[str]:
    """Accept a list of strings or a dataset with a ``prompt`` column."""
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
    if not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("Every prompt must be a non-empty string.")
    return prompts


def _prompt_space(
    prompts: Sequence[str], charset: frozenset[str] = frozenset(string.printable)
) -> spaces.Text:
    charset = set(charset) | {c for prompt in prompts for c in prompt}
    return spaces.Text(max_length=_MAX_PROMPT_LENGTH, min_length=1, charset=frozenset(charset))


class DenoisingVectorEnv(VectorEnv):
    """Batched denoising of a flow-matching text-to-video model, one SDE step per `step`.

    ## Description

    ``num_envs = B * group_size`` videos are denoised together: B prompts, each generated ``group_size``
    times from different seeds (a GRPO group is the consecutive block ``[g * group_size, (g+1) * group_size)``).
    Each step moves every video from noise level ``sigma_t`` to ``sigma_{t+1}`` with the chosen SDE
    (`sage_env.sde`); after the last step the videos are decoded and scored.

    ## Action Space

    The velocity ``v`` the policy predicts for the current latents (after classifier-free guidance):
    ``Box(-inf, inf, (num_envs, *latent_shape), float32)``. Any float dtype is accepted; NaN/inf are rejected.

    ## Observation Space

    A ``Dict`` with, per sub-environment:

    | key | space | meaning |
    |---|---|---|
    | ``latents`` | ``Box(-inf, inf, latent_shape, float32)`` | current latents ``x_t`` |
    | ``sigma`` | ``Box(0, 1, (), float32)`` | current noise level ``sigma_t`` |
    | ``step`` | ``Discrete(num_steps + 1)`` | index ``t`` of the next step |
    | ``prompt`` | ``Text`` | the prompt |

    In ``array_mode="torch"`` (default) values are torch tensors on ``device`` (prompts a tuple of str);
    in ``array_mode="numpy"`` numpy arrays, for `gymnasium.utils.env_checker.check_env`.

    ## Rewards

    0 at every intermediate step. At the last step: the weighted composite reward of the decoded videos
    (`sage_env.rewards.CompositeReward`). A sample whose reward failed gets NaN and
    ``info["reward_valid"]`` False (never a silent 0).

    ## Starting State

    Per-sample Gaussian noise drawn from per-sample generators seeded from ``reset(seed=...)`` (or the
    ``seeds`` option), at ``sigma = 1``.

    ## Episode End

    ``terminated`` is True for every sub-environment after ``num_steps`` steps; ``truncated`` is always
    False. Autoreset is disabled (``metadata["autoreset_mode"] = AutoresetMode.DISABLED``): call `reset`
    for the next batch; `step` after the end raises.

    ## Information

    Every step: ``log_prob``, ``std`` and ``mean`` of the transition and ``sde_type``. At the end also
    ``reward_components`` (``{name: (num_envs,)}``), ``reward_valid`` and ``reward_errors``.
    `DenoisingVectorEnv.trajectory` holds the full `Trajectory` (latents at every step, sigmas, log-probs,
    prompts, seeds, rewards) for a learner.

    ## Arguments

    - ``backbone``: a `VideoBackbone`, or a model path / Hub id / ``"toy"`` for `load_backbone`;
      ``pipeline_class`` forces the backbone (e.g. ``"WanPipeline"``), ``torch_dtype`` its dtype.
    - ``reward_fn``: a reward function, a list of them, or a `CompositeReward` (see `sage_env.rewards`).
    - ``prompts``: list of prompts (or a dataset with a ``prompt`` column) sampled at `reset`; a reset
      can instead pass ``options={"prompts": [...]}`` with one prompt per group.
    - ``num_envs``, ``group_size``: batch size and GRPO group size (``group_size`` must divide ``num_envs``).
    - ``num_steps``, ``shift``: the flow-matching schedule (`sage_env.sde.flow_match_sigmas`); or pass
      ``sigmas`` explicitly, e.g. from a diffusers scheduler (`sage_env.sde.sigmas_from_scheduler`).
    - ``sde``: ``"sage" | "flow_grpo" | "dance_grpo" | "cps" | "ode"``; ``eta``: exploration scale.
    - ``sde_window``: ``(start, end)``: only steps ``start <= t < end`` use the SDE, the others the ODE.
    - ``log_prob_kind``: ``"gaussian"`` or ``"cps"`` (published CPS' ``-mse``).
    - ``num_frames``, ``height``, ``width``: the video size; ``fps`` passed to the reward (the backbone's
      default when None).
    - ``device``: where latents live (the backbone's device when None); ``array_mode``: ``"torch"`` or
      ``"numpy"``; ``render_mode``: None or ``"rgb_array"`` (decoded current frames, uint8).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["rgb_array"],
        "autoreset_mode": AutoresetMode.DISABLED,
        "render_fps": 8,
    }

    def __init__(
        self,
        backbone: VideoBackbone | str,
        reward_fn: Callable | Sequence[Callable] | CompositeReward | None,
        prompts: Sequence[str] | Any = None,
        *,
        pipeline_class: str | None = None,
        torch_dtype: torch.dtype | None = None,
        num_envs: int = 1,
        group_size: int = 1,
        num_frames: int,
        height: int,
        width: int,
        num_steps: int = 20,
        shift: float = 5.0,
        sigmas: torch.Tensor | None = None,
        sde: str = "sage",
        eta: float = 0.5,
        sde_window: tuple[int, int] | None = None,
        log_prob_kind: str = "gaussian",
        fps: float | None = None,
        device: torch.device | str | None = None,
        array_mode: str = "torch",
        render_mode: str | None = None,
    ) -> None:
        self._validate_sizes(num_envs, group_size, array_mode, render_mode)
        validate_sde_settings(sde, eta, log_prob_kind)
        if reward_fn is None:
            raise ValueError(
                "reward_fn is required: pass a reward function (see sage_env.rewards) or a list of them."
            )
        self.backbone = load_backbone(
            backbone, backbone=pipeline_class, torch_dtype=torch_dtype, device=device
        )
        self.reward = as_composite_reward(reward_fn)
        self.prompts = _prompt_list(prompts)
        self.num_envs, self.group_size = num_envs, group_size
        self.num_groups = num_envs // group_size
        self.sigmas = self._schedule(sigmas, num_steps, shift)
        self.num_steps = len(self.sigmas) - 1
        self.step_sde_types = self._step_sde_types(sde, sde_window)
        self.sde, self.eta, self.sde_window, self.log_prob_kind = sde, float(eta), sde_window, log_prob_kind
        self.latent_shape = tuple(self.backbone.latent_shape(num_frames, height, width))
        self.num_frames, self.height, self.width = num_frames, height, width
        self.fps = float(fps if fps is not None else self.backbone.default_fps)
        self.device = torch.device(device) if device is not None else self.backbone.device
        self.array_mode, self.render_mode = array_mode, render_mode
        self._build_spaces()
        self._latents: torch.Tensor | None = None
        self._step_index = 0
        self._recorder: dict[str, list[torch.Tensor]] = {}
        self.trajectory: Trajectory | None = None

    # -- construction ----------------------------------------------------------------------------

    @staticmethod
    def _validate_sizes(num_envs: int, group_size: int, array_mode: str, render_mode: str | None) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}.")
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}.")
        if num_envs % group_size:
            raise ValueError(
                f"group_size ({group_size}) must divide num_envs ({num_envs}): num_envs = prompts per batch x "
                f"group_size, e.g. num_envs={(num_envs // group_size + 1) * group_size}."
            )
        if array_mode not in ("torch", "numpy"):
            raise ValueError(f"array_mode must be 'torch' or 'numpy', got {array_mode!r}.")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}.")

    @staticmethod
    def _schedule(sigmas: torch.Tensor | None, num_steps: int, shift: float) -> torch.Tensor:
        if sigmas is None:
            return sde.flow_match_sigmas(num_steps, shift)
        sigmas = torch.as_tensor(sigmas, dtype=torch.float32).cpu()
        sde.validate_sigma_schedule(sigmas)
        return sigmas

    def _step_sde_types(self, sde_type: str, sde_window: tuple[int, int] | None) -> tuple[str, ...]:
        start, end = (0, self.num_steps) if sde_window is None else sde_window
        if not 0 <= start < end <= self.num_steps:
            raise ValueError(
                f"sde_window {sde_window} must satisfy 0 <= start < end <= num_steps ({self.num_steps})."
            )
        return tuple(sde_type if start <= step < end else "ode" for step in range(self.num_steps))

    def _build_spaces(self) -> None:
        self.single_observation_space = spaces.Dict(
            {
                "latents": spaces.Box(-np.inf, np.inf, self.latent_shape, np.float32),
                "sigma": spaces.Box(0.0, 1.0, (), np.float32),
                "step": spaces.Discrete(self.num_steps + 1),
                "prompt": _prompt_space(self.prompts),
            }
        )
        self.single_action_space = spaces.Box(-np.inf, np.inf, self.latent_shape, np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    # -- reset -----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new batch: draw prompts and per-sample seeds, and the initial noise.

        Args:
            seed: seeds the environment's generator (prompt sampling and per-sample seeds).
            options: ``{"prompts": [...]}`` one prompt per group (``num_envs // group_size``) instead of
                sampling from the prompt list; ``{"seeds": [...]}`` one seed per sample.
        """
        super().reset(seed=seed)
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        options = dict(options or {})
        unknown = set(options) - {"prompts", "seeds"}
        if unknown:
            raise ValueError(f"Unknown reset options {sorted(unknown)}; allowed: 'prompts', 'seeds'.")
        group_prompts = self._group_prompts(options.get("prompts"))
        seeds = self._sample_seeds(options.get("seeds"))
        self._start(group_prompts, seeds)
        return self._observation(), {"seeds": self._to_array(self._seeds)}

    def _group_prompts(self, prompts: Sequence[str] | None) -> list[str]:
        if prompts is None:
            if not self.prompts:
                raise ValueError(
                    "No prompts: pass prompts=... at construction or reset(options={'prompts': [...]})."
                )
            # Distinct prompts per batch whenever the list is long enough.
            replace_ = self.num_groups > len(self.prompts)
            return [
                self.prompts[i]
                for i in self.np_random.choice(len(self.prompts), self.num_groups, replace=replace_)
            ]
        prompts = _prompt_list(prompts)
        if len(prompts) != self.num_groups:
            raise ValueError(
                f"options['prompts'] needs one prompt per group: {self.num_groups} "
                f"(num_envs={self.num_envs} / group_size={self.group_size}), got {len(prompts)}."
            )
        self._widen_prompt_space(prompts)
        return prompts

    def _widen_prompt_space(self, prompts: Sequence[str]) -> None:
        # The Text space's charset must cover every prompt the env can emit.
        space = self.single_observation_space["prompt"]
        if any(c not in space.character_set for prompt in prompts for c in prompt):
            self.single_observation_space.spaces["prompt"] = _prompt_space(prompts, space.character_set)
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def _sample_seeds(self, seeds: Sequence[int] | None) -> torch.Tensor:
        if seeds is None:
            return torch.as_tensor(self.np_random.integers(0, _SEED_BOUND, self.num_envs), dtype=torch.long)
        seeds = torch.as_tensor(list(seeds), dtype=torch.long)
        if seeds.shape != (self.num_envs,):
            raise ValueError(
                f"options['seeds'] needs one seed per sample ({self.num_envs}), got {tuple(seeds.shape)}."
            )
        return seeds

    def _start(self, group_prompts: list[str], seeds: torch.Tensor) -> None:
        self._prompts = tuple(p for p in group_prompts for _ in range(self.group_size))
        self._seeds = seeds
        self._generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        shape = (self.num_envs, *self.latent_shape)
        self._latents = sde.sample_noise(shape, self._generators, self.device)
        self._sigmas = self.sigmas.to(self.device).expand(self.num_envs, -1)
        self._step_index = 0
        self._recorder = {"latents": [self._latents], "log_probs": [], "stds": [], "trainable": []}
        self.trajectory = None

    # -- step ------------------------------------------------------------------------------------

    def step(self, actions: torch.Tensor | np.ndarray) -> tuple[dict, Any, Any, Any, dict]:
        """Apply one SDE step with the given velocities; the last step decodes and scores the videos."""
        if self._latents is None:
            raise RuntimeError("Call reset() before step().")
        if self._step_index >= self.num_steps:
            raise RuntimeError("The episode has ended (all steps taken); call reset() to start a new batch.")
        velocity = self._velocity_from_action(actions)
        index = self._step_index
        with torch.no_grad():  # the rollout is data; learners recompute log-probs with gradients
            out = sde.sde_step(
                self.step_sde_types[index],
                self._latents,
                velocity,
                self._sigmas[:, index],
                self._sigmas[:, index + 1],
                self.eta,
                generator=self._generators,
                log_prob_kind=self.log_prob_kind,
            )
        self._record(out)
        self._latents, self._step_index = out.x_next, index + 1
        info = {
            "log_prob": out.log_prob,
            "std": out.std,
            "mean": out.mean,
            "sde_type": self.step_sde_types[index],
        }
        rewards = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        terminated = self._step_index == self.num_steps
        if terminated:
            rewards = self._finish(info)
        done = torch.full((self.num_envs,), terminated, dtype=torch.bool, device=self.device)
        truncated = torch.zeros_like(done)
        return (
            self._observation(),
            self._to_array(rewards),
            self._to_array(done),
            self._to_array(truncated),
            self._convert_info(info),
        )

    def _velocity_from_action(self, actions: torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(actions, np.ndarray):
            actions = torch.from_numpy(actions)
        if not isinstance(actions, torch.Tensor):
            raise ValueError(
                f"The action must be a torch.Tensor or numpy array of velocities, got {type(actions).__name__}."
            )
        expected = (self.num_envs, *self.latent_shape)
        if tuple(actions.shape) != expected:
            raise ValueError(
                f"The action (velocity) must have shape {expected} (num_envs, *latent_shape), got {tuple(actions.shape)}."
            )
        if not actions.is_floating_point():
            raise ValueError(f"The action (velocity) must be a float tensor, got {actions.dtype}.")
        actions = actions.to(self.device, torch.float32)
        if not torch.isfinite(actions).all():
            raise ValueError("The action (velocity) contains NaN or inf; check the policy's output.")
        return actions

    def _record(self, out: sde.SDEStepOutput) -> None:
        self._recorder["latents"].append(out.x_next)
        self._recorder["log_probs"].append(out.log_prob)
        self._recorder["stds"].append(out.std)
        self._recorder["trainable"].append(out.trainable)

    def _finish(self, info: dict[str, Any]) -> torch.Tensor:
        videos = self.backbone.decode(self._latents)
        rewards = self.reward(videos, self._prompts, fps=self.fps)
        self.trajectory = self._build_trajectory(rewards, videos)
        info["reward_components"] = {name: s.to(self.device) for name, s in rewards.components.items()}
        info["reward_valid"] = rewards.valid.to(self.device)
        info["reward_errors"] = tuple(rewards.errors)
        return rewards.total.to(self.device)

    def _build_trajectory(self, rewards: RewardOutput, videos: torch.Tensor) -> Trajectory:
        stacked = {name: torch.stack(values, dim=1) for name, values in self._recorder.items()}
        return Trajectory(
            prompts=self._prompts,
            group_index=torch.arange(self.num_groups).repeat_interleave(self.group_size),
            seeds=self._seeds.clone(),
            sigmas=self._sigmas.clone(),
            latents=stacked["latents"],
            log_probs=stacked["log_probs"],
            stds=stacked["stds"],
            trainable=stacked["trainable"],
            sde_types=self.step_sde_types,
            eta=self.eta,
            log_prob_kind=self.log_prob_kind,
            rewards=rewards,
            videos=videos,
        )

    # -- observations ------------------------------------------------------------------------------

    def _observation(self) -> dict[str, Any]:
        index = self._step_index
        return {
            "latents": self._to_array(self._latents),
            "sigma": self._to_array(self._sigmas[:, index]),
            "step": self._to_array(torch.full((self.num_envs,), index, dtype=torch.long)),
            "prompt": self._prompts,
        }

    def _to_array(self, value: torch.Tensor) -> torch.Tensor | np.ndarray:
        if self.array_mode == "torch":
            return value
        array = value.detach().cpu().numpy()
        return array.astype(np.float32) if array.dtype == np.float64 else array.copy()

    def _convert_info(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.array_mode == "torch":
            return info
        return {
            key: self._convert_info(value)
            if isinstance(value, dict)
            else self._to_array(value)
            if isinstance(value, torch.Tensor)
            else value
            for key, value in info.items()
        }

    def render(self) -> tuple[np.ndarray, ...] | None:
        """``rgb_array``: the decoded current latents, one ``(F, H, W, 3)`` uint8 array per sub-environment."""
        if self.render_mode is None or self._latents is None:
            return None
        with torch.no_grad():
            videos = self.backbone.decode(self._latents)
        frames = (videos.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).cpu().numpy()
        return tuple(frames)


def validate_sde_settings(sde_type: str, eta: float, log_prob_kind: str) -> None:
    """Validate the SDE settings of an environment with the SDE module's own rules."""
    sde.validate_sde_type(sde_type)
    sde.validate_eta(sde_type, eta)
    if log_prob_kind not in sde.LOG_PROB_KINDS:
        raise ValueError(
            f"Unknown log_prob_kind {log_prob_kind!r}; choose one of {', '.join(sde.LOG_PROB_KINDS)}."
        )


class DenoisingEnv(gym.Env):
    """Denoising of one video by a flow-matching text-to-video model, one SDE step per `step`.

    The single-video view of `DenoisingVectorEnv` (same arguments, without ``num_envs``/``group_size``):

    ## Action Space
    ``Box(-inf, inf, latent_shape, float32)``: the predicted velocity for the current latents (after CFG).

    ## Observation Space
    ``Dict(latents=Box(latent_shape), sigma=Box(0, 1, ()), step=Discrete(num_steps + 1), prompt=Text)``.

    ## Rewards
    0 before the last step; then the composite reward of the decoded video (NaN with
    ``info["reward_valid"] = False`` when the reward failed).

    ## Episode End
    ``terminated`` after ``num_steps`` steps; never truncated. `step` after the end raises.

    ## Information
    ``log_prob``, ``std``, ``mean``, ``sde_type`` each step; ``reward_components``, ``reward_valid``,
    ``reward_errors`` at the end. `DenoisingEnv.trajectory` holds the recorded `Trajectory`.

    ## Arguments
    See `DenoisingVectorEnv`. ``array_mode="numpy"`` gives numpy observations for `check_env`.
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

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new video; ``options`` may carry ``{"prompt": str, "seed": int}``."""
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"prompt", "seed"}
        if unknown:
            raise ValueError(f"Unknown reset options {sorted(unknown)}; allowed: 'prompt', 'seed'.")
        vector_options = {}
        if "prompt" in options:
            vector_options["prompts"] = [options["prompt"]]
        if "seed" in options:
            vector_options["seeds"] = [options["seed"]]
        observation, info = self._vector.reset(seed=seed, options=vector_options)
        self.observation_space = self._vector.single_observation_space
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
        """``rgb_array``: the decoded current video, ``(F, H, W, 3)`` uint8."""
        frames = self._vector.render()
        return None if frames is None else frames[0]

    def _unbatch(self, observation: dict[str, Any]) -> dict[str, Any]:
        unbatched = {key: value[0] for key, value in observation.items()}
        if self._vector.array_mode == "numpy":
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


class BackbonePolicy:
    """A backbone used as the policy: observation -> velocity (with classifier-free guidance), no gradients.

    Args:
        backbone: the video model.
        guidance_scale: CFG scale (None: the backbone's default).
        negative_prompt: negative prompt for CFG (None: the backbone's default).
        batch_size: videos per transformer forward (None: the whole batch at once).
    """

    def __init__(
        self,
        backbone: VideoBackbone,
        guidance_scale: float | None = 1.0,
        negative_prompt: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}.")
        self.backbone, self.guidance_scale = backbone, guidance_scale
        self.negative_prompt, self.batch_size = negative_prompt, batch_size

    @torch.no_grad()
    def __call__(self, observation: dict[str, Any]) -> torch.Tensor:
        """The velocity for a batched observation of a `DenoisingVectorEnv`."""
        latents = torch.as_tensor(observation["latents"], device=self.backbone.device)
        sigma = torch.as_tensor(observation["sigma"], device=self.backbone.device)
        conditioning = self.backbone.encode_prompts(list(observation["prompt"]), self.negative_prompt)
        size = self.batch_size or len(latents)
        parts = [
            self.backbone.predict_velocity(
                latents[start : start + size],
                sigma[start : start + size],
                conditioning.select(range(start, min(start + size, len(latents)))),
                self.guidance_scale,
            )
            for start in range(0, len(latents), size)
        ]
        return torch.cat(parts)


def run_episode(
    env: DenoisingVectorEnv,
    policy: Callable[[dict[str, Any]], torch.Tensor],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Trajectory:
    """Reset ``env``, step it with ``policy(observation) -> velocity`` until the episode ends, return the
    recorded `Trajectory`."""
    observation, _ = env.reset(seed=seed, options=options)
    while True:
        observation, _, terminated, _, _ = env.step(policy(observation))
        if bool(terminated.all()):
            return env.trajectory
