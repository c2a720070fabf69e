"""The `Agent` interface and the policy-gradient agent every built-in algorithm uses (`agents.registry` finds them).

An agent acts in a `sage_env` environment (the velocity for an observation, from a `VideoBackbone` policy)
and updates from the recorded `sage_env.Trajectory`, returning metrics::

    import agents, sage_env, gymnasium as gym
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=8, group_size=4)
    agent = agents.make("sage_grpo", env=envs, learning_rate=3e-3)  # the env's backbone and SDE settings
    observation, _ = envs.reset(seed=0, options=agent.rollout_options(envs))
    while True:
        observation, reward, terminated, truncated, info = envs.step(agent.act(observation))
        if terminated.all():
            break
    metrics = agent.update(envs.unwrapped.trajectory)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from agents.algorithm import Algorithm, TrainingBatch
from agents.rollout import RolloutShape, samples_with_signal
from sage_env.backbones import VideoBackbone
from sage_env.checks import Integer, check_fields, hyperparameter
from sage_env.env import BackbonePolicy, Trajectory
from sage_env.rewards import RewardFailureMonitor

__all__ = ["Agent", "AgentSettings", "AlgorithmAgent", "PolicyGradientAgent", "environment_attributes", "rollout_shape"]


def environment_attributes(env: Any, names: Sequence[str]) -> dict[str, Any]:
    """Attributes of a `sage_env` environment: looked through gymnasium's wrappers, and through gymnasium's own
    vector environments over `sage_env` environments (``make_vec(..., vectorization_mode="sync" | "async")``,
    whose ``get_attr`` asks the first sub-environment; an async one sends the value over its pipe)."""
    unwrapped = getattr(env, "unwrapped", env)
    if all(hasattr(unwrapped, name) for name in names):
        return {name: getattr(unwrapped, name) for name in names}
    if callable(getattr(env, "get_attr", None)):
        return {name: env.get_attr(name)[0] for name in names}
    raise ValueError(
        f"env= must be a sage_env environment (gym.make / gym.make_vec of a sage_env id), got {type(env).__name__}."
    )


def rollout_shape(env: Any) -> RolloutShape:
    """``env``'s schedule, group size and SDE window (`environment_attributes`), as algorithms shape rollouts from."""
    values = environment_attributes(env, ("sigmas", "group_size", "sde_window"))
    return RolloutShape(torch.as_tensor(values["sigmas"]), values["group_size"], values["sde_window"])


class Agent(ABC):
    """An RL algorithm acting in a `sage_env` environment with a video backbone as its policy."""

    def __init__(self, policy: VideoBackbone) -> None:
        self.policy = policy

    @abstractmethod
    def act(self, observation: Mapping[str, Any]) -> torch.Tensor:
        """The velocity to apply for a (batched) observation of a `sage_env` environment."""

    @abstractmethod
    def update(self, trajectory: Trajectory | Sequence[Trajectory]) -> dict[str, float]:
        """Learn from a finished batch of rollouts; return metrics (``policy_loss``, ``reward/...``, ``kl/...``)."""

    def rollout_options(self, env: Any) -> dict[str, Any]:
        """The ``reset`` options of the next rollout in ``env`` (a `sage_env` environment, wrapped or vectorised by
        gymnasium): ``env.reset(seed=..., options=agent.rollout_options(env))``. Empty unless the algorithm asks for
        its own rollout (MixGRPO's moving SDE window, GRPO-Guard's recorded means)."""
        return {}


@dataclass
class AgentSettings:
    """How an agent's own update loop runs, beside the algorithm's hyperparameters (the TRL trainer has its own:
    ``gradient_accumulation_steps`` and TRL's ``seed``)."""

    num_minibatches: int = hyperparameter(
        1,
        "Optimizer steps per pass over a rollout: the rollout's (sample, step) pairs are split into this many "
        "random minibatches. More steps per rollout learn faster per rollout but move the policy further from "
        "the one that sampled it (the ratio and its clipping then act). Recommended: 1.",
        Integer(1, 4096),
    )
    seed: int = hyperparameter(
        0,
        "Seed of the timestep selection and minibatch order (the rollouts' noise is the env's).",
        Integer(0, 2**63 - 1),
    )

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def field_names(cls) -> set[str]:
        """Names of every field."""
        return {f.name for f in fields(cls)}


