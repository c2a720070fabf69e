"""Finding agents by name: algorithms from any installed package, agents registered in this process, ``make``.

Algorithms are plug-ins (`sage_env.plugins`) of the entry-point group ``sage_grpo.algorithms``: an entry point loads
either an `agents.AlgorithmConfig` subclass (a new algorithm reusing an update rule: it changes ``defaults``, may add
fields of its own, and may name its update rule as ``algorithm_class``) or an `agents.Algorithm` subclass naming its
``config_class``. This library's built-ins are declared the same way in its pyproject. ``module:attr``
works as a name too. Agents that are not built on an `agents.Algorithm` (their own update loop) register a factory
in-process with `register`.

`make` builds either for a policy or a `sage_env` environment (gymnasium's ``make`` and ``make_vec``, wrapped or
not; `environment_attributes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agents.algorithm import Algorithm, AlgorithmConfig, PolicyGradientAlgorithm
from agents.base import Agent, AgentSettings, AlgorithmAgent, environment_attributes, rollout_shape
from sage_env.backbones import VideoBackbone
from sage_env.plugins import GROUPS, PluginError, PluginGroup

__all__ = [
    "AGENT_REGISTRY",
    "ALGORITHMS",
    "ALGORITHM_CLASSES",
    "ALGORITHM_CONFIGS",
    "ROLLOUT_SETTINGS",
    "AlgorithmSpec",
    "algorithm_spec",
    "environment_attributes",
    "list_agents",
    "make",
    "register",
    "register_algorithm",
    "rollout_settings",
]

AgentFactory = Callable[..., Agent]

AGENT_REGISTRY: dict[str, AgentFactory] = {}
"""Agent factories registered in this process: ``name -> factory(policy=..., **config) -> Agent``."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm: its config class (hyperparameters and defaults) and its update rule."""

    config_class: type[AlgorithmConfig]
    algorithm_class: type[Algorithm]


def _as_algorithm(loaded: Any, name: str) -> AlgorithmSpec:
    """What a ``sage_grpo.algorithms`` entry point loads, as an `AlgorithmSpec`."""
    if isinstance(loaded, AlgorithmSpec):
        return loaded
    if isinstance(loaded, type) and issubclass(loaded, AlgorithmConfig):
        return AlgorithmSpec(loaded, loaded.algorithm_class or PolicyGradientAlgorithm)
    if isinstance(loaded, type) and issubclass(loaded, Algorithm):
        if not (isinstance(loaded.config_class, type) and issubclass(loaded.config_class, AlgorithmConfig)):
            raise TypeError(f"{loaded.__name__}.config_class must be an AlgorithmConfig subclass")
        return AlgorithmSpec(loaded.config_class, loaded)
    raise TypeError(
        f"an algorithm entry point must load an agents.AlgorithmConfig or agents.Algorithm subclass, got {loaded!r}"
    )


