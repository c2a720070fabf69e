"""``sage-train``'s layered parsing: the preset, then the ``--config`` YAML, then the command-line flags.

Layers, each on top of the previous one: the dataclass defaults, the preset (``--preset NAME``, or the model's own
preset: the toy world's for ``model_name_or_path: toy``), the ``--config`` file, the flags. Both files are read
as data (`sage_trl.config_files`: no aliases, no duplicate keys, no ``env:`` block). Every key of a preset or a
YAML must be a field of `TrainScriptArguments`, of `SageGRPOConfig` or of the chosen algorithm's own fields: a
misspelt key is an error naming it and the closest field, never silently ignored.

The chosen algorithm's own fields (those its config class declares beyond `agents.AlgorithmConfig`, such as
DDPO's ``stat_buffer_size``) are flags and YAML keys like any other; they are collected into
``SageGRPOConfig.algorithm_args``.

A negative number in scientific notation (``--learning_rate -1e-3``) is read as the flag's value, where argparse
alone would take it for an option.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from sage_trl.cli.arguments import TrainScriptArguments
from sage_trl.config_files import read_config_file
from sage_trl.presets import load_preset, preset_for_model, values_for

__all__ = ["algorithm_arguments_class", "parse_train_arguments"]

_TRUE = ("true", "yes", "1", "t", "y")


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    flag = f"--{name}"
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(f"{flag}="):
            return token.split("=", 1)[1]
    return None


def _without_flag(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` without ``--name VALUE`` / ``--name=VALUE``."""
    flag, kept, skip = f"--{name}", [], False
    for token in argv:
        if skip:
            skip = False
        elif token == flag:
            skip = True
        elif not token.startswith(f"{flag}="):
            kept.append(token)
    return kept


def _is_negative_number(token: str) -> bool:
    if not token.startswith("-") or token.startswith("--"):
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


def _attach_negative_numbers(argv: Sequence[str]) -> list[str]:
    """``--flag -1e-3`` -> ``--flag=-1e-3``: argparse takes ``-1e-3`` (not ``-1``) for an option otherwise."""
    joined: list[str] = []
    for token in argv:
        if joined and joined[-1].startswith("--") and "=" not in joined[-1] and _is_negative_number(token):
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def _check_keys(values: dict[str, Any], known: set[str], source: str) -> None:
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; see sage-train --help."
            raise ValueError(f"{source} has the key {key!r}, which is not a sage-train field{hint}")


def _accepts_text(annotation: Any) -> bool:
    """Whether a field annotated so may hold a string (a str, an enum read from its value, or anything untyped)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for arm in typing.get_args(annotation) if union else (annotation,):
        origin = typing.get_origin(arm) or arm
        if origin is str or not isinstance(origin, type) or issubclass(origin, enum.Enum):
            return True  # a str, an enum, or an annotation this check does not judge
    return False


def _check_file_types(values: dict[str, Any], hints: dict[str, Any], source: str) -> None:
    """A quoted value in a file is a string: argparse would convert it silently (``"3e-4"`` -> 0.0003), so a string
    for a field that holds no string is an error, as it is from Python."""
    for key, value in values.items():
        if key in hints and isinstance(value, str) and not _accepts_text(hints[key]):
            raise ValueError(
                f"{source}: {key} is the string {value!r}, but it holds a {getattr(hints[key], '__name__', hints[key])}; "
                "write the value without quotes (e.g. max_steps: 3, learning_rate: 3.0e-4, use_peft: false)."
            )


def algorithm_arguments_class(algorithm: str) -> type | None:
    """A dataclass of the algorithm's own fields, for the command-line parser (None when it declares none).

    Its fields are the algorithm config's own `dataclasses.Field` declarations (help, default, check), resolved to
    runtime types so the parser can convert strings; the values it parses go to ``algorithm_args``.
    """
    from agents import ALGORITHM_CONFIGS

    config_class = ALGORITHM_CONFIGS.get(algorithm)
    own = config_class.own_fields() if config_class is not None else ()
    if not own:
        return None
    hints = typing.get_type_hints(config_class)
    return dataclasses.make_dataclass(
        f"{config_class.__name__}Arguments",
        [(f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata)) for f in own],
    )


def _layers(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(preset values, config-file values, algorithm)`` named by the flags and files, keys not yet checked; the
    preset's values are those for the algorithm (`sage_trl.presets.values_for`)."""
    config_path = _flag_value(argv, "config")
    config_values = read_config_file(config_path, "config") if config_path else {}
    preset = _flag_value(argv, "preset") or config_values.get("preset")
    if preset is None:
        preset = preset_for_model(
            _flag_value(argv, "model_name_or_path") or config_values.get("model_name_or_path", "toy")
        )
    preset_values = load_preset(preset) if preset is not None else {}
    algorithm = (
        _flag_value(argv, "algorithm") or config_values.get("algorithm") or preset_values.get("algorithm")
    ) or "sage_grpo"
    return values_for(preset_values, algorithm), config_values, algorithm


