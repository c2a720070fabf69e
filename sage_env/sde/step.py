"""One denoising step: the inner arithmetic (`step`, used by the env and the loss) and the validating
public entry point (`sde_step`).

`step` is what diffusers' ``scheduler.step`` is to a pipeline: float32 arithmetic on tensors the caller has
validated, with no data-dependent host synchronisation, so on an accelerator it never waits for the device.
`sde_step` validates its inputs first (types, shapes, finiteness, sigma ranges: each a device synchronisation)
and then calls `step`; use it from your own code, where data enters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers.utils import BaseOutput

from sage_env.sde.base import LOG_PROB_KINDS, SDE, get_sde, per_sample

__all__ = [
    "SDEStepOutput",
    "gaussian_log_prob",
    "sample_noise",
    "sde_step",
    "step",
    "validate_eta",
    "validate_sde_type",
]

_COMPUTE_DTYPE = torch.float32
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class SDEStepOutput(BaseOutput):
    """Result of one denoising step.

    Args:
        x_next (`torch.Tensor`): the next latents, shape of the input latents, float32.
        mean (`torch.Tensor`): the mean of the Gaussian transition, same shape, float32.
        std (`torch.Tensor`): the per-sample noise std, shape ``(B,)``.
        log_prob (`torch.Tensor`): per-sample log-probability of ``x_next`` (see `gaussian_log_prob`),
            averaged over all non-batch dimensions, shape ``(B,)``.
        trainable (`torch.Tensor`): boolean ``(B,)``; ``False`` where ``std == 0`` (the step is
            deterministic: exclude it from the policy loss).
    """

    x_next: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor
    trainable: torch.Tensor


def validate_sde_type(sde_type: str) -> SDE:
    """The registered unit of ``sde_type``; ``ValueError`` naming the registered types otherwise."""
    return get_sde(sde_type)


def validate_eta(sde_type: str, eta: float) -> None:
    """Raise ``ValueError`` unless ``eta`` is a valid exploration scale for ``sde_type``."""
    get_sde(sde_type).validate_eta(eta)


def sample_noise(
    shape: torch.Size | Sequence[int],
    generator: torch.Generator | Sequence[torch.Generator] | None,
    device: torch.device | str,
) -> torch.Tensor:
    """Standard normal float32 noise; with a list of generators each sample uses its own.

    Each per-sample draw happens on its generator's device and is then moved, so the same seed gives the
    same noise regardless of the batch it is part of.
    """
    shape = tuple(shape)
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        return torch.randn(shape, generator=generator, device=gen_device, dtype=_COMPUTE_DTYPE).to(device)
    generators = list(generator)
    if len(generators) != shape[0]:
        raise ValueError(f"Got {len(generators)} generators for a batch of {shape[0]}; pass one per sample.")
    draws = [torch.randn(shape[1:], generator=g, device=g.device, dtype=_COMPUTE_DTYPE) for g in generators]
    return torch.stack(draws).to(device)


def gaussian_log_prob(
    x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, kind: str = "gaussian"
) -> torch.Tensor:
    """Per-sample log-probability of a transition, averaged over non-batch dimensions.

    ``kind="gaussian"``: ``-(x'-mean)^2 / (2 std^2) - log std - log(2 pi)/2`` per element (the form every
    peer averages, hence clip ranges of ~1e-4); 0 where ``std == 0``, with finite gradients there.
    ``kind="cps"``: published CPS' ``-(x'-mean)^2`` per element, at every step (also where ``std == 0``:
    the published code scores the last, deterministic step the same way).
    """
    if kind not in LOG_PROB_KINDS:
        raise ValueError(f"Unknown log-prob kind {kind!r}; choose one of {', '.join(LOG_PROB_KINDS)}.")
    reduce_dims = tuple(range(1, x_next.ndim))
    squared_error = (x_next.to(_COMPUTE_DTYPE) - mean.to(_COMPUTE_DTYPE)) ** 2
    if kind == "cps":
        return -squared_error.mean(dim=reduce_dims)
    trainable = std > 0
    safe_std = torch.where(trainable, std, torch.ones_like(std)).to(_COMPUTE_DTYPE)
    per_element = -squared_error / (2.0 * per_sample(safe_std, x_next) ** 2)
    log_prob = per_element.mean(dim=reduce_dims) - torch.log(safe_std) - _HALF_LOG_2PI
    return torch.where(trainable, log_prob, torch.zeros_like(log_prob))


def step(
    sde: SDE | str,
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: float,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    x_next: torch.Tensor | None = None,
    log_prob_kind: str = "gaussian",
) -> SDEStepOutput:
    """One step of ``sde`` on validated inputs: arithmetic only (the inner step of the env and of the loss).

    ``sigma`` and ``sigma_next`` are float32 ``(B,)`` tensors on the latents' device; everything else as in
    `sde_step`. A deterministic SDE type draws no noise; a stochastic one always draws it (a per-sample std of
    0, as at the last CPS step, multiplies it away), so no branch depends on tensor values.
    """
    unit = get_sde(sde)
    latents32, velocity32 = latents.to(_COMPUTE_DTYPE), velocity.to(_COMPUTE_DTYPE)
    std = unit.std(sigma, sigma_next, eta)
    mean = unit.mean(latents32, velocity32, sigma, sigma_next, std)
    if x_next is not None:
        x_next = x_next.to(_COMPUTE_DTYPE)
    elif unit.stochastic:
        noise = sample_noise(latents.shape, generator, latents.device)
        x_next = mean.detach() + per_sample(std, latents) * noise
    else:
        x_next = mean.detach()
    log_prob = gaussian_log_prob(x_next, mean, std, kind=log_prob_kind)
    return SDEStepOutput(x_next=x_next, mean=mean, std=std, log_prob=log_prob, trainable=std > 0)


def _as_sigma(value: torch.Tensor | float, name: str, batch_size: int, device: torch.device) -> torch.Tensor:
    sigma = torch.as_tensor(value, dtype=_COMPUTE_DTYPE, device=device)
    if sigma.ndim == 0:
        sigma = sigma.expand(batch_size)
    if sigma.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or have shape ({batch_size},) (one per sample), got {tuple(sigma.shape)}."
        )
    if not torch.isfinite(sigma).all():
        raise ValueError(f"{name} contains NaN or inf.")
    if sigma.min() < 0 or sigma.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1], got range [{sigma.min():.4g}, {sigma.max():.4g}].")
    return sigma


def _check_tensor(tensor: torch.Tensor, name: str, shape: torch.Size) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but the latents have shape {tuple(shape)}.")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}.")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains NaN or inf; check the model output / stored trajectory.")


def _check_inputs(
    latents: torch.Tensor, velocity: torch.Tensor, x_next: torch.Tensor | None, log_prob_kind: str
) -> None:
    _check_tensor(latents, "latents", latents.shape if isinstance(latents, torch.Tensor) else torch.Size())
    if latents.ndim < 2:
        raise ValueError(
            f"latents must have a batch dimension and at least one more, got shape {tuple(latents.shape)}."
        )
    _check_tensor(velocity, "velocity", latents.shape)
    if x_next is not None:
        _check_tensor(x_next, "x_next", latents.shape)
    if log_prob_kind not in LOG_PROB_KINDS:
        raise ValueError(
            f"Unknown log-prob kind {log_prob_kind!r}; choose one of {', '.join(LOG_PROB_KINDS)}."
        )


def sde_step(
    sde_type: str,
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    eta: float = 0.0,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    x_next: torch.Tensor | None = None,
    log_prob_kind: str = "gaussian",
) -> SDEStepOutput:
    """Apply one denoising step of the chosen SDE, or score a stored transition; inputs are validated.

    Args:
        sde_type: a registered SDE type (``"sage" | "flow_grpo" | "dance_grpo" | "cps" | "ode"``).
        latents: current latents ``x`` of shape ``(B, ...)``.
        velocity: predicted velocity ``v`` (after classifier-free guidance), same shape. Gradients flow
            through it into ``mean`` and ``log_prob``.
        sigma: current noise level, a scalar or per-sample ``(B,)`` tensor, in (0, 1].
        sigma_next: next noise level, scalar or ``(B,)``, in [0, sigma].
        eta: exploration scale (ignored by ``ode``).
        generator: one generator for the batch or one per sample; only used when ``x_next`` is None.
        x_next: a stored next state to score instead of sampling a new one (for recomputing log-probs).
        log_prob_kind: ``"gaussian"`` (default) or ``"cps"`` (see `gaussian_log_prob`).

    Returns:
        `SDEStepOutput` with float32 ``x_next``, ``mean``, per-sample ``std``, ``log_prob`` and ``trainable``.

    Raises:
        ValueError: unknown SDE type, invalid eta, sigmas outside [0, 1] or increasing, mismatched shapes, or
            non-finite inputs.
    """
    unit = get_sde(sde_type)
    unit.validate_eta(eta)
    _check_inputs(latents, velocity, x_next, log_prob_kind)
    batch_size, device = latents.shape[0], latents.device
    sigma = _as_sigma(sigma, "sigma", batch_size, device)
    sigma_next = _as_sigma(sigma_next, "sigma_next", batch_size, device)
    if (sigma <= 0).any():
        raise ValueError("sigma must be > 0 for a denoising step (sigma = 0 is already the clean sample).")
    if (sigma_next > sigma).any():
        raise ValueError(
            "sigma_next must not exceed sigma: a denoising step goes from noise (1) to data (0)."
        )
    return step(
        unit,
        latents,
        velocity,
        sigma,
        sigma_next,
        eta,
        generator=generator,
        x_next=x_next,
        log_prob_kind=log_prob_kind,
    )