ALGORITHMS = PluginGroup("algorithm", GROUPS["algorithms"], _as_algorithm)
"""Every algorithm, built in or installed: ``ALGORITHMS.load(name) -> AlgorithmSpec`` (imported on first use)."""


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The `AlgorithmSpec` of ``name`` (see `ALGORITHMS`); a `sage_env.plugins.PluginError` naming the known ones."""
    return ALGORITHMS.load(name)


class _SpecView(Mapping):
    """A read-only, lazily loading view of one attribute of every algorithm (``ALGORITHM_CONFIGS["ddpo"]``)."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute

    def __getitem__(self, name: str) -> Any:
        if name not in ALGORITHMS:
            raise KeyError(name)
        return getattr(ALGORITHMS.load(name), self.attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(ALGORITHMS.names())

    def __len__(self) -> int:
        return len(ALGORITHMS.names())

    def __contains__(self, name: object) -> bool:
        return name in ALGORITHMS


ALGORITHM_CONFIGS: Mapping[str, type[AlgorithmConfig]] = _SpecView("config_class")
"""The config class of every algorithm by name (loaded on access; the trainer's ``algorithm=`` field)."""
ALGORITHM_CLASSES: Mapping[str, type[Algorithm]] = _SpecView("algorithm_class")
"""The update rule of every algorithm by name (loaded on access)."""


def register(name: str, factory: AgentFactory, *, overwrite: bool = False) -> None:
    """Register an agent factory under ``name`` (``factory(policy=backbone, **config) -> Agent``) in this process."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Agent names must be non-empty strings, got {name!r}.")
    if not callable(factory):
        raise ValueError(f"The factory for {name!r} must be callable, got {type(factory).__name__}.")
    if (name in AGENT_REGISTRY or name in ALGORITHMS) and not overwrite:
        raise ValueError(
            f"An agent named {name!r} is already registered; pick another name or pass overwrite=True."
        )
    AGENT_REGISTRY[name] = factory


def register_algorithm(
    name: str,
    config_class: type[AlgorithmConfig],
    algorithm_class: type[Algorithm] | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Register an algorithm in this process (a package declares it as an entry point instead):
    `make`, the TRL trainer and ``sage-train --algorithm`` find it by ``name``."""
    update_rule = algorithm_class or config_class.algorithm_class or PolicyGradientAlgorithm
    ALGORITHMS.register(name, AlgorithmSpec(config_class, update_rule), overwrite=overwrite)


def _algorithm_agent(name: str, policy: VideoBackbone, config: dict[str, Any]) -> AlgorithmAgent:
    spec = algorithm_spec(name)
    allowed = spec.config_class.field_names() | AgentSettings.field_names()
    unknown = set(config) - allowed
    if unknown:
        raise ValueError(
            f"Unknown option(s) {sorted(unknown)} for agent {name!r}; allowed: {', '.join(sorted(allowed))}."
        )
    settings = AgentSettings(**{k: v for k, v in config.items() if k in AgentSettings.field_names()})
    algorithm_config = spec.config_class(
        **{k: v for k, v in config.items() if k not in AgentSettings.field_names()}
    )
    return AlgorithmAgent(policy, spec.algorithm_class(algorithm_config, seed=settings.seed), settings)


ROLLOUT_SETTINGS = ("sde", "eta", "log_prob_kind")
"""What an environment decides about the trajectories it records, and an algorithm's config must match (declared by
the config; an env built for an algorithm takes them from it, an algorithm made for an env takes them from the env)."""


def rollout_settings(env: Any) -> dict[str, Any]:
    """The SDE settings of a `sage_env` environment (see `environment_attributes`)."""
    return environment_attributes(env, ROLLOUT_SETTINGS)


def make(name: str, policy: VideoBackbone | None = None, *, env: Any = None, **config: Any) -> Agent:
    """Build the agent ``name`` (an algorithm of `ALGORITHMS`, or an agent registered with `register`) for ``policy``
    with config overrides.

    With ``env`` (a `sage_env` environment from ``gym.make`` or ``gym.make_vec``, wrapped or not), the policy
    defaults to the environment's backbone and the algorithm takes the environment's SDE settings
    (``sde``, ``eta``, ``log_prob_kind``), so the agent scores exactly the trajectories the environment records;
    explicit values still win, and an update on trajectories sampled with other settings is refused. Over
    gymnasium's sync or async vector environments the agent acts for every sub-environment (the actions are its
    velocities), and learns from ``agent.update(envs.get_attr("trajectory"))``.
    """
    custom = name in AGENT_REGISTRY
    if not custom and name not in ALGORITHMS and ":" not in str(name):
        raise PluginError(
            f"Unknown agent {name!r}; known: {', '.join(list_agents())}. Install a package that declares the "
            f"algorithm in the entry-point group {ALGORITHMS.group!r}, name it as 'package.module:Class', or "
            "register an agent with agents.register(name, factory)."
        )
    if env is not None:
        policy = policy if policy is not None else environment_attributes(env, ("backbone",))["backbone"]
        if not custom:
            config = {**rollout_settings(env), **config}
    if policy is None:
        raise ValueError(
            f"agents.make({name!r}) needs policy= (a VideoBackbone) or env= (a sage_env environment)."
        )
    if custom:
        return AGENT_REGISTRY[name](policy=policy, **config)
    agent = _algorithm_agent(name, policy, config)
    if env is not None:
        shape = rollout_shape(env)
        agent.config.check_rollouts(shape.group_size, shape.stochastic_steps)
    return agent


def list_agents() -> list[str]:
    """Names of every agent: the algorithms of `ALGORITHMS` and the agents registered with `register`."""
    return sorted({*AGENT_REGISTRY, *ALGORITHMS.names()})