class AlgorithmAgent(Agent):
    """An agent driving any `agents.Algorithm` with its own AdamW optimizer (no TRL, no accelerate): the plain
    gymnasium loop's side of the interface `sage_trl.SageGRPOTrainer` drives too.

    Args:
        policy: the backbone whose ``transformer`` is trained (its ``requires_grad`` parameters: the LoRA
            adapter when peft adapters are injected, else the whole transformer).
        algorithm: the algorithm (its config decides SDE, advantages, loss and KL).
        settings: the update loop's own settings (`AgentSettings`; defaults when None).
    """

    def __init__(
        self, policy: VideoBackbone, algorithm: Algorithm, settings: AgentSettings | None = None
    ) -> None:
        super().__init__(policy)
        self.algorithm = algorithm
        self.config = algorithm.config
        self.settings = settings if settings is not None else AgentSettings()
        module = policy.transformer
        if not any(p.requires_grad for p in module.parameters()):
            module.requires_grad_(True)
        self.parameters = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=self.config.learning_rate, weight_decay=0.0)
        self.references = algorithm.build_references(module)
        self.reward_failures = RewardFailureMonitor(self.config.max_consecutive_reward_failures)
        self._act = BackbonePolicy(policy, self.config.guidance_scale, self.config.negative_prompt)

    def act(self, observation: Mapping[str, Any]) -> torch.Tensor:
        """Velocity of the current policy (with the config's classifier-free guidance), without gradients."""
        return self._act(observation)

    def rollout_options(self, env: Any) -> dict[str, Any]:
        """The algorithm's `agents.Algorithm.rollout_options` for ``env``'s schedule and group size."""
        return self.algorithm.rollout_options(rollout_shape(env))

    def update(self, trajectory: Trajectory | Sequence[Trajectory]) -> dict[str, float]:
        """``num_iterations`` passes over the rollout, ``num_minibatches`` optimizer steps each.

        ``trajectory``: a vector environment's batch, or several episodes (`Trajectory.concat`: grouped by prompt,
        e.g. a single-video environment run ``group_size`` times per prompt). Raises
        `sage_env.rewards.RewardFailureError` when no sample had a valid reward in
        ``max_consecutive_reward_failures`` updates in a row.
        """
        if not isinstance(trajectory, Trajectory):
            trajectory = Trajectory.concat(trajectory)
        rewards = trajectory.rewards
        if rewards is not None:
            self.reward_failures.observe(int(rewards.valid.sum()), len(rewards.valid), rewards.errors)
        advantages, usable = self.algorithm.advantages(trajectory)
        totals: dict[str, list[float]] = defaultdict(list)
        for iteration in range(self.config.num_iterations):
            batch = self.algorithm.training_batch(trajectory, advantages, usable, self.policy)
            if len(batch) == 0:
                break  # no usable group (all invalid or zero spread): nothing to learn from
            order = torch.randperm(len(batch), generator=self.algorithm.generator)
            splits = torch.tensor_split(order, min(self.settings.num_minibatches, len(batch)))
            for index, minibatch in enumerate(splits):
                selected = batch.select(minibatch)
                selected.on_policy = iteration == 0 and index == 0  # no optimizer step since the rollout yet
                for name, value in self._optimizer_step(selected).items():
                    totals[name].append(value)
        metrics = {name: sum(values) / len(values) for name, values in totals.items()}
        metrics.update(self._rollout_metrics(trajectory, advantages, usable))
        return metrics

    def _optimizer_step(self, batch: TrainingBatch) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        chunks = list(batch.chunks(self.config.micro_batch_size))
        sums: dict[str, float] = defaultdict(float)
        for chunk in chunks:
            loss, metrics = self.algorithm.loss(self.policy, chunk, self.references)
            (loss * len(chunk) / len(batch)).backward()
            for name, value in metrics.items():
                sums[name] += float(value) * len(chunk) / len(batch)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.algorithm.after_optimizer_step(sums["kl/total"], self.references)
        return {**sums, "grad_norm": float(grad_norm)}

    @staticmethod
    def _rollout_metrics(
        trajectory: Trajectory, advantages: torch.Tensor, usable: torch.Tensor
    ) -> dict[str, float]:
        rewards = trajectory.rewards
        valid = rewards.valid
        metrics = {
            f"reward/{name}": float(scores[valid].mean())
            for name, scores in rewards.components.items()
            if valid.any()
        }
        metrics["reward/total"] = float(rewards.total[valid].mean()) if valid.any() else float("nan")
        metrics["reward/invalid_count"] = float(rewards.num_invalid)
        metrics["reward/failed_calls"] = float(rewards.failed_calls)
        metrics["advantage_mean_abs"] = float(advantages[usable].abs().mean()) if usable.any() else 0.0
        metrics["usable_fraction"] = float(samples_with_signal(usable).float().mean())
        stochastic = trajectory.trainable
        metrics["rollout/exploration_std"] = (
            float(trajectory.stds[stochastic].mean()) if stochastic.any() else 0.0
        )
        return metrics


PolicyGradientAgent = AlgorithmAgent
"""The name `AlgorithmAgent` had before it drove likelihood-free algorithms too (kept for existing code)."""
