"""Diagnostic metrics of a training step (docs/runs.md, "What the metrics mean"): the clip fractions by side and how
far the training forward's log-probabilities are from the rollout's, in all and per denoising step."""

from __future__ import annotations

import torch

__all__ = ["PER_STEP_METRICS", "PER_STEP_PREFIX", "clip_metrics", "per_step_prefix", "rollout_gap_metrics"]

PER_STEP_PREFIX = "diagnostics/step_"
"""Metrics of one denoising step's pairs: ``diagnostics/step_<k>/<metric>``, with ``diagnostics/step_<k>/pairs``
their share of the micro-batch (a trainer turns the shares into the step's mean over its own pairs)."""


PER_STEP_METRICS = ("log_prob_gap", "pairs")
"""The per-step metric names under `per_step_prefix` (`rollout_gap_metrics` writes them)."""


def per_step_prefix(step: int) -> str:
    """``diagnostics/step_07/``: the prefix of denoising step ``step``'s metrics."""
    return f"{PER_STEP_PREFIX}{step:02d}/"


def clip_metrics(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fractions of the pairs whose ratio was clipped: in all, above ``1 + epsilon_high`` and below ``1 - epsilon``."""
    clipped, ratio = stats["clipped"], stats["ratio"]
    return {
        "clip_fraction": clipped.float().mean(),
        "clip_fraction_high": (clipped & (ratio > 1)).float().mean(),
        "clip_fraction_low": (clipped & (ratio < 1)).float().mean(),
    }


def rollout_gap_metrics(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, step_index: torch.Tensor, on_policy: bool
) -> dict[str, torch.Tensor]:
    """The mean absolute gap between the training forward's log-probabilities and the rollout's, in all and per
    denoising step (``diagnostics/step_<k>/log_prob_gap`` as a share of the micro-batch, with ``.../pairs``), and
    before the first optimizer step on a rollout (``on_policy``: the policy *is* the behaviour policy, the
    importance ratio must be 1) the ratio's mean deviation from 1. Dropout left on, another dtype or batching
    between rollout and training, or a non-deterministic kernel show here first; a gap growing with the step shows
    where along the trajectory (the steps the equalizer weights differently, paper Sec. 4.2)."""
    gap = (log_prob - old_log_prob).abs()
    metrics = {"diagnostics/log_prob_gap": gap.mean()}
    if on_policy:
        metrics["diagnostics/on_policy_ratio_deviation"] = (torch.exp(log_prob - old_log_prob) - 1).abs().mean()
    pairs = max(len(gap), 1)
    for step in torch.unique(step_index).tolist():  # a few host values: the metrics are logged as floats anyway
        at = step_index == step
        prefix = per_step_prefix(int(step))
        metrics[f"{prefix}log_prob_gap"] = gap[at].sum() / pairs
        metrics[f"{prefix}pairs"] = at.sum() / pairs
    return metrics
