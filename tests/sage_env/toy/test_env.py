"""``sage_env/Toy-v0`` and `sample_videos`: defaults, and one rollout reproduced by both paths."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import sage_env  # noqa: F401  (registers the environment ids)
from sage_env.backbones import load_backbone
from sage_env.backbones.toy import ToyBackbone
from sage_env.env import BackbonePolicy, sample_videos
from sage_env.rewards.toy import ToyReward
from sage_env.toy.env import TOY_ENV_DEFAULTS, make_toy_vector_env
from sage_env.toy.world import TOY_TRAIN_PROMPTS


@pytest.fixture(scope="module")
def prior() -> ToyBackbone:
    return load_backbone("toy")


def roll_out(envs, seeds: list[int], prompts: list[str]) -> dict:
    observation, _ = envs.reset(options={"prompts": prompts, "seeds": seeds})
    policy = BackbonePolicy(envs.unwrapped.backbone)
    while True:
        observation, reward, terminated, _, info = envs.step(policy(observation))
        if terminated.all():
            return {"reward": reward, "info": info, "trajectory": envs.unwrapped.trajectory}


def test_toy_env_needs_no_arguments_and_uses_the_toy_defaults(prior):
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, backbone=prior)
    env = envs.unwrapped
    assert isinstance(env.backbone, ToyBackbone) and env.latent_shape == (3, 8, 16, 16)
    assert env.num_steps == 10 and env.step_sde_types == ("sage",) * 5 + ("ode",) * 5 and env.eta == 0.7
    assert env.prompts == list(TOY_TRAIN_PROMPTS)
    assert isinstance(env.reward.reward_funcs[0], ToyReward)
    single = gym.make("sage_env/Toy-v0", backbone=prior)
    assert single.observation_space["latents"].shape == (3, 8, 16, 16)
    assert TOY_ENV_DEFAULTS["backbone"] == "toy"


def test_env_rollout_equals_sample_videos_with_the_same_seeds(prior):
    prompts, seeds = ["a red square moving right", "a blue circle moving up"], [5, 6, 7, 8]
    result = roll_out(make_toy_vector_env(num_envs=4, group_size=2, backbone=prior), seeds, prompts)
    expected = sample_videos(
        prior, [p for p in prompts for _ in range(2)], seeds, sde_type="sage", eta=0.7, sde_window=(0, 5)
    )
    torch.testing.assert_close(result["trajectory"].videos, expected)
    assert not torch.equal(expected[0], expected[1])  # same prompt, different seeds
    assert set(result["info"]["reward_components"]) == {"vq", "mq", "ta"}
    assert np.isfinite(result["reward"]).all()


def test_keywords_override_the_defaults(prior):
    envs = make_toy_vector_env(
        num_envs=2,
        backbone=prior,
        num_steps=4,
        sde="ode",
        sde_window=None,
        prompts=["a red square moving left"],
    )
    assert envs.num_steps == 4 and envs.step_sde_types == ("ode",) * 4


def test_sample_videos_is_deterministic_and_independent_of_the_batch(prior):
    prompts = ["a green square moving left", "a yellow circle moving down", "a red circle moving up"]
    batch = sample_videos(prior, prompts, [1, 2, 3], sde_type="sage", eta=0.7, sde_window=(0, 5))
    alone = sample_videos(prior, prompts[1:2], [2], sde_type="sage", eta=0.7, sde_window=(0, 5))
    assert batch.shape == (3, 8, 3, 16, 16) and batch.min() >= 0 and batch.max() <= 1
    torch.testing.assert_close(batch[1:2], alone, atol=1e-5, rtol=0)
    assert torch.equal(
        batch, sample_videos(prior, prompts, [1, 2, 3], sde_type="sage", eta=0.7, sde_window=(0, 5))
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"prompts": ["a red square moving left"], "seeds": [1, 2]}, "one seed per prompt"),
        (
            {"prompts": ["a red square moving left"], "seeds": [1], "sde_window": (0, 11)},
            "sde_window .* must satisfy",
        ),
        ({"prompts": ["a red square moving left"], "seeds": [1], "sde_type": "langevin"}, "Unknown SDE type"),
    ],
)
def test_sample_videos_rejects_bad_arguments(prior, arguments, message):
    with pytest.raises(ValueError, match=message):
        sample_videos(prior, **arguments)
