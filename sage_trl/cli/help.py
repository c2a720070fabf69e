"""``sage-train --help``: what applies to this command, in sections, with the defaults this run would use.

The parser knows every field of `TrainScriptArguments`, `SageGRPOConfig` (TRL's and transformers' included) and the
chosen algorithm's own fields; the help reorders them for a person:

* sage-train's own arguments; the model, video, memory and reward fields; the algorithm's hyperparameters, each
  with the default the chosen algorithm (``--algorithm``), the preset and the ``--config`` file give it (a field
  the algorithm leaves to the model says so); the algorithm's own fields; then transformers' training loop,
  logging, saving and Hub options;
* GRPOConfig's options for text generation, which `SageGRPOConfig` refuses, are not listed.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

__all__ = ["NOT_LISTED", "format_train_help"]

NOT_LISTED = frozenset(
    {
        # language-model token options, which no video run reads
        "label_smoothing_factor", "use_cache", "neftune_noise_alpha", "include_num_input_tokens_seen",
        "average_tokens_across_devices", "remove_unused_columns", "label_names", "length_column_name",
        "train_sampling_strategy", "liger_kernel_config",
        # evaluation through an eval_dataset, which SageGRPOTrainer refuses (held-out evaluation: sage-train's own)
        "eval_delay", "per_device_eval_batch_size", "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
        "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics",
        "bf16_full_eval", "fp16_full_eval", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
        "do_train", "do_eval", "do_predict", "num_generations_eval",
        # GRPOConfig's completion logging, which has no videos to log
        "log_completions", "num_completions_to_print", "log_unique_prompts", "log_multimodal",
    }
)  # fmt: skip
"""transformers and TRL fields the help leaves out: they do nothing for a video run (they stay accepted)."""

_DESCRIPTION = (
    "Train a video model with RL (SAGE-GRPO by default). With no arguments: SAGE-GRPO + LoRA on the built-in toy "
    "world, minutes on a CPU. Layers: the preset (--preset, or the model's own), then --config FILE.yaml, then the "
    "flags. `--algorithm NAME --help` shows that algorithm's defaults and its own fields."
)


def _move(parser: argparse.ArgumentParser, actions: list[argparse.Action], title: str) -> None:
    """Put ``actions`` under a new section ``title`` of the help (argparse keeps one action list per group)."""
    group = parser.add_argument_group(title)
    for action in actions:
        for existing in parser._action_groups:
            if action in existing._group_actions:
                existing._group_actions.remove(action)
        group._group_actions.append(action)


def _field_names(config_class: type, declared_only: bool = False) -> list[str]:
    if declared_only:
        return [name for name in inspect.get_annotations(config_class) if name in _names(config_class)]
    return list(_names(config_class))


def _names(config_class: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_class)}


def format_train_help(
    parser: argparse.ArgumentParser,
    algorithm: str,
    own_class: type | None,
    layered: dict[str, Any],
) -> str:
    """The help text of ``parser`` (sage-train's, with the algorithm's own fields added), regrouped.

    Args:
        parser: the parser of `TrainScriptArguments`, `SageGRPOConfig` and ``own_class``.
        algorithm: the chosen algorithm's name.
        own_class: the dataclass of its own fields (None when it has none).
        layered: the values the preset and the config file set (shown as the defaults of their fields).
    """
    from agents import AlgorithmConfig, algorithm_spec
    from sage_trl.cli.arguments import TrainScriptArguments
    from sage_trl.config import SageGRPOFields
    from sage_trl.config_checks import refused_fields

    spec = algorithm_spec(algorithm)
    defaults = {**spec.config_class.defaults, **layered}
    # By option name: a boolean field's --no_<flag> complement shares its dest with the flag itself.
    by_dest = {action.option_strings[0][2:]: action for action in parser._actions if action.option_strings}
    hidden = refused_fields() | NOT_LISTED
    for dest, action in by_dest.items():
        if dest in hidden or (dest.startswith("no_") and dest[3:] in hidden):
            action.help = argparse.SUPPRESS
        elif dest in defaults and action.help is not argparse.SUPPRESS:
            action.default = defaults[dest]
            if dest in layered:
                action.help = f"{action.help} Set by the preset or the --config file."
            elif defaults[dest] is None and dest in AlgorithmConfig.defaults:
                action.help = f"{action.help} None: the model's."
    sections = [
        ("sage-train", _field_names(TrainScriptArguments)),
        (
            "model, video, memory and rewards (SageGRPOConfig)",
            _field_names(SageGRPOFields, declared_only=True),
        ),
        (
            f"algorithm: {spec.config_class.display_name} (--algorithm {algorithm})",
            _field_names(AlgorithmConfig),
        ),
    ]
    if own_class is not None:
        sections.append((f"{spec.config_class.display_name}'s own fields", _field_names(own_class)))
    listed = {name for _, names in sections for name in names}
    for title, names in sections:
        _move(parser, [by_dest[n] for n in names if n in by_dest] + _complements(by_dest, names), title)
    rest = [a for d, a in by_dest.items() if d not in listed and not d.startswith("no_") and d != "help"]
    _move(parser, rest + _complements(by_dest, [a.option_strings[0][2:] for a in rest]), "training loop, logging, saving, Hub "
          "(transformers TrainingArguments and TRL GRPOConfig)")  # fmt: skip
    parser.description = _DESCRIPTION
    parser.usage = "sage-train [--preset NAME] [--config FILE.yaml] [--algorithm NAME] [--FIELD VALUE ...]"
    return parser.format_help()


def _complements(by_dest: dict[str, argparse.Action], names: Sequence[str]) -> list[argparse.Action]:
    """The ``--no_<flag>`` options transformers' parser adds for boolean fields defaulting to True."""
    return [by_dest[f"no_{name}"] for name in names if f"no_{name}" in by_dest]
