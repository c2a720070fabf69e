"""DenoisingEnv / DenoisingVectorEnv: array modes, spaces, seeding, recording, rendering and errors (analytic backbone).

gymnasium's own checker and wrappers are run on the environments in tests/clients/test_gymnasium.py.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces.utils import flatten, flatten_space, unflatten

import sage_env
from sage_env import sde
from sage_env.env import BackbonePolicy, DenoisingEnv, DenoisingVectorEnv, PromptSpace, run_episode
from sage_env.env.spaces import MAX_PROMPT_LENGTH, VELOCITY_BOUND
from tests.doubles import LinearBackbone, mean_brightness

PROMPTS = ["a red ball moving left", "a blue cube moving up", "a green ball moving down"]
SIZE = {"num_frames": 2, "height": 4, "width": 4}


def make_vector_env(**kwargs) -> DenoisingVectorEnv:
    arguments = {"num_envs": 4, "group_size": 2, "num_steps": 4, "sde": "sage", "eta": 0.7, **SIZE}
    arguments.update(kwargs)
    backbone = arguments.pop("backbone", None) or LinearBackbone()
    reward_fn = arguments.pop("reward_fn", mean_brightness)
    return DenoisingVectorEnv(backbone, reward_fn, PROMPTS, **arguments)


def rollout(env: DenoisingVectorEnv, seed: int | None = 0, options: dict | None = None):
    """Drive the env with its own backbone (no CFG); return the final step's outputs."""
    observation, _ = env.reset(seed=seed, options=options)
    conditioning = env.backbone.encode_prompts(list(observation["prompt"]))
    while True:
        with torch.no_grad():
            velocity = env.backbone.predict_velocity(
                torch.as_tensor(observation["latents"]), torch.as_tensor(observation["sigma"]), conditioning
            )
        observation, reward, terminated, truncated, info = env.step(velocity)
        if bool(terminated[0]):
            return observation, reward, terminated, truncated, info


# ------------------------------------------------------------------------------------------
# gymnasium contract
# ------------------------------------------------------------------------------------------


def test_numpy_mode_is_the_default_and_returns_declared_types() -> None:
    env = make_vector_env()
    observation, info = env.reset(seed=0)
    assert env.array_mode == "numpy" and observation in env.observation_space
    assert isinstance(observation["latents"], np.ndarray) and observation["latents"].dtype == np.float32
    assert observation["sigma"].dtype == np.float32 and observation["step"].dtype == np.int64
    assert isinstance(info["seeds"], np.ndarray)
    observation, reward, terminated, truncated, info = env.step(np.zeros(env.action_space.shape, np.float32))
    assert observation in env.observation_space
    assert reward.dtype == np.float32 and terminated.dtype == np.bool_ and truncated.dtype == np.bool_
    for value in (reward, terminated, truncated, info["log_prob"], info["std"]):
        assert isinstance(value, np.ndarray) and value.shape == (env.num_envs,)


def test_torch_mode_returns_tensors_and_the_same_rollout() -> None:
    numpy_env, torch_env = make_vector_env(), make_vector_env(array_mode="torch")
    observation, info = torch_env.reset(seed=0)
    assert isinstance(observation["latents"], torch.Tensor) and isinstance(info["seeds"], torch.Tensor)
    _, reward, _, _, info = rollout(torch_env, seed=4)
    assert isinstance(reward, torch.Tensor) and isinstance(info["reward_valid"], torch.Tensor)
    _, numpy_reward, _, _, _ = rollout(numpy_env, seed=4)
    np.testing.assert_array_equal(numpy_reward, reward.numpy())
    assert torch.equal(numpy_env.trajectory.latents, torch_env.trajectory.latents)


