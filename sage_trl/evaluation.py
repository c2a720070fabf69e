"""Deterministic evaluation on fixed prompts and seeds: the same videos before and after training."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sage_env.backbones import VideoBackbone
from sage_env.env import BackbonePolicy, DenoisingVectorEnv, run_episode
from sage_env.rewards import CompositeReward

__all__ = ["EvaluationResult", "evaluate_policy", "summary_table"]


@dataclass
class EvaluationResult:
    """Scores and videos of one evaluation.

    Args:
        prompts: the prompt of each video.
        seeds: the seed of each video.
        components: ``{name: (N,)}`` reward components (NaN where the reward failed).
        total: ``(N,)`` weighted reward.
        videos: ``(N, F, 3, H, W)`` in [0, 1].
    """

    prompts: list[str]
    seeds: list[int]
    components: dict[str, torch.Tensor]
    total: torch.Tensor
    videos: torch.Tensor

    def means(self) -> dict[str, float]:
        """Mean of every component and of the total over the valid videos."""
        values = {**self.components, "total": self.total}
        return {name: float(torch.nanmean(scores)) for name, scores in values.items()}

    def stds(self) -> dict[str, float]:
        """Population std of every component and of the total over the valid videos."""
        values = {**self.components, "total": self.total}
        return {name: _nanstd(scores) for name, scores in values.items()}


def _nanstd(scores: torch.Tensor) -> float:
    finite = scores[torch.isfinite(scores)]
    return float(finite.std(unbiased=False)) if finite.numel() > 1 else 0.0


def evaluate_policy(
    backbone: VideoBackbone,
    reward: CompositeReward,
    prompts: Sequence[str],
    seeds: Sequence[int],
    *,
    num_frames: int,
    height: int,
    width: int,
    num_steps: int | None = None,
    shift: float | None = None,
    guidance_scale: float = 1.0,
    negative_prompt: str | None = None,
    batch_size: int = 16,
    sde: str = "ode",
) -> EvaluationResult:
    """Sample one video per (prompt, seed) with the deterministic sampler (``sde="ode"``) and score it.

    The same prompts and seeds give the same starting noise, so results before and after training are
    directly comparable. ``num_steps``/``shift`` None: the backbone's own schedule, as in rollouts
    (`sage_env.DenoisingVectorEnv`).
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"Need one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds.")
    parts = []
    for start in range(0, len(prompts), batch_size):
        batch_prompts, batch_seeds = (
            list(prompts[start : start + batch_size]),
            list(seeds[start : start + batch_size]),
        )
        env = DenoisingVectorEnv(
            backbone,
            reward,
            num_envs=len(batch_prompts),
            group_size=1,
            num_frames=num_frames,
            height=height,
            width=width,
            num_steps=num_steps,
            shift=shift,
            sde=sde,
            eta=0.0,
            array_mode="torch",
        )
        policy = BackbonePolicy(backbone, guidance_scale, negative_prompt)
        parts.append(run_episode(env, policy, options={"prompts": batch_prompts, "seeds": batch_seeds}))
    rewards = [trajectory.rewards for trajectory in parts]
    return EvaluationResult(
        prompts=list(prompts),
        seeds=list(seeds),
        components={name: torch.cat([r.components[name] for r in rewards]) for name in rewards[0].components},
        total=torch.cat([r.total for r in rewards]),
        videos=torch.cat([trajectory.videos.cpu() for trajectory in parts]),
    )


def summary_table(before: EvaluationResult, after: EvaluationResult) -> str:
    """Markdown table: mean +- std per component before and after, and the change."""
    before_means, after_means = before.means(), after.means()
    before_stds, after_stds = before.stds(), after.stds()
    lines = ["| component | before | after | change |", "|---|---|---|---|"]
    for name in [*sorted(before.components), "total"]:
        change = after_means[name] - before_means[name]
        sign = "+" if change >= 0 or math.isnan(change) else ""
        lines.append(
            f"| {name} | {before_means[name]:.4f} ± {before_stds[name]:.4f} | "
            f"{after_means[name]:.4f} ± {after_stds[name]:.4f} | {sign}{change:.4f} |"
        )
    return "\n".join(lines)
