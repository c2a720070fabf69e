"""The rules of `SageGRPOConfig`'s fields that transformers and TRL declare, and the strict types of all the others.

Our own fields carry their check in their declaration (`sage_env.checks.hyperparameter`). The fields inherited
from ``TrainingArguments`` and ``GRPOConfig`` are declared in those libraries; the ones a run uses get their
check here (`TRAINING_ARGUMENT_CHECKS`), and every other field is held to the type its annotation names
(`check_annotated_types`): a YAML file's ``max_steps: true`` or ``logging_first_step: "yes"`` is an error naming
the field, never a silent coercion. GRPOConfig's options for text generation are refused (`refused_fields`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any

from trl import GRPOConfig

from sage_env.checks import Check, Choice, Flag, Integer, Real, Text, check_value

__all__ = [
    "REFUSED_HINTS",
    "TRAINING_ARGUMENT_CHECKS",
    "USED_GRPO_FIELDS",
    "check_annotated_types",
    "refused_fields",
    "reporting_integrations",
]

_TEXT_GENERATION = (
    "a text-generation option of GRPOConfig; SageGRPOTrainer samples videos, whose randomness is the SDE noise "
    "(eta) and whose length is num_frames x num_inference_steps"
)
REFUSED_HINTS = {
    "loss_type": "the loss is the algorithm's (Eq. 43, a mean over (video, step) pairs); choose it with `algorithm`",
    "use_vllm": "vLLM generates text, not videos",
    "use_transformers_paged": "paged text generation does not apply to video diffusion",
    "use_transformers_continuous_batching": "continuous text batching does not apply to video diffusion",
    "use_liger_kernel": "Liger kernels patch language-model heads",
    "sync_ref_model": "use kl_strategy='moving' (the paper's periodic anchor, Eq. 13) instead",
    "importance_sampling_level": "ratios are per (video, step) pair, there are no tokens",
    "top_entropy_quantile": "there are no token entropies in video diffusion",
    "entropy_coef": "there are no token entropies in video diffusion",
}
"""Refused GRPOConfig options whose refusal says more than `_TEXT_GENERATION`."""

USED_GRPO_FIELDS = frozenset(
    {
        "num_generations",
        "num_generations_eval",
        "shuffle_dataset",
        "generation_batch_size",
        "steps_per_generation",
        "beta",
        "num_iterations",
        "epsilon",
        "epsilon_high",
        "reward_weights",
        "scale_rewards",
        "log_completions",
        "log_multimodal",
        "num_completions_to_print",
        "log_unique_prompts",
    }
)
"""GRPOConfig's own fields the trainer uses; everything else GRPOConfig adds to TrainingArguments is refused."""