def test_successive_numpy_observations_do_not_share_memory() -> None:
    env = make_vector_env()
    zeros = np.zeros(env.action_space.shape, np.float32)
    first, _ = env.reset(seed=0)
    second, *_, info = env.step(zeros)
    third, *_, next_info = env.step(zeros)
    for earlier, later in ((first, second), (second, third)):
        assert not np.shares_memory(earlier["latents"], later["latents"])
    assert not np.shares_memory(info["mean"], next_info["mean"])
    third["latents"][:] = 0.0  # a user scribbling on an observation changes neither the env nor the record
    for _ in range(2):
        env.step(zeros)
    assert env.trajectory.latents[:, 2].abs().sum() > 0


def test_spaces_are_fixed_at_construction_and_bounded() -> None:
    env = make_vector_env()
    spaces_before = (env.single_observation_space, env.observation_space)
    observation, _ = env.reset(options={"prompts": ["un chat très rapide", "猫が走る"]})
    assert (env.single_observation_space, env.observation_space) == spaces_before
    assert observation in env.observation_space
    action_space = env.single_action_space
    assert action_space.high.max() == VELOCITY_BOUND and action_space.low.min() == -VELOCITY_BOUND
    assert np.isfinite(env.single_observation_space["latents"].high).all()


def test_sampled_actions_keep_a_whole_episode_in_the_observation_space() -> None:
    for sde_type in sde.SDE_TYPES:
        env = make_vector_env(sde=sde_type, eta=0.5)
        env.action_space.seed(0)
        env.reset(seed=0)
        for _ in range(env.num_steps):
            observation, *_ = env.step(env.action_space.sample())
            assert observation in env.observation_space, sde_type


# ------------------------------------------------------------------------------------------
# The prompt space
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt", ["a red ball", "une boule à gauche", "赤いボール 🎈", "x" * MAX_PROMPT_LENGTH]
)
def test_prompt_space_contains_any_prompt_and_flattens_to_code_points(prompt: str) -> None:
    space = PromptSpace()
    assert space.contains(prompt)
    flat = flatten(space, prompt)
    assert flat in flatten_space(space) and flat[: len(prompt)].tolist() == [ord(c) for c in prompt]
    assert unflatten(space, flat) == prompt
    assert unflatten(space, flat.astype(np.float64)) == prompt  # as inside a flattened Dict


def test_prompt_space_rejects_non_prompts_and_samples_prompts() -> None:
    space = PromptSpace()
    for bad in ("", "a\x00b", "x" * (MAX_PROMPT_LENGTH + 1), 3, b"bytes"):
        assert not space.contains(bad)
    space.seed(0)
    assert all(space.contains(space.sample()) for _ in range(5))
    assert space == PromptSpace() and space != PromptSpace(max_length=10) and "PromptSpace" in repr(space)


def test_observation_layout_and_groups() -> None:
    env = make_vector_env(num_envs=6, group_size=3)
    observation, info = env.reset(seed=1)
    assert observation["latents"].shape == (6, 3, 2, 4, 4) and observation["latents"].dtype == np.float32
    assert observation["sigma"].tolist() == [1.0] * 6 and observation["step"].tolist() == [0] * 6
    prompts = observation["prompt"]
    assert prompts[0] == prompts[1] == prompts[2] and prompts[3] == prompts[4] == prompts[5]
    assert prompts[0] != prompts[3]  # distinct prompts per batch when the list allows it
    assert len(set(info["seeds"].tolist())) == 6


def test_env_ids_are_registered_with_a_vector_entry_point() -> None:
    for env_id in ("sage_env/Wan-v0", "sage_env/HunyuanVideo15-v0", "sage_env/Toy-v0"):
        spec = gym.spec(env_id)
        assert spec.vector_entry_point is not None
    assert set(sage_env.ENV_IDS) >= {"sage_env/Wan-v0", "sage_env/HunyuanVideo15-v0", "sage_env/Toy-v0"}


# ------------------------------------------------------------------------------------------
# Seeding and recording
# ------------------------------------------------------------------------------------------


