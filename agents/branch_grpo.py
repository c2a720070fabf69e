"""BranchGRPO (Li et al., 2025, "BranchGRPO: Stable and Efficient GRPO with Structured Branching in Diffusion Models",
arXiv 2509.06040): each group is one tree of rollouts that share their prefix and split in two at chosen steps
(the environment's branched rollouts, `sage_env.env.branching`); every node's reward is the mean of its leaves',
advantages are z-scores among a tree's nodes at the same depth, and each transition is trained with the advantage
of the node it leads to.

Written from the paper and the authors' code (Fredreic1849/BranchGRPO at 19fbb9f, ``fastvideo/train_branchgrpo_flux.py``:
``run_tree_sample_step``, ``compute_node_rewards_from_leaves``, ``compute_hierarchical_advantages_by_depth`` and the
width pruning): splits every 3 steps from step 0 with 2 children each (``--tree_split_points 0,3,6,9`` for 16
leaves), DanceGRPO's SDE with eta 0.3, node rewards the plain mean over leaf descendants (its default; the
probability-weighted fusion is an option there, off by default), per-depth z-scores with the unbiased std and eps
1e-8 (0 where a depth has one node or no spread), PPO clip 1e-3, advantage clip 5, lr 1e-5, no KL; width pruning of
the edges after the last split (its mode 2, best and worst halves), off by default as published.

Differences on purpose:
- a split draws the children's noise at the SDE's own std; the published code multiplies it by 4
  (``split_noise_scale``) but scores the transition with the unscaled std, so its split edges are trained as if
  sampled from a Gaussian they were not sampled from;
- the rollout computes one velocity per node, as published (`sage_env.env.BackbonePolicy` shares the forward of
  identical lanes), but training sees the tree as its leaves: a shared edge appears on each lane that passes
  through it and is computed on each, its weight split among them (`transition_weights`), so it counts once in the
  loss, as in the published one, at the training cost of every lane;
- depth pruning (off by default there) and the probability-weighted fusion are not included;
- the published code makes every step stochastic; here only the SDE window's steps are, so the default splits start at
  the window's first step and, where the window is too short for them 3 steps apart (a few-step schedule), come
  closer (`BranchGRPOAgentConfig.split_steps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents.algorithm import PolicyGradientAlgorithm
from agents.config import AlgorithmConfig
from agents.rollout import RolloutShape
from sage_env.checks import Integer, ListOf, Real, hyperparameter
from sage_env.env import Trajectory
from sage_env.env.branching import BranchPlan, step_levels

__all__ = ["BranchGRPOAgentConfig", "BranchGRPOAlgorithm", "tree_advantages", "width_pruned"]

_ZERO_SPREAD = 1e-6
"""A depth whose node rewards spread less than this carries no signal (the published threshold)."""

PUBLISHED_BRANCH_INTERVAL = 3
"""Steps between splits in the published trees (``--tree_split_points 0,3,6,9``, arXiv 2509.06040 Sec. 4)."""


@dataclass
class BranchGRPOAgentConfig(AlgorithmConfig):
    """BranchGRPO's published defaults: DanceGRPO's SDE (eta 0.3), PPO clip 1e-3, advantage eps 1e-8, no KL, no
    equalizer, lr 1e-5 (its full fine-tuning of FLUX.1-dev); trees that split in two every 3 steps from step 0.

    Besides its ``defaults`` it declares the tree's fields.
    """

    display_name: ClassVar[str] = "BranchGRPO"
    summary: ClassVar[str | None] = (
        "tree-shaped rollouts sharing prefixes, with advantages per tree depth"
    )

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "dance_grpo",
        "eta": 0.3,
        "epsilon": 1e-3,
        "advantage_eps": 1e-8,
        "equalizer": False,
        "kl_strategy": "none",
        "learning_rate": 1e-5,
    }

    branch_steps: list[int] | None = hyperparameter(
        None,
        "BranchGRPO: the denoising steps whose transition splits every node of a group's tree; a tree has "
        "branch_factor ** len(branch_steps) leaves, which must equal num_generations. Earlier splits share less "
        "of the rollout; each step must be stochastic (inside sde_window). None: every branch_interval steps from "
        "the SDE window's first step (published: 0,3,6,9 for 16 leaves, arXiv 2509.06040 Sec. 4).",
        ListOf(Integer(0, 10**4), min_length=1, optional=True, hint="e.g. [0, 3]"),
    )
    branch_interval: int | None = hyperparameter(
        None,
        "BranchGRPO: steps between splits when branch_steps is None. Larger spreads the splits over more of the "
        "schedule. None: the published 3 where the tree's splits fit in the SDE window 3 apart, else the widest "
        "spacing that fits them (a 2-step window, as on a 4-step schedule, gets splits 1 apart); a number is kept "
        "or refused. Published: 3 (every step is stochastic there).",
        Integer(1, 10**4, optional=True),
    )
    branch_factor: int = hyperparameter(
        2,
        "BranchGRPO: children of each split. Published: 2.",
        Integer(2, 64),
    )
    branch_width_pruning_ratio: float = hyperparameter(
        0.0,
        "BranchGRPO width pruning: the share of each tree's leaves whose edges after the last split are trained, "
        "the best and the worst by advantage (its mode 2); 0 trains all. Saves that share of the post-split "
        "training. Published default: off (0); 0.5 in its pruning runs.",
        Real(0.0, 1.0),
    )

    def tree_depth(self, group_size: int) -> int:
        """Splits per tree for groups of ``group_size`` leaves (``ValueError`` when no whole number fits)."""
        depth, leaves = 0, 1
        while leaves < group_size:
            depth, leaves = depth + 1, leaves * self.branch_factor
        if leaves != group_size or depth == 0:
            raise ValueError(
                f"BranchGRPO needs groups of branch_factor ** k samples (k >= 1 splits): num_generations {group_size} "
                f"(the environment's group_size) is not a power of branch_factor {self.branch_factor}; e.g. "
                f"num_generations {self.branch_factor ** max(depth, 1)}."
            )
        if self.branch_steps is not None and len(self.branch_steps) != depth:
            raise ValueError(
                f"branch_steps {self.branch_steps} make trees of {self.branch_factor ** len(self.branch_steps)} leaves "
                f"but groups have {group_size}: give {depth} branch steps (or None for every branch_interval steps)."
            )
        return depth

    def check_rollouts(self, group_size: int, sde_window: Sequence[int] | None) -> None:
        """A tree per group: ``group_size`` must be a power of ``branch_factor`` (and match ``branch_steps``), and
        when ``sde_window`` is known the tree's splits must fit in it."""
        if sde_window is None:
            self.tree_depth(group_size)
        else:
            self.split_steps(group_size, sde_window)

    def split_steps(self, group_size: int, sde_window: Sequence[int]) -> list[int]:
        """The branch steps of trees of ``group_size`` leaves when steps ``sde_window`` (``[start, end)``) are
        stochastic: ``branch_steps``, or every ``branch_interval`` steps from ``start`` (`PUBLISHED_BRANCH_INTERVAL`,
        closer where those do not fit). Errors name the field and the fix."""
        depth = self.tree_depth(group_size)
        start, end = sde_window
        if self.branch_steps is not None:
            steps = list(self.branch_steps)
        else:
            widest = (end - 1 - start) // (depth - 1) if depth > 1 else PUBLISHED_BRANCH_INTERVAL
            interval = self.branch_interval or max(1, min(PUBLISHED_BRANCH_INTERVAL, widest))
            steps = [start + index * interval for index in range(depth)]
        if any(not start <= step < end for step in steps):
            fix = (
                "widen sde_window (or lengthen the schedule, num_inference_steps, where the window is every step), or "
                "use fewer generations per prompt (num_generations; an environment's group_size)"
                if depth > end - start
                else f"set {'branch_steps' if self.branch_steps is not None else 'branch_interval'} so that they "
                "fall inside the window, or widen sde_window"
            )
            raise ValueError(
                f"BranchGRPO splits at steps {steps}, but only steps {start}..{end - 1} are stochastic (sde_window "
                f"[{start}, {end}]): a split needs the SDE's noise. Trees of {group_size} leaves need {depth} "
                f"splits: {fix}."
            )
        return steps


