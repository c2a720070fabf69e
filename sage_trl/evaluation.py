"""Deterministic evaluation on fixed prompts and seeds: the same videos before and after training.

Besides the reward, an evaluation can carry measurements the reward cannot fool (``measures``): on the toy world,
the distance of each video to the world's own videos of its prompt and its object's area against the world's
(`sage_env.toy.gold`, `world_measures`). Summaries show them beside the reward, because a rising reward is not yet
a better model.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from sage_env.backbones import VideoBackbone
from sage_env.env import sample
from sage_env.models import SamplingDefaults
from sage_env.rewards import CompositeReward, RewardOutput

__all__ = [
    "EVAL_REWARD_PREFIX",
    "HELD_OUT_EVAL_REWARD",
    "HELD_OUT_REWARD",
    "HELD_OUT_WORLD",
    "TRAINING_REWARD_PREFIX",
    "WORLD_MEASURES",
    "WORLD_PREFIX",
    "EvaluationResult",
    "evaluate_policy",
    "evaluation_metrics",
    "is_evaluation_record",
    "logged_name",
    "metric_name",
    "sampling_held_out",
    "world_measures",
]

EVAL_REWARD_PREFIX = "eval_reward/"
"""Names of the evaluation rewards' components (and their ``total``) in an `EvaluationResult` and its metrics."""

TRAINING_REWARD_PREFIX = "reward/"
"""The training reward's components and ``total`` in an evaluation's metrics (as the training rollouts log them)."""

WORLD_PREFIX = "world/"
"""The toy world's measures (`WORLD_MEASURES`) in an evaluation's metrics."""


def metric_name(name: str, prefix: str = "eval") -> str:
    """An evaluation metric's logged name, the transformers way: ``<prefix>_<name>`` (its trackers show it under
    ``<prefix>/``), e.g. ``metric_name(TRAINING_REWARD_PREFIX + "total")`` is ``eval_reward/total``."""
    return f"{prefix}_{name}"


HELD_OUT_REWARD = metric_name(TRAINING_REWARD_PREFIX)
"""``eval_reward/``: an evaluation's training-reward metrics (``HELD_OUT_REWARD + "total"``, its components)."""
HELD_OUT_EVAL_REWARD = metric_name(EVAL_REWARD_PREFIX)
"""``eval_eval_reward/``: an evaluation's evaluation-reward metrics."""
HELD_OUT_WORLD = metric_name(WORLD_PREFIX)
"""``eval_world/``: an evaluation's toy-world measures."""


def is_evaluation_record(record: dict) -> bool:
    """Whether a logged record (``metrics.jsonl``, the log history) is an evaluation's (it has the held-out total)."""
    return isinstance(record.get(HELD_OUT_REWARD + "total"), (int, float))


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
    eval_rewards: dict[str, torch.Tensor] = field(default_factory=dict)
    """``{f"{EVAL_REWARD_PREFIX}{component}": (N,)}``: the evaluation rewards (logged, never optimised), with their
    ``total``; their own names, so a component the training reward shares (``vq`` of two toy rewards) stays apart."""

    def _values(self) -> dict[str, torch.Tensor]:
        return {**self.components, "total": self.total, **self.eval_rewards, **self.measures}

    def means(self) -> dict[str, float]:
        """Mean of every component, of the total and of every measure over the valid videos."""
        return {name: float(torch.nanmean(scores)) for name, scores in self._values().items()}

    def stds(self) -> dict[str, float]:
        """Population std of every component, of the total and of every measure over the valid videos."""
        return {name: _nanstd(scores) for name, scores in self._values().items()}


def _nanstd(scores: torch.Tensor) -> float:
    finite = scores[torch.isfinite(scores)]
    return float(finite.std(unbiased=False)) if finite.numel() > 1 else 0.0


_SAMPLING_HELD_OUT: ContextVar[bool] = ContextVar("sampling_held_out", default=False)