def test_same_seed_same_trajectory_bit_for_bit() -> None:
    env = make_vector_env()
    rollout(env, seed=11)
    first = env.trajectory
    rollout(env, seed=11)
    second = env.trajectory
    assert first.prompts == second.prompts
    assert torch.equal(first.latents, second.latents) and torch.equal(first.log_probs, second.log_probs)
    assert torch.equal(first.rewards.total, second.rewards.total)
    rollout(env, seed=12)
    assert not torch.equal(first.latents[:, -1], env.trajectory.latents[:, -1])


def test_fixed_prompts_and_seeds_through_options() -> None:
    env = make_vector_env()
    options = {"prompts": ["a cat", "a dog"], "seeds": [5, 6, 7, 8]}
    rollout(env, seed=None, options=options)
    trajectory = env.trajectory
    assert trajectory.prompts == ("a cat", "a cat", "a dog", "a dog")
    assert trajectory.seeds.tolist() == [5, 6, 7, 8]
    expected_noise = sde.sample_noise((1, 3, 2, 4, 4), [torch.Generator().manual_seed(7)], "cpu")
    assert torch.equal(trajectory.latents[2, 0], expected_noise[0])


def test_recorded_log_probs_match_recomputation() -> None:
    env = make_vector_env(sde="flow_grpo", eta=0.6)
    rollout(env)
    trajectory = env.trajectory
    backbone = env.backbone
    conditioning = backbone.encode_prompts(list(trajectory.prompts))
    assert trajectory.latents.shape == (4, 5, 3, 2, 4, 4)
    for step in range(trajectory.num_steps):
        latents = trajectory.latents[:, step]
        with torch.no_grad():
            velocity = backbone.predict_velocity(latents, trajectory.sigmas[:, step], conditioning)
        out = sde.sde_step(
            "flow_grpo",
            latents,
            velocity,
            trajectory.sigmas[:, step],
            trajectory.sigmas[:, step + 1],
            0.6,
            x_next=trajectory.latents[:, step + 1],
        )
        torch.testing.assert_close(out.log_prob, trajectory.log_probs[:, step], rtol=0, atol=1e-6)
        torch.testing.assert_close(out.std, trajectory.stds[:, step])
    assert not trajectory.log_probs.requires_grad


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_every_sde_type_runs_end_to_end(sde_type: str) -> None:
    env = make_vector_env(sde=sde_type, eta=0.5)
    _, reward, terminated, truncated, _ = rollout(env)
    assert terminated.all() and not truncated.any()
    assert np.isfinite(reward).all() and reward.shape == (4,)
    trajectory = env.trajectory
    assert torch.isfinite(trajectory.log_probs).all()
    expect_stochastic = sde_type != "ode"
    assert bool(trajectory.trainable[:, 0].all()) == expect_stochastic
    assert trajectory.videos.shape == (4, 2, 3, 4, 4)
    torch.testing.assert_close(
        torch.from_numpy(reward), mean_brightness(trajectory.videos, trajectory.prompts)
    )


def test_sde_window_makes_outer_steps_deterministic() -> None:
    env = make_vector_env(num_steps=6, sde_window=(1, 3))
    rollout(env)
    trajectory = env.trajectory
    assert trajectory.sde_types == ("ode", "sage", "sage", "ode", "ode", "ode")
    assert trajectory.trainable.tolist() == [[False, True, True, False, False, False]] * 4
    assert (trajectory.stds[:, [0, 3, 4, 5]] == 0).all()


def test_intermediate_rewards_are_zero_and_final_info_has_components() -> None:
    env = make_vector_env()
    env.reset(seed=0)
    action = torch.zeros(4, 3, 2, 4, 4)
    _, reward, terminated, _, info = env.step(action)
    assert (reward == 0).all() and not terminated.any() and "reward_components" not in info
    for _ in range(3):
        _, reward, terminated, _, info = env.step(action)
    assert terminated.all()
    assert set(info["reward_components"]) == {"mean_brightness"}
    assert info["reward_valid"].all() and info["reward_errors"] == (None,) * 4


