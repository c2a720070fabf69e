"""Contract with the installed trl / transformers: every private name SageGRPOTrainer relies on is there."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from transformers import Trainer
from trl import GRPOTrainer, TrlParser

from sage_trl import SageGRPOConfig, SageGRPOTrainer, _trl_compat
from tests.doubles import LinearBackbone, mean_brightness


def attributes_read(method) -> set[str]:
    """Every ``self.<name>`` a method's source reads."""
    return set(re.findall(r"self\.([A-Za-z_][A-Za-z0-9_]*)", inspect.getsource(method)))


def test_reused_grpo_methods_exist_and_are_not_overridden() -> None:
    for name in _trl_compat.GRPO_REUSED_METHODS:
        assert callable(getattr(GRPOTrainer, name)), f"trl.GRPOTrainer.{name} is gone"
        assert getattr(SageGRPOTrainer, name) is getattr(GRPOTrainer, name), (
            f"{name} should be reused, not overridden"
        )


def test_transformers_private_methods_exist() -> None:
    for name in _trl_compat.TRAINER_PRIVATE_METHODS:
        assert callable(getattr(Trainer, name)), f"transformers.Trainer.{name} is gone"


def test_init_grpo_state_sets_what_the_reused_methods_read(tmp_path: Path) -> None:
    args = SageGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        num_frames=2,
        height=4,
        width=4,
        per_device_train_batch_size=4,
        num_inference_steps=2,
    )
    trainer = SageGRPOTrainer(LinearBackbone(), mean_brightness, args=args, train_dataset=["a", "b"])
    for name in _trl_compat.GRPO_REUSED_METHODS:
        for attribute in attributes_read(getattr(GRPOTrainer, name)):
            if attribute in _trl_compat.TRAIN_TIME_ATTRIBUTES:
                continue
            assert hasattr(trainer, attribute), f"GRPOTrainer.{name} reads self.{attribute}, which is not set"


def test_yaml_config_through_trl_parser(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "output_dir: out\nalgorithm: dance_grpo\nnum_inference_steps: 10\nsde_window: [0, 5]\n"
        "reward_component_weights: '{\"ta\": 2.0}'\nuse_cpu: true\n"
    )
    (args,) = TrlParser((SageGRPOConfig,)).parse_args_and_config(["--config", str(config), "--eta", "0.4"])
    assert args.algorithm == "dance_grpo" and args.sde == "dance_grpo" and args.eta == 0.4
    assert args.sde_window == [0, 5] and args.reward_component_weights == {"ta": 2.0}
    assert args.timestep_fraction == 0.6  # DanceGRPO's default came with the algorithm
