"""AWM, advantage-weighted matching (Xue et al., 2025, "Advantage Weighted Matching: Aligning RL with Pretraining
in Diffusion Models", arXiv 2509.25050): likelihood-free. The flow-matching loss of the policy's own final samples,
noised again by the forward process, weighted by their advantages: pretraining's objective, steered by the reward.

Written from the paper and the authors' code (scxue/advantage_weighted_matching at be51372,
``scripts/train_sd3_awm.py``, ``config/dgx_awm.py``), checked against Flow-Factory's ``trainers/awm.py``. Per
(final sample ``x0``, noise level ``t``) with fresh noise ``eps``:

* ``l = mean_d (v(x_t) - (eps - x0))^2`` and its weighting ``w(l, t)`` (default ``ghuber``:
  ``(t / p) ((l + 1e-10)^p - 1e-10^p)`` with ``p = 0.25``), the sample's "log-probability" being ``-w``;
* the PPO-form loss ``max(-A' r, -A' clip(r))`` with ``r = exp(-w + w_old)`` and ``A' = clip(A, -5, 5) / 5``: on-policy
  (``w_old = w`` without gradient, ratio 1) its gradient is ``A' grad w``, the advantage-weighted matching loss;
* ``beta x mean_d (v - v_ref)^2`` to the initial model (1e-3 for GenEval) plus ``ema_kl_coef x mean_d (v - v_ema)^2``
  to an EMA of the policy, soft-updated after each step with ``d = min(0.001 x step, 0.3)``.

Published defaults: 6 noise levels per sample, one per stratum of the rollout's levels 1 .. ``0.9 T`` (never the first,
pure-noise one; ``discrete_wo_init``), CFG-free, ODE-like rollouts, lr 3e-4, advantages from the group's mean and
the batch's std. Differences on purpose: each sample draws its own levels (theirs share them within a micro-batch)
so that a sample's rows do not depend on the process holding it; the EMA term does not need ``beta > 0`` (theirs
is nested under it, as Flow-Factory notes); a pass over a rollout after the policy moved (``num_iterations > 1``,
several optimizer steps per rollout) is refused, as the authors' clipping is inactive and their runs are on-policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents import objective
from agents.algorithm import FinalSampleBatch, References
from agents.likelihood_free import (
    LikelihoodFreeAlgorithm,
    LikelihoodFreeConfig,
    initial_model_reference,
    soft_update_decay,
)
from agents.references import ParameterSnapshot
from sage_env.backbones import VideoBackbone
from sage_env.checks import Choice, Integer, Real, hyperparameter

__all__ = ["WEIGHTINGS", "AWMAgentConfig", "AWMAlgorithm", "matching_weight", "stratified_levels"]

_GHUBER_OFFSET = 1e-10
"""The authors' offset inside the generalised Huber weighting (keeps its gradient finite at l = 0)."""


def _ghuber(loss: torch.Tensor, t: torch.Tensor, power: float) -> torch.Tensor:
    return (t / power) * ((loss + _GHUBER_OFFSET) ** power - _GHUBER_OFFSET**power)


WEIGHTINGS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "uniform": lambda loss, t, power: loss,
    "t": lambda loss, t, power: t * loss,
    "t2": lambda loss, t, power: t**2 * loss,
    "huber": lambda loss, t, power: t * ((loss + _GHUBER_OFFSET).sqrt() - 1e-5),
    "ghuber": _ghuber,
}
"""AWM's weightings ``w(l, t)`` of the per-row matching loss (the authors' ``weighting`` options)."""


@dataclass
class AWMAgentConfig(LikelihoodFreeConfig):
    """AWM's published defaults (GenEval): ODE rollouts, CFG-free, a fixed KL to the initial model with coefficient
    1e-3 (``beta``), lr 3e-4, advantages from the group's mean and the batch's std, no PPO clip (``epsilon`` inf:
    theirs, 1, never binds on-policy); ``equalizer`` and the moving anchor do not apply.

    Besides its ``defaults`` it declares its noise levels, its weighting and its EMA anchor.
    """

    display_name: ClassVar[str] = "AWM"
    summary: ClassVar[str | None] = (
        "likelihood-free: advantage-weighted flow matching on the policy's own final samples"
    )

    defaults: ClassVar[Mapping[str, Any]] = {"beta": 1e-3, "epsilon": float("inf")}  # over LikelihoodFreeConfig's

    awm_noise_levels: int = hyperparameter(
        6,
        "AWM: noise levels trained per sample, one from each stratum of the rollout's levels 1 .. "
        "timestep_fraction x steps (the pure-noise level 0 never). Training cost grows linearly with it. "
        "Published: 6 (arXiv 2509.25050; train_timesteps).",
        Integer(1, 10**4),
    )
    awm_weighting: str = hyperparameter(
        "ghuber",
        "AWM: weighting w(l, t) of each row's matching loss l: uniform (l), t, t2, huber, ghuber (a generalised "
        "Huber, robust to large errors). Published: ghuber.",
        Choice(tuple(WEIGHTINGS)),
    )
    awm_ghuber_power: float = hyperparameter(
        0.25,
        "AWM: the power p of the ghuber weighting; smaller is more robust to large errors. Published: 0.25.",
        Real(0.0, 1.0, low_open=True),
    )
    ema_kl_coef: float = hyperparameter(
        1.0,
        "AWM: coefficient of the velocity KL to an EMA of the policy (0 turns the EMA anchor off). Larger keeps "
        "each step closer to the recent policy. Published: 1.",
        Real(0.0),
    )
    ema_decay_rate: float = hyperparameter(
        0.001,
        "AWM: the EMA anchor's decay grows by this per optimizer step (ema <- d ema + (1 - d) policy). "
        "Published: 0.001.",
        Real(0.0, 1.0),
    )
    ema_decay_max: float = hyperparameter(
        0.3, "AWM: the largest decay of the EMA anchor. Published: 0.3.", Real(0.0, 1.0, high_open=True)
    )

    def check_algorithm_rules(self) -> None:
        """The likelihood-free rules, and one pass per rollout: AWM's log-probability is the current policy's."""
        super().check_algorithm_rules()
        if self.num_iterations != 1:
            raise ValueError(
                f"num_iterations={self.num_iterations}: AWM trains on-policy only (one pass over each rollout); "
                "set num_iterations=1."
            )


