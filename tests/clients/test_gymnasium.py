"""gymnasium as the oracle: ``check_env``, ``gym.make``/``make_vec`` with the passive checker, and gymnasium's own
single and vector wrappers (``RecordEpisodeStatistics``, ``RecordVideo``, ``TimeLimit``, ``FlattenObservation``)
on the environments in their default configuration."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from gymnasium.spaces.utils import flatdim, unflatten
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.utils.passive_env_checker import env_data_reuse_passive_checker
from gymnasium.wrappers import FlattenObservation, RecordEpisodeStatistics, RecordVideo, TimeLimit
from gymnasium.wrappers import vector as vector_wrappers

import sage_env
from sage_env.backbones import load_backbone
from sage_env.backbones.toy import ToyBackbone
from sage_env.env import BackbonePolicy, DenoisingEnv
from tests.doubles import mean_brightness
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

TOY = "sage_env/Toy-v0"
PROMPTS = ["a red ball rolls left", "a blue cube spins"]

# The fixture holding the tiny pipeline each registered id needs to build offline (None: no argument needed).
OFFLINE_BACKBONES = {
    "sage_env/Toy-v0": None,
    "sage_env/Wan-v0": "tiny_wan_path",
    "sage_env/HunyuanVideo15-v0": "tiny_hunyuan_path",
}


@contextmanager
def no_warnings() -> Iterator[None]:
    """Fail when anything inside warns (gymnasium's checkers report through ``warnings.warn``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert [str(w.message) for w in caught] == []


@pytest.fixture(scope="module")
def prior() -> ToyBackbone:
    return load_backbone("toy")


def offline_arguments(env_id: str, request: pytest.FixtureRequest) -> dict:
    """The keywords that make ``env_id`` build without the network (small videos for the tiny pipelines)."""
    fixture = OFFLINE_BACKBONES[env_id]
    if fixture is None:
        return {}
    path = request.getfixturevalue(fixture)
    return {"backbone": str(path), "reward_fn": mean_brightness, "prompts": PROMPTS, **TINY_VIDEO_SIZE}


def act(backbone: ToyBackbone, observation: dict) -> np.ndarray:
    """The backbone's velocity for a (single or batched) observation, as the numpy action gymnasium expects."""
    single = isinstance(observation["prompt"], str)
    batched = {key: [value] for key, value in observation.items()} if single else observation
    batched = {key: np.asarray(value) if key != "prompt" else value for key, value in batched.items()}
    velocity = BackbonePolicy(backbone)(batched).numpy()
    return velocity[0] if single else velocity


def play(env: gym.Env, backbone: ToyBackbone, seed: int = 0) -> list[tuple]:
    """One episode driven by the backbone; the results of its steps."""
    observation, _ = env.reset(seed=seed)
    results = []
    while True:
        results.append(env.step(act(backbone, observation)))
        observation, _, terminated, truncated, _ = results[-1]
        if terminated or truncated:
            return results


def play_vector(envs: gym.vector.VectorEnv, backbone: ToyBackbone, seed: int = 0) -> tuple:
    """One batch of episodes driven by the backbone; the last step's results."""
    observation, _ = envs.reset(seed=seed)
    while True:
        result = envs.step(act(backbone, observation))
        observation, _, terminated, _, _ = result
        if terminated.all():
            return result


def test_every_registered_id_is_covered() -> None:
    assert set(sage_env.ENV_IDS) == set(OFFLINE_BACKBONES)


# ------------------------------------------------------------------------------------------
# check_env and the passive checker
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", list(OFFLINE_BACKBONES))
def test_check_env_passes_without_warnings(env_id: str, request: pytest.FixtureRequest) -> None:
    env = gym.make(env_id, **offline_arguments(env_id, request))
    with no_warnings():
        check_env(env.unwrapped)  # render modes and close checked through the spec too


def test_make_passive_checker_is_silent_over_whole_episodes(prior) -> None:
    with no_warnings():
        env = gym.make(TOY, backbone=prior, render_mode="rgb_array")
        for seed in (0, 1):
            results = play(env, prior, seed)
            env.render()
        assert results[-1][2] and np.isfinite(results[-1][1])


def test_make_vec_sync_mode_runs_the_single_env_under_the_passive_checker(prior) -> None:
    with no_warnings():
        envs = gym.make_vec(TOY, num_envs=2, vectorization_mode="sync", backbone=prior)
        _, reward, _, _, _ = play_vector(envs, prior)
    assert np.isfinite(reward).all()
    native = gym.make_vec(TOY, num_envs=2, backbone=prior)
    assert native.observation_space == envs.observation_space
    assert native.action_space == envs.action_space


def test_vector_observations_and_infos_are_fresh(prior) -> None:
    envs = gym.make_vec(TOY, num_envs=4, group_size=2, backbone=prior)
    previous = envs.reset(seed=0)
    with no_warnings():
        for step in range(3):
            observation, _, _, _, info = envs.step(act(prior, previous[0]))
            env_data_reuse_passive_checker(
                previous, (observation, info), "reset" if step == 0 else "step", "step"
            )
            assert observation in envs.observation_space
            previous = (observation, info)


# ------------------------------------------------------------------------------------------
# Wrappers
# ------------------------------------------------------------------------------------------


def test_record_episode_statistics_single(prior) -> None:
    with no_warnings():
        env = RecordEpisodeStatistics(gym.make(TOY, backbone=prior))
        results = play(env, prior)
    episode = results[-1][4]["episode"]
    assert episode["r"] == pytest.approx(results[-1][1]) and episode["l"] == len(results) == 10
    assert len(env.return_queue) == 1


def test_record_episode_statistics_vector(prior) -> None:
    with no_warnings():
        envs = gym.make_vec(TOY, num_envs=4, group_size=2, backbone=prior)
        _, reward, _, _, info = play_vector(vector_wrappers.RecordEpisodeStatistics(envs), prior)
    assert info["_episode"].all() and (info["episode"]["l"] == 10).all()
    np.testing.assert_allclose(info["episode"]["r"], reward, rtol=1e-6)


def test_time_limit_truncates_and_the_env_resets(prior) -> None:
    with no_warnings():
        env = gym.make(TOY, backbone=prior, max_episode_steps=3)  # gymnasium's make adds TimeLimit
        for seed in (0, 1):  # a reset after the truncation starts a new episode
            results = play(env, prior, seed)
            assert len(results) == 3 and results[-1][3] and not results[-1][2]
            assert env.unwrapped.trajectory is None  # cut before the end: no reward, no trajectory
    results = play(TimeLimit(gym.make(TOY, backbone=prior), max_episode_steps=50), prior)
    assert len(results) == 10 and results[-1][2] and not results[-1][3]


def test_flatten_observation_single_round_trips_the_observation(prior) -> None:
    env = FlattenObservation(gym.make(TOY, backbone=prior))
    reference = gym.make(TOY, backbone=prior)
    options = {"prompt": "une boule rouge roule à gauche, 赤いボール"}
    flat, _ = env.reset(seed=0, options=options)
    observation, _ = reference.reset(seed=0, options=options)
    for _ in range(2):
        assert flat.shape == (flatdim(reference.observation_space),) and flat in env.observation_space
        assert data_equivalence(unflatten(reference.observation_space, flat), observation)
        action = act(prior, observation)
        flat, *_ = env.step(action)
        observation, *_ = reference.step(action)


def test_flatten_observation_vector(prior) -> None:
    envs = vector_wrappers.FlattenObservation(gym.make_vec(TOY, num_envs=4, group_size=2, backbone=prior))
    flat, _ = envs.reset(options={"prompts": PROMPTS})
    assert (
        flat.shape == (4, flatdim(envs.unwrapped.single_observation_space)) and flat in envs.observation_space
    )
    prompts = [unflatten(envs.unwrapped.single_observation_space, row)["prompt"] for row in flat]
    assert prompts == [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]]