def test_failed_reward_is_nan_and_reported_not_zero() -> None:
    def fragile(videos, prompts, **kwargs):
        if any("dog" in p for p in prompts):
            raise RuntimeError("reward model crashed on a dog")
        return videos.mean(dim=(1, 2, 3, 4))

    env = make_vector_env(reward_fn=fragile)
    _, reward, _, _, info = rollout(env, seed=None, options={"prompts": ["a cat", "a dog"]})
    assert np.isfinite(reward[:2]).all() and np.isnan(reward[2:]).all()
    assert info["reward_valid"].tolist() == [True, True, False, False]
    assert "reward model crashed on a dog" in info["reward_errors"][2]
    assert env.trajectory.rewards.num_invalid == 2


def test_trajectory_select_keeps_rows_consistent() -> None:
    env = make_vector_env()
    rollout(env)
    picked = env.trajectory.select([3, 0])
    assert picked.prompts == (env.trajectory.prompts[3], env.trajectory.prompts[0])
    assert torch.equal(picked.latents[0], env.trajectory.latents[3])
    assert torch.equal(picked.rewards.total, env.trajectory.rewards.total[[3, 0]])


def test_single_env_reset_options_and_unbatched_outputs() -> None:
    env = DenoisingEnv(LinearBackbone(), mean_brightness, PROMPTS, num_steps=2, **SIZE)
    observation, _ = env.reset(options={"prompt": "a yellow ball", "seed": 4})
    assert observation["prompt"] == "a yellow ball" and observation["latents"].shape == (3, 2, 4, 4)
    observation, reward, terminated, truncated, _ = env.step(torch.zeros(3, 2, 4, 4))
    assert reward == 0.0 and not terminated
    observation, reward, terminated, truncated, _ = env.step(torch.zeros(3, 2, 4, 4))
    assert terminated and not truncated and isinstance(reward, float) and math.isfinite(reward)
    assert env.trajectory.seeds.tolist() == [4]


def test_render_is_one_rgb_image_per_env_and_render_video_the_whole_videos() -> None:
    env = make_vector_env(render_mode="rgb_array")
    with pytest.raises(RuntimeError, match="reset"):
        env.render()
    env.reset(seed=0)
    frames, videos = env.render(), env.render_video()
    assert len(frames) == 4 and all(f.shape == (4, 4, 3) and f.dtype == np.uint8 for f in frames)
    assert videos.shape == (4, 2, 4, 4, 3) and videos.dtype == np.uint8
    for frame, video in zip(frames, videos):
        np.testing.assert_array_equal(frame, video[0])
    rollout(env)
    final = (env.trajectory.videos.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(env.render_video(), final.numpy())
    plain = make_vector_env()  # no render mode: render gives None, render_video still works
    plain.reset(seed=0)
    assert plain.render() is None and plain.render_video().shape == (4, 2, 4, 4, 3)


def test_single_env_render_contract() -> None:
    env = DenoisingEnv(
        LinearBackbone(), mean_brightness, PROMPTS, num_steps=2, render_mode="rgb_array", **SIZE
    )
    env.reset(seed=0)
    frame, video = env.render(), env.render_video()
    assert frame.shape == (4, 4, 3) and video.shape == (2, 4, 4, 3)
    np.testing.assert_array_equal(frame, video[0])


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


def test_bad_actions_raise_clear_errors() -> None:
    env = make_vector_env()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(torch.zeros(4, 3, 2, 4, 4))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(4, 3, 2, 4, 5))
    with pytest.raises(ValueError, match="float"):
        env.step(torch.zeros(4, 3, 2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(torch.full((4, 3, 2, 4, 4), float("nan")))
    with pytest.raises(ValueError, match="beyond the action space bound"):
        env.step(torch.full((4, 3, 2, 4, 4), 2 * VELOCITY_BOUND))
    with pytest.raises(ValueError, match=r"torch\.Tensor or numpy"):
        env.step([0.0] * 4)
    for _ in range(4):
        env.step(torch.zeros(4, 3, 2, 4, 4))
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step(torch.zeros(4, 3, 2, 4, 4))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 5, "group_size": 2}, "must divide num_envs"),
        ({"sde": "euler"}, "Unknown SDE type"),
        ({"eta": -0.5}, "eta"),
        ({"sde_window": (2, 9)}, "sde_window"),
        ({"array_mode": "jax"}, "array_mode"),
        ({"reward_fn": None}, "reward_fn is required"),
        ({"log_prob_kind": "laplace"}, "log_prob_kind"),
        ({"sigmas": torch.tensor([1.0, 0.5])}, "end at sigma = 0"),
    ],
)
def test_bad_construction_raises_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_vector_env(**kwargs)