def sampling_held_out() -> bool:
    """True while `evaluate_policy` samples the held-out videos and scores them with the training reward, in its
    thread (the evaluation rewards score them after): a forward hook tells the evaluation's transformer forwards from
    the training's by it (the arena's compute counter, `sage_trl.arena.compute`)."""
    return _SAMPLING_HELD_OUT.get()


@contextmanager
def _held_out_sampling() -> Iterator[None]:
    token = _SAMPLING_HELD_OUT.set(True)
    try:
        yield
    finally:
        _SAMPLING_HELD_OUT.reset(token)


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
    eval_reward: CompositeReward | None = None,
) -> EvaluationResult:
    """Sample one video per (prompt, seed) deterministically (ODE steps of `sage_env.env.sample`) and score it.

    The same prompts and seeds give the same starting noise, so results before and after training are
    directly comparable. ``sampling``: the run's size, steps, shift, guidance and frame rate, each unset one the
    backbone's default, as in rollouts. ``measure(videos, prompts) -> {name: (N,)}`` adds measurements beside the
    reward (`world_measures` for the toy world); ``eval_reward`` scores the same videos with rewards that are
    logged and never optimised (`EvaluationResult.eval_rewards`).
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"Need one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds.")
    batches = [slice(start, start + batch_size) for start in range(0, len(prompts), batch_size)]
    with _held_out_sampling():
        parts = [
            sample(backbone, list(prompts[rows]), list(seeds[rows]), sampling, negative_prompt=negative_prompt, reward=reward)
            for rows in batches
        ]
    rewards = RewardOutput.concat([trajectory.rewards for trajectory in parts])
    videos = torch.cat([trajectory.videos.cpu() for trajectory in parts])
    fps = (sampling or backbone.sampling_defaults).filled_from(backbone.sampling_defaults).fps
    return EvaluationResult(
        prompts=list(prompts),
        seeds=list(seeds),
        components=rewards.components,
        total=rewards.total,
        videos=videos,
        measures=measure(videos, list(prompts)) if measure is not None else {},
        eval_rewards=_eval_reward_scores(eval_reward, videos, list(prompts), fps) if eval_reward is not None else {},
    )


def _eval_reward_scores(
    eval_reward: CompositeReward, videos: torch.Tensor, prompts: list[str], fps: float
) -> dict[str, torch.Tensor]:
    """Every component of ``eval_reward`` and its weighted total (NaN where it failed), named for the results."""
    scored = eval_reward(videos, prompts, fps=fps)
    values = {**scored.components, "total": scored.total}
    return {f"{EVAL_REWARD_PREFIX}{name}": scores.float().cpu() for name, scores in values.items()}


def evaluation_metrics(result: EvaluationResult, prefix: str = "eval") -> dict[str, float]:
    """The logged metrics of an evaluation, named the transformers way (``<prefix>_...``, which its trackers show
    under ``<prefix>/``): ``reward/<component>`` and ``reward/total`` for the training reward (the names of the
    training rollouts' ``reward/...``), ``eval_reward/...`` for the evaluation rewards, ``world/<measure>`` for the
    measures (docs/runs.md)."""
    return {logged_name(name, prefix, result.measures): mean for name, mean in result.means().items()}


def logged_name(name: str, prefix: str = "eval", measures: Collection[str] | None = None) -> str:
    """The logged metric (`evaluation_metrics`) of an evaluation's result ``name`` (an ``eval_results.json`` key: a
    training-reward component or ``total``, an ``eval_reward/...`` or a name of ``measures``, by default the toy
    world's `WORLD_MEASURES`)."""
    if name.startswith(EVAL_REWARD_PREFIX):
        return metric_name(name, prefix)
    is_measure = name in (WORLD_MEASURES if measures is None else measures)
    return metric_name((WORLD_PREFIX if is_measure else TRAINING_REWARD_PREFIX) + name, prefix)


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
