"""The family of likelihood-free algorithms (DiffusionNFT, AWM): they train on the rollouts' final samples, noised
again by the forward process, and need no transition log-probability (`LikelihoodFreeAlgorithm`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from agents import objective
from agents.algorithm import Algorithm, FinalSampleBatch
from agents.config import AlgorithmConfig
from agents.references import DisabledAdapters, ParameterSnapshot, initial_model
from sage_env.backbones import VideoBackbone
from sage_env.env import Trajectory
from sage_env.sde import get_sde

__all__ = [
    "LikelihoodFreeAlgorithm",
    "LikelihoodFreeConfig",
    "initial_model_reference",
    "soft_update_decay",
]


def soft_update_decay(step: int, rate: float, maximum: float, start: int = 0) -> float:
    """The decay ``d`` of a soft-updated policy copy (``copy <- d copy + (1 - d) policy``) after ``step`` optimizer
    steps: 0 for ``start`` steps, then growing by ``rate`` per step up to ``maximum`` (DiffusionNFT's old policy,
    AWM's EMA anchor)."""
    return min(max(step - start, 0) * rate, maximum)


@dataclass
class LikelihoodFreeConfig(AlgorithmConfig):
    """What DiffusionNFT and AWM publish alike: ODE rollouts, CFG-free (guidance 1), advantages from the group's mean
    and the batch's std, 9 of 10 rollout noise levels, a fixed KL to the initial model with a constant coefficient,
    lr 3e-4 (their LoRA runs); ``equalizer`` and the moving anchor do not apply (no transition likelihood)."""

    defaults: ClassVar[Mapping[str, Any]] = {
        "sde": "ode",
        "guidance_scale": 1.0,
        "scale_rewards": "batch",
        "equalizer": False,
        "timestep_fraction": 0.9,
        "kl_strategy": "fixed",
        "kl_coef_schedule": "constant",
        "learning_rate": 3e-4,
    }

    def check_algorithm_rules(self) -> None:
        """Any sampler (stochastic or not) with a valid ``eta``; a KL to the initial model or none."""
        get_sde(self.sde).validate_eta(self.eta)
        if self.kl_strategy not in ("none", "fixed"):
            raise ValueError(
                f"kl_strategy={self.kl_strategy!r} needs transition log-probabilities, which a likelihood-free "
                "algorithm does not compute; use 'fixed' (a KL to the initial model) or 'none'."
            )


def initial_model_reference(module: torch.nn.Module, config: object) -> DisabledAdapters | ParameterSnapshot | None:
    """The initial model of a ``fixed`` KL (the adapter-free base for LoRA, a copy for full fine-tuning); None when
    ``kl_strategy`` is ``none`` or its coefficient ``beta`` is 0."""
    if config.kl_strategy != "fixed" or config.beta == 0:
        return None
    return initial_model(module, config.reference_offload)


class LikelihoodFreeAlgorithm(Algorithm):
    """Rows of (final sample, rollout noise level, fresh noise) per usable sample (`FinalSampleBatch`); a subclass
    writes `loss` (and chooses the levels with `noise_levels`)."""

    def compute_advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's mean and ``scale_rewards``' std; every valid sample trains (in a group without spread its
        advantage is 0, and the loss holds the policy where it is)."""
        cfg = self.config
        advantages, _ = objective.group_advantages(
            rewards, group_index, valid, cfg.scale_rewards, cfg.advantage_eps
        )
        return advantages, valid.to(torch.bool)

    def noise_levels(self, num_steps: int, generator: torch.Generator) -> torch.Tensor:
        """Which of the rollout's ``num_steps`` noise levels one sample trains on: ``timestep_fraction`` of them,
        in a random order when ``timestep_permutation``."""
        cfg = self.config
        levels = torch.arange(num_steps)
        if cfg.timestep_permutation:
            levels = levels[torch.randperm(num_steps, generator=generator)]
        return levels[: math.ceil(cfg.timestep_fraction * num_steps)]

    def training_batch(
        self,
        trajectory: Trajectory,
        advantages: torch.Tensor,
        usable: torch.Tensor,
        policy: VideoBackbone,
        on_policy: bool = False,
    ) -> FinalSampleBatch:
        """`noise_levels` of the rollout per usable sample, each row with fresh noise.

        A sample's levels and noise come from its own generator, seeded by its rollout seed and the optimizer-step
        count: the rows do not depend on which process holds the sample (DDP trains what one process trains) and
        a resumed run draws them again exactly.
        """
        device = trajectory.latents.device
        clean = trajectory.latents[:, -1]
        samples, steps, noise = [], [], []
        for sample in torch.nonzero(usable.cpu()).flatten().tolist():
            generator = self._sample_generator(int(trajectory.seeds[sample]))
            levels = self.noise_levels(trajectory.num_steps, generator)
            steps.append(levels)
            samples.append(torch.full((len(levels),), sample))
            noise.append(torch.randn((len(levels), *clean.shape[1:]), generator=generator))
        samples_d = torch.cat(samples).to(device) if samples else torch.zeros(0, dtype=torch.long, device=device)
        steps_d = torch.cat(steps).to(device) if steps else torch.zeros_like(samples_d)
        noise_d = torch.cat(noise).to(device) if noise else clean.new_zeros((0, *clean.shape[1:]))
        conditioning = policy.encode_prompts(list(trajectory.prompts), self.config.negative_prompt)
        return FinalSampleBatch(
            clean=clean[samples_d],
            noise=noise_d,
            sigma=trajectory.sigmas[samples_d, steps_d],
            advantages=advantages.to(device)[samples_d],
            sample_index=samples_d,
            step_index=steps_d,
            conditioning=conditioning.select(samples_d.cpu()),
            on_policy=on_policy,
        )

    def _sample_generator(self, rollout_seed: int) -> torch.Generator:
        """A generator for one sample's rows from (its rollout seed, the optimizer steps taken, this run's seed)."""
        entropy = [rollout_seed, self.optimizer_steps, self.seed]
        return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))

    @staticmethod
    def noisy(batch: FinalSampleBatch) -> torch.Tensor:
        """The forward process at each row's level: ``x_t = (1 - sigma) clean + sigma noise``."""
        t = batch.sigma.view(-1, *[1] * (batch.clean.ndim - 1))
        return (1 - t) * batch.clean + t * batch.noise

    def velocity(self, policy: VideoBackbone, batch: FinalSampleBatch, noisy: torch.Tensor) -> torch.Tensor:
        """The policy's velocity at ``noisy`` (float32), with the config's guidance."""
        velocity = policy.predict_velocity(noisy, batch.sigma, batch.conditioning, self.config.guidance_scale)
        return velocity.float()

    def frozen_velocity(
        self, policy: VideoBackbone, batch: FinalSampleBatch, noisy: torch.Tensor, reference: object | None
    ) -> torch.Tensor | None:
        """The velocity of a reference policy (its weights swapped in, no gradient); None without one. Call it
        before the policy's own forward: the swap must not happen under a live graph."""
        if reference is None:
            return None
        with torch.no_grad(), reference.applied():
            return self.velocity(policy, batch, noisy)

    @staticmethod
    def velocity_kl(velocity: torch.Tensor, reference: torch.Tensor | None) -> torch.Tensor:
        """``mean_rows mean_d (v - v_ref)^2``, the velocity-space KL of the authors' code (0 without a reference)."""
        if reference is None:
            return velocity.new_zeros(())
        return (velocity - reference).pow(2).flatten(1).mean(1).mean()