def reporting_integrations() -> tuple[str, ...]:
    """What ``report_to`` may name: transformers' reporting integrations, ``all`` and ``none``."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return (*sorted(INTEGRATION_TO_CALLBACK), "all", "none")


@dataclasses.dataclass(frozen=True)
class ReportTo(Check):
    """``report_to``: one integration name or a list of them (`reporting_integrations`)."""

    optional: bool = True

    def describe(self) -> str:
        return "one or more of " + ", ".join(reporting_integrations())

    def check(self, name: str, value: Any) -> None:
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(n in reporting_integrations() for n in names):
            self.fail(name, value)


TRAINING_ARGUMENT_CHECKS: dict[str, Check] = {
    "output_dir": Text(max_length=4096, optional=True, hint="name the run folder, e.g. runs/my-run"),
    "max_steps": Integer(
        -1, 10**9, hint="a positive number of optimizer steps, or -1 to train num_train_epochs"
    ),
    "num_train_epochs": Real(0.0, 10**6, low_open=True),
    "per_device_train_batch_size": Integer(1, 2**16),
    "gradient_accumulation_steps": Integer(1, 2**16),
    "num_generations": Integer(
        2, 2**12, hint="GRPO compares at least 2 videos of the same prompt (paper: 4)"
    ),
    "steps_per_generation": Integer(1, 2**16, optional=True),
    "generation_batch_size": Integer(1, 2**20, optional=True),
    "seed": Integer(0, 2**32 - 1),
    "data_seed": Integer(0, 2**32 - 1, optional=True),
    "logging_steps": Real(0.0, 10**9, low_open=True),
    "save_steps": Real(0.0, 10**9, low_open=True),
    "save_total_limit": Integer(1, 10**6, optional=True),
    "warmup_steps": Real(0.0, 10**9),
    "adam_beta1": Real(0.0, 1.0, high_open=True),
    "adam_beta2": Real(0.0, 1.0, high_open=True),
    "adam_epsilon": Real(0.0, 1.0, low_open=True),
    "weight_decay": Real(0.0, 1.0),
    "dataloader_num_workers": Integer(0, 256),
    "use_cpu": Flag(),
    "push_to_hub": Flag(),
    "hub_model_id": Text(max_length=200, optional=True),
    "hub_private_repo": Flag(optional=True),
    "report_to": ReportTo(),
    "save_strategy": Choice(("no", "steps", "epoch")),
    "logging_strategy": Choice(("no", "steps", "epoch")),
}
"""Checks of the TrainingArguments / GRPOConfig fields a run uses (declared there, so their rule lives here)."""


@functools.cache
def _type_hints(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def _arms(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _matches(value: Any, arm: Any) -> bool | None:
    """Whether ``value`` is of the annotation arm ``arm``; None when the arm is not a plain type we judge."""
    origin = typing.get_origin(arm) or arm
    if arm is type(None):
        return value is None
    if origin is bool:
        return isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        return isinstance(value, (origin, str))
    return None


def check_annotated_types(config: Any, skip: set[str]) -> None:
    """Hold every field of ``config`` not in ``skip`` to the plain types its annotation names (bool, int, float,
    str, list, dict, an enum); fields annotated with other types, and unset ones (None or the default), are left
    to their library."""
    hints = _type_hints(type(config))
    for config_field in dataclasses.fields(config):
        if config_field.name in skip or config_field.name not in hints:
            continue
        value = getattr(config, config_field.name)
        if value is None or value is config_field.default:  # unset: the library's own default handling
            continue
        verdicts = [_matches(value, arm) for arm in _arms(hints[config_field.name])]
        if None in verdicts or any(verdicts):
            continue
        names = " or ".join(getattr(arm, "__name__", str(arm)) for arm in _arms(hints[config_field.name]))
        raise ValueError(
            f"{config_field.name} must be {names.replace('NoneType', 'None')}, got {value!r} "
            f"({type(value).__name__}); in YAML, write the value without quotes (true, 3, 0.5)."
        )


def check_training_arguments(config: Any) -> None:
    """The checks of `TRAINING_ARGUMENT_CHECKS` on ``config``."""
    for name, check in TRAINING_ARGUMENT_CHECKS.items():
        check_value(check, name, getattr(config, name))


def _grpo_own_fields() -> set[str]:
    from transformers import TrainingArguments

    return {f.name for f in dataclasses.fields(GRPOConfig)} - {
        f.name for f in dataclasses.fields(TrainingArguments)
    }


def refused_fields() -> set[str]:
    """GRPOConfig's text-generation and LLM fields, which `SageGRPOConfig` refuses when set."""
    return (_grpo_own_fields() - USED_GRPO_FIELDS) | set(REFUSED_HINTS)


def _default_of(config_field: dataclasses.Field) -> Any:
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return config_field.default


def refuse_text_generation_options(config: Any) -> None:
    """GRPOConfig options for text generation or LLM internals: an error when set, instead of being ignored."""
    refused = refused_fields()
    for grpo_field in dataclasses.fields(GRPOConfig):
        if grpo_field.name not in refused:
            continue
        value = getattr(config, grpo_field.name)
        if value != _default_of(grpo_field):
            reason = REFUSED_HINTS.get(grpo_field.name, _TEXT_GENERATION)
            raise ValueError(f"{grpo_field.name}={value!r} is not supported by SageGRPOTrainer: {reason}.")
