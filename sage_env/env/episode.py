"""One episode's schedule from ``reset`` options: its noise levels, the SDE type of each step, how its deterministic
steps after the last SDE step are solved, and what the trajectory records beyond the default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sage_env import sde
from sage_env.env.denoising import step_sde_types

__all__ = ["SCHEDULE_OPTIONS", "EpisodeSchedule", "check_noise_is_finite"]

SCHEDULE_OPTIONS = ("sigmas", "sde_window", "ode_solver", "record_means")
"""The ``reset`` options that shape an episode's schedule (`EpisodeSchedule.from_options`)."""


def check_noise_is_finite(sde_types: tuple[str, ...], sigmas: torch.Tensor, eta: float) -> None:
    """Every step's noise std over ``sigmas`` is a float32 number (an absurd eta would overflow it)."""
    for index, sde_type in enumerate(sde_types):
        std = sde.noise_std(sde_type, sigmas[index : index + 1], sigmas[index + 1 : index + 2], eta)
        if not torch.isfinite(std).all():
            raise ValueError(
                f"eta={eta:g} makes the {sde_type} noise std of step {index} non-finite on this schedule; "
                "typical eta: 0.3-1.0."
            )


@dataclass(frozen=True)
class EpisodeSchedule:
    """An episode's ``sigmas`` (``(T + 1,)``), the SDE type of each of its ``T`` steps, its ``ode_solver``
    (`sage_env.sde.ODE_SOLVERS`) and whether transition means are recorded."""

    sigmas: torch.Tensor
    sde_types: tuple[str, ...]
    ode_solver: str = "euler"
    record_means: bool = False

    @classmethod
    def from_options(cls, options: dict[str, Any], env: Any) -> EpisodeSchedule:
        """The schedule ``options`` ask of ``env`` (a `DenoisingVectorEnv`: its ``sigmas``, ``num_steps``, ``sde``,
        ``sde_window`` and ``eta`` are the defaults and bounds); errors name the option and the fix."""
        sigmas = _episode_sigmas(options.get("sigmas"), env)
        record_means = options.get("record_means", False)
        if not isinstance(record_means, bool):
            raise ValueError(f"options['record_means'] must be True or False, got {record_means!r}.")
        ode_solver = options.get("ode_solver", "euler")
        if ode_solver not in sde.ODE_SOLVERS:
            raise ValueError(f"options['ode_solver'] must be one of {sde.ODE_SOLVERS}, got {ode_solver!r}.")
        return cls(sigmas, _episode_sde_types(options, sigmas, env), ode_solver, record_means)


def _episode_sigmas(value: Any, env: Any) -> torch.Tensor:
    if value is None:
        return env.sigmas
    try:
        sigmas = torch.as_tensor(value, dtype=torch.float32).cpu()
        sde.validate_sigma_schedule(sigmas)
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"options['sigmas']: {error}") from None
    if len(sigmas) - 1 > env.num_steps:
        raise ValueError(
            f"options['sigmas'] has {len(sigmas) - 1} steps, more than the {env.num_steps} the observation space "
            "declares; build the environment with num_steps at least that."
        )
    return sigmas


def _episode_sde_types(options: dict[str, Any], sigmas: torch.Tensor, env: Any) -> tuple[str, ...]:
    """``options["sde_window"]``'s SDE types when given, else the environment's window, on this episode's schedule."""
    num_steps = len(sigmas) - 1
    if "sde_window" not in options:
        if sigmas is env.sigmas:
            return env.step_sde_types
        name, bounds = "options['sigmas'] with the environment's sde_window", env.sde_window
    else:
        name, bounds = "options['sde_window']", _window(options["sde_window"])
    try:
        sde_types = step_sde_types(env.sde, num_steps, bounds)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    check_noise_is_finite(sde_types, sigmas, env.eta)
    return sde_types


def _window(window: Any) -> tuple[int, int] | None:
    if window is not None and (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in window)
    ):
        raise ValueError(f"options['sde_window'] must be None or (start, end) integers, got {window!r}.")
    return None if window is None else (int(window[0]), int(window[1]))
