"""sage_env: denoising of flow-matching text-to-video models as gymnasium environments.

Importing the package registers the environment ids of `sage_env.registration` with gymnasium, and makes forked
worker processes (gymnasium's ``AsyncVectorEnv``) run one torch thread each (`sage_env.forking`: torch's thread
pool does not survive a fork).
"""

from sage_env import sde
from sage_env.env import DenoisingEnv, DenoisingVectorEnv, Trajectory
from sage_env.forking import register_fork_handler
from sage_env.registration import ENV_IDS, register_envs

register_envs()
register_fork_handler()

__all__ = ["ENV_IDS", "DenoisingEnv", "DenoisingVectorEnv", "Trajectory", "sde"]
