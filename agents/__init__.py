"""agents: RL algorithms that train a video backbone against any `sage_env` environment.

``agents.make(name, env=envs, **config)`` builds an agent for an environment (its backbone as the policy, its SDE
settings; or ``policy=backbone``). Algorithms are found by name in any installed package (entry-point group
``sage_grpo.algorithms``, `agents.registry`); ``agents.register(name, factory)`` adds a custom agent in-process.
Built-ins: the policy gradients over SDE transitions ``sage_grpo`` (the paper), ``flow_grpo``, ``dance_grpo``,
``cps``, ``ddpo``, ``reinforce``, ``grpo_guard``, ``mix_grpo``, ``mix_grpo_flash`` and ``branch_grpo`` (one
implementation of their math, `agents.algorithm`), and the likelihood-free ``diffusion_nft`` and ``awm``
(`agents.likelihood_free`). The TRL trainer (`sage_trl`) drives them too; every algorithm, built in or installed, is
an `agents.Algorithm`.
"""

from agents.algorithm import (
    KL_STRATEGIES,
    Algorithm,
    AlgorithmConfig,
    FinalSampleBatch,
    PolicyGradientAlgorithm,
    References,
    RowBatch,
    TrainingBatch,
    TransitionBatch,
)
from agents.base import Agent, AgentSettings, AlgorithmAgent, PolicyGradientAgent
from agents.cps import CPSAgentConfig
from agents.dance_grpo import DanceGRPOAgentConfig
from agents.ddpo import DDPOAgentConfig, DDPOAlgorithm
from agents.flow_grpo import FlowGRPOAgentConfig
from agents.registry import (
    AGENT_REGISTRY,
    ALGORITHM_CLASSES,
    ALGORITHM_CONFIGS,
    ALGORITHMS,
    ROLLOUT_SETTINGS,
    AlgorithmSpec,
    algorithm_spec,
    environment_attributes,
    list_agents,
    make,
    register,
    register_algorithm,
    rollout_settings,
)
from agents.reinforce import ReinforceAgentConfig
from agents.rollout import RolloutShape, ScoredTrajectory
from agents.sage_grpo import SageGRPOAgentConfig

__all__ = [
    "AGENT_REGISTRY",
    "ALGORITHMS",
    "ALGORITHM_CLASSES",
    "ALGORITHM_CONFIGS",
    "KL_STRATEGIES",
    "ROLLOUT_SETTINGS",
    "Agent",
    "AgentSettings",
    "Algorithm",
    "AlgorithmAgent",
    "AlgorithmConfig",
    "AlgorithmSpec",
    "CPSAgentConfig",
    "DDPOAgentConfig",
    "DDPOAlgorithm",
    "DanceGRPOAgentConfig",
    "FinalSampleBatch",
    "FlowGRPOAgentConfig",
    "PolicyGradientAgent",
    "PolicyGradientAlgorithm",
    "References",
    "ReinforceAgentConfig",
    "RolloutShape",
    "RowBatch",
    "SageGRPOAgentConfig",
    "ScoredTrajectory",
    "TrainingBatch",
    "TransitionBatch",
    "algorithm_spec",
    "environment_attributes",
    "list_agents",
    "make",
    "register",
    "register_algorithm",
    "rollout_settings",
]