def _mapping(value: Any, source: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]  # not JSON at all: refused below with the same words
    if value is not None and not isinstance(value, dict):
        raise ValueError(
            f'{source} must be a mapping of the algorithm\'s own fields, e.g. {{"stat_buffer_size": 8}}.'
        )
    return dict(value or {})


def _algorithm_args(
    preset_values: dict[str, Any], config_values: dict[str, Any], flag: str | None, own_names: set[str]
) -> dict[str, Any]:
    """The algorithm's own fields from the layers below the own flags: each file's ``algorithm_args`` and own keys,
    then ``--algorithm_args``; the own flags (``--stat_buffer_size 8``) are parsed on top of these."""
    collected: dict[str, Any] = {}
    for values, source in ((preset_values, "the preset's algorithm_args"), (config_values, "algorithm_args")):
        collected.update(_mapping(values.get("algorithm_args"), source))
        collected.update({k: v for k, v in values.items() if k in own_names})
    if flag is not None:
        collected.update(_mapping(flag, "--algorithm_args"))
    return collected


def parse_train_arguments(argv: Sequence[str] | None = None) -> tuple[TrainScriptArguments, Any]:
    """Parse ``sage-train``'s arguments: preset, then ``--config``, then flags (see the module docstring)."""
    from trl import TrlParser

    from sage_trl.config import SageGRPOConfig

    argv = _attach_negative_numbers(sys.argv[1:] if argv is None else argv)
    preset_values, config_values, algorithm = _layers(argv)
    own_class = algorithm_arguments_class(algorithm)
    own_names = {f.name for f in dataclasses.fields(own_class)} if own_class else set()
    if "-h" in argv or "--help" in argv:
        _print_help(algorithm, own_class, {**preset_values, **config_values})
    known = {f.name for f in dataclasses.fields(TrainScriptArguments)} | {
        f.name for f in dataclasses.fields(SageGRPOConfig)
    }
    hints = {**typing.get_type_hints(TrainScriptArguments), **typing.get_type_hints(SageGRPOConfig)}
    hints.update(typing.get_type_hints(own_class) if own_class else {})
    for values, source in (
        (preset_values, "the preset"),
        (config_values, f"config {_flag_value(argv, 'config')}"),
    ):
        _check_keys(values, known | own_names | {"config"}, source)
        _check_file_types(values, hints, source)
    rest = _without_flag(_without_flag(argv, "config"), "algorithm_args")
    algorithm_args = _algorithm_args(
        preset_values, config_values, _flag_value(argv, "algorithm_args"), own_names
    )
    if own_class is not None:
        own_parser = TrlParser(own_class, add_help=False, allow_abbrev=False)
        own_parser.set_defaults_with_config(**{k: v for k, v in algorithm_args.items() if k in own_names})
        own_values, rest = own_parser.parse_args_into_dataclasses(rest, return_remaining_strings=True)
        algorithm_args.update(dataclasses.asdict(own_values))
    parser = TrlParser((TrainScriptArguments, SageGRPOConfig))
    for values in (preset_values, config_values):
        parser.set_defaults_with_config(**{k: v for k, v in values.items() if k in known})
    parser.set_defaults_with_config(algorithm_args=algorithm_args or None)
    if _preflight_requested(argv, config_values):
        # A plan for a GPU is traced on any machine: bf16 must not be refused for lack of one.
        parser.set_defaults_with_config(use_cpu=True)
    script_args, config = parser.parse_args_into_dataclasses(rest)
    return script_args, config


def _print_help(algorithm: str, own_class: type | None, layered: dict[str, Any]) -> None:
    """``--help``: the sections of `sage_trl.cli.help`, with this algorithm's and the files' defaults; exits."""
    from trl import TrlParser

    from sage_trl.cli.help import format_train_help
    from sage_trl.config import SageGRPOConfig

    types = (TrainScriptArguments, SageGRPOConfig, *((own_class,) if own_class else ()))
    parser = TrlParser(types, prog="sage-train")
    print(format_train_help(parser, algorithm, own_class, layered))
    raise SystemExit(0)


def _preflight_requested(argv: Sequence[str], config_values: dict[str, Any]) -> bool:
    """Whether ``--preflight`` is on (a bare flag, ``--preflight true`` / ``=true``, or ``preflight: true``)."""
    for index, token in enumerate(argv):
        if token == "--preflight":
            following = argv[index + 1] if index + 1 < len(argv) else "--"
            return following.startswith("--") or following.lower() in _TRUE
        if token.startswith("--preflight="):
            return token.split("=", 1)[1].lower() in _TRUE
    return config_values.get("preflight") is True
