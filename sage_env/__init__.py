"""sage_env: denoising of flow-matching video models as gymnasium environments."""

from sage_env import sde

__all__ = ["sde"]
