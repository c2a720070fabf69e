"""Denoising of a flow-matching video model as gymnasium environments.

`DenoisingVectorEnv` is natively batched: B prompts x ``group_size`` generations advance together, latents
stay torch tensors on the model's device, and the policy (an agent wrapping a `VideoBackbone`) makes one
batched call per step. `DenoisingEnv` is the single-video `gymnasium.Env` built on the same code. Both return
numpy values by default, as gymnasium's checker and wrappers expect; ``array_mode="torch"`` returns tensors.

Modules: `sage_env.env.vector` (the batched env), `sage_env.env.single` (the single-video env),
`sage_env.env.spaces` (observation and action spaces, `PromptSpace`), `sage_env.env.trajectory` (the
recorded `Trajectory`), `sage_env.env.denoising` (`DenoisingBatch`, the one sampler both envs step, and `sample` /
`sample_videos`, which sample from a backbone without an agent), `sage_env.env.episode` (an episode's schedule from
its ``reset`` options), `sage_env.env.branching` (tree-shaped rollouts), `sage_env.env.policy` (`BackbonePolicy`,
`run_episode`).
"""

from sage_env.env.denoising import DenoisingBatch, sample, sample_videos
from sage_env.env.policy import BackbonePolicy, run_episode
from sage_env.env.single import DenoisingEnv
from sage_env.env.spaces import PromptSpace
from sage_env.env.trajectory import Trajectory, TrajectoryRecorder
from sage_env.env.vector import ARRAY_MODES, DenoisingVectorEnv, validate_sde_settings

__all__ = [
    "ARRAY_MODES",
    "BackbonePolicy",
    "DenoisingBatch",
    "DenoisingEnv",
    "DenoisingVectorEnv",
    "PromptSpace",
    "Trajectory",
    "TrajectoryRecorder",
    "run_episode",
    "sample",
    "sample_videos",
    "validate_sde_settings",
]
