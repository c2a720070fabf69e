"""BranchGRPO: the published tree rewards, depth-wise advantages and width pruning computed by hand, each transition
trained with its child node's advantage, and the algorithm in a plain gymnasium loop."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

import agents
import sage_env
from agents.branch_grpo import BranchGRPOAgentConfig, BranchGRPOAlgorithm, tree_advantages, width_pruned

# The toy tree of the published code's logic: splits at steps 0 and 1, leaves AA, AB, BA, BB with rewards 1, 3, 2, 6.
LEAF_REWARDS = torch.tensor([1.0, 3.0, 2.0, 6.0])
ALL_VALID = torch.ones(4, dtype=torch.bool)


def test_node_rewards_are_leaf_means_and_advantages_z_scores_per_depth() -> None:
    advantages, usable = tree_advantages(LEAF_REWARDS, ALL_VALID, 2, 2, eps=1e-8)
    # Depth 1: r(A) = mean(1, 3) = 2, r(B) = mean(2, 6) = 4; mean 3, unbiased std sqrt(2).
    a1 = 1 / math.sqrt(2)
    # Depth 2: the leaves; mean 3, unbiased std sqrt(14 / 3).
    std2 = math.sqrt(14 / 3)
    expected = torch.tensor(
        [[0.0, -a1, -2 / std2], [0.0, -a1, 0.0], [0.0, a1, -1 / std2], [0.0, a1, 3 / std2]]
    )
    torch.testing.assert_close(advantages, expected)
    assert usable[:, 0].tolist() == [False] * 4  # the root: one node, no signal
    assert usable[:, 1:].all()


def test_invalid_leaves_leave_their_nodes_and_a_depth_without_spread_has_no_signal() -> None:
    valid = torch.tensor([True, False, True, True])
    advantages, usable = tree_advantages(torch.tensor([1.0, float("nan"), 2.0, 6.0]), valid, 2, 2, eps=1e-8)
    # r(A) = 1 (its valid leaf), r(B) = 4: z-scores -+1/sqrt(2); the invalid leaf's own node has no reward.
    torch.testing.assert_close(advantages[:, 1], torch.tensor([-1, -1, 1, 1]) / math.sqrt(2))
    assert usable[:, 2].tolist() == [True, False, True, True]
    assert torch.isfinite(advantages).all()
    flat, flat_usable = tree_advantages(torch.tensor([2.0, 2.0, 2.0, 2.0]), ALL_VALID, 2, 2, eps=1e-8)
    assert not flat.any() and not flat_usable.any()


def test_width_pruning_keeps_the_best_and_worst_leaves() -> None:
    advantages, usable = tree_advantages(LEAF_REWARDS, ALL_VALID, 2, 2, eps=1e-8)
    # Mode 2, ratio 0.5: k = max(2, int(4 * 0.5)) = 2, the best (BB) and the worst (AA).
    assert width_pruned(advantages[:, -1], usable[:, -1], 4, 0.5).tolist() == [True, False, False, True]
    assert width_pruned(advantages[:, -1], usable[:, -1], 4, 0.0).tolist() == [True] * 4
    algorithm = BranchGRPOAlgorithm(BranchGRPOAgentConfig(branch_width_pruning_ratio=0.5))
    _, column_usable = algorithm.compute_advantages(["p"] * 4, LEAF_REWARDS, ALL_VALID, torch.zeros(4, dtype=torch.long))
    assert column_usable[:, 2].all()  # the last split's own edges are not pruned
    assert column_usable[:, 3].tolist() == [True, False, False, True]  # the edges after it are


def test_splits_every_interval_from_the_windows_first_step_for_the_group_size() -> None:
    config = BranchGRPOAgentConfig()
    assert config.split_steps(16, (0, 20)) == [0, 3, 6, 9]  # the published tree
    assert config.split_steps(4, (0, 5)) == [0, 3]  # the toy preset's window
    assert config.split_steps(4, (2, 8)) == [2, 5]
    assert BranchGRPOAgentConfig(branch_steps=[1, 2]).split_steps(4, (0, 10)) == [1, 2]
    assert BranchGRPOAgentConfig(branch_factor=4).split_steps(16, (0, 10)) == [0, 3]
    with pytest.raises(ValueError, match=r"num_generations 6 \(the environment's group_size\) is not a power"):
        config.split_steps(6, (0, 10))
    with pytest.raises(ValueError, match=r"num_generations 2 .* is not a power of branch_factor 4"):
        agents.make("branch_grpo", env=gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2), branch_factor=4)
    with pytest.raises(ValueError, match="give 2 branch steps"):
        BranchGRPOAgentConfig(branch_steps=[1]).split_steps(4, (0, 10))


def test_splits_come_closer_where_the_window_is_too_short_for_the_published_interval() -> None:
    config = BranchGRPOAgentConfig()
    assert config.split_steps(4, (0, 2)) == [0, 1]  # the arena's few-step task: 4 steps, the SDE on 2
    assert config.split_steps(8, (0, 5)) == [0, 2, 4]
    assert BranchGRPOAgentConfig(branch_interval=2).split_steps(4, (0, 5)) == [0, 2]  # a number is kept
    with pytest.raises(ValueError, match=r"steps \[0, 3\], but only steps 0..1 are stochastic .* set branch_interval"):
        BranchGRPOAgentConfig(branch_interval=3).split_steps(4, (0, 2))
    with pytest.raises(ValueError, match=r"steps 1..4 are stochastic \(sde_window \[1, 5\]\).* set branch_steps"):
        BranchGRPOAgentConfig(branch_steps=[0, 3]).split_steps(4, (1, 5))
    too_short = r"need 3 splits: widen sde_window .* use fewer generations per prompt \(num_generations"
    with pytest.raises(ValueError, match=too_short):
        config.split_steps(8, (0, 2))


def _rollout(envs: gym.vector.VectorEnv, agent: agents.Agent, seed: int) -> sage_env.Trajectory:
    observation, _ = envs.reset(seed=seed, options=agent.rollout_options(envs))
    while True:
        observation, _, terminated, _, _ = envs.step(agent.act(observation))
        if terminated.all():
            return envs.unwrapped.trajectory


def _toy(num_steps: int = 5) -> gym.vector.VectorEnv:
    return gym.make_vec(
        "sage_env/Toy-v0", num_envs=8, group_size=4, num_steps=num_steps, sde_window=None, sde="dance_grpo", eta=0.3
    )


def test_each_transition_carries_its_child_nodes_advantage_and_a_shared_edge_counts_once() -> None:
    envs = _toy()
    agent = agents.make("branch_grpo", env=envs, branch_steps=[1, 3])
    trajectory = _rollout(envs, agent, seed=0)
    advantages, usable = agent.algorithm.advantages(trajectory)
    batch = agent.algorithm.training_batch(trajectory, advantages, usable, agent.policy)
    # Steps 0..4 read columns 0 (root: not trained), 1, 1, 2 (the split at 3), 3 (after the last split).
    columns = [0, 1, 1, 2, 3]
    for sample, step, advantage in zip(batch.sample_index.tolist(), batch.step_index.tolist(), batch.advantages):
        assert advantage == advantages[sample, columns[step]]
    assert 0 not in batch.step_index.tolist()  # the root's edge: a single node has no advantage
    assert len(batch) == 8 * 4  # timestep_fraction 1: every trainable step of every sample
    # 1 / lanes per node: 1/2 at steps 1-2, 1 at steps 3-4 (and 1/4 at step 0), rescaled to mean 1 over all 5 steps.
    share = torch.tensor([0.25, 0.5, 0.5, 1.0, 1.0])
    expected = share / share.mean()
    torch.testing.assert_close(batch.weights, expected[batch.step_index])


def test_an_unbranched_rollout_is_refused_with_the_fix() -> None:
    envs = _toy()
    agent = agents.make("branch_grpo", env=envs)
    envs.reset(seed=0)
    while True:
        _, _, terminated, _, _ = envs.step(agent.act(envs.unwrapped._observation()))
        if terminated.all():
            break
    trajectory = envs.unwrapped.trajectory
    advantages, usable = agent.algorithm.advantages(trajectory)
    with pytest.raises(ValueError, match=r"options=agent.rollout_options\(env\)"):
        agent.algorithm.training_batch(trajectory, advantages, usable, agent.policy)


def test_a_few_step_window_gets_its_splits_from_the_environment_through_agents_make() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=8, group_size=4, num_steps=4, sde_window=(0, 2), sde="dance_grpo")
    agent = agents.make("branch_grpo", env=envs)
    assert agent.rollout_options(envs) == {"branch_steps": [0, 1], "branch_factor": 2}
    assert _rollout(envs, agent, seed=0).branch_steps == (0, 1)
    with pytest.raises(ValueError, match=r"only steps 0..1 are stochastic \(sde_window \[0, 2\]\)"):
        agents.make("branch_grpo", env=envs, branch_interval=3)
    whole_schedule = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=4, num_steps=4, sde_window=None)
    with pytest.raises(ValueError, match=r"splits at steps \[0, 4\], but only steps 0..3 are stochastic"):
        agents.make("branch_grpo", env=whole_schedule, branch_steps=[0, 4])  # refused before any rollout


def test_branch_grpo_trains_in_a_plain_gymnasium_loop() -> None:
    envs = _toy()
    agent = agents.make("branch_grpo", env=envs, learning_rate=3e-3)
    assert agent.rollout_options(envs) == {"branch_steps": [0, 3], "branch_factor": 2}
    before = {n: p.detach().clone() for n, p in agent.policy.transformer.named_parameters() if p.requires_grad}
    for iteration in range(2):
        metrics = agent.update(_rollout(envs, agent, seed=iteration))
        assert math.isfinite(metrics["policy_loss"]) and metrics["usable_fraction"] > 0
    after = dict(agent.policy.transformer.named_parameters())
    assert any(not torch.equal(value, after[name]) for name, value in before.items())
