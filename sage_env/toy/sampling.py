"""Sampling videos from a backbone on its own schedule, exactly as the environment would: the toy's sampler.

`sample_videos` draws each video's starting noise and every step's noise from its own ``torch.Generator``
seeded with the video's seed, and applies `sage_env.sde.sde_step` step by step on ``backbone.sigmas(...)``, so
it reproduces a rollout of `sage_env.DenoisingVectorEnv` (same seeds, same schedule, same SDE window) without
the env's bookkeeping. The prior's training script evaluates with it, and so do the toy tests, the model card's
measurements and ``sage-generate`` for the toy model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sage_env import sde
from sage_env.backbones.base import VideoBackbone
from sage_env.models import sampling_defaults
from sage_env.toy.world import TOY_HEIGHT, TOY_NUM_FRAMES, TOY_WIDTH

__all__ = ["TOY_NUM_STEPS", "TOY_SHIFT", "sample_videos"]

TOY_NUM_STEPS: int = sampling_defaults("toy").num_steps
"""Denoising steps of the toy world (declared in `sage_env.models`: the prior was evaluated with 10 steps)."""
TOY_SHIFT: float = sampling_defaults("toy").shift
"""Time shift of the toy schedule (declared in `sage_env.models`: the prior was trained at shift 3)."""


def sample_videos(
    backbone: VideoBackbone,
    prompts: Sequence[str],
    seeds: Sequence[int],
    *,
    num_steps: int = TOY_NUM_STEPS,
    shift: float | None = None,
    sde_type: str = "ode",
    eta: float = 0.0,
    sde_steps: int | None = None,
    guidance_scale: float | None = None,
    num_frames: int = TOY_NUM_FRAMES,
    height: int = TOY_HEIGHT,
    width: int = TOY_WIDTH,
    negative_prompt: str | None = None,
) -> torch.Tensor:
    """Sample one video per (prompt, seed): ``(B, F, 3, H, W)`` float32 in [0, 1], without gradients.

    Args:
        backbone: the model to sample from.
        prompts, seeds: one seed per prompt; the seed fixes the starting noise and the SDE noise.
        num_steps, shift: the schedule ``backbone.sigmas(num_steps, shift)`` (``shift=None``: the backbone's own;
            for the toy, `sage_env.sde.flow_match_sigmas` at shift `TOY_SHIFT`).
        sde_type: the SDE of the stochastic steps (``"ode"``: deterministic Euler sampling).
        eta: exploration scale of the SDE.
        sde_steps: how many of the first steps use ``sde_type`` (the rest use the ODE); all when None.
        guidance_scale: classifier-free guidance scale (None: the backbone's default; 1: none).
        num_frames, height, width: the video size.
        negative_prompt: the negative prompt of CFG (the backbone's, ``""``, when None).
    """
    if isinstance(prompts, str) or len(prompts) != len(seeds):
        raise ValueError("Pass a list of prompts and one seed per prompt.")
    sigmas = backbone.sigmas(num_steps, shift)
    window = num_steps if sde_steps is None else sde_steps
    if not 0 <= window <= num_steps:
        raise ValueError(f"sde_steps must lie in [0, num_steps={num_steps}], got {sde_steps}.")
    sde.validate_sde_type(sde_type)
    sde.validate_eta(sde_type, eta)
    conditioning = backbone.encode_prompts(list(prompts), negative_prompt)
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    shape = (len(prompts), *backbone.latent_shape(num_frames, height, width))
    latents = sde.sample_noise(shape, generators, backbone.device)
    batch_sigmas = sigmas.to(backbone.device).expand(len(prompts), -1)
    with torch.no_grad():
        for index in range(num_steps):
            velocity = backbone.predict_velocity(
                latents, batch_sigmas[:, index], conditioning, guidance_scale
            )
            step_type = sde_type if index < window else "ode"
            step = sde.sde_step(
                step_type, latents, velocity, batch_sigmas[:, index], batch_sigmas[:, index + 1], eta,
                generator=generators,
            )  # fmt: skip
            latents = step.x_next
        return backbone.decode(latents)
