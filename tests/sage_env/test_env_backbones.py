"""The environments over the tiny diffusers pipelines: pipeline parity, every SDE type, log-probs, registered ids.

``check_env`` and gymnasium's wrappers on the registered ids run in tests/clients/test_gymnasium.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sage_env import sde
from sage_env.env import BackbonePolicy, DenoisingEnv, DenoisingVectorEnv, run_episode
from tests.doubles import mean_brightness
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

PROMPTS = ["a red ball rolls left", "a blue cube spins"]
NUM_STEPS = 4
TOLERANCE = 1e-5


def wan_sigmas(backbone) -> torch.Tensor:
    backbone.pipeline.scheduler.set_timesteps(NUM_STEPS)
    return sde.sigmas_from_scheduler(backbone.pipeline.scheduler)


def hunyuan_sigmas(backbone) -> torch.Tensor:
    return sde.flow_match_sigmas(NUM_STEPS, backbone.pipeline.scheduler.config.shift)


def drive(env: DenoisingVectorEnv, prompts, seeds, guidance_scale, negative_prompt=None):
    """Roll out with the env's backbone as the policy (the agent's job), return the trajectory."""
    policy = BackbonePolicy(env.backbone, guidance_scale, negative_prompt)
    return run_episode(env, policy, options={"prompts": prompts, "seeds": seeds})


def make_env(backbone, sigmas, num_envs, sde_type="ode", eta=0.0, array_mode="numpy"):
    return DenoisingVectorEnv(
        backbone,
        mean_brightness,
        num_envs=num_envs,
        group_size=1,
        sigmas=sigmas,
        sde=sde_type,
        eta=eta,
        array_mode=array_mode,
        **TINY_VIDEO_SIZE,
    )


@pytest.mark.parametrize("array_mode", ["numpy", "torch"])
def test_env_rollout_reproduces_the_wan_pipeline(tiny_wan_backbone, array_mode: str) -> None:
    env = make_env(tiny_wan_backbone, wan_sigmas(tiny_wan_backbone), 2, array_mode=array_mode)
    trajectory = drive(env, PROMPTS, [11, 12], 5.0, "blurry")
    arguments = {
        "prompt": PROMPTS,
        "negative_prompt": "blurry",
        "num_inference_steps": NUM_STEPS,
        "guidance_scale": 5.0,
        **TINY_VIDEO_SIZE,
    }
    latents = trajectory.latents[:, 0].clone()
    expected = tiny_wan_backbone.pipeline(latents=latents.clone(), output_type="latent", **arguments).frames
    assert (trajectory.latents[:, -1] - expected).abs().max() <= TOLERANCE
    videos = tiny_wan_backbone.pipeline(latents=latents.clone(), output_type="pt", **arguments).frames
    assert trajectory.videos.shape == videos.shape
    assert (trajectory.videos - videos).abs().max() <= TOLERANCE


def test_env_rollout_reproduces_the_hunyuan_pipeline(tiny_hunyuan_backbone) -> None:
    # HunyuanVideo15Pipeline (diffusers 0.42) cannot decode batches > 1: compare one video.
    env = make_env(tiny_hunyuan_backbone, hunyuan_sigmas(tiny_hunyuan_backbone), 1)
    trajectory = drive(env, PROMPTS[:1], [5], None)
    arguments = {"prompt": PROMPTS[:1], "num_inference_steps": NUM_STEPS, **TINY_VIDEO_SIZE}
    latents = trajectory.latents[:, 0].clone()
    expected = tiny_hunyuan_backbone.pipeline(
        latents=latents.clone(), output_type="latent", **arguments
    ).frames
    assert (trajectory.latents[:, -1] - expected).abs().max() <= TOLERANCE
    videos = tiny_hunyuan_backbone.pipeline(latents=latents.clone(), output_type="pt", **arguments).frames
    assert (trajectory.videos - videos).abs().max() <= TOLERANCE


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_every_sde_type_on_tiny_wan(tiny_wan_backbone, sde_type: str) -> None:
    env = make_env(tiny_wan_backbone, wan_sigmas(tiny_wan_backbone), 2, sde_type, eta=0.5)
    trajectory = drive(env, PROMPTS, [1, 2], 5.0)
    assert torch.isfinite(trajectory.rewards.total).all() and torch.isfinite(trajectory.log_probs).all()
    assert trajectory.latents.shape[:2] == (2, NUM_STEPS + 1)


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_every_sde_type_on_tiny_hunyuan(tiny_hunyuan_backbone, sde_type: str) -> None:
    env = make_env(tiny_hunyuan_backbone, hunyuan_sigmas(tiny_hunyuan_backbone), 1, sde_type, eta=0.5)
    trajectory = drive(env, PROMPTS[:1], [3], None)
    assert torch.isfinite(trajectory.rewards.total).all() and torch.isfinite(trajectory.log_probs).all()


def test_recorded_log_probs_recompute_through_the_wan_backbone(tiny_wan_backbone) -> None:
    env = make_env(tiny_wan_backbone, wan_sigmas(tiny_wan_backbone), 2, "sage", eta=0.7)
    trajectory = drive(env, PROMPTS, [7, 8], 5.0)
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    for step in range(NUM_STEPS):
        latents, sigma = trajectory.latents[:, step], trajectory.sigmas[:, step]
        with torch.no_grad():
            velocity = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, 5.0)
        out = sde.sde_step(
            "sage",
            latents,
            velocity,
            sigma,
            trajectory.sigmas[:, step + 1],
            0.7,
            x_next=trajectory.latents[:, step + 1],
        )
        torch.testing.assert_close(out.log_prob, trajectory.log_probs[:, step], rtol=0, atol=1e-5)


def test_make_vec_through_the_registered_wan_id(tiny_wan_path) -> None:
    import gymnasium as gym

    envs = gym.make_vec(
        "sage_env/Wan-v0",
        num_envs=4,
        group_size=2,
        backbone=str(tiny_wan_path),
        reward_fn=mean_brightness,
        prompts=PROMPTS,
        num_steps=2,
        **TINY_VIDEO_SIZE,
    )
    assert isinstance(envs, DenoisingVectorEnv) and envs.num_envs == 4
    observation, _ = envs.reset(seed=0)
    latent_shape = envs.backbone.latent_shape(**TINY_VIDEO_SIZE)
    assert isinstance(observation["latents"], np.ndarray)
    assert observation["latents"].shape == (4, *latent_shape)
    env = gym.make(
        "sage_env/Wan-v0",
        backbone=str(tiny_wan_path),
        reward_fn=mean_brightness,
        prompts=PROMPTS,
        num_steps=2,
        **TINY_VIDEO_SIZE,
    )
    assert isinstance(env.unwrapped, DenoisingEnv)
