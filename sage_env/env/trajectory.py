"""The record of a batch of rollouts: `Trajectory` (what a learner consumes) and `TrajectoryRecorder`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from sage_env import sde
from sage_env.env.branching import BranchPlan
from sage_env.rewards import RewardOutput

__all__ = ["Trajectory", "TrajectoryRecorder"]


@dataclass
class Trajectory:
    """Everything a learner needs to recompute log-probabilities of a batch of rollouts.

    Tensors are batch-first (``N`` samples, ``T`` steps) and live on the environment's device.

    Args:
        prompts: the prompt of each sample.
        group_index: ``(N,)`` index of each sample's group (samples of a group share the prompt).
        seeds: ``(N,)`` per-sample seeds: initial noise and every step's noise come from them.
        sigmas: ``(N, T + 1)`` noise levels, from 1 down to 0.
        latents: ``(N, T + 1, *latent_shape)`` float32 latents before each step and the final ones.
        log_probs: ``(N, T)`` rollout-phase log-probability of each transition (0 where deterministic).
        stds: ``(N, T)`` noise std of each transition.
        trainable: ``(N, T)`` bool, True where the step was stochastic (std > 0): only these have a policy
            gradient.
        sde_types: the SDE type applied at each of the ``T`` steps (``"ode"`` outside the SDE window).
        eta: exploration scale of the stochastic steps.
        log_prob_kind: how log-probabilities were computed (see `sage_env.sde.gaussian_log_prob`).
        rewards: the `RewardOutput` of the final videos (None until the episode ends).
        videos: the decoded final videos ``(N, F, 3, H, W)`` in [0, 1] (None until the episode ends).
        means: ``(N, T, *latent_shape)`` the mean of each transition, recorded only when the episode was reset with
            ``options={"record_means": True}`` (GRPO-Guard's ratio normalisation needs it); None otherwise.
        branch_steps, branch_factor: the trees the samples are leaves of, when the episode was reset with
            ``options={"branch_steps": [...]}`` (`sage_env.env.branching`: trees of ``branch_factor **
            len(branch_steps)`` consecutive samples, split at those steps); ``()`` and 1: no trees.
    """

    prompts: tuple[str, ...]
    group_index: torch.Tensor
    seeds: torch.Tensor
    sigmas: torch.Tensor
    latents: torch.Tensor
    log_probs: torch.Tensor
    stds: torch.Tensor
    trainable: torch.Tensor
    sde_types: tuple[str, ...]
    eta: float
    log_prob_kind: str = "gaussian"
    rewards: RewardOutput | None = None
    videos: torch.Tensor | None = None
    means: torch.Tensor | None = None
    branch_steps: tuple[int, ...] = ()
    branch_factor: int = 1

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_steps(self) -> int:
        """Number of denoising steps ``T``."""
        return self.log_probs.shape[1]

    @classmethod
    def concat(cls, parts: Sequence[Trajectory]) -> Trajectory:
        """Several finished batches (or single-video episodes) as one trajectory.

        The parts must come from the same settings (steps, SDE types, ``eta``, log-probability kind, latent shape).
        Groups are formed by prompt: every sample of a prompt, from whichever part, joins that prompt's group, so
        episodes of a single-video environment run several times per prompt make GRPO groups.
        """
        parts = list(parts)
        if not parts:
            raise ValueError("Cannot concatenate an empty list of trajectories.")
        first = parts[0]
        for part in parts[1:]:
            if _settings(part) != _settings(first):
                raise ValueError(
                    "Trajectories sampled with different settings (steps, SDE types, eta, log_prob_kind, video size "
                    "or branching) cannot be concatenated; sample them from one environment."
                )
        if any(part.rewards is None for part in parts):
            raise ValueError("Every trajectory must be finished (rewarded) before they are concatenated.")
        prompts = tuple(prompt for part in parts for prompt in part.prompts)
        groups = {prompt: index for index, prompt in enumerate(dict.fromkeys(prompts))}
        tensors = {
            name: torch.cat([getattr(part, name) for part in parts])
            for name in ("seeds", "sigmas", "latents", "log_probs", "stds", "trainable")
        }
        optional = {
            name: None if any(getattr(p, name) is None for p in parts) else torch.cat([getattr(p, name) for p in parts])
            for name in ("videos", "means")
        }
        return replace(
            first,
            prompts=prompts,
            group_index=torch.tensor([groups[prompt] for prompt in prompts], device=first.group_index.device),
            rewards=RewardOutput.concat([part.rewards for part in parts]),
            **optional,
            **tensors,
        )

    def state_dict(self) -> dict[str, Any]:
        """The trajectory as tensors, strings and numbers (a checkpoint's buffered rollout, saved without pickle),
        without the decoded videos: a learner trains on latents, and videos would dominate the file."""
        state: dict[str, Any] = {}
        for field_ in fields(self):
            value = getattr(self, field_.name)
            if field_.name == "videos":
                continue
            if isinstance(value, RewardOutput):
                value = value.state_dict()
            state[field_.name] = list(value) if isinstance(value, tuple) else value
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Trajectory:
        """The inverse of `state_dict` (``videos`` None)."""
        values = dict(state)
        values["prompts"] = tuple(values["prompts"])
        values["sde_types"] = tuple(values["sde_types"])
        values["branch_steps"] = tuple(values.get("branch_steps", ()))
        if values.get("rewards") is not None:
            values["rewards"] = RewardOutput.from_state_dict(values["rewards"])
        return cls(**values)

    def select(self, index: torch.Tensor | Sequence[int]) -> Trajectory:
        """The samples ``index`` (in that order) as a new trajectory."""
        index = torch.as_tensor(index, dtype=torch.long)
        values = {}
        for field_ in fields(self):
            value = getattr(self, field_.name)
            if isinstance(value, torch.Tensor):
                value = value[index.to(value.device)]
            elif field_.name == "prompts":
                value = tuple(value[i] for i in index.tolist())
            elif isinstance(value, RewardOutput):
                value = _select_rewards(value, index)
            values[field_.name] = value
        return replace(self, **values)


def _settings(trajectory: Trajectory) -> tuple[Any, ...]:
    """What two trajectories must share to be concatenated."""
    return (
        trajectory.sde_types,
        trajectory.eta,
        trajectory.log_prob_kind,
        trajectory.latents.shape[1:],
        trajectory.branch_steps,
        trajectory.branch_factor,
    )


def _select_rewards(rewards: RewardOutput, index: torch.Tensor) -> RewardOutput:
    return RewardOutput(
        total=rewards.total[index],
        components={name: scores[index] for name, scores in rewards.components.items()},
        valid=rewards.valid[index],
        errors=[rewards.errors[i] for i in index.tolist()],
        weights=dict(rewards.weights),
    )


class TrajectoryRecorder:
    """Collects the per-step tensors of one batch of rollouts and assembles the `Trajectory` at the end.

    Args:
        prompts: the prompt of each sample.
        group_size: samples per group (a group is a consecutive block of samples sharing the prompt).
        seeds: ``(N,)`` per-sample seeds.
        sigmas: ``(N, T + 1)`` per-sample noise levels.
        initial_latents: ``(N, *latent_shape)`` the starting noise.
        sde_types, eta, log_prob_kind: the SDE settings of the ``T`` steps.
        record_means: also keep each transition's mean (`Trajectory.means`).
        branching: the episode's trees (`Trajectory.branch_steps`, ``branch_factor``), None without.
    """

    def __init__(
        self,
        prompts: tuple[str, ...],
        group_size: int,
        seeds: torch.Tensor,
        sigmas: torch.Tensor,
        initial_latents: torch.Tensor,
        sde_types: tuple[str, ...],
        eta: float,
        log_prob_kind: str,
        record_means: bool = False,
        branching: BranchPlan | None = None,
    ) -> None:
        self._static = {
            "prompts": prompts,
            "group_index": torch.arange(len(prompts) // group_size).repeat_interleave(group_size),
            "seeds": seeds.clone(),
            "sigmas": sigmas.clone(),
            "sde_types": sde_types,
            "eta": eta,
            "log_prob_kind": log_prob_kind,
            "branch_steps": branching.branch_steps if branching is not None else (),
            "branch_factor": branching.branch_factor if branching is not None else 1,
        }
        self._steps: dict[str, list[torch.Tensor]] = {
            "latents": [initial_latents],
            "log_probs": [],
            "stds": [],
            "trainable": [],
            **({"means": []} if record_means else {}),
        }

    def record(self, out: sde.SDEStepOutput) -> None:
        """Append one step's transition."""
        self._steps["latents"].append(out.x_next)
        self._steps["log_probs"].append(out.log_prob)
        self._steps["stds"].append(out.std)
        self._steps["trainable"].append(out.trainable)
        if "means" in self._steps:
            self._steps["means"].append(out.mean)

    def finish(self, rewards: RewardOutput, videos: torch.Tensor) -> Trajectory:
        """The recorded `Trajectory`, with the rewards and decoded videos of the final latents."""
        stacked = {name: torch.stack(values, dim=1) for name, values in self._steps.items()}
        return Trajectory(**self._static, **stacked, rewards=rewards, videos=videos)
