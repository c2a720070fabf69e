"""agents: RL algorithms that train a video backbone against any `sage_env` environment.

``agents.make(name, env=envs, **config)`` builds a registered agent for an environment (its backbone as the
policy, its SDE settings; or ``policy=backbone``); ``agents.register(name,
factory)`` adds your own. Built-ins: ``sage_grpo`` (the paper), ``flow_grpo``, ``dance_grpo``, ``cps``,
``ddpo``, ``reinforce``; all share one implementation of the math (`agents.algorithm`), which the TRL
trainer (`sage_trl`) uses too.
"""

from agents.algorithm import (
    KL_STRATEGIES,
    AlgorithmConfig,
    PolicyGradientAlgorithm,
    References,
    TransitionBatch,
)
from agents.base import (
    AGENT_REGISTRY,
    ALGORITHM_CLASSES,
    ALGORITHM_CONFIGS,
    ROLLOUT_SETTINGS,
    Agent,
    PolicyGradientAgent,
    list_agents,
    make,
    register,
    register_algorithm,
    rollout_settings,
)
from agents.cps import CPSAgentConfig
from agents.dance_grpo import DanceGRPOAgentConfig
from agents.ddpo import DDPOAgentConfig, DDPOAlgorithm
from agents.flow_grpo import FlowGRPOAgentConfig
from agents.reinforce import ReinforceAgentConfig
from agents.sage_grpo import SageGRPOAgentConfig

register_algorithm("sage_grpo", SageGRPOAgentConfig)
register_algorithm("flow_grpo", FlowGRPOAgentConfig)
register_algorithm("dance_grpo", DanceGRPOAgentConfig)
register_algorithm("cps", CPSAgentConfig)
register_algorithm("ddpo", DDPOAgentConfig, DDPOAlgorithm)
register_algorithm("reinforce", ReinforceAgentConfig)

__all__ = [
    "AGENT_REGISTRY",
    "ALGORITHM_CLASSES",
    "ALGORITHM_CONFIGS",
    "KL_STRATEGIES",
    "ROLLOUT_SETTINGS",
    "Agent",
    "AlgorithmConfig",
    "CPSAgentConfig",
    "DDPOAgentConfig",
    "DDPOAlgorithm",
    "DanceGRPOAgentConfig",
    "FlowGRPOAgentConfig",
    "PolicyGradientAgent",
    "PolicyGradientAlgorithm",
    "References",
    "ReinforceAgentConfig",
    "SageGRPOAgentConfig",
    "TransitionBatch",
    "list_agents",
    "make",
    "register",
    "register_algorithm",
    "rollout_settings",
]
