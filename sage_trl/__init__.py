"""sage_trl: TRL-style training of flow-matching video models with SAGE-GRPO (and any `agents` algorithm)."""

from sage_trl.config import SageGRPOConfig
from sage_trl.trainer import SageGRPOTrainer

__all__ = ["SageGRPOConfig", "SageGRPOTrainer"]
