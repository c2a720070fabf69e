"""Tree-shaped rollouts (BranchGRPO, Li et al., 2025, arXiv 2509.06040): the lanes of a vector environment as the
leaves of trees that share a prefix and split at chosen steps.

A tree is ``branch_factor ** len(branch_steps)`` consecutive lanes. Before the first branch step all its lanes are
one node (one starting noise, one latent); the transition of a branch step splits every node into
``branch_factor`` children, each a contiguous block of the node's lanes, which from then on draw their own noise.
A node is represented by its first lane: every lane of a node takes that lane's starting noise, velocity and step
noise (`representatives`), so the lanes of a node hold bit-identical latents until the node splits, whatever the
policy computes for the others. The *level* of a step is the number of splits at or before it (`step_levels`):
the nodes a step's transitions lead to are the nodes of its level.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from sage_env import sde

__all__ = ["BRANCH_OPTIONS", "BranchPlan", "representatives", "splits_by", "step_levels"]

BRANCH_OPTIONS = ("branch_steps", "branch_factor")
"""The ``reset`` options of a branched rollout (`BranchPlan.from_options`)."""


def splits_by(branch_steps: Sequence[int], step_index: int) -> int:
    """The level of step ``step_index``: how many branch steps are at or before it, i.e. the splits done by the end of
    its transition (0 before the first; -1, before any step, is 0 too)."""
    return sum(step <= step_index for step in branch_steps)


def step_levels(branch_steps: Sequence[int], num_steps: int) -> torch.Tensor:
    """``(num_steps,)`` the level of each step (`splits_by`)."""
    return torch.tensor([splits_by(branch_steps, index) for index in range(num_steps)], dtype=torch.long)


def representatives(num_lanes: int, tree_size: int, node_size: int) -> torch.Tensor:
    """``(num_lanes,)`` the first lane of each lane's node, nodes being ``node_size`` consecutive lanes of trees of
    ``tree_size`` consecutive lanes."""
    lanes = torch.arange(num_lanes)
    return lanes - (lanes % tree_size) % node_size


class BranchPlan:
    """The trees of one episode: where they split and which lane represents each node at each step.

    Args:
        branch_steps: the steps whose transition splits every node (strictly increasing).
        branch_factor: children per split (BranchGRPO: 2).
        num_lanes: the environment's ``num_envs``; a multiple of the tree size.
    """

    def __init__(self, branch_steps: Sequence[int], branch_factor: int, num_lanes: int) -> None:
        self.branch_steps, self.branch_factor = tuple(int(s) for s in branch_steps), int(branch_factor)
        self.tree_size = self.branch_factor ** len(self.branch_steps)
        self.num_lanes = num_lanes

    @classmethod
    def from_options(
        cls, options: dict[str, Any], sde_types: Sequence[str], prompts: Sequence[str]
    ) -> BranchPlan | None:
        """The plan of ``options["branch_steps"]`` / ``options["branch_factor"]`` (None without branch steps),
        validated against this episode's SDE types and per-lane prompts; errors name the option and the fix."""
        steps = options.get("branch_steps")
        factor = options.get("branch_factor", 2)
        if steps is None or (isinstance(steps, (list, tuple)) and not steps):
            if "branch_factor" in options:
                raise ValueError("options['branch_factor'] needs options['branch_steps'] (the steps that split).")
            return None
        if not _is_integer(factor) or factor < 2:
            raise ValueError(f"options['branch_factor'] must be an integer >= 2 (children per split), got {factor!r}.")
        _check_steps(steps, sde_types)
        plan = cls(steps, int(factor), len(prompts))
        plan._check_lanes(prompts)
        return plan

    def _check_lanes(self, prompts: Sequence[str]) -> None:
        if self.num_lanes % self.tree_size:
            raise ValueError(
                f"options['branch_steps'] {list(self.branch_steps)} with branch_factor {self.branch_factor} make trees "
                f"of {self.tree_size} lanes, which must divide num_envs ({self.num_lanes}): use "
                f"log_{self.branch_factor}(group size) branch steps so that a tree is a group."
            )
        for start in range(0, self.num_lanes, self.tree_size):
            if len(set(prompts[start : start + self.tree_size])) != 1:
                raise ValueError(
                    f"Lanes {start}-{start + self.tree_size - 1} form one tree (options['branch_steps']) but have "
                    "different prompts: a tree is one prompt's group; make the tree size the group size."
                )

    def node_size(self, level: int) -> int:
        """Lanes per node after ``level`` splits."""
        return self.tree_size // self.branch_factor**level

    def representatives(self, level: int) -> torch.Tensor:
        """``(num_lanes,)`` the lane representing each lane's node after ``level`` splits."""
        return representatives(self.num_lanes, self.tree_size, self.node_size(level))

    def level(self, step_index: int) -> int:
        """How many splits have happened by the end of step ``step_index``'s transition (`splits_by`)."""
        return splits_by(self.branch_steps, step_index)


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_steps(steps: Any, sde_types: Sequence[str]) -> None:
    if not isinstance(steps, (list, tuple)) or not all(_is_integer(s) for s in steps):
        raise ValueError(f"options['branch_steps'] must be a list of step indices, got {steps!r}.")
    if any(later <= earlier for earlier, later in pairwise(steps)):
        raise ValueError(f"options['branch_steps'] must be strictly increasing, got {list(steps)}.")
    num_steps = len(sde_types)
    for step in steps:
        if not 0 <= step < num_steps:
            raise ValueError(f"options['branch_steps'] has step {step}, outside 0..{num_steps - 1} of this schedule.")
        if not sde.get_sde(sde_types[step]).stochastic:
            raise ValueError(
                f"options['branch_steps'] has step {step}, which is deterministic ({sde_types[step]}) in this episode: "
                "children of a split need the SDE's noise there; branch inside the SDE window."
            )