def stratified_levels(num_steps: int, fraction: float, count: int, generator: torch.Generator) -> torch.Tensor:
    """AWM's ``discrete_wo_init`` levels: one uniformly drawn level from each of ``count`` strata of
    ``1 .. int(fraction x num_steps)`` (fewer strata when there are fewer levels; level 0 only for a 1-step schedule)."""
    last = int(fraction * num_steps)
    count = max(1, min(count, last - 1))
    if last < 2:
        return torch.zeros(1, dtype=torch.long)
    bounds = torch.linspace(1, last, count + 1).long()
    draws = torch.rand(count, generator=generator)
    return bounds[:-1] + (draws * (bounds[1:] - bounds[:-1]).float()).long()


def matching_weight(loss: torch.Tensor, t: torch.Tensor, weighting: str, power: float) -> torch.Tensor:
    """``w(l, t)`` of `WEIGHTINGS`, computed in float64 as the authors do."""
    return WEIGHTINGS[weighting](loss.double(), t.double(), power)


class AWMAlgorithm(LikelihoodFreeAlgorithm):
    """AWM's update: `FinalSampleBatch` rows at `stratified_levels`, the advantage-weighted matching loss, the EMA
    anchor's soft update."""

    config_class = AWMAgentConfig

    def build_references(self, module: torch.nn.Module) -> References:
        """The EMA anchor (``anchor``; none when ``ema_kl_coef`` is 0) and the initial model of the KL."""
        cfg = self.config
        anchor = ParameterSnapshot(module, offload=cfg.reference_offload) if cfg.ema_kl_coef > 0 else None
        return References(anchor=anchor, fixed=initial_model_reference(module, cfg))

    def noise_levels(self, num_steps: int, generator: torch.Generator) -> torch.Tensor:
        """`stratified_levels` of the rollout's schedule."""
        cfg = self.config
        return stratified_levels(num_steps, cfg.timestep_fraction, cfg.awm_noise_levels, generator)

    def loss(
        self, policy: VideoBackbone, batch: FinalSampleBatch, references: References
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The advantage-weighted matching loss of one micro-batch plus its two velocity KL terms."""
        cfg = self.config
        if not batch.on_policy:
            raise ValueError(
                "AWM trains on-policy only (its log-probability is defined by the current policy): use one pass "
                "and one optimizer step per rollout (num_iterations=1, gradient_accumulation_steps a multiple of "
                "steps_per_generation; num_minibatches=1 in the gymnasium loop)."
            )
        noisy = self.noisy(batch)
        ema_velocity = self.frozen_velocity(policy, batch, noisy, references.anchor)
        reference_velocity = self.frozen_velocity(policy, batch, noisy, references.fixed)
        velocity = self.velocity(policy, batch, noisy)
        matching = (velocity.double() - (batch.noise - batch.clean).double()).pow(2).flatten(1).mean(1)
        log_prob = -matching_weight(matching, batch.sigma, cfg.awm_weighting, cfg.awm_ghuber_power)
        advantages = batch.advantages.clamp(-cfg.adv_clip_max, cfg.adv_clip_max) / cfg.adv_clip_max
        per_row, stats = objective.clipped_policy_loss(
            log_prob.float(), log_prob.detach().float(), advantages, torch.ones_like(advantages), cfg.epsilon
        )
        policy_loss = per_row.mean()
        kl_fixed = self.velocity_kl(velocity, reference_velocity)
        kl_ema = self.velocity_kl(velocity, ema_velocity)
        kl_total = cfg.beta * kl_fixed + cfg.ema_kl_coef * kl_ema
        return policy_loss + kl_total, {
            "policy_loss": policy_loss.detach(),
            "matching_loss": matching.mean().float().detach(),
            "kl/fixed": kl_fixed.detach(),
            "kl/ema": kl_ema.detach(),
            "kl/total": kl_total.detach(),
            "kl/coef": torch.tensor(cfg.beta),
            "ratio_mean": stats["ratio"].mean(),
        }

    def after_optimizer_step(self, kl_value: float, references: References) -> None:
        """Soft-update the EMA anchor toward the policy (`agents.likelihood_free.soft_update_decay`)."""
        super().after_optimizer_step(kl_value, references)
        if references.anchor is not None:
            cfg = self.config
            references.anchor.blend(soft_update_decay(self.optimizer_steps, cfg.ema_decay_rate, cfg.ema_decay_max))