def expected_first_frames(env: DenoisingEnv | gym.vector.VectorEnv, sample: int) -> np.ndarray:
    """The first frame of every recorded latent of ``sample``, decoded: ``(T + 1, H, W, 3)`` uint8."""
    trajectory = env.unwrapped.trajectory
    with torch.no_grad():
        videos = env.unwrapped.backbone.decode(trajectory.latents[sample])
    return (videos[:, 0].clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def assert_video_matches(path: Path, expected: np.ndarray) -> None:
    """The mp4 holds one frame per expected image, each closest to its own.

    Compared on 2 x 2 pixel means: the mp4 stores colour at half resolution (yuv420p), and H.264 is lossy.
    """
    frames = iio.imread(path, plugin="pyav")
    assert frames.shape == expected.shape and frames.dtype == np.uint8
    errors = np.abs(_pooled(frames)[:, None] - _pooled(expected)[None]).mean(axis=(2, 3, 4))
    np.testing.assert_array_equal(errors.argmin(axis=1), np.arange(len(expected)))
    assert errors.diagonal().max() < 20.0  # of 255


def _pooled(images: np.ndarray) -> np.ndarray:
    count, height, width, channels = images.shape
    blocks = images.astype(np.float64).reshape(count, height // 2, 2, width // 2, 2, channels)
    return blocks.mean(axis=(2, 4))


def test_record_video_writes_the_denoising_of_the_first_frame(prior, tmp_path: Path) -> None:
    with no_warnings():
        env = RecordVideo(gym.make(TOY, backbone=prior, render_mode="rgb_array"), str(tmp_path / "videos"))
        play(env, prior)
        env.close()
    (path,) = (tmp_path / "videos").glob("*.mp4")
    assert_video_matches(path, expected_first_frames(env, 0))
    assert env.unwrapped.render_video().shape == (8, 16, 16, 3)  # the whole generated video


def test_vector_record_video_tiles_the_sub_environments(prior, tmp_path: Path) -> None:
    with no_warnings():
        envs = gym.make_vec(TOY, num_envs=4, group_size=2, backbone=prior, render_mode="rgb_array")
        envs = vector_wrappers.RecordVideo(envs, str(tmp_path / "videos"))
        play_vector(envs, prior)
        envs.close()
    (path,) = (tmp_path / "videos").glob("*.mp4")
    tiles = [expected_first_frames(envs, sample) for sample in range(4)]
    grid = np.concatenate([np.concatenate(tiles[:2], axis=2), np.concatenate(tiles[2:], axis=2)], axis=1)
    assert_video_matches(path, grid)
