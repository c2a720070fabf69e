"""Presets: shipped YAML configurations applied first, with the user's YAML and flags on top.

A preset holds fields of `sage_trl.SageGRPOConfig` and `sage_trl.cli.TrainScriptArguments`. ``sage-train``
applies the preset named by ``--preset`` (or, when none is named, the model's own preset: the toy world's for
``model_name_or_path: toy``), then the ``--config`` file, then the command-line flags. The Python API does the
same with ``SageGRPOConfig.from_preset(name, **overrides)``.

A preset may hold a ``per_algorithm`` section, ``{algorithm: {field: value}}``: values applied only when that
algorithm runs, on top of the preset's other keys and under the ``--config`` file and the flags (`values_for`). The
toy preset tunes SAGE-GRPO's KL coefficient so; ``sage-train --algorithm flow_grpo`` keeps flow_grpo's own.

Shipped: ``toy`` (SAGE-GRPO with LoRA on the built-in toy world, minutes on a CPU).
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path
from typing import Any

from agents.registry import list_agents
from sage_trl.config_files import read_config_file

__all__ = [
    "MODEL_PRESETS",
    "PER_ALGORITHM",
    "algorithm_values",
    "list_presets",
    "load_preset",
    "preset_for_model",
    "values_for",
]

MODEL_PRESETS: dict[str, str] = {"toy": "toy"}
"""``model_name_or_path`` -> the preset applied when none is named."""
PER_ALGORITHM = "per_algorithm"
"""The preset key of the values that apply only when a given algorithm runs: ``{algorithm: {field: value}}``."""


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(
        Path(str(entry)).stem for entry in files(__name__).iterdir() if str(entry).endswith(".yaml")
    )


def load_preset(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The values of a shipped preset (by name) or of a YAML file (by path)."""
    text = os.fspath(name_or_path)
    if text in list_presets():
        return read_config_file(Path(str(files(__name__).joinpath(f"{text}.yaml"))), "the preset")
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return read_config_file(path, "the preset file")
    raise ValueError(
        f"preset: {text!r} is neither a shipped preset ({', '.join(list_presets())}) nor an existing YAML file."
    )


def preset_for_model(model_name_or_path: str | None) -> str | None:
    """The preset a model brings (applied when no preset is named), or None."""
    return MODEL_PRESETS.get(str(model_name_or_path)) if model_name_or_path is not None else None


def algorithm_values(preset_values: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """The preset's `PER_ALGORITHM` entry for ``algorithm`` (empty when it has none). A section that is not a mapping
    of registered algorithms to mappings is an error naming the fix."""
    section = preset_values.get(PER_ALGORITHM) or {}
    if not isinstance(section, dict) or not all(isinstance(entry, dict) for entry in section.values()):
        raise ValueError(
            f"the preset's {PER_ALGORITHM} must map algorithm names to mappings of fields, e.g. "
            f"{PER_ALGORITHM}: {{sage_grpo: {{beta: 2.0}}}}."
        )
    unknown = sorted(set(section) - set(list_agents()))
    if unknown:
        raise ValueError(
            f"the preset's {PER_ALGORITHM} names {unknown}, which are not registered algorithms "
            f"({', '.join(list_agents())}); fix the name or install the algorithm's package."
        )
    return dict(section.get(algorithm, {}))


def values_for(preset_values: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """A preset's values for a run of ``algorithm``: its keys, with its `algorithm_values` on top and the
    `PER_ALGORITHM` section itself left out."""
    common = {key: value for key, value in preset_values.items() if key != PER_ALGORITHM}
    return {**common, **algorithm_values(preset_values, algorithm)}
