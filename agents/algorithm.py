"""The one algorithm interface (`Algorithm`) and the policy-gradient family that implements it.

An algorithm turns a finished `sage_env.Trajectory` into advantages, a training batch of its own choosing
(`TrainingBatch`), and a differentiable loss on that batch. It owns no optimizer: `agents.base.AlgorithmAgent`
(a plain gymnasium loop) and `sage_trl.SageGRPOTrainer` (TRL/accelerate) drive any `Algorithm` through the same
calls, in the same order:

0. ``rollout_options(shape)`` before each rollout (``shape``: the environment's schedule and group size, a
   `RolloutShape`): the environment ``reset`` options the algorithm's rollout needs (MixGRPO's moving SDE window,
   MixGRPO-Flash's shorter schedule, BranchGRPO's trees; none for most);
1. ``advantages(trajectory)`` (the trainer calls ``compute_advantages`` on every process's rewards gathered), kept
   with the trajectory as a `ScoredTrajectory` (the one form a rollout takes from the environment to the loss);
2. ``training_batch(trajectory, advantages, usable, policy, on_policy)`` once per pass over the rollout, split by
   the driver with ``batch.select`` / ``batch.chunks`` into minibatches and micro-batches;
3. ``loss(policy, micro_batch, references)``, backpropagated by the driver;
4. ``after_optimizer_step(kl_value, references)`` after each optimizer step;
5. ``state_dict`` / ``load_state_dict`` in checkpoints.

The batch is the algorithm's: `PolicyGradientAlgorithm` (SAGE-GRPO, Flow-GRPO, DanceGRPO, CPS, DDPO, REINFORCE,
MixGRPO) trains on (sample, timestep) transitions with their rollout log-probabilities (`TransitionBatch`); an
algorithm that needs no transition likelihood (DiffusionNFT, AWM: `agents.likelihood_free`) trains on the final
samples, noised again by the forward process (`FinalSampleBatch`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Protocol

import torch

from agents import diagnostics, objective
from agents.config import KL_STRATEGIES, AlgorithmConfig
from agents.references import DisabledAdapters, ParameterSnapshot, initial_model
from agents.rollout import RolloutShape
from sage_env import sde
from sage_env.backbones import PromptConditioning, VideoBackbone
from sage_env.env import Trajectory

__all__ = [
    "KL_STRATEGIES",
    "Algorithm",
    "AlgorithmConfig",
    "FinalSampleBatch",
    "PolicyGradientAlgorithm",
    "References",
    "RowBatch",
    "TrainingBatch",
    "TransitionBatch",
]


class TrainingBatch(Protocol):
    """What a driver needs of an algorithm's training batch: its length, rows, micro-batches, and whether the
    policy has not been updated since the rollout (``on_policy``, which the driver sets per minibatch)."""

    on_policy: bool

    def __len__(self) -> int: ...

    def select(self, index: torch.Tensor) -> TrainingBatch: ...

    def chunks(self, size: int) -> Iterator[TrainingBatch]: ...


class RowBatch:
    """Rows of a training batch as a dataclass of ``(M, ...)`` tensors plus ``conditioning``: `select` and `chunks`
    for any such dataclass (`TransitionBatch`, `FinalSampleBatch`, or an algorithm's own)."""

    conditioning: PromptConditioning
    sample_index: torch.Tensor

    def __len__(self) -> int:
        return self.sample_index.shape[0]

    def select(self, index: torch.Tensor) -> RowBatch:
        """Rows ``index`` as a new batch."""
        tensors = {
            f.name: getattr(self, f.name)[index.to(getattr(self, f.name).device)]
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, conditioning=self.conditioning.select(index), **tensors)

    def chunks(self, size: int) -> Iterator[RowBatch]:
        """Consecutive micro-batches of at most ``size`` rows."""
        for start in range(0, len(self), size):
            yield self.select(torch.arange(start, min(start + size, len(self))))


@dataclass
class TransitionBatch(RowBatch):
    """(sample, timestep) pairs to train on, with what the loss needs; tensors are ``(M, ...)``."""

    latents: torch.Tensor
    next_latents: torch.Tensor
    sigma: torch.Tensor
    sigma_next: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    sample_index: torch.Tensor
    step_index: torch.Tensor
    conditioning: PromptConditioning
    sde_type: str
    eta: float
    log_prob_kind: str
    on_policy: bool = False
    old_mean: torch.Tensor | None = None
    """The rollout's transition means (``ratio_norm`` only)."""


@dataclass
class FinalSampleBatch(RowBatch):
    """(final sample, noise level) rows for an algorithm that needs no transition likelihood (DiffusionNFT, AWM):
    it noises the rollout's clean final latents itself, ``x_t = (1 - sigma) clean + sigma noise``; ``(M, ...)``.

    Args:
        clean: the rollouts' final latents; ``noise``: the noise of each row (drawn by the algorithm);
            ``sigma``: each row's noise level (the rollout's at ``step_index``); ``advantages``: its sample's.
    """

    clean: torch.Tensor
    noise: torch.Tensor
    sigma: torch.Tensor
    advantages: torch.Tensor
    sample_index: torch.Tensor
    step_index: torch.Tensor
    conditioning: PromptConditioning
    on_policy: bool = False


@dataclass
class References:
    """The reference policies an algorithm's KL term needs (None where unused)."""

    anchor: ParameterSnapshot | None = None
    fixed: ParameterSnapshot | DisabledAdapters | None = None


class Algorithm(ABC):
    """An RL algorithm for a denoising policy, as every driver sees it (the module docstring lists the calls).

    Args:
        config: its hyperparameters (an instance of ``config_class``; its defaults when None).
        seed: seeds ``generator``, the algorithm's own randomness (which timesteps to train on, its own noise):
            the agent's seed, or the trainer's TRL seed.
    """

    config_class: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig

    def __init__(self, config: AlgorithmConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else self.config_class()
        self.optimizer_steps = 0
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def build_references(self, module: torch.nn.Module) -> References:
        """The reference policies of the loss, made from the policy module before any update (none by default)."""
        return References()

    def rollout_options(self, shape: RolloutShape) -> dict[str, Any]:
        """The environment ``reset`` options the next rollout needs, given the environment's schedule and group size
        (`sage_env.DenoisingVectorEnv.reset`): how an algorithm that chooses its rollout asks for it, e.g. MixGRPO's
        ``{"sde_window": (start, end)}`` from its optimizer-step count (which checkpoints restore), MixGRPO-Flash's
        compressed schedule, BranchGRPO's trees. Empty by default: the environment's schedule."""
        return {}

    def advantages(self, trajectory: Trajectory) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, usable)`` per sample of a finished trajectory (see `compute_advantages`)."""
        rewards = trajectory.rewards
        if rewards is None:
            raise ValueError("The trajectory has no rewards: finish the episode before updating.")
        group_index = trajectory.group_index.to(rewards.total.device)
        return self.compute_advantages(trajectory.prompts, rewards.total, rewards.valid, group_index)

    @abstractmethod
    def compute_advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, usable)`` ``(N,)`` from the samples' rewards: ``usable`` marks samples that carry a
        learning signal (a valid reward in a group with spread)."""

    @abstractmethod
    def training_batch(
        self,
        trajectory: Trajectory,
        advantages: torch.Tensor,
        usable: torch.Tensor,
        policy: VideoBackbone,
        on_policy: bool = False,
    ) -> TrainingBatch:
        """What one pass over the rollout trains on (``on_policy``: no optimizer step since the rollout)."""

    @abstractmethod
    def loss(
        self, policy: VideoBackbone, batch: TrainingBatch, references: References
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Differentiable loss of one micro-batch and its metrics (detached scalars; ``kl/total`` feeds
        `after_optimizer_step`)."""

    def after_optimizer_step(self, kl_value: float, references: References) -> None:
        """Called after each optimizer step with the step's mean ``kl/total``."""
        self.optimizer_steps += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint restores: counters and ``generator`` (references are saved by their owner)."""
        return {"optimizer_steps": self.optimizer_steps, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self.optimizer_steps = int(state["optimizer_steps"])
        self.generator.set_state(state["generator"])


class PolicyGradientAlgorithm(Algorithm):
    """GRPO-style policy optimisation over denoising steps; SAGE-GRPO with the default `AlgorithmConfig`.

    The loss is Eq. 43 in its clipped-ratio form: ``mean_pairs[S_t * max(-A r, -A clip(r))] + lambda_KL * L_KL``
    with ``L_KL`` set by ``kl_strategy`` (Eq. 40 for ``dual``) and ``lambda_KL`` from `AdaptiveKLController`.
    Subclasses override `advantages` (e.g. DDPO's per-prompt statistics) or nothing at all.
    """

    def __init__(self, config: AlgorithmConfig | None = None, seed: int = 0) -> None:
        """``seed`` seeds the timestep selection (`select_timesteps`): the agent's, or the trainer's TRL seed."""
        super().__init__(config, seed)
        cfg = self.config
        self.kl_controller = objective.AdaptiveKLController(
            cfg.kl_coef_min,
            cfg.beta,
            cfg.kl_warmup_steps,
            cfg.kl_target,
            cfg.kl_history,
            adaptive=cfg.kl_coef_schedule == "adaptive",
        )

    # -- references ------------------------------------------------------------------------------

    def build_references(self, module: torch.nn.Module) -> References:
        """Create the reference policies of the KL strategy for the policy module (before any update).

        LoRA runs use an adapter snapshot as the moving anchor and the adapter-free base as the fixed
        reference; full fine-tuning uses parameter copies (optionally on CPU).
        """
        strategy, offload = self.config.kl_strategy, self.config.reference_offload
        anchor = ParameterSnapshot(module, offload=offload) if strategy in ("moving", "dual") else None
        fixed = None
        if strategy == "fixed":
            fixed = initial_model(module, offload)
        return References(anchor=anchor, fixed=fixed)

    # -- data ------------------------------------------------------------------------------------

    def rollout_options(self, shape: RolloutShape) -> dict[str, Any]:
        """``{"record_means": True}`` with ``ratio_norm`` (GRPO-Guard needs the rollout's transition means)."""
        return {"record_means": True} if self.config.ratio_norm else {}

    def compute_advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor, group_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Group-normalised advantages (Eq. 10) with invalid samples excluded; ``usable`` marks samples whose
        group carries a learning signal."""
        cfg = self.config
        return objective.group_advantages(rewards, group_index, valid, cfg.scale_rewards, cfg.advantage_eps)

    def check_trajectory(self, trajectory: Trajectory) -> None:
        """Refuse trajectories sampled with other SDE settings than this algorithm's (their log-probs differ)."""
        cfg = self.config
        stochastic = {t for t in trajectory.sde_types if sde.get_sde(t).stochastic}
        if (
            stochastic != {cfg.sde}
            or not math.isclose(trajectory.eta, cfg.eta)
            or trajectory.log_prob_kind != cfg.log_prob_kind
        ):
            raise ValueError(
                f"The trajectory was sampled with sde={sorted(stochastic)}, eta={trajectory.eta}, "
                f"log_prob_kind={trajectory.log_prob_kind!r} but the algorithm expects sde={cfg.sde!r}, "
                f"eta={cfg.eta}, log_prob_kind={cfg.log_prob_kind!r}; build the environment with the same values."
            )

    def transition_advantages(
        self, trajectory: Trajectory, advantages: torch.Tensor, usable: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, T)`` advantage and usability of each transition: its sample's at every step (BranchGRPO: its
        node's at that step's branch level)."""
        steps = trajectory.num_steps
        return advantages[:, None].expand(-1, steps), usable[:, None].expand(-1, steps)

    def transition_weights(self, trajectory: Trajectory, experts: torch.Tensor | None = None) -> torch.Tensor:
        """``(N, T)`` loss weight of each transition: the temporal gradient equalizer's (Eq. 12), or 1 without it;
        ``experts``: the expert of each step (`objective.equalizer_matrix`: one median per expert)."""
        cfg = self.config
        return objective.equalizer_matrix(
            trajectory.sigmas,
            trajectory.sde_types,
            trajectory.eta,
            cfg.equalizer,
            eps=cfg.equalizer_eps,
            median=cfg.equalizer_median,
            experts=experts,
        )

    def training_batch(
        self,
        trajectory: Trajectory,
        advantages: torch.Tensor,
        usable: torch.Tensor,
        policy: VideoBackbone,
        on_policy: bool = False,
    ) -> TransitionBatch:
        """The (sample, step) pairs to train on: stochastic steps of usable samples, equalizer-weighted.

        ``on_policy``: no optimizer step has been taken since the rollout (the ratio is then exactly 1).
        """
        self.check_trajectory(trajectory)
        cfg = self.config
        weights = self.transition_weights(trajectory, policy.expert_of(trajectory.sigmas[:, :-1]))
        step_advantages, step_usable = self.transition_advantages(trajectory, advantages, usable)
        trainable = trajectory.trainable & step_usable.to(trajectory.trainable.device)
        samples, steps = objective.select_timesteps(
            trainable, cfg.timestep_fraction, self.generator, cfg.timestep_permutation
        )
        device = trajectory.latents.device
        samples_d, steps_d = samples.to(device), steps.to(device)
        conditioning = policy.encode_prompts(list(trajectory.prompts), cfg.negative_prompt)
        if cfg.ratio_norm and trajectory.means is None:
            raise ValueError(
                "ratio_norm needs the rollout's transition means: reset the environment with "
                "options=agent.rollout_options(env) (it asks for record_means)."
            )
        return TransitionBatch(
            latents=trajectory.latents[samples_d, steps_d],
            next_latents=trajectory.latents[samples_d, steps_d + 1],
            sigma=trajectory.sigmas[samples_d, steps_d],
            sigma_next=trajectory.sigmas[samples_d, steps_d + 1],
            old_log_prob=trajectory.log_probs[samples_d, steps_d],
            advantages=step_advantages.to(device)[samples_d, steps_d],
            weights=weights.to(device)[samples_d, steps_d],
            sample_index=samples_d,
            step_index=steps_d,
            conditioning=conditioning.select(samples),
            sde_type=cfg.sde,
            eta=trajectory.eta,
            log_prob_kind=trajectory.log_prob_kind,
            on_policy=on_policy,
            old_mean=trajectory.means[samples_d, steps_d] if cfg.ratio_norm else None,
        )

    # -- loss ------------------------------------------------------------------------------------

    def _reference_mean(self, policy: VideoBackbone, batch: TransitionBatch, reference: Any) -> torch.Tensor:
        with torch.no_grad(), reference.applied():
            velocity = policy.predict_velocity(
                batch.latents, batch.sigma, batch.conditioning, self.config.guidance_scale
            )
            return self._step(batch, velocity).mean

    def _step(self, batch: TransitionBatch, velocity: torch.Tensor) -> sde.SDEStepOutput:
        # The inner step: the stored trajectory was validated when the env recorded it.
        return sde.step(
            batch.sde_type,
            batch.latents,
            velocity,
            batch.sigma,
            batch.sigma_next,
            batch.eta,
            x_next=batch.next_latents,
            log_prob_kind=batch.log_prob_kind,
        )

    def loss(
        self, policy: VideoBackbone, batch: TransitionBatch, references: References
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Differentiable loss of one micro-batch and its metrics (detached scalars)."""
        cfg = self.config
        reference = references.anchor if cfg.kl_strategy in ("moving", "dual") else references.fixed
        # References first: they swap weights in place, which must not happen under a live graph.
        reference_mean = self._reference_mean(policy, batch, reference) if reference is not None else None
        velocity = policy.predict_velocity(batch.latents, batch.sigma, batch.conditioning, cfg.guidance_scale)
        out = self._step(batch, velocity)
        advantages = batch.advantages.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)
        # Before the first optimizer step on a rollout the policy *is* the behaviour policy: use its own detached
        # log-prob (ratio exactly 1, as TRL does) rather than the rollout's, which differs in the last bits
        # because the rollout batched other samples together.
        old_log_prob = out.log_prob.detach() if batch.on_policy else batch.old_log_prob
        per_pair, stats = self._policy_loss(out, batch, old_log_prob, advantages)
        policy_loss = per_pair.mean()
        kl_term, kl_metrics = self._kl_term(out, batch, reference_mean)
        loss = policy_loss + self.kl_controller.coef * kl_term
        log_ratio = out.log_prob.detach() - old_log_prob
        metrics = {
            "policy_loss": policy_loss.detach(),
            **diagnostics.clip_metrics(stats),
            "ratio_mean": stats["ratio"].mean(),
            "ratio_std": stats["ratio"].std(unbiased=False),
            "kl/approx": 0.5 * (log_ratio**2).mean(),
            "equalizer_weight_mean": batch.weights.mean(),
            "kl/coef": torch.tensor(self.kl_controller.coef),
            **kl_metrics,
            **diagnostics.rollout_gap_metrics(out.log_prob.detach(), batch.old_log_prob, batch.step_index, batch.on_policy),
        }
        return loss, metrics

    def _policy_loss(
        self, out: sde.SDEStepOutput, batch: TransitionBatch, old_log_prob: torch.Tensor, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped surrogate per pair; with ``ratio_norm``, GRPO-Guard's: the normalised log-ratio
        (`objective.normalized_log_ratio`) and each step's loss divided by ``|sigma - sigma_next|``."""
        cfg = self.config
        if not cfg.ratio_norm:
            return objective.clipped_policy_loss(
                out.log_prob, old_log_prob, advantages, batch.weights, cfg.epsilon, cfg.epsilon_high
            )
        old_mean = out.mean.detach() if batch.on_policy else batch.old_mean
        log_ratio = objective.normalized_log_ratio(out.log_prob, old_log_prob, out.mean, old_mean, out.std)
        weights = batch.weights / (batch.sigma - batch.sigma_next)
        return objective.clipped_policy_loss(
            log_ratio, torch.zeros_like(log_ratio), advantages, weights, cfg.epsilon, cfg.epsilon_high
        )

    def _kl_term(
        self, out: sde.SDEStepOutput, batch: TransitionBatch, reference_mean: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        strategy, cfg = self.config.kl_strategy, self.config
        zero = out.log_prob.new_zeros(())
        position = (
            objective.position_kl(out.mean, reference_mean, out.std).mean()
            if reference_mean is not None
            else zero
        )
        velocity = (
            objective.stepwise_kl(out.log_prob, batch.old_log_prob).mean()
            if strategy in ("stepwise", "dual")
            else zero
        )
        weights = {
            "none": (0.0, 0.0),
            "fixed": (1.0, 0.0),
            "moving": (1.0, 0.0),
            "stepwise": (0.0, 1.0),
            "dual": (cfg.beta_pos, cfg.beta_vel),
        }[strategy]
        kl_term = weights[0] * position + weights[1] * velocity
        return kl_term, {
            "kl/position": position.detach(),
            "kl/velocity": velocity.detach(),
            "kl/total": kl_term.detach(),
        }

    # -- after each optimizer step -----------------------------------------------------------------

    def after_optimizer_step(self, kl_value: float, references: References) -> None:
        """Update the KL coefficient (App. A.6) and refresh the moving anchor every N steps (Eq. 13)."""
        super().after_optimizer_step(kl_value, references)
        if self.config.kl_strategy != "none":
            self.kl_controller.observe(kl_value)
        if references.anchor is not None and self.optimizer_steps % self.config.anchor_update_steps == 0:
            references.anchor.refresh()

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Counters, the KL controller and the timestep generator (references are saved by their owner)."""
        return {**super().state_dict(), "kl_controller": self.kl_controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        super().load_state_dict(state)
        self.kl_controller.load_state_dict(state["kl_controller"])
