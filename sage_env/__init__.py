"""sage_env: denoising of flow-matching text-to-video models as gymnasium environments.

Importing the package registers the environment ids of `sage_env.registration` with gymnasium.
"""

from sage_env import sde
from sage_env.env import DenoisingEnv, DenoisingVectorEnv, Trajectory
from sage_env.registration import ENV_IDS, register_envs

register_envs()

__all__ = ["ENV_IDS", "DenoisingEnv", "DenoisingVectorEnv", "Trajectory", "sde"]
