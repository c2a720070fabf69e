"""`PipelineBackbone`: what the backbones over a diffusers pipeline share, above all the pipeline's own schedule.

`PipelineBackbone.sigmas` returns exactly the sigmas the pipeline's ``__call__`` sets on its scheduler for
``num_inference_steps=N`` (each subclass copies its pipeline's one ``set_timesteps`` call onto a fresh copy of
``pipe.scheduler``; ``pipe.scheduler`` itself is never touched). What is equal to what:

* with ``FlowMatchEulerDiscreteScheduler`` (HunyuanVideo 1.5 as released; the tests' tiny pipelines), the
  pipeline takes Euler steps on these sigmas, so an ``ode`` rollout of `sage_env.DenoisingVectorEnv` equals
  ``pipe(..., output_type="latent")`` to float tolerance;
* the released Wan checkpoints ship ``UniPCMultistepScheduler``, a multistep solver: the env steps with its
  sigmas but with a one-step (Euler or SDE) update, so a rollout is *not* equal to ``pipe(...)``. Equality
  needs ``pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)``.

An explicit ``shift`` means what diffusers users do to change it: the same scheduler class rebuilt from
``pipe.scheduler.config`` with its shift setting replaced (``shift`` for ``FlowMatchEulerDiscreteScheduler``,
``flow_shift`` for UniPC / DPM-Solver), then the pipeline's own ``set_timesteps`` call (`make_scheduler`).
"""

from __future__ import annotations

import inspect
import math
from abc import abstractmethod
from typing import Any

import torch

from sage_env import sde
from sage_env.backbones.base import VideoBackbone

__all__ = ["PipelineBackbone"]

_SHIFT_SETTINGS = ("shift", "flow_shift")
"""Config keys under which diffusers' flow-matching schedulers keep their time shift."""


class PipelineBackbone(VideoBackbone):
    """A `VideoBackbone` over a diffusers pipeline (``self.pipeline``), sampling on the pipeline's own schedule."""

    pipeline: Any
    sequential_cfg: bool = False
    """Checkpoint each CFG branch of a forward with gradients as a whole (`_diffusers.branch_prediction`)."""

    def enable_sequential_cfg(self) -> None:
        """The training forward's CFG branches are recomputed and backpropagated one after the other: the
        activations of one branch at a time (``sequential_cfg``)."""
        self.sequential_cfg = True

    @property
    def vae(self) -> torch.nn.Module:
        """The pipeline's autoencoder."""
        return self.pipeline.vae

    @property
    def default_guidance_scale(self) -> float:
        """The declared CFG scale, or (declared None) the one ``pipe(...)`` applies by default."""
        declared = self.sampling_defaults.guidance_scale
        return self._pipeline_guidance_scale() if declared is None else declared

    def _pipeline_guidance_scale(self) -> float:
        """The default of ``guidance_scale`` in the signature of the pipeline's ``__call__``."""
        parameter = inspect.signature(type(self.pipeline).__call__).parameters.get("guidance_scale")
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise ValueError(f"{type(self.pipeline).__name__}.__call__ has no default guidance_scale.")
        return float(parameter.default)

    def make_scheduler(self, shift: float | None = None) -> Any:
        """A fresh copy of ``pipe.scheduler`` (from its config); with ``shift``, that shift setting replaced.

        Assign it to ``pipe.scheduler`` to make ``pipe(...)`` sample on ``sigmas(N, shift)``.
        """
        scheduler = self.pipeline.scheduler
        if shift is None:
            return type(scheduler).from_config(scheduler.config)
        if (
            isinstance(shift, bool)
            or not isinstance(shift, (int, float))
            or not math.isfinite(shift)
            or shift <= 0
        ):
            raise ValueError(
                f"shift must be a finite number > 0 (or None: the scheduler's own), got {shift!r}."
            )
        config = scheduler.config
        setting = next((name for name in _SHIFT_SETTINGS if name in config), None)
        ignored = config.get("use_dynamic_shifting") or (
            setting == "flow_shift" and not config.get("use_flow_sigmas")
        )
        if setting is None or ignored:
            raise ValueError(
                f"{type(scheduler).__name__} has no static flow-matching shift to replace; pass shift=None "
                "(the pipeline's own schedule) or explicit sigmas."
            )
        return type(scheduler).from_config(config, **{setting: float(shift)})

    def sigmas(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """The sigmas ``pipe(..., num_inference_steps=num_steps)`` steps through: float32 ``(N + 1,)`` ending at 0.

        ``shift=None``: the declared shift of `sampling_defaults`, and when that is None too, the scheduler as
        shipped. See the module docstring for what a given shift means and what is equal to what.
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
        scheduler = self.make_scheduler(self.sampling_defaults.shift if shift is None else shift)
        self._set_timesteps(scheduler, num_steps)
        return sde.sigmas_from_scheduler(scheduler)

    @abstractmethod
    def _set_timesteps(self, scheduler: Any, num_steps: int) -> None:
        """Call ``set_timesteps`` on ``scheduler`` exactly as the pipeline's ``__call__`` does."""
