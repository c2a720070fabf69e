"""DiffusionNFT (Zheng et al., 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process",
arXiv 2509.16117): likelihood-free. It needs no SDE and no transition log-probability: rollouts come from any
sampler (the ODE by default), and the policy is trained with the flow-matching loss on its own final samples,
noised again by the forward process, steered by the reward.

Written from the paper and the authors' code (NVlabs/DiffusionNFT at 24af555, ``scripts/train_nft_sd3.py``,
``config/nft.py``, ``config/base.py``). Per (final sample ``x0``, noise level ``t``) with fresh noise ``eps``:

* ``x_t = (1 - t) x0 + t eps``; ``v_old`` from the old policy, ``v`` from the policy (the only gradient);
* the implicit positive and negative policies ``v+ = beta v + (1 - beta) v_old``, ``v- = (1 + beta) v_old - beta v``;
* their clean predictions ``x0± = x_t - t v±`` and losses ``L± = mean_d (x0± - x0)^2 / w±`` with the adaptive
  weight ``w± = max(mean_d |x0± - x0|, 1e-5)`` (no gradient, float64);
* the optimality probability ``r = clip(A / adv_clip_max / 2 + 1/2, 0, 1)`` from the advantage ``A`` (the group's
  mean, the batch's std, clipped to 5): ``L = adv_clip_max * (r L+ + (1 - r) L-) / beta``, plus ``kl_coef x mean_d
  (v - v_ref)^2`` to the initial model (the adapter-free base for LoRA);
* after each optimizer step the old policy moves toward the policy, ``old <- d old + (1 - d) policy`` with
  ``d = min(rate x max(step - start, 0), max)`` (the authors' ``decay_type`` 1: rate 0.001, max 0.5, start 0).

Published defaults: beta 1.0, KL coefficient 1e-4, lr 3e-4, CFG-free (guidance 1), 9 of 10 rollout noise levels per
sample, the ODE for rollouts. Differences on purpose: rollouts come from the current policy (the authors sample with
the old one; their ``d`` stays 0.001 x step early on, so the two differ little), the soft update runs after each
optimizer step (theirs after each rollout's training, one step per rollout in their configs), and the rollout
sampler is Euler or any SDE of this library rather than their 2nd-order DPM-Solver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agents.algorithm import FinalSampleBatch, References
from agents.likelihood_free import (
    LikelihoodFreeAlgorithm,
    LikelihoodFreeConfig,
    initial_model_reference,
    soft_update_decay,
)
from agents.references import ParameterSnapshot
from sage_env.backbones import VideoBackbone
from sage_env.checks import Integer, Real, hyperparameter

__all__ = ["DiffusionNFTAgentConfig", "DiffusionNFTAlgorithm", "nft_loss"]

_ADAPTIVE_WEIGHT_FLOOR = 1e-5
"""The floor of the adaptive weight ``w±`` (the authors' ``clamp(min=1e-5)``)."""


@dataclass
class DiffusionNFTAgentConfig(LikelihoodFreeConfig):
    """DiffusionNFT's published defaults: ODE rollouts, CFG-free (guidance 1), advantages from the group's mean and
    the batch's std, a fixed KL to the initial model with coefficient 1e-4 (``beta``), lr 3e-4, 9 of 10 noise levels
    per sample; ``epsilon``, ``equalizer`` and the moving anchor do not apply (no likelihood ratio).

    Besides its ``defaults`` it declares the strength of its implicit policies and its old policy's soft update.
    """

    display_name: ClassVar[str] = "DiffusionNFT"
    summary: ClassVar[str | None] = (
        "likelihood-free: the flow-matching loss on its own final samples, steered by the reward"
    )

    defaults: ClassVar[Mapping[str, Any]] = {"beta": 1e-4}  # over `LikelihoodFreeConfig`'s

    nft_beta: float = hyperparameter(
        1.0,
        "DiffusionNFT: strength of the implicit positive and negative policies (v+ = beta v + (1 - beta) v_old); "
        "the loss is divided by it. Smaller keeps the policy closer to the old one per step (steadier, slower). "
        "Published: 1.0 (GenEval, PickScore), 0.1 (OCR, multi-reward); arXiv 2509.16117, Eq. 6.",
        Real(0.0, 10.0, low_open=True),
    )
    old_policy_decay_rate: float = hyperparameter(
        0.001,
        "DiffusionNFT: the old policy's decay d grows by this per optimizer step (old <- d old + (1 - d) policy "
        "after each step). Larger makes the old policy lag further behind (steadier, slower). Published: 0.001.",
        Real(0.0, 1.0),
    )
    old_policy_decay_max: float = hyperparameter(
        0.5,
        "DiffusionNFT: the largest decay d of the old policy (0: the old policy is the policy after every step). "
        "Published: 0.5 (0.999 for OCR).",
        Real(0.0, 1.0, high_open=True),
    )
    old_policy_decay_start: int = hyperparameter(
        0,
        "DiffusionNFT: optimizer steps with decay 0 before d starts to grow. Published: 0 (75 for OCR).",
        Integer(0, 10**9),
    )


def nft_loss(
    velocity: torch.Tensor,
    old_velocity: torch.Tensor,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    sigma: torch.Tensor,
    optimality: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-row ``(r L+ + (1 - r) L-) / beta`` (see the module docstring); every input but ``velocity`` without grad.

    Args:
        velocity, old_velocity: ``(M, ...)`` the policy's and the old policy's velocity at ``noisy``.
        noisy, clean: ``(M, ...)`` ``x_t`` and the final sample ``x0``; ``sigma``: ``(M,)`` the noise level ``t``.
        optimality: ``(M,)`` the optimality probability ``r`` in [0, 1]; ``beta``: the implicit policies' strength.
    """
    t = sigma.view(-1, *[1] * (clean.ndim - 1)).float()
    positive = beta * velocity + (1 - beta) * old_velocity
    negative = (1 + beta) * old_velocity - beta * velocity
    losses = []
    for implicit in (positive, negative):
        error = noisy - t * implicit - clean  # x0± - x0
        dims = tuple(range(1, error.ndim))
        with torch.no_grad():
            weight = error.double().abs().mean(dims).clamp_min(_ADAPTIVE_WEIGHT_FLOOR)
        losses.append((error**2).mean(dims) / weight.to(error.dtype))
    return (optimality * losses[0] + (1 - optimality) * losses[1]) / beta


class DiffusionNFTAlgorithm(LikelihoodFreeAlgorithm):
    """DiffusionNFT's update: `FinalSampleBatch` rows, `nft_loss`, the old policy's soft update."""

    config_class = DiffusionNFTAgentConfig

    def build_references(self, module: torch.nn.Module) -> References:
        """The old policy (``anchor``, a snapshot soft-updated after each step) and the initial model of the KL."""
        cfg = self.config
        anchor = ParameterSnapshot(module, offload=cfg.reference_offload)
        return References(anchor=anchor, fixed=initial_model_reference(module, cfg))

    def loss(
        self, policy: VideoBackbone, batch: FinalSampleBatch, references: References
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``adv_clip_max x mean(nft_loss) + beta x KL`` of one micro-batch (references first: they swap weights)."""
        cfg = self.config
        noisy = self.noisy(batch)
        old_velocity = self.frozen_velocity(policy, batch, noisy, references.anchor)
        reference_velocity = self.frozen_velocity(policy, batch, noisy, references.fixed)
        velocity = self.velocity(policy, batch, noisy)
        advantages = batch.advantages.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)
        optimality = (advantages / cfg.adv_clip_max / 2 + 0.5).clamp(0.0, 1.0)
        per_row = nft_loss(velocity, old_velocity, noisy, batch.clean, batch.sigma, optimality, cfg.nft_beta)
        policy_loss = cfg.adv_clip_max * per_row.mean()
        kl = self.velocity_kl(velocity, reference_velocity)
        loss = policy_loss + cfg.beta * kl
        return loss, {
            "policy_loss": policy_loss.detach(),
            "optimality_mean": optimality.mean(),
            "old_policy_distance": (velocity.detach() - old_velocity).pow(2).mean(),
            "kl/fixed": kl.detach(),
            "kl/total": kl.detach(),
            "kl/coef": torch.tensor(cfg.beta),
        }

    def after_optimizer_step(self, kl_value: float, references: References) -> None:
        """Soft-update the old policy toward the policy (`agents.likelihood_free.soft_update_decay`)."""
        super().after_optimizer_step(kl_value, references)
        cfg = self.config
        decay = soft_update_decay(
            self.optimizer_steps,
            cfg.old_policy_decay_rate,
            cfg.old_policy_decay_max,
            cfg.old_policy_decay_start,
        )
        references.anchor.blend(decay)
