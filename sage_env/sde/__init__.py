"""Stochastic and deterministic steps of a rectified-flow sampler: pure tensor math, no model.

Every SDE type is one self-contained unit (`sage_env.sde.base.SDE`) in its own module, registered by name:

============  ==========================================================  ===============================
type          std (Table 1 and peers)                                     mean
============  ==========================================================  ===============================
sage          ``eta * sqrt(log((1-sigma')/(1-sigma)) - d)`` (Eq. 5-6)     ``x - d v + std^2/2 * s`` (Eq. 7)
flow_grpo     ``eta * sqrt(sigma/(1-sigma) * d)``                         same form as sage
dance_grpo    ``eta * sqrt(d)``                                           same form as sage
cps           ``sigma' * sin(eta * pi / 2)``                              ``(1-sigma') x0_hat +
                                                                          sqrt(sigma'^2 - std^2) eps_hat``
ode           ``0``                                                       ``x - d v`` (plain Euler)
============  ==========================================================  ===============================

Each unit's docstring states the published implementation it matches. `step` is the inner arithmetic the
environment and the loss call (no validation, no host synchronisation); `sde_step` validates and then steps.
Schedules: `flow_match_sigmas`, `sigmas_from_scheduler`. Higher-order deterministic steps (never trained):
`sage_env.sde.multistep`. The equalizer: `gradient_scale`, `equalizer_weights`.
"""

from sage_env.plugins import own_names
from sage_env.sde.base import (
    LOG_PROB_KINDS,
    SDE,
    SDE_REGISTRY,
    SDES,
    get_sde,
    register_sde,
    sde_types,
    stochastic_sde_types,
)
from sage_env.sde.cps import CPSSDE
from sage_env.sde.dance_grpo import DanceGRPOSDE
from sage_env.sde.equalizer import (
    MEDIAN_KINDS,
    equalizer_weights,
    gradient_scale,
    mean_velocity_sensitivity,
    noise_std,
)
from sage_env.sde.flow_grpo import FlowGRPOSDE
from sage_env.sde.multistep import ODE_SOLVERS, dpm_solver_2m_correction, half_log_snr
from sage_env.sde.ode import ODE
from sage_env.sde.sage import SAGE_SIGMA_MAX, SageSDE
from sage_env.sde.schedule import flow_match_sigmas, sigmas_from_scheduler, validate_sigma_schedule
from sage_env.sde.step import (
    SDEStepOutput,
    gaussian_log_prob,
    sample_noise,
    sde_step,
    step,
    validate_eta,
    validate_sde_type,
)

SDE_TYPES: tuple[str, ...] = own_names("sdes")
"""The SDE types built in, as this library's pyproject declares them (entry-point group ``sage_grpo.sdes``); any
installed package adds its own (`sde_types`)."""

__all__ = [
    "CPSSDE",
    "LOG_PROB_KINDS",
    "MEDIAN_KINDS",
    "ODE",
    "ODE_SOLVERS",
    "SAGE_SIGMA_MAX",
    "SDE",
    "SDES",
    "SDE_REGISTRY",
    "SDE_TYPES",
    "DanceGRPOSDE",
    "FlowGRPOSDE",
    "SDEStepOutput",
    "SageSDE",
    "dpm_solver_2m_correction",
    "equalizer_weights",
    "flow_match_sigmas",
    "gaussian_log_prob",
    "get_sde",
    "gradient_scale",
    "half_log_snr",
    "mean_velocity_sensitivity",
    "noise_std",
    "register_sde",
    "sample_noise",
    "sde_step",
    "sde_types",
    "sigmas_from_scheduler",
    "step",
    "stochastic_sde_types",
    "validate_eta",
    "validate_sde_type",
    "validate_sigma_schedule",
]
