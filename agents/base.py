"""The `Agent` interface, the policy-gradient agent every built-in algorithm uses, and the registry.

An agent acts in a `sage_env` environment (the velocity for an observation, from a `VideoBackbone` policy)
and updates from the recorded `sage_env.Trajectory`, returning metrics::

    import agents, sage_env, gymnasium as gym
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=8, group_size=4)
    agent = agents.make("sage_grpo", env=envs, learning_rate=3e-3)  # the env's backbone and SDE settings
    observation, _ = envs.reset(seed=0)
    while True:
        observation, reward, terminated, truncated, info = envs.step(agent.act(observation))
        if terminated.all():
            break
    metrics = agent.update(envs.unwrapped.trajectory)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from agents.algorithm import AlgorithmConfig, PolicyGradientAlgorithm, TransitionBatch
from sage_env.backbones import VideoBackbone
from sage_env.env import BackbonePolicy, Trajectory
from sage_env.rewards import RewardFailureMonitor

__all__ = [
    "AGENT_REGISTRY",
    "ALGORITHM_CLASSES",
    "ALGORITHM_CONFIGS",
    "ROLLOUT_SETTINGS",
    "Agent",
    "PolicyGradientAgent",
    "list_agents",
    "make",
    "register",
    "register_algorithm",
    "rollout_settings",
]


class Agent(ABC):
    """An RL algorithm acting in a `sage_env` environment with a video backbone as its policy."""

    def __init__(self, policy: VideoBackbone) -> None:
        self.policy = policy

    @abstractmethod
    def act(self, observation: Mapping[str, Any]) -> torch.Tensor:
        """The velocity to apply for a (batched) observation of a `sage_env` environment."""

    @abstractmethod
    def update(self, trajectory: Trajectory) -> dict[str, float]:
        """Learn from a finished batch of rollouts; return metrics (``policy_loss``, ``reward/...``, ``kl/...``)."""


class PolicyGradientAgent(Agent):
    """An agent driving a `PolicyGradientAlgorithm` with its own Adam optimizer (no TRL, no accelerate).

    Args:
        policy: the backbone whose ``transformer`` is trained (its ``requires_grad`` parameters: the LoRA
            adapter when peft adapters are injected, else the whole transformer).
        algorithm: the algorithm (its config decides SDE, advantages, loss and KL).
    """

    def __init__(self, policy: VideoBackbone, algorithm: PolicyGradientAlgorithm) -> None:
        super().__init__(policy)
        self.algorithm = algorithm
        self.config = algorithm.config
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

    def update(self, trajectory: Trajectory) -> dict[str, float]:
        """``num_iterations`` passes over the rollout, ``num_minibatches`` optimizer steps each.

        Raises `sage_env.rewards.RewardFailureError` when no sample had a valid reward in
        ``max_consecutive_reward_failures`` updates in a row.
        """
        rewards = trajectory.rewards
        if rewards is not None:
            self.reward_failures.observe(int(rewards.valid.sum()), len(rewards.valid), rewards.errors)
        advantages, usable = self.algorithm.advantages(trajectory)
        totals: dict[str, list[float]] = defaultdict(list)
        for iteration in range(self.config.num_iterations):
            batch = self.algorithm.transitions(trajectory, advantages, usable, self.policy)
            if len(batch) == 0:
                break  # no usable group (all invalid or zero spread): nothing to learn from
            order = torch.randperm(len(batch), generator=self.algorithm.generator)
            splits = torch.tensor_split(order, min(self.config.num_minibatches, len(batch)))
            for index, minibatch in enumerate(splits):
                selected = batch.select(minibatch)
                selected.on_policy = iteration == 0 and index == 0  # no optimizer step since the rollout yet
                for name, value in self._optimizer_step(selected).items():
                    totals[name].append(value)
        metrics = {name: sum(values) / len(values) for name, values in totals.items()}
        metrics.update(self._rollout_metrics(trajectory, advantages, usable))
        return metrics

    def _optimizer_step(self, batch: TransitionBatch) -> dict[str, float]:
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
        metrics["usable_fraction"] = float(usable.float().mean())
        stochastic = trajectory.trainable
        metrics["rollout/exploration_std"] = (
            float(trajectory.stds[stochastic].mean()) if stochastic.any() else 0.0
        )
        return metrics


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

AgentFactory = Callable[..., Agent]

AGENT_REGISTRY: dict[str, AgentFactory] = {}
"""Registered agent factories: ``name -> factory(policy=..., **config) -> Agent``."""

ALGORITHM_CONFIGS: dict[str, type[AlgorithmConfig]] = {}
"""Config class of each built-in policy-gradient algorithm (used by the trainer's ``algorithm=`` field)."""

ALGORITHM_CLASSES: dict[str, type[PolicyGradientAlgorithm]] = {}


def register(name: str, factory: AgentFactory, *, overwrite: bool = False) -> None:
    """Register an agent factory under ``name`` (``factory(policy=backbone, **config) -> Agent``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Agent names must be non-empty strings, got {name!r}.")
    if not callable(factory):
        raise ValueError(f"The factory for {name!r} must be callable, got {type(factory).__name__}.")
    if name in AGENT_REGISTRY and not overwrite:
        raise ValueError(
            f"An agent named {name!r} is already registered; pick another name or pass overwrite=True."
        )
    AGENT_REGISTRY[name] = factory


def register_algorithm(
    name: str,
    config_class: type[AlgorithmConfig],
    algorithm_class: type[PolicyGradientAlgorithm] = PolicyGradientAlgorithm,
) -> None:
    """Register a policy-gradient algorithm: an agent factory plus its config for the TRL trainer."""

    def factory(policy: VideoBackbone, **config: Any) -> PolicyGradientAgent:
        unknown = set(config) - config_class.field_names()
        if unknown:
            raise ValueError(
                f"Unknown option(s) {sorted(unknown)} for agent {name!r}; "
                f"allowed: {', '.join(sorted(config_class.field_names()))}."
            )
        return PolicyGradientAgent(policy, algorithm_class(config_class(**config)))

    register(name, factory)
    ALGORITHM_CONFIGS[name] = config_class
    ALGORITHM_CLASSES[name] = algorithm_class


ROLLOUT_SETTINGS = ("sde", "eta", "log_prob_kind")
"""What an environment decides about the trajectories it records, and a policy-gradient agent must match."""


def rollout_settings(env: Any) -> dict[str, Any]:
    """The SDE settings of a `sage_env` environment (gymnasium wrappers are looked through)."""
    unwrapped = getattr(env, "unwrapped", env)
    return {name: getattr(unwrapped, name) for name in ROLLOUT_SETTINGS}


def make(name: str, policy: VideoBackbone | None = None, *, env: Any = None, **config: Any) -> Agent:
    """Build the registered agent ``name`` for ``policy`` with config overrides.

    With ``env`` (a `sage_env` environment, wrapped or not), the policy defaults to the environment's backbone and
    a policy-gradient algorithm takes the environment's SDE settings (``sde``, ``eta``, ``log_prob_kind``), so
    the agent scores exactly the trajectories the environment records; explicit values still win, and an update on
    trajectories sampled with other settings is refused.
    """
    if name not in AGENT_REGISTRY:
        raise ValueError(
            f"Unknown agent {name!r}; registered agents: {', '.join(list_agents())}. "
            "Register your own with agents.register(name, factory)."
        )
    if env is not None:
        policy = policy if policy is not None else getattr(env, "unwrapped", env).backbone
        if name in ALGORITHM_CONFIGS:
            config = {**rollout_settings(env), **config}
    if policy is None:
        raise ValueError(f"agents.make({name!r}) needs policy= (a VideoBackbone) or env= (a sage_env environment).")
    return AGENT_REGISTRY[name](policy=policy, **config)


def list_agents() -> list[str]:
    """Names of the registered agents."""
    return sorted(AGENT_REGISTRY)
