"""`DenoisingVectorEnv`: batched denoising of a flow-matching video model, one SDE step per `step`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sage_env import sde
from sage_env.backbones import VideoBackbone, load_backbone, resolve_torch_dtype
from sage_env.env.branching import BRANCH_OPTIONS, BranchPlan
from sage_env.env.denoising import DenoisingBatch, step_sde_types
from sage_env.env.episode import SCHEDULE_OPTIONS, EpisodeSchedule, check_noise_is_finite
from sage_env.env.spaces import VELOCITY_BOUND, denoising_spaces, prompt_list
from sage_env.env.trajectory import Trajectory
from sage_env.rewards import CompositeReward, as_composite_reward

__all__ = ["ARRAY_MODES", "RESET_OPTIONS", "DenoisingVectorEnv", "validate_sde_settings"]

RESET_OPTIONS = ("prompts", "seeds", *SCHEDULE_OPTIONS, *BRANCH_OPTIONS)
"""The keys `DenoisingVectorEnv.reset` accepts in ``options``."""

ARRAY_MODES = ("numpy", "torch")
_SEED_BOUND = 2**31 - 1


class DenoisingVectorEnv(VectorEnv):
    """Batched denoising of a flow-matching text-to-video model, one SDE step per `step`.

    ## Description

    ``num_envs = B * group_size`` videos are denoised together: B prompts, each generated ``group_size``
    times from different seeds (a GRPO group is the consecutive block ``[g * group_size, (g+1) * group_size)``).
    Each step moves every video from noise level ``sigma_t`` to ``sigma_{t+1}`` with the chosen SDE
    (`sage_env.sde`); after the last step the videos are decoded and scored.

    ## Action Space

    The velocity ``v`` the policy predicts for the current latents (after classifier-free guidance):
    ``Box(-1e4, 1e4, (num_envs, *latent_shape), float32)`` (`sage_env.env.spaces.VELOCITY_BOUND`). A numpy
    array or a torch tensor of any float dtype is accepted; NaN, inf and values beyond the bound are rejected.

    ## Observation Space

    A ``Dict`` with, per sub-environment:

    | key | space | meaning |
    |---|---|---|
    | ``latents`` | ``Box(-f32max, f32max, latent_shape, float32)`` | current latents ``x_t`` (any finite value) |
    | ``sigma`` | ``Box(0, 1, (), float32)`` | current noise level ``sigma_t`` |
    | ``step`` | ``Discrete(num_steps + 1)`` | index ``t`` of the next step |
    | ``prompt`` | `PromptSpace` (a ``Text``) | the prompt, a tuple of ``num_envs`` str |

    With ``array_mode="numpy"`` (default) values are numpy arrays, new ones at every call, as gymnasium's
    checker and wrappers expect. ``array_mode="torch"`` returns torch tensors on ``device`` without copies
    (for learners on a GPU; observations then alias the recorded trajectory: do not modify them in place).

    Under ``gymnasium.wrappers.vector.FlattenObservation`` an observation becomes one float64 vector per
    sub-environment: the latents, sigma, the one-hot step, then the prompt as its Unicode code points padded
    with 0 to 8192 (`PromptSpace`); ``gymnasium.spaces.utils.unflatten`` restores the dict, prompt included.

    ## Rewards

    0 at every intermediate step. At the last step: the weighted composite reward of the decoded videos
    (`sage_env.rewards.CompositeReward`). A sample whose reward failed gets NaN and
    ``info["reward_valid"]`` False (never a silent 0).

    ## Starting State

    Per-sample Gaussian noise drawn from per-sample generators seeded from ``reset(seed=...)`` (or the
    ``seeds`` option), at ``sigma = 1``.

    Branched rollouts (BranchGRPO): ``reset(options={"branch_steps": [0, 3], "branch_factor": 2})`` makes each
    block of ``branch_factor ** len(branch_steps)`` consecutive sub-environments (one prompt's group) a tree
    (`sage_env.env.branching`): they start from the block's first noise and move as one node, with that node's
    first sub-environment's velocity and noise, until a branch step's transition splits every node into
    ``branch_factor`` children, each continuing with its own first sub-environment's generator. The samples are
    the tree's leaves; their shared prefixes are bit-identical (the actions of a node's other sub-environments are
    not used before it splits; `sage_env.env.BackbonePolicy` computes one velocity per node).

    ## Episode End

    ``terminated`` is True for every sub-environment after ``num_steps`` steps; ``truncated`` is always
    False. Autoreset is disabled (``metadata["autoreset_mode"] = AutoresetMode.DISABLED``): call `reset`
    for the next batch; `step` after the end raises.

    ## Information

    Every step: ``log_prob``, ``std`` and ``mean`` of the transition and ``sde_type``. At the end also
    ``reward_components`` (``{name: (num_envs,)}``), ``reward_valid`` and ``reward_errors``.
    `DenoisingVectorEnv.trajectory` holds the full `Trajectory` (latents at every step, sigmas, log-probs,
    prompts, seeds, rewards, final videos) as torch tensors for a learner.

    ## Rendering

    ``render_mode="rgb_array"``: `render` returns one ``(H, W, 3)`` uint8 image per sub-environment, the
    first frame of its current latents decoded, so that ``RecordVideo`` films the denoising, one image per
    step (``metadata["render_fps"]`` images per second). `render_video` returns the whole current videos,
    ``(num_envs, F, H, W, 3)`` uint8, whatever the render mode.

    ## Arguments

    - ``backbone``: a `VideoBackbone`, or a model path / Hub id / ``"toy"`` for `load_backbone`;
      ``pipeline_class`` forces the backbone (e.g. ``"WanPipeline"``), ``torch_dtype`` its dtype.
    - ``reward_fn``: a reward function, a list of them, or a `CompositeReward` (see `sage_env.rewards`).
    - ``prompts``: list of prompts (or a dataset with a ``prompt`` column) sampled at `reset`; a reset
      can instead pass ``options={"prompts": [...]}`` with one prompt per group.
    - ``num_envs``, ``group_size``: batch size and GRPO group size (``group_size`` must divide ``num_envs``).
    - ``num_steps``, ``shift``: the schedule, ``backbone.sigmas(num_steps, shift)``: the model's own (for a
      diffusers pipeline, exactly the sigmas ``pipe(..., num_inference_steps=num_steps)`` uses). None: the
      model's declared steps (`sage_env.models.SamplingDefaults`) and its own shift. Or pass ``sigmas``
      explicitly (they take precedence), e.g. from a diffusers scheduler (`sage_env.sde.sigmas_from_scheduler`).
    - ``sde``: ``"sage" | "flow_grpo" | "dance_grpo" | "cps" | "ode"``; ``eta``: exploration scale.
    - ``sde_window``: ``(start, end)``: only steps ``start <= t < end`` use the SDE, the others the ODE.
    - ``log_prob_kind``: ``"gaussian"`` or ``"cps"`` (published CPS' ``-mse``).
    - ``num_frames``, ``height``, ``width``: the video size; ``fps`` passed to the reward (each the backbone's
      ``sampling_defaults`` when None).
    - ``device``: where latents live (the backbone's device when None); ``array_mode``: ``"numpy"``
      (default) or ``"torch"``; ``render_mode``: None or ``"rgb_array"``.
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
        torch_dtype: torch.dtype | str | None = None,
        num_envs: int = 1,
        group_size: int = 1,
        num_frames: int | None = None,
        height: int | None = None,
        width: int | None = None,
        num_steps: int | None = None,
        shift: float | None = None,
        sigmas: torch.Tensor | None = None,
        sde: str = "sage",
        eta: float = 0.5,
        sde_window: tuple[int, int] | None = None,
        log_prob_kind: str = "gaussian",
        fps: float | None = None,
        device: torch.device | str | None = None,
        array_mode: str = "numpy",
        render_mode: str | None = None,
    ) -> None:
        # Every cheap check first: a bad argument must not cost a model load.
        self._validate_sizes(num_envs, group_size, array_mode, render_mode)
        torch_dtype = resolve_torch_dtype(torch_dtype)
        validate_sde_settings(sde, eta, log_prob_kind)
        _validate_sampling(num_steps, shift, sde_window, fps)
        if reward_fn is None:
            raise ValueError(
                "reward_fn is required: pass a reward function (see sage_env.rewards) or a list of them."
            )
        self.reward = as_composite_reward(reward_fn)
        self.prompts = prompt_list(prompts)
        self.backbone = load_backbone(
            backbone, backbone=pipeline_class, torch_dtype=torch_dtype, device=device
        )
        self.num_envs, self.group_size = num_envs, group_size
        self.num_groups = num_envs // group_size
        self.sigmas = self._schedule(sigmas, num_steps, shift)
        self.num_steps = len(self.sigmas) - 1
        self.step_sde_types = step_sde_types(sde, self.num_steps, sde_window)
        self.sde, self.eta, self.sde_window, self.log_prob_kind = sde, float(eta), sde_window, log_prob_kind
        check_noise_is_finite(self.step_sde_types, self.sigmas, self.eta)
        num_frames, height, width = self._video_size(num_frames, height, width)
        self.latent_shape = tuple(self.backbone.latent_shape(num_frames, height, width))
        self.num_frames, self.height, self.width = num_frames, height, width
        self.fps = float(fps if fps is not None else self.backbone.default_fps)
        self.device = torch.device(device) if device is not None else self.backbone.device
        self.array_mode, self.render_mode = array_mode, render_mode
        self.single_observation_space, self.single_action_space = denoising_spaces(
            self.latent_shape, self.num_steps
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._batch: DenoisingBatch | None = None  # the batch being denoised (`sage_env.env.denoising`)
        self._decoded: tuple[torch.Tensor, torch.Tensor] | None = None  # (latents, their decoded videos)
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
        if array_mode not in ARRAY_MODES:
            raise ValueError(f"array_mode must be one of {ARRAY_MODES}, got {array_mode!r}.")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}.")

    def _video_size(
        self, num_frames: int | None, height: int | None, width: int | None
    ) -> tuple[int, int, int]:
        """The video size asked for, each unset one the backbone's declared default."""
        defaults = self.backbone.sampling_defaults
        size = {
            "num_frames": defaults.num_frames if num_frames is None else num_frames,
            "height": defaults.height if height is None else height,
            "width": defaults.width if width is None else width,
        }
        missing = [name for name, value in size.items() if value is None]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} must be given: the {type(self.backbone).__name__} declares no default video size."
            )
        return size["num_frames"], size["height"], size["width"]

    def _schedule(
        self, sigmas: torch.Tensor | None, num_steps: int | None, shift: float | None
    ) -> torch.Tensor:
        if sigmas is None:
            steps = self.backbone.sampling_defaults.num_steps if num_steps is None else num_steps
            return self.backbone.sigmas(steps, shift).cpu()
        sigmas = torch.as_tensor(sigmas, dtype=torch.float32).cpu()
        sde.validate_sigma_schedule(sigmas)
        return sigmas

    # -- reset -----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a new batch: draw prompts and per-sample seeds, and the initial noise.

        Args:
            seed: seeds the environment's generator (prompt sampling and per-sample seeds).
            options: ``{"prompts": [...]}`` one prompt per group (``num_envs // group_size``) instead of
                sampling from the prompt list; ``{"seeds": [...]}`` one seed per sample; ``{"sde_window": (start,
                end)}`` this episode's SDE steps instead of the construction's ``sde_window`` (None: every step);
                ``{"sigmas": [...]}`` this episode's schedule (from 1 to 0, at most ``num_steps`` steps) instead of
                the construction's; ``{"ode_solver": "dpmsolver++"}`` solves the deterministic steps after the
                episode's last SDE step with second-order multistep DPM-Solver++ instead of Euler
                (`sage_env.sde.multistep`); ``{"record_means": True}`` also records each transition's mean
                (`Trajectory.means`);
                ``{"branch_steps": [...], "branch_factor": 2}`` rolls out trees that split at those steps (see
                Starting State). That is how an algorithm asks for its rollout (MixGRPO's sliding window,
                GRPO-Guard's means, MixGRPO-Flash's compressed schedule, BranchGRPO's trees):
                ``reset(options=agent.rollout_options(env))``.
        """
        super().reset(seed=seed)
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        options = dict(options or {})
        unknown = set(options) - set(RESET_OPTIONS)
        if unknown:
            raise ValueError(
                f"Unknown reset options {sorted(unknown)}; allowed: {', '.join(map(repr, RESET_OPTIONS))}."
            )
        schedule = EpisodeSchedule.from_options(options, self)
        group_prompts = self._group_prompts(options.get("prompts"))
        seeds = self._sample_seeds(options.get("seeds"))
        prompts = tuple(p for p in group_prompts for _ in range(self.group_size))
        branching = BranchPlan.from_options(options, schedule.sde_types, prompts)
        self._batch = DenoisingBatch(
            self.backbone, prompts, self.group_size, seeds, schedule.sigmas, schedule.sde_types, self.eta,
            self.log_prob_kind, self.latent_shape, self.device, schedule.record_means, branching, schedule.ode_solver,
        )  # fmt: skip
        self.trajectory = None
        return self._observation(), {"seeds": self._to_array(self._batch.seeds)}

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
        prompts = prompt_list(prompts)
        if len(prompts) != self.num_groups:
            raise ValueError(
                f"options['prompts'] needs one prompt per group: {self.num_groups} "
                f"(num_envs={self.num_envs} / group_size={self.group_size}), got {len(prompts)}."
            )
        return prompts

    def _sample_seeds(self, seeds: Sequence[int] | None) -> torch.Tensor:
        if seeds is None:
            return torch.as_tensor(self.np_random.integers(0, _SEED_BOUND, self.num_envs), dtype=torch.long)
        seeds = list(seeds)
        if any(
            isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < _SEED_BOUND
            for s in seeds
        ):
            raise ValueError(f"options['seeds'] must be integers in [0, {_SEED_BOUND}), got {seeds!r}.")
        seeds = torch.as_tensor(seeds, dtype=torch.long)
        if seeds.shape != (self.num_envs,):
            raise ValueError(
                f"options['seeds'] needs one seed per sample ({self.num_envs}), got {tuple(seeds.shape)}."
            )
        return seeds

    # -- step ------------------------------------------------------------------------------------

    def step(self, actions: torch.Tensor | np.ndarray) -> tuple[dict, Any, Any, Any, dict]:
        """Apply one SDE step with the given velocities; the last step decodes and scores the videos."""
        if self._batch is None:
            raise RuntimeError("Call reset() before step().")
        if self._batch.done:
            raise RuntimeError("The episode has ended (all steps taken); call reset() to start a new batch.")
        index = self._batch.step_index
        # The inner step: inputs were validated where they entered (construction, the action here).
        out = self._batch.advance(self._velocity_from_action(actions))
        info = {
            "log_prob": out.log_prob,
            "std": out.std,
            "mean": out.mean,
            "sde_type": self._batch.sde_types[index],
        }
        rewards = torch.zeros(self.num_envs, dtype=torch.float32, device=self.device)
        terminated = self._batch.done
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
        # One reduction checks both: NaN compares False, so it fails `<=` like inf and too-large values.
        if not (actions.abs() <= VELOCITY_BOUND).all():
            if not torch.isfinite(actions).all():
                raise ValueError("The action (velocity) contains NaN or inf; check the policy's output.")
            raise ValueError(
                f"The action (velocity) reaches {actions.abs().max().item():.3g}, beyond the action space bound "
                f"{VELOCITY_BOUND:g}; a velocity (noise minus clean latents) is of order 1: check the policy."
            )
        return actions

    def _finish(self, info: dict[str, Any]) -> torch.Tensor:
        self.trajectory = self._batch.finish(self.reward, self.fps)
        self._decoded = (self._batch.latents, self.trajectory.videos)
        rewards = self.trajectory.rewards
        info["reward_components"] = {name: s.to(self.device) for name, s in rewards.components.items()}
        info["reward_valid"] = rewards.valid.to(self.device)
        info["reward_errors"] = tuple(rewards.errors)
        return rewards.total.to(self.device)

    # -- observations ------------------------------------------------------------------------------

    def _observation(self) -> dict[str, Any]:
        batch = self._batch
        return {
            "latents": self._to_array(batch.latents),
            "sigma": self._to_array(batch.sigma),
            "step": self._to_array(torch.full((self.num_envs,), batch.step_index, dtype=torch.long)),
            "prompt": batch.prompts,
        }

    def _to_array(self, value: torch.Tensor) -> torch.Tensor | np.ndarray:
        if self.array_mode == "torch":
            return value
        # A copy: successive observations and infos must not share memory (users keep them in buffers).
        return value.detach().cpu().numpy().copy()

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

    # -- rendering ---------------------------------------------------------------------------------

    def render(self) -> tuple[np.ndarray, ...] | None:
        """``rgb_array``: one ``(H, W, 3)`` uint8 image per sub-environment, the first frame of its current
        latents decoded (None when ``render_mode`` is None). `render_video` gives the whole videos."""
        if self.render_mode is None:
            return None
        return tuple(_uint8_images(self._current_videos()[:, 0]))

    def render_video(self) -> np.ndarray:
        """The current latents decoded: ``(num_envs, F, H, W, 3)`` uint8 videos (at the end of an episode, the
        generated videos; ``trajectory.videos`` holds them as float tensors). Works in any render mode."""
        return _uint8_images(self._current_videos())

    def _current_videos(self) -> torch.Tensor:
        if self._batch is None:
            raise RuntimeError("Call reset() before render() or render_video().")
        latents = self._batch.latents
        if self._decoded is None or self._decoded[0] is not latents:
            with torch.no_grad():
                self._decoded = (latents, self.backbone.decode(latents))
        return self._decoded[1]


def _uint8_images(images: torch.Tensor) -> np.ndarray:
    """``(..., 3, H, W)`` floats in [0, 1] -> ``(..., H, W, 3)`` uint8, the layout of gymnasium's rgb_array."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).movedim(-3, -1).contiguous().cpu().numpy()


def _validate_sampling(
    num_steps: int | None, shift: float | None, sde_window: tuple[int, int] | None, fps: float | None
) -> None:
    """The schedule and frame-rate arguments, before anything is loaded."""
    if num_steps is not None and (
        isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1
    ):
        raise ValueError(f"num_steps must be a positive integer (or None: the model's), got {num_steps!r}.")
    for name, value in (("shift", shift), ("fps", fps)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{name} must be a finite number > 0 (or None: the model's), got {value!r}.")
    if sde_window is not None:
        window = tuple(sde_window) if isinstance(sde_window, (list, tuple)) else None
        if (
            window is None
            or len(window) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in window)
        ):
            raise ValueError(f"sde_window must be two integers (start, end), got {sde_window!r}.")
        if not 0 <= window[0] < window[1] or (num_steps is not None and window[1] > num_steps):
            raise ValueError(
                f"sde_window {sde_window} must satisfy 0 <= start < end <= num_steps ({num_steps})."
            )


def validate_sde_settings(sde_type: str, eta: float, log_prob_kind: str) -> None:
    """Validate the SDE settings of an environment with the SDE module's own rules."""
    sde.validate_sde_type(sde_type)
    sde.validate_eta(sde_type, eta)
    if log_prob_kind not in sde.LOG_PROB_KINDS:
        raise ValueError(
            f"Unknown log_prob_kind {log_prob_kind!r}; choose one of {', '.join(sde.LOG_PROB_KINDS)}."
        )
