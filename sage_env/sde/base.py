"""`SDE`: one self-contained unit per stochastic (or deterministic) denoising step, and their registry.

Each unit holds everything the library needs to know about its SDE type, in the spirit of a diffusers
scheduler: the per-sample noise ``std`` of a step (through its ``variance``), the ``mean`` of the Gaussian
transition, the sensitivity ``lambda_t = |d mean / d v|`` of the mean to the velocity (App. A.5, for the
equalizer's ``N_t = lambda_t / std_t``), its log-probability convention, the ``eta`` it accepts, one line of
notes and the published implementation it matches. All arithmetic is float32 on per-sample sigmas of shape
``(B,)`` and contains no data-dependent host synchronisation: validation happens where inputs enter (see
`sage_env.sde.sde_step`).

Notation (paper "Manifold-Aware Exploration for Reinforcement Learning in Video Generation", arXiv
2603.21872, Sec. 3.1-3.2, App. A): ``x = (1 - sigma) x0 + sigma z``, velocity ``v = z - x0`` (diffusers'
convention: the Euler step is ``x + (sigma' - sigma) v``), ``d = sigma - sigma' >= 0``, clean estimate
``x0_hat = x - sigma v``, noise estimate ``eps_hat = x + (1 - sigma) v``, score ``s = -eps_hat / sigma``.

Adding an SDE type is one subclass and `register_sde` (docs/extending.md shows it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

__all__ = ["LOG_PROB_KINDS", "SDE", "SDE_REGISTRY", "get_sde", "register_sde", "stochastic_sde_types"]

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)

LOG_PROB_KINDS: tuple[str, ...] = ("gaussian", "cps")
"""``gaussian``: the exact Gaussian log-density averaged per element; ``cps``: published CPS' ``-mean((x' - mean)^2)``."""


def per_sample(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B,)`` -> ``(B, 1, ..., 1)`` broadcastable against ``like``."""
    return value.reshape(value.shape[0], *([1] * (like.ndim - 1)))


class SDE(ABC):
    """One type of denoising step ``x' = mean + std * noise`` from ``sigma`` to ``sigma_next``.

    Subclasses set the class attributes and implement `variance`; the default `mean` and `sensitivity` are
    the score-corrected Euler step shared by sage, flow_grpo and dance_grpo (Eq. 7):
    ``mean = x - d v + (std^2 / 2) s = x - d v - std^2 / (2 sigma) * eps_hat``.
    """

    name: ClassVar[str]
    """Registry name (``SageGRPOConfig.sde``, the env's ``sde``)."""
    stochastic: ClassVar[bool] = True
    """False for a step that never injects noise (it is never trained)."""
    default_log_prob_kind: ClassVar[str] = "gaussian"
    """The log-probability convention of the published method."""
    notes: ClassVar[str]
    """One line for docs and model cards."""
    reference: ClassVar[str]
    """The published implementation (repository, file, commit) this unit matches."""

    def validate_eta(self, eta: float) -> None:
        """Raise ``ValueError`` unless ``eta`` is a valid exploration scale for this SDE."""
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
            raise ValueError(f"eta must be a finite number >= 0, got {eta!r} (typical: 0.3-1.0).")
        if eta * eta > _FLOAT32_MAX:
            raise ValueError(f"eta={eta:g} overflows the float32 noise variance (eta^2 > 3.4e38); typical: 0.3-1.0.")

    @abstractmethod
    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        """Per-sample noise variance ``std^2`` of the step, float32 ``(B,)``."""

    def std(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        """Per-sample noise std of the step, float32 ``(B,)``."""
        return self.variance(sigma, sigma_next, eta).sqrt()

    def mean(
        self,
        latents: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        std: torch.Tensor,
    ) -> torch.Tensor:
        """Mean of the Gaussian transition (Eq. 7): Euler step plus the score correction of the noise."""
        s, s_next, sd = (per_sample(t, latents) for t in (sigma, sigma_next, std))
        eps_hat = latents + (1.0 - s) * velocity
        return latents - (s - s_next) * velocity - sd**2 / (2.0 * s) * eps_hat

    def sensitivity(self, sigma: torch.Tensor, sigma_next: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``lambda_t = |d mean / d v|`` (App. A.5): the mean is affine in ``v`` with this per-sample slope.

        For Eq. 7, ``mean = x - d v - std^2 / (2 sigma) (x + (1 - sigma) v)``, so
        ``lambda = d + std^2 (1 - sigma) / (2 sigma)``.
        """
        return (sigma - sigma_next) + std**2 * (1.0 - sigma) / (2.0 * sigma)


SDE_REGISTRY: dict[str, SDE] = {}
"""Registered SDE units by name, in registration order."""


def register_sde(unit: SDE, *, overwrite: bool = False) -> SDE:
    """Add an SDE unit (an instance) to the registry under ``unit.name``; returns it."""
    if not isinstance(unit, SDE):
        raise ValueError(f"register_sde takes an SDE instance, got {type(unit).__name__}.")
    if unit.name in SDE_REGISTRY and not overwrite:
        raise ValueError(
            f"An SDE named {unit.name!r} is already registered; pass overwrite=True to replace it."
        )
    if unit.default_log_prob_kind not in LOG_PROB_KINDS:
        raise ValueError(f"{unit.name}: default_log_prob_kind must be one of {LOG_PROB_KINDS}.")
    SDE_REGISTRY[unit.name] = unit
    return unit


def get_sde(name: str) -> SDE:
    """The registered unit ``name``; a ``ValueError`` naming the registered types otherwise."""
    if isinstance(name, SDE):
        return name
    unit = SDE_REGISTRY.get(name) if isinstance(name, str) else None
    if unit is None:
        raise ValueError(f"Unknown SDE type {name!r}; choose one of {', '.join(SDE_REGISTRY)}.")
    return unit


def stochastic_sde_types() -> tuple[str, ...]:
    """Names of the registered SDE types that inject noise (the ones a policy gradient can train)."""
    return tuple(name for name, unit in SDE_REGISTRY.items() if unit.stochastic)
