"""Backbone-level parity: an Euler loop over predict_velocity reproduces pipe(...) latents and videos.

The loop uses `sage_env.sde.sde_step("ode", ...)` with the pipeline's own sigma schedule read by
`sage_env.sde.sigmas_from_scheduler`, the same initial latents, prompts and guidance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sage_env import sde
from sage_env.backbones import VideoBackbone
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from sage_env.backbones.wan import WanBackbone
from tests.fixtures.tiny_pipelines import (
    TINY_VIDEO_SIZE,
    build_tiny_hunyuan_pipeline,
    build_tiny_wan_pipeline,
)

PROMPTS = ["a red ball rolls left", 'a sign that says "OPEN"']
NUM_STEPS = 4
TOLERANCE = 1e-5


def initial_latents(backbone: VideoBackbone, batch_size: int, seed: int = 0) -> torch.Tensor:
    shape = backbone.latent_shape(**TINY_VIDEO_SIZE)
    return torch.randn(batch_size, *shape, generator=torch.Generator().manual_seed(seed))


def euler_rollout(
    backbone: VideoBackbone,
    latents: torch.Tensor,
    sigmas: torch.Tensor,
    prompts: list[str],
    guidance_scale: float | None,
    negative_prompt: str | None = None,
) -> torch.Tensor:
    """The hand-written denoising loop: velocity from the backbone, deterministic ``ode`` step from sage_env.sde."""
    conditioning = backbone.encode_prompts(prompts, negative_prompt)
    batch_size = latents.shape[0]
    with torch.no_grad():
        for index in range(len(sigmas) - 1):
            sigma, sigma_next = sigmas[index].expand(batch_size), sigmas[index + 1].expand(batch_size)
            velocity = backbone.predict_velocity(latents, sigma, conditioning, guidance_scale)
            latents = sde.sde_step("ode", latents, velocity, sigma, sigma_next).x_next
    return latents


def max_difference(first: torch.Tensor | np.ndarray, second: torch.Tensor | np.ndarray) -> float:
    return (torch.as_tensor(first).float() - torch.as_tensor(second).float()).abs().max().item()


def wan_schedule(backbone: WanBackbone) -> torch.Tensor:
    """WanPipeline calls ``scheduler.set_timesteps(num_inference_steps)``."""
    backbone.pipeline.scheduler.set_timesteps(NUM_STEPS)
    return sde.sigmas_from_scheduler(backbone.pipeline.scheduler)


def hunyuan_schedule(backbone: HunyuanVideo15Backbone) -> torch.Tensor:
    """HunyuanVideo15Pipeline calls ``set_timesteps(sigmas=linspace(1, 0, N + 1)[:-1])``."""
    backbone.pipeline.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, NUM_STEPS + 1)[:-1])
    return sde.sigmas_from_scheduler(backbone.pipeline.scheduler)


# -- Wan -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("guidance_scale", "negative_prompt"), [(5.0, None), (1.0, None), (3.0, "blurry")])
def test_wan_rollout_reproduces_pipeline_latents(tiny_wan_backbone, guidance_scale, negative_prompt):
    latents = initial_latents(tiny_wan_backbone, 2)
    sigmas = wan_schedule(tiny_wan_backbone)
    rollout = euler_rollout(tiny_wan_backbone, latents, sigmas, PROMPTS, guidance_scale, negative_prompt)
    expected = tiny_wan_backbone.pipeline(
        prompt=PROMPTS,
        negative_prompt=negative_prompt,
        latents=latents.clone(),
        num_inference_steps=NUM_STEPS,
        guidance_scale=guidance_scale,
        output_type="latent",
        **TINY_VIDEO_SIZE,
    ).frames
    assert max_difference(rollout, expected) <= TOLERANCE


def time_shift(u: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * u / (1 + (shift - 1) * u)


def test_wan_schedule_is_not_the_plain_flow_match_schedule(tiny_wan_backbone):
    sigmas = wan_schedule(tiny_wan_backbone)
    shift = tiny_wan_backbone.pipeline.scheduler.config.shift
    # The scheduler shifts its own (already shifted) sigma_min = shift(1/1000) once more.
    sigma_min = time_shift(torch.tensor(1e-3, dtype=torch.float64), shift).item()
    expected = time_shift(torch.linspace(1.0, sigma_min, NUM_STEPS, dtype=torch.float64), shift)
    torch.testing.assert_close(sigmas[:-1].double(), expected, atol=1e-6, rtol=0)
    assert sigmas[-1] == 0 and max_difference(sigmas, sde.flow_match_sigmas(NUM_STEPS, shift)) > 1e-3


@pytest.mark.parametrize(
    ("options", "backbone_options"),
    [
        ({"two_experts": True, "boundary_ratio": 0.7}, {"guidance_scale_2": 2.0}),
        ({"two_experts": True, "boundary_ratio": 0.7}, {"guidance_scale_2": 2.0, "expert": "both"}),
        (
            {"two_experts": True, "boundary_ratio": 0.7},
            {"guidance_scale_2": 2.0, "expert": "both", "offload_idle_expert": True},
        ),
        ({"expand_timesteps": True}, {}),
    ],
    ids=[
        "wan22-a14b-two-experts",
        "wan22-a14b-both-trainable",
        "wan22-a14b-both-trainable-swapped",
        "wan22-ti2v-expanded-timesteps",
    ],
)
def test_wan22_variants_reproduce_pipeline_latents(options, backbone_options):
    backbone = WanBackbone(build_tiny_wan_pipeline(**options), **backbone_options)
    latents = initial_latents(backbone, 2)
    sigmas = wan_schedule(backbone)
    assert (sigmas[:-1] >= 0.7).any() and (sigmas[:-1] < 0.7).any()  # both experts take steps
    rollout = euler_rollout(backbone, latents, sigmas, PROMPTS, 4.0)
    call_options = {"guidance_scale_2": 2.0} if options.get("two_experts") else {}
    expected = backbone.pipeline(
        prompt=PROMPTS,
        latents=latents.clone(),
        num_inference_steps=NUM_STEPS,
        guidance_scale=4.0,
        output_type="latent",
        **call_options,
        **TINY_VIDEO_SIZE,
    ).frames
    assert max_difference(rollout, expected) <= TOLERANCE


def test_wan_decode_matches_pipeline_videos(tiny_wan_backbone):
    latents = initial_latents(tiny_wan_backbone, 2)
    rollout = euler_rollout(tiny_wan_backbone, latents, wan_schedule(tiny_wan_backbone), PROMPTS, 5.0)
    with torch.no_grad():
        videos = tiny_wan_backbone.decode(rollout)
    arguments = {
        "prompt": PROMPTS,
        "num_inference_steps": NUM_STEPS,
        "guidance_scale": 5.0,
        **TINY_VIDEO_SIZE,
    }
    as_tensor = tiny_wan_backbone.pipeline(latents=latents.clone(), output_type="pt", **arguments).frames
    as_array = tiny_wan_backbone.pipeline(latents=latents.clone(), output_type="np", **arguments).frames
    assert videos.shape == as_tensor.shape == (2, 5, 3, 16, 16)
    assert max_difference(videos, as_tensor) <= TOLERANCE
    assert max_difference(videos.permute(0, 1, 3, 4, 2), as_array) <= TOLERANCE


# -- HunyuanVideo 1.5 ----------------------------------------------------------------------------


def test_hunyuan_schedule_is_the_flow_match_schedule(tiny_hunyuan_backbone):
    sigmas = hunyuan_schedule(tiny_hunyuan_backbone)
    shift = tiny_hunyuan_backbone.pipeline.scheduler.config.shift
    torch.testing.assert_close(sigmas, sde.flow_match_sigmas(NUM_STEPS, shift), atol=1e-6, rtol=0)


@pytest.mark.parametrize("guider_scale", [6.0, 1.0])
def test_hunyuan_rollout_reproduces_pipeline_latents(guider_scale):
    backbone = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline(guidance_scale=guider_scale))
    latents = initial_latents(backbone, 2)
    rollout = euler_rollout(backbone, latents, hunyuan_schedule(backbone), PROMPTS, None)
    expected = backbone.pipeline(
        prompt=PROMPTS,
        latents=latents.clone(),
        num_inference_steps=NUM_STEPS,
        output_type="latent",
        **TINY_VIDEO_SIZE,
    ).frames
    assert max_difference(rollout, expected) <= TOLERANCE


def test_hunyuan_decode_matches_pipeline_videos(tiny_hunyuan_backbone):
    # HunyuanVideo15Pipeline's VAE cannot decode batches > 1 (diffusers 0.42): compare one video.
    latents = initial_latents(tiny_hunyuan_backbone, 1, seed=3)
    rollout = euler_rollout(
        tiny_hunyuan_backbone, latents, hunyuan_schedule(tiny_hunyuan_backbone), PROMPTS[1:], None
    )
    with torch.no_grad():
        videos = tiny_hunyuan_backbone.decode(rollout)
    arguments = {"prompt": PROMPTS[1:], "num_inference_steps": NUM_STEPS, **TINY_VIDEO_SIZE}
    as_tensor = tiny_hunyuan_backbone.pipeline(latents=latents.clone(), output_type="pt", **arguments).frames
    as_array = tiny_hunyuan_backbone.pipeline(latents=latents.clone(), output_type="np", **arguments).frames
    assert videos.shape == as_tensor.shape == (1, 5, 3, 16, 16)
    assert max_difference(videos, as_tensor) <= TOLERANCE
    assert max_difference(videos.permute(0, 1, 3, 4, 2), as_array) <= TOLERANCE