def tree_advantages(
    rewards: torch.Tensor, valid: torch.Tensor, depth: int, branch_factor: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """BranchGRPO's depth-wise advantages of trees of ``branch_factor ** depth`` consecutive leaves (the published
    ``compute_node_rewards_from_leaves`` and ``compute_hierarchical_advantages_by_depth``).

    At level ``l`` (after ``l`` splits) a node is ``tree_size / branch_factor**l`` consecutive leaves and its reward
    is the mean of its valid leaves' rewards; its advantage is ``(r - mean) / (std + eps)`` over the tree's nodes at
    that level with a valid reward (unbiased std), 0 and unusable where fewer than 2 such nodes or no spread.

    Returns:
        ``(advantages, usable)``, ``(N, depth + 1)``: column ``l`` is each leaf's node at level ``l``.
    """
    rewards = torch.where(valid, rewards.detach().float(), torch.zeros_like(rewards, dtype=torch.float32))
    tree_size = branch_factor**depth
    columns = [_level_advantages(rewards, valid, tree_size, branch_factor**level, eps) for level in range(depth + 1)]
    return torch.stack([c[0] for c in columns], 1), torch.stack([c[1] for c in columns], 1)


def _level_advantages(
    rewards: torch.Tensor, valid: torch.Tensor, tree_size: int, nodes_per_tree: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    node_size = tree_size // nodes_per_tree
    shape = (-1, nodes_per_tree, node_size)  # (tree, node, leaf)
    counts = valid.reshape(shape).sum(-1)
    node_reward = rewards.reshape(shape).sum(-1) / counts.clamp(min=1)
    node_valid = counts > 0
    members = node_valid.sum(-1, keepdim=True)
    mean = (node_reward * node_valid).sum(-1, keepdim=True) / members.clamp(min=1)
    variance = (((node_reward - mean) * node_valid) ** 2).sum(-1, keepdim=True) / (members - 1).clamp(min=1)
    std = variance.sqrt()
    signal = node_valid & (members >= 2) & (std >= _ZERO_SPREAD)
    node_advantage = torch.where(signal, (node_reward - mean) / (std + eps), torch.zeros_like(node_reward))
    per_leaf = node_advantage.repeat_interleave(node_size, dim=-1).reshape(-1)
    return per_leaf, signal.repeat_interleave(node_size, dim=-1).reshape(-1)


def width_pruned(advantages: torch.Tensor, usable: torch.Tensor, tree_size: int, ratio: float) -> torch.Tensor:
    """The leaves whose edges after the last split stay trained under width pruning (published mode 2): per tree,
    of its ``n`` usable leaves the ``k // 2`` best and ``k - k // 2`` worst by advantage, ``k = max(2, int(n *
    ratio))``; every usable leaf when ``ratio`` is 0."""
    if ratio == 0:
        return usable.clone()
    kept = torch.zeros_like(usable)
    for start in range(0, len(advantages), tree_size):
        lanes = torch.arange(start, start + tree_size)[usable[start : start + tree_size]]
        keep = max(2, int(len(lanes) * ratio))
        order = lanes[torch.argsort(advantages[lanes], descending=True, stable=True)]
        best, worst = order[: keep // 2], order[len(order) - (keep - keep // 2) :]
        kept[torch.cat([best, worst])] = True
    return kept


class BranchGRPOAlgorithm(PolicyGradientAlgorithm):
    """The clipped policy gradient over the edges of branched rollouts, each with its child node's advantage.

    Advantages are ``(N, depth + 2)``: column ``l <= depth`` each leaf's node after ``l`` splits
    (`tree_advantages`); the last column is the leaves again, for the steps after the last split, where width
    pruning applies. A transition at step ``t`` reads column ``level(t)``, or the last one after the last split.
    """

    config_class = BranchGRPOAgentConfig

    def rollout_options(self, shape: RolloutShape) -> dict[str, Any]:
        """``{"branch_steps": [...], "branch_factor": k}``: each group is rolled out as one tree."""
        steps = self.config.split_steps(shape.group_size, shape.stochastic_steps)
        return {
            **super().rollout_options(shape),
            "branch_steps": steps,
            "branch_factor": self.config.branch_factor,
        }

    def compute_advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth-wise advantages per tree (a tree is a group: consecutive samples of one prompt)."""
        cfg = self.config
        tree_size = _group_size(group_index)
        depth = cfg.tree_depth(tree_size)
        valid = valid.bool() & torch.isfinite(rewards)
        advantages, usable = tree_advantages(rewards, valid, depth, cfg.branch_factor, cfg.advantage_eps)
        leaves_kept = width_pruned(advantages[:, -1], usable[:, -1], tree_size, cfg.branch_width_pruning_ratio)
        return (
            torch.cat([advantages, advantages[:, -1:]], 1),
            torch.cat([usable, leaves_kept[:, None]], 1),
        )

    def _step_columns(self, trajectory: Trajectory) -> torch.Tensor:
        """``(T,)`` the advantage column of each step (module docstring)."""
        if not trajectory.branch_steps or trajectory.branch_factor != self.config.branch_factor:
            raise ValueError(
                f"BranchGRPO trains on branched rollouts (branch_factor {self.config.branch_factor}) but the trajectory "
                f"has branch_steps {list(trajectory.branch_steps)}, branch_factor {trajectory.branch_factor}: reset the "
                "environment with options=agent.rollout_options(env)."
            )
        levels = step_levels(trajectory.branch_steps, trajectory.num_steps)
        after_last = torch.arange(trajectory.num_steps) > trajectory.branch_steps[-1]
        return levels + after_last.long()

    def transition_advantages(
        self, trajectory: Trajectory, advantages: torch.Tensor, usable: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each transition's child node's advantage: column `_step_columns` of the per-level advantages."""
        columns = self._step_columns(trajectory)
        if advantages.ndim != 2 or advantages.shape[1] != len(trajectory.branch_steps) + 2:
            raise ValueError(
                f"BranchGRPO's advantages are per tree level, (N, {len(trajectory.branch_steps) + 2}), got "
                f"{tuple(advantages.shape)}: compute them with this algorithm's compute_advantages."
            )
        index = columns.to(advantages.device)
        return advantages[:, index], usable[:, index.to(usable.device)]

    def transition_weights(self, trajectory: Trajectory, experts: torch.Tensor | None = None) -> torch.Tensor:
        """The equalizer's weights times ``1 / (lanes sharing the edge)``, rescaled to mean 1 over the stochastic
        steps: a shared edge's lanes together count as one edge, and the learning rate keeps its meaning."""
        plan = BranchPlan(trajectory.branch_steps, trajectory.branch_factor, len(trajectory))
        levels = step_levels(trajectory.branch_steps, trajectory.num_steps).tolist()
        share = torch.tensor([1.0 / plan.node_size(level) for level in levels])
        stochastic = trajectory.trainable.any(0).cpu()
        share = share / share[stochastic].mean() if stochastic.any() else share
        return super().transition_weights(trajectory, experts) * share.to(trajectory.sigmas.device)[None]


def _group_size(group_index: torch.Tensor) -> int:
    """The size of the groups, which must be consecutive blocks of one size (trees)."""
    sizes = torch.unique_consecutive(group_index, return_counts=True)[1]
    if len(sizes) == 0 or not (sizes == sizes[0]).all() or len(torch.unique(group_index)) != len(sizes):
        raise ValueError(
            "BranchGRPO needs each group's samples consecutive and all groups the same size (one tree each), got "
            f"group sizes {sizes.tolist()}."
        )
    return int(sizes[0])
