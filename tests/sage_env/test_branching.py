"""Branched rollouts (`sage_env.env.branching`): a group as one tree whose leaves share their prefix exactly and split
at the chosen steps, through gymnasium's own API (`gym.make_vec`, `check_env`, its vector wrappers)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import sage_env
from sage_env.env.branching import representatives, step_levels

BRANCHES = {"branch_steps": [1, 3], "branch_factor": 2}


def _toy(num_envs: int, group_size: int, num_steps: int = 4, **kwargs) -> gym.vector.VectorEnv:
    """The toy world with the SDE on every step."""
    return gym.make_vec(
        "sage_env/Toy-v0", num_envs=num_envs, group_size=group_size, num_steps=num_steps, sde_window=None, **kwargs
    )


def _roll_out(envs: gym.vector.VectorEnv, options: dict, seed: int = 0) -> sage_env.Trajectory:
    generator = torch.Generator().manual_seed(123)
    envs.reset(seed=seed, options=options)
    while True:  # a policy that acts differently on every lane: the tree must still share what it shares
        action = torch.randn(envs.action_space.shape, generator=generator).numpy()
        _, _, terminated, _, _ = envs.step(action)
        if terminated.all():
            return envs.unwrapped.trajectory


def test_levels_and_representatives_follow_the_splits() -> None:
    assert step_levels([1, 3], 5).tolist() == [0, 1, 1, 2, 2]
    assert step_levels([0], 3).tolist() == [1, 1, 1]
    assert representatives(8, 4, 4).tolist() == [0, 0, 0, 0, 4, 4, 4, 4]
    assert representatives(8, 4, 2).tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    assert representatives(8, 4, 1).tolist() == list(range(8))


def test_branches_share_their_prefix_exactly_and_differ_after_it() -> None:
    envs = _toy(8, 4, num_steps=5, sde="flow_grpo", eta=0.7)
    trajectory = _roll_out(envs, BRANCHES)
    latents, log_probs = trajectory.latents, trajectory.log_probs
    assert trajectory.branch_steps == (1, 3) and trajectory.branch_factor == 2
    for tree in (0, 4):
        leaves = latents[tree : tree + 4]
        # Latents before step t+1's transition: one node up to the first split's result (index 2 = after step 1).
        for index in range(2):  # the root: initial noise and step 0
            assert all(torch.equal(leaves[0, index], leaves[k, index]) for k in range(4))
        for index in range(2, 4):  # after the split at step 1: two nodes of two leaves each
            assert torch.equal(leaves[0, index], leaves[1, index]) and torch.equal(leaves[2, index], leaves[3, index])
            assert not torch.equal(leaves[0, index], leaves[2, index])
        for index in range(4, 6):  # after the split at step 3: four leaves, all different
            assert len({leaves[k, index].numpy().tobytes() for k in range(4)}) == 4
        assert torch.equal(log_probs[tree, :3], log_probs[tree + 1, :3])  # shared edges: one transition
    assert not torch.equal(latents[0, 0], latents[4, 0])  # the two trees are different trees


def test_a_branch_reproduces_the_rollout_of_its_own_seed_after_the_split() -> None:
    """Each child continues with its own lane's generator: the same seeds give the same tree, other seeds another."""
    envs = _toy(4, 4, sde="flow_grpo", eta=0.7)
    seeds = [11, 12, 13, 14]
    first = _roll_out(envs, {**BRANCHES, "seeds": seeds})
    again = _roll_out(envs, {**BRANCHES, "seeds": seeds})
    other = _roll_out(envs, {**BRANCHES, "seeds": [11, 12, 99, 14]})
    assert torch.equal(first.latents, again.latents)
    assert torch.equal(other.latents[:2], first.latents[:2])  # lane 2 leads only its own subtree
    assert torch.equal(other.latents[2:, :2], first.latents[2:, :2])  # the shared root and step 0
    assert not torch.equal(other.latents[2, 2], first.latents[2, 2])


def test_check_env_passes_and_branching_is_a_reset_option_of_any_wrapped_env() -> None:
    check_env(gym.make("sage_env/Toy-v0", num_steps=3, sde_window=None).unwrapped)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        _toy(4, 4)
    )
    trajectory = _roll_out(envs, {"branch_steps": [0, 2]})  # branch_factor 2 by default
    assert trajectory.branch_steps == (0, 2)
    assert np.isfinite(trajectory.rewards.total.numpy()).all()
    plain = _roll_out(envs, {})  # the next episode is not branched
    assert plain.branch_steps == () and not torch.equal(plain.latents[0, 0], plain.latents[1, 0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"branch_steps": [0, 2, 3]}, r"trees of 8 lanes, which must divide num_envs \(4\)"),
        ({"branch_steps": [2, 1]}, "strictly increasing"),
        ({"branch_steps": [0, 7]}, r"outside 0\.\.3"),
        ({"branch_steps": "0,2"}, "list of step indices"),
        ({"branch_steps": [0, 2], "branch_factor": 1}, "integer >= 2"),
        ({"branch_factor": 2}, "needs options\\['branch_steps'\\]"),
        ({"branch_steps": [0, 3], "sde_window": (0, 2)}, "step 3, which is deterministic"),
    ],
)
def test_bad_branch_options_are_refused_before_the_rollout(options: dict, message: str) -> None:
    envs = _toy(4, 4)
    with pytest.raises(ValueError, match=message):
        envs.reset(seed=0, options=options)


def test_a_tree_must_be_one_prompts_group() -> None:
    envs = _toy(4, 2)
    with pytest.raises(ValueError, match="different prompts"):
        envs.reset(seed=0, options={"branch_steps": [0, 2], "prompts": ["a red ball", "a blue cube"]})


def test_a_tree_costs_one_forward_row_per_node() -> None:
    envs = _toy(8, 4, num_steps=5)
    backbone = envs.unwrapped.backbone
    rows, predict = [], backbone.predict_velocity

    def counting(latents, *args, **kwargs):
        rows.append(len(latents))
        return predict(latents, *args, **kwargs)

    backbone.predict_velocity = counting
    policy = sage_env.env.BackbonePolicy(backbone)
    trajectory = sage_env.env.run_episode(envs.unwrapped, policy, seed=0, options=BRANCHES)
    # Two trees of 4: one node each at steps 0-1 (step 1's transition splits it), 2 at steps 2-3, 4 at step 4.
    assert rows == [2, 2, 4, 4, 8]
    unbranched = sage_env.env.run_episode(envs.unwrapped, policy, seed=0)
    assert rows[5:] == [8] * 5 and unbranched.branch_steps == ()
    # The shared forward gives each lane what the node's own row gives alone (up to the batch's float rounding).
    observation = {"latents": trajectory.latents[:, 2], "sigma": trajectory.sigmas[:, 2], "prompt": trajectory.prompts}
    shared = policy(observation)
    alone = torch.cat([policy({k: v[i : i + 1] for k, v in observation.items()}) for i in range(8)])
    torch.testing.assert_close(shared, alone, rtol=1e-4, atol=1e-5)
    assert torch.equal(shared[0], shared[1]) and not torch.equal(shared[1], shared[2])