def test_bad_reset_options_raise_clear_errors() -> None:
    env = make_vector_env()
    with pytest.raises(ValueError, match="one prompt per group"):
        env.reset(options={"prompts": ["only one"]})
    with pytest.raises(ValueError, match="one seed per sample"):
        env.reset(options={"seeds": [1, 2]})
    with pytest.raises(ValueError, match="Unknown reset options"):
        env.reset(options={"prompt": "x"})
    with pytest.raises(ValueError, match="DenoisingVectorEnv"):
        DenoisingEnv(LinearBackbone(), mean_brightness, PROMPTS, num_envs=2, **SIZE)


def test_backbone_policy_batches_and_run_episode() -> None:
    env = make_vector_env(num_envs=6, group_size=2)
    whole = run_episode(env, BackbonePolicy(env.backbone), seed=5)
    chunked = run_episode(env, BackbonePolicy(env.backbone, batch_size=4), seed=5)
    torch.testing.assert_close(chunked.latents, whole.latents, rtol=0, atol=1e-6)
    assert whole.latents.shape[1] == 5 and torch.equal(whole.seeds, chunked.seeds)
    with pytest.raises(ValueError, match="batch_size"):
        BackbonePolicy(env.backbone, batch_size=0)


def test_a_reset_option_chooses_the_episodes_sde_window() -> None:
    env = make_vector_env(sde_window=(0, 2))
    env.reset(seed=0, options={"sde_window": (1, 3)})
    trajectory = run_episode(env, BackbonePolicy(env.backbone), seed=0, options={"sde_window": (1, 3)})
    assert trajectory.sde_types == ("ode", "sage", "sage", "ode")
    assert trajectory.trainable.tolist()[0] == [False, True, True, False]
    steps = []
    env.reset(seed=0, options={"sde_window": None})  # every step
    for _ in range(env.num_steps):
        steps.append(env.step(np.zeros(env.action_space.shape, np.float32))[4]["sde_type"])
    assert steps == ["sage"] * 4
    assert run_episode(env, BackbonePolicy(env.backbone), seed=0).sde_types == ("sage", "sage", "ode", "ode")


@pytest.mark.parametrize(
    ("window", "message"),
    [((2, 2), r"options\['sde_window'\]: sde_window \(2, 2\) must satisfy"), ((0, 9), "must satisfy"),
     ((0,), "must be None or"), ((0.5, 2), "must be None or"), ("0:2", "must be None or")],
)  # fmt: skip
def test_a_bad_sde_window_option_names_the_option(window: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_vector_env().reset(options={"sde_window": window})


def test_the_single_environment_passes_the_sde_window_option_on() -> None:
    env = DenoisingEnv(LinearBackbone(), mean_brightness, PROMPTS, num_steps=4, **SIZE)
    assert env.num_steps == 4
    env.reset(seed=0, options={"sde_window": (2, 4)})
    types = [env.step(np.zeros(env.action_space.shape, np.float32))[4]["sde_type"] for _ in range(4)]
    assert types == ["ode", "ode", "sage", "sage"]
