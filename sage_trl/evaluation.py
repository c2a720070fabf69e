"""Deterministic evaluation on fixed prompts and seeds: the same videos before and after training.

Besides the reward, an evaluation can carry measurements the reward cannot fool (``measures``): on the toy world,
the distance of each video to the world's own videos of its prompt and its object's area against the world's
(`sage_env.toy.gold`, `world_measures`). Summaries show them beside the reward, because a rising reward is not yet
a better model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from sage_env.backbones import VideoBackbone
from sage_env.env import sample
from sage_env.models import SamplingDefaults
from sage_env.rewards import CompositeReward

__all__ = ["WORLD_MEASURES", "EvaluationResult", "evaluate_policy", "summary_table", "world_measures"]


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
    measures: dict[str, torch.Tensor] = field(default_factory=dict)

    def _values(self) -> dict[str, torch.Tensor]:
        return {**self.components, "total": self.total, **self.measures}

    def means(self) -> dict[str, float]:
        """Mean of every component, of the total and of every measure over the valid videos."""
        return {name: float(torch.nanmean(scores)) for name, scores in self._values().items()}

    def stds(self) -> dict[str, float]:
        """Population std of every component, of the total and of every measure over the valid videos."""
        return {name: _nanstd(scores) for name, scores in self._values().items()}


def _nanstd(scores: torch.Tensor) -> float:
    finite = scores[torch.isfinite(scores)]
    return float(finite.std(unbiased=False)) if finite.numel() > 1 else 0.0


def evaluate_policy(
    backbone: VideoBackbone,
    reward: CompositeReward,
    prompts: Sequence[str],
    seeds: Sequence[int],
    sampling: SamplingDefaults | None = None,
    *,
    negative_prompt: str | None = None,
    batch_size: int = 16,
    measure: Callable[[torch.Tensor, list[str]], dict[str, torch.Tensor]] | None = None,
) -> EvaluationResult:
    """Sample one video per (prompt, seed) deterministically (ODE steps of `sage_env.env.sample`) and score it.

    The same prompts and seeds give the same starting noise, so results before and after training are
    directly comparable. ``sampling``: the run's size, steps, shift, guidance and frame rate, each unset one the
    backbone's default, as in rollouts. ``measure(videos, prompts) -> {name: (N,)}`` adds measurements beside the
    reward (`world_measures` for the toy world).
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"Need one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds.")
    batches = [slice(start, start + batch_size) for start in range(0, len(prompts), batch_size)]
    parts = [
        sample(
            backbone,
            list(prompts[rows]),
            list(seeds[rows]),
            sampling,
            negative_prompt=negative_prompt,
            reward=reward,
        )
        for rows in batches
    ]
    rewards = [trajectory.rewards for trajectory in parts]
    videos = torch.cat([trajectory.videos.cpu() for trajectory in parts])
    return EvaluationResult(
        prompts=list(prompts),
        seeds=list(seeds),
        components={name: torch.cat([r.components[name] for r in rewards]) for name in rewards[0].components},
        total=torch.cat([r.total for r in rewards]),
        videos=videos,
        measures=measure(videos, list(prompts)) if measure is not None else {},
    )


WORLD_MEASURES = {
    "world_distance": "RMS pixel distance to the nearest of the world's own videos of the prompt (0 is the world)",
    "object_area_ratio": "the object's area per frame over the world's for the prompt's shape (1 is the world)",
}
"""The toy world's measurements in an evaluation, and what each means (`sage_env.toy.gold`)."""


def world_measures(videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
    """The toy world's gold measurements of `WORLD_MEASURES` (a ``measure`` for `evaluate_policy`)."""
    from sage_env.toy.gold import gold_report

    report = gold_report(videos, prompts)
    return {"world_distance": report.distance, "object_area_ratio": report.area_ratio}


def summary_table(before: EvaluationResult, after: EvaluationResult) -> str:
    """Markdown table: mean +- std per component (and measure) before and after, and the change."""
    before_means, after_means = before.means(), after.means()
    before_stds, after_stds = before.stds(), after.stds()
    lines = ["| component | before | after | change |", "|---|---|---|---|"]
    for name in [*sorted(before.components), "total", *before.measures]:
        change = after_means[name] - before_means[name]
        sign = "+" if change >= 0 or math.isnan(change) else ""
        lines.append(
            f"| {name} | {before_means[name]:.4f} ± {before_stds[name]:.4f} | "
            f"{after_means[name]:.4f} ± {after_stds[name]:.4f} | {sign}{change:.4f} |"
        )
    legend = [f"- `{name}`: {WORLD_MEASURES[name]}" for name in before.measures if name in WORLD_MEASURES]
    return "\n".join(lines + (["", *legend] if legend else []))
