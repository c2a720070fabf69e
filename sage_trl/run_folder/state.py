"""Checkpoint state without pickle: the structure in JSON, the tensors in safetensors.

A checkpoint is the user's data and may travel through the Hub (``hub_strategy="checkpoint"``): loading it must
never run code. `save_state` writes a nested structure of dicts, lists, tuples, strings, numbers, booleans, None
and tensors as ``<name>.json`` (tensors replaced by references) plus ``<name>.safetensors`` (the tensors);
`load_state` reads them back. Neither format can carry executable objects.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

__all__ = ["StateFormatError", "load_state", "save_state"]

_TENSOR_KEY = "__tensor__"
_FLOAT_KEY = "__float__"


class StateFormatError(ValueError):
    """A state file is missing, truncated, or not of this format."""


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous().clone()
        return {_TENSOR_KEY: path}
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"State at {path or '<root>'} has non-string keys; only str keys can be saved.")
        return {key: _encode(item, f"{path}.{key}" if path else key, tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(item, f"{path}.{index}", tensors) for index, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_KEY: repr(value)}  # JSON has no NaN/inf
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"State at {path or '<root>'} is a {type(value).__name__}; only tensors, numbers, strings, lists and "
        "dicts are saved (no pickle)."
    )


def _decode(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR_KEY}:
            return tensors[value[_TENSOR_KEY]]
        if set(value) == {_FLOAT_KEY}:
            return float(value[_FLOAT_KEY])
        return {key: _decode(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item, tensors) for item in value]
    return value


def save_state(state: Mapping[str, Any], json_path: str | os.PathLike, tensors_path: str | os.PathLike) -> None:
    """Write ``state`` as JSON (structure) plus safetensors (tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(state, "", tensors)
    save_file(tensors, str(tensors_path))
    Path(json_path).write_text(json.dumps(encoded, indent=1) + "\n")


def load_state(
    json_path: str | os.PathLike, tensors_path: str | os.PathLike, device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Read what `save_state` wrote; tensors land on ``device``. Raises `StateFormatError` on a broken file."""
    json_path, tensors_path = Path(json_path), Path(tensors_path)
    for path in (json_path, tensors_path):
        if not path.is_file():
            raise StateFormatError(f"{path} is missing: the checkpoint is incomplete or not SageGRPOTrainer's.")
    try:
        structure = json.loads(json_path.read_text())
        tensors = load_file(str(tensors_path), device=str(device))
        return _decode(structure, tensors)
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, KeyError) as error:
        raise StateFormatError(
            f"The checkpoint state {json_path.name} / {tensors_path.name} in {json_path.parent} is damaged or not "
            f"SageGRPOTrainer's ({type(error).__name__}: {error}); resume from another checkpoint."
        ) from error
