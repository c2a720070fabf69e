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

Adding an SDE type is one subclass, registered in-process with `register_sde` or, from a package, declared in the
entry-point group ``sage_grpo.sdes`` (this library declares its built-ins there too; docs/extending.md shows both).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from sage_env.plugins import GROUPS, PluginError, PluginGroup

__all__ = [
    "LOG_PROB_KINDS",
    "SDE",
    "SDES",
    "SDE_REGISTRY",
    "get_sde",
    "register_sde",
    "sde_types",
    "stochastic_sde_types",
]

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
    max_eta: ClassVar[float] = 10.0
    """The largest ``eta`` accepted. The published settings are 0.3-1.0; far beyond them the injected noise swamps
    the step (at eta 10 every step of a 20-step schedule adds noise of the order of the whole signal), so a larger
    value is a typo (``1e6`` for ``1e-6``, a misplaced decimal point) rather than a setting."""

    def validate_eta(self, eta: float) -> None:
        """Raise ``ValueError`` unless ``eta`` is a valid exploration scale for this SDE: in ``[0, max_eta]``."""
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
            raise ValueError(f"eta must be a finite number >= 0, got {eta!r} (typical: 0.3-1.0).")
        if eta > self.max_eta:
            raise ValueError(
                f"eta={eta:g} is above {self.max_eta:g}, the largest the {self.name} SDE accepts (typical: 0.3-1.0); "
                "was a decimal point or an exponent mistyped?"
            )

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
"""SDE units registered in this process with `register_sde` (the in-process part of `SDES`)."""


def _as_unit(loaded: object, name: str) -> SDE:
    """What an ``sage_grpo.sdes`` entry point loads (an `SDE` instance or subclass) as a unit named ``name``."""
    unit = loaded() if isinstance(loaded, type) and issubclass(loaded, SDE) else loaded
    if not isinstance(unit, SDE):
        raise TypeError(
            f"an SDE entry point must load an SDE subclass or instance, got {type(loaded).__name__}"
        )
    if unit.name != name and ":" not in name:
        raise ValueError(f"the unit's name is {unit.name!r}; declare it under that name")
    _check_unit(unit)
    return unit


SDES = PluginGroup("SDE type", GROUPS["sdes"], _as_unit, registered=SDE_REGISTRY)
"""The SDE types of every installed package (entry-point group ``sage_grpo.sdes``), loaded by name."""


def _check_unit(unit: SDE) -> None:
    if unit.default_log_prob_kind not in LOG_PROB_KINDS:
        raise ValueError(f"{unit.name}: default_log_prob_kind must be one of {LOG_PROB_KINDS}.")


def register_sde(unit: SDE, *, overwrite: bool = False) -> SDE:
    """Add an SDE unit (an instance) to the registry under ``unit.name``; returns it."""
    if not isinstance(unit, SDE):
        raise ValueError(f"register_sde takes an SDE instance, got {type(unit).__name__}.")
    if unit.name in SDE_REGISTRY and not overwrite and SDE_REGISTRY[unit.name] is not unit:
        raise ValueError(
            f"An SDE named {unit.name!r} is already registered; pass overwrite=True to replace it."
        )
    _check_unit(unit)
    SDE_REGISTRY[unit.name] = unit
    return unit


def get_sde(name: str) -> SDE:
    """The unit ``name``: registered in this process, declared by an installed package (entry-point group
    ``sage_grpo.sdes``), or ``"package.module:Class"``. A `sage_env.plugins.PluginError` (a ``ValueError``)
    naming the known types otherwise."""
    if isinstance(name, SDE):
        return name
    return SDES.load(name)


def sde_types() -> tuple[str, ...]:
    """Every SDE type name: registered in this process and declared by installed packages (none is imported)."""
    return tuple(SDES.names())


def stochastic_sde_types() -> tuple[str, ...]:
    """Names of the SDE types that inject noise (the ones a policy gradient can train). A plug-in that fails to load
    is left out here; asking for it by name reports why."""
    stochastic = []
    for name in sde_types():
        try:
            if get_sde(name).stochastic:
                stochastic.append(name)
        except PluginError:
            continue
    return tuple(stochastic)
