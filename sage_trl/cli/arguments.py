"""``sage-train``'s own arguments, `TrainScriptArguments`, beside `SageGRPOConfig`.

Every field carries its help and its declared check (`sage_env.checks`); the rules between fields (LoRA options
without LoRA, a reward spec's form) are in ``__post_init__``. The layered parsing of presets, ``--config`` files
and flags is `sage_trl.cli.parsing`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sage_env.checks import Flag, Integer, ListOf, Real, Text, check_fields, hyperparameter

__all__ = ["LORA_FIELDS", "TrainScriptArguments"]

_REWARD_PREFIXES = ("videoalign:",)
LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
"""The LoRA options, which apply only with ``use_peft``."""


@dataclass
class TrainScriptArguments:
    """What ``sage-train`` needs besides `SageGRPOConfig`: the preset, rewards, prompts, evaluation, LoRA."""

    preset: str | None = hyperparameter(
        None,
        "A shipped preset (sage_trl.presets: toy) or a YAML file, applied before --config and the flags. "
        "None: the model's own preset when one ships (the toy world's for model_name_or_path toy).",
        Text(max_length=4096, optional=True),
    )
    reward: list[str] = hyperparameter(
        ["toy"],
        "Reward functions: 'toy' (the toy world's VQ/MQ/TA, whose best videos are the world's own), 'toy_hackable' "
        "(the earlier toy reward, a proxy RL games: for studying over-optimisation), an installed package's "
        "reward (entry-point group sage_grpo.rewards), 'videoalign:<folder or Hub id>' (VideoAlign), or "
        "'package.module:function' (any function following the reward protocol). Several may be given.",
        ListOf(
            Text(max_length=4096),
            min_length=1,
            max_length=64,
            hint="e.g. --reward toy, or reward: [toy] in YAML",
        ),
    )
    eval_reward: list[str] = hyperparameter(
        [],
        "Evaluation rewards: scored on the held-out videos at every evaluation and logged (eval_eval_reward/...; "
        "TensorBoard: eval/eval_reward/...), never optimised; the same forms as reward (e.g. VideoAlign's heads or the toy world's reward while training on "
        "another). A score the training reward does not see shows what optimising the reward did to the rest "
        "(docs/runs.md).",
        ListOf(Text(max_length=4096), max_length=64, hint="e.g. --eval_reward toy"),
    )
    dataset_name: str = hyperparameter(
        "toy",
        "Training prompts: 'toy', a text file (one prompt per line), or a datasets name/folder with a "
        "'prompt' column.",
        Text(max_length=4096),
    )
    dataset_split: str = hyperparameter("train", "Split of a datasets dataset.", Text(max_length=256))
    eval_prompts: str = hyperparameter(
        "toy",
        "Held-out prompts, evaluated before and after training and at every eval_steps with eval_strategy steps: "
        "'toy', a text file, or 'none'.",
        Text(max_length=4096),
    )
    num_eval_prompts: int = hyperparameter(
        8, "How many held-out prompts to evaluate (0: no evaluation).", Integer(0, 10_000)
    )
    use_peft: bool = hyperparameter(True, "Train a LoRA adapter (False: full fine-tuning).", Flag())
    lora_r: int = hyperparameter(8, "LoRA rank (with use_peft).", Integer(1, 4096))
    lora_alpha: int = hyperparameter(
        16, "LoRA alpha (with use_peft): the adapter's output is scaled by alpha / r.", Integer(1, 10**6)
    )
    lora_dropout: float = hyperparameter(0.0, "LoRA dropout (with use_peft).", Real(0.0, 1.0, high_open=True))
    lora_target_modules: list[str] | None = hyperparameter(
        None,
        "Modules LoRA adapts (with use_peft); None: the backbone's defaults (attention projections).",
        ListOf(Text(max_length=256), min_length=1, max_length=1024, optional=True),
    )
    preflight: bool = hyperparameter(
        False,
        "Print the full-size memory and compute plan of this config (traced on the CPU, nothing "
        "downloaded or trained) instead of training.",
        Flag(),
    )
    gpu: str | None = hyperparameter(
        None,
        "Preflight: the GPU to plan for (e.g. H100, A100-80GB, RTX4090).",
        Text(max_length=64, optional=True),
    )
    gpu_memory_gib: float | None = hyperparameter(
        None,
        "Preflight: the memory budget per GPU in GiB; savers that would make it fit are listed.",
        Real(0.0, 10_000.0, low_open=True, optional=True),
    )
    preflight_world_size: int | None = hyperparameter(
        None,
        "Preflight: plan per GPU for this many processes (DDP, or FSDP2 with preflight_fsdp); None: $WORLD_SIZE "
        "as accelerate launch sets it, else 1. Lets one CPU process plan a multi-GPU config.",
        Integer(1, 1_000_000, optional=True),
    )
    preflight_fsdp: bool | None = hyperparameter(
        None,
        "Preflight: plan FSDP2 sharding over preflight_world_size processes (False: DDP); None: "
        "$ACCELERATE_USE_FSDP as accelerate launch sets it.",
        Flag(optional=True),
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for spec in [*self.reward, *self.eval_reward]:
            _check_reward_spec(spec)
        if not self.use_peft:
            defaults = {f.name: f.default for f in fields(self)}
            changed = [name for name in LORA_FIELDS if getattr(self, name) != defaults[name]]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} set with use_peft false: LoRA options do nothing in full fine-tuning. "
                    "Remove them, or pass --use_peft true to train an adapter."
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


def _check_reward_spec(spec: str) -> None:
    """The form of a reward spec (whether it loads is checked when the rewards are resolved, before the model)."""
    if spec.startswith(_REWARD_PREFIXES) and not spec.split(":", 1)[1]:
        raise ValueError(f"reward {spec!r} names no checkpoint: use 'videoalign:<folder or Hub id>'.")
    if ":" in spec and not spec.startswith(_REWARD_PREFIXES) and not all(spec.partition(":")[::2]):
        raise ValueError(f"reward {spec!r} is not of the form 'package.module:function'.")
