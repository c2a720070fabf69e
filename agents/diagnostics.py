"""Diagnostic metrics of a training step (docs/runs.md, "What the metrics mean"): the clip fractions by side, how
far the training forward's log-probabilities are from the rollout's, in all and per denoising step, and the
gradient norm per denoising step."""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "GRADIENT_NORM",
    "PER_STEP_METRICS",
    "PER_STEP_PREFIX",
    "clip_metrics",
    "per_step_gradient_norms",
    "per_step_prefix",
    "rollout_gap_metrics",
]

PER_STEP_PREFIX = "diagnostics/step_"
"""Metrics of one denoising step's pairs: ``diagnostics/step_<k>/<metric>``, with ``diagnostics/step_<k>/pairs``
their share of the micro-batch (a trainer turns the shares into the step's mean over its own pairs)."""


PER_STEP_METRICS = ("log_prob_gap", "pairs")
"""The per-step metric names under `per_step_prefix` that `rollout_gap_metrics` writes."""

GRADIENT_NORM = "grad_norm"
"""The per-step metric `per_step_gradient_norms` writes: ``diagnostics/step_<k>/grad_norm``."""


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


def per_step_gradient_norms(
    algorithm: Any, policy: Any, batch: Any, references: Any, parameters: list[torch.Tensor], micro_batch_size: int
) -> dict[int, float]:
    """``{denoising step: L2 norm of the gradient of that step's loss}`` over ``parameters``: the mean loss of
    the batch's pairs at each step (as `algorithm.loss` weighs them: with the equalizer's weights), backpropagated
    on its own in micro-batches of ``micro_batch_size``. The paper's Fig. 4 / Eq. 8: without the equalizer the
    norm grows as the noise falls; the equalizer (Eq. 9) is meant to flatten it. Costs one more forward and
    backward of every pair; the parameters' ``.grad`` are left untouched (`torch.autograd.grad`). A batch without
    denoising steps (a likelihood-free algorithm's) gives ``{}``."""
    step_index = getattr(batch, "step_index", None)
    if step_index is None or len(batch) == 0:
        return {}
    norms = {}
    for step in torch.unique(step_index).tolist():  # a few host values, on a diagnostic step only
        rows = batch.select(torch.nonzero(step_index == step).flatten())
        gradient = [torch.zeros_like(p) for p in parameters]
        for chunk in rows.chunks(micro_batch_size):
            loss, _ = algorithm.loss(policy, chunk, references)
            parts = torch.autograd.grad(loss * (len(chunk) / len(rows)), parameters, allow_unused=True)
            for total, part in zip(gradient, parts):
                if part is not None:
                    total.add_(part.float())
        norms[int(step)] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in gradient])))
    return norms
