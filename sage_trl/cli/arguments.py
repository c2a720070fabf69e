"""``sage-train``'s arguments: `TrainScriptArguments` beside `SageGRPOConfig`, and the layered parsing.

Layers, each on top of the previous one: the dataclass defaults, the preset (``--preset NAME``, or the model's own
preset: the toy world's for ``model_name_or_path: toy``), the ``--config`` YAML, the command-line flags. Every key
of a preset or a YAML must be a field of one of the two dataclasses: a misspelt key is an error naming it and the
closest field, never silently ignored.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sage_trl.presets import load_preset, preset_for_model

__all__ = ["TrainScriptArguments", "parse_train_arguments"]

_BUILT_IN_REWARDS = ("toy",)
_REWARD_PREFIXES = ("videoalign:",)


@dataclass
class TrainScriptArguments:
    """What ``sage-train`` needs besides `SageGRPOConfig`: the preset, rewards, prompts, evaluation, LoRA."""

    preset: str | None = field(
        default=None,
        metadata={
            "help": "A shipped preset (sage_trl.presets: toy) or a YAML file, applied before --config and the flags. "
            "None: the model's own preset when one ships (the toy world's for model_name_or_path toy)."
        },
    )
    reward: list[str] = field(
        default_factory=lambda: ["toy"],
        metadata={
            "help": "Reward functions: 'toy' (the toy world's VQ/MQ/TA), 'videoalign:<folder or Hub id>' (VideoAlign), "
            "or 'package.module:function' (any function following the reward protocol). Several may be given."
        },
    )
    dataset_name: str = field(
        default="toy",
        metadata={
            "help": "Training prompts: 'toy', a text file (one prompt per line), or a datasets name/folder with a "
            "'prompt' column."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Split of a datasets dataset."})
    eval_prompts: str = field(
        default="toy",
        metadata={"help": "Held-out prompts for the before/after evaluation: 'toy', a text file, or 'none'."},
    )
    num_eval_prompts: int = field(default=8, metadata={"help": "How many held-out prompts to evaluate."})
    eval_seeds: list[int] = field(
        default_factory=lambda: [0, 1], metadata={"help": "Seeds per held-out prompt."}
    )
    use_peft: bool = field(default=True, metadata={"help": "Train a LoRA adapter (False: full fine-tuning)."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules LoRA adapts; None: the backbone's defaults (attention projections)."},
    )
    preflight: bool = field(
        default=False,
        metadata={
            "help": "Print the full-size memory and compute plan of this config (traced on the CPU, nothing "
            "downloaded or trained) instead of training."
        },
    )
    gpu: str | None = field(
        default=None, metadata={"help": "Preflight: the GPU to plan for (e.g. H100, A100-80GB, RTX4090)."}
    )
    gpu_memory_gib: float | None = field(
        default=None,
        metadata={
            "help": "Preflight: the memory budget per GPU in GiB; savers that would make it fit are listed."
        },
    )

    def peft_config(self) -> Any:
        """The ``peft.LoraConfig`` these arguments describe (None without ``use_peft``: full fine-tuning)."""
        if not self.use_peft:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=self.lora_target_modules,
            init_lora_weights=True,
        )

    def __post_init__(self) -> None:
        for spec in self.reward:
            _check_reward_spec(spec)
        if not self.reward:
            raise ValueError("reward must name at least one reward function, e.g. --reward toy.")
        _check_int(self, "num_eval_prompts", minimum=0)
        for name in ("lora_r",):
            _check_int(self, name, minimum=1)
        if not isinstance(self.lora_alpha, (int, float)) or self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha!r}.")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must lie in [0, 1), got {self.lora_dropout!r}.")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.eval_seeds):
            raise ValueError(f"eval_seeds must be non-negative integers, got {self.eval_seeds!r}.")
        if self.gpu_memory_gib is not None and not self.gpu_memory_gib > 0:
            raise ValueError(f"gpu_memory_gib must be > 0, got {self.gpu_memory_gib!r}.")


def _check_int(arguments: Any, name: str, minimum: int) -> None:
    value = getattr(arguments, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


def _check_reward_spec(spec: str) -> None:
    if spec in _BUILT_IN_REWARDS or spec.startswith(_REWARD_PREFIXES):
        if spec.startswith(_REWARD_PREFIXES) and not spec.split(":", 1)[1]:
            raise ValueError(f"reward {spec!r} names no checkpoint: use 'videoalign:<folder or Hub id>'.")
        return
    module, _, function = spec.partition(":")
    if not module or not function:
        raise ValueError(
            f"Unknown reward {spec!r}; use 'toy', 'videoalign:<folder or Hub id>' or 'package.module:function'."
        )


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    flag = f"--{name}"
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(f"{flag}="):
            return token.split("=", 1)[1]
    return None


def _check_keys(values: dict[str, Any], known: set[str], source: str) -> None:
    for key in values:
        if key not in known and key != "env":
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; see sage-train --help."
            raise ValueError(f"{source} has the key {key!r}, which is not a sage-train field{hint}")


def _read_config_file(path: str) -> dict[str, Any]:
    if not Path(path).is_file():
        raise ValueError(f"config: {path} does not exist (pass a YAML file with --config).")
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"config: {path} is not valid YAML ({error}).") from error
    if not isinstance(values, dict):
        raise ValueError(f"config: {path} must hold a YAML mapping of field: value.")
    return values


def parse_train_arguments(argv: Sequence[str] | None = None) -> tuple[TrainScriptArguments, Any]:
    """Parse ``sage-train``'s arguments: preset, then ``--config``, then flags (see the module docstring)."""
    from trl import TrlParser

    from sage_trl.config import SageGRPOConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    known = {f.name for f in fields(TrainScriptArguments)} | {f.name for f in fields(SageGRPOConfig)}
    config_path = _flag_value(argv, "config")
    config_values = _read_config_file(config_path) if config_path else {}
    _check_keys(config_values, known, f"config file {config_path}")
    preset = _flag_value(argv, "preset") or config_values.get("preset")
    if preset is None:
        model = _flag_value(argv, "model_name_or_path") or config_values.get("model_name_or_path", "toy")
        preset = preset_for_model(model)
    parser = TrlParser((TrainScriptArguments, SageGRPOConfig))
    if preset is not None:
        preset_values = load_preset(preset)
        _check_keys(preset_values, known, f"preset {preset}")
        parser.set_defaults_with_config(**preset_values)
    if _preflight_requested(argv, config_values):
        # A plan for a GPU is traced on any machine: bf16 must not be refused for lack of one.
        parser.set_defaults_with_config(use_cpu=True)
    script_args, config = parser.parse_args_and_config(argv)
    return script_args, config


def _preflight_requested(argv: Sequence[str], config_values: dict[str, Any]) -> bool:
    """Whether ``--preflight`` is on (a bare flag, ``--preflight true`` / ``=true``, or ``preflight: true``)."""
    for index, token in enumerate(argv):
        if token == "--preflight":
            following = argv[index + 1] if index + 1 < len(argv) else "--"
            return following.startswith("--") or following.lower() in ("true", "yes", "1", "t", "y")
        if token.startswith("--preflight="):
            return token.split("=", 1)[1].lower() in ("true", "yes", "1", "t", "y")
    return config_values.get("preflight") is True
