"""How `SageGRPOTrainer` saves and restores itself: the final model, atomic checkpoints, state without pickle.

* The model: a LoRA adapter in the diffusers format (``pytorch_lora_weights.safetensors``) or, after full
  fine-tuning, the transformer as a diffusers folder; beside it ``sage_config.json``, the resolved config and
  the run record (base model, reward functions and their resolved weights, dataset).
* A checkpoint adds transformers' optimizer, scheduler, RNG and trainer state, and the trainer's own state
  (algorithm counters, KL controller, moving anchor, reward-failure count, the buffered rollout) as JSON plus
  safetensors (`sage_trl.run_folder.save_state`): resuming a checkpoint never unpickles anything of ours, and
  transformers loads its files with ``weights_only=True``.
* Everything of a checkpoint is written into ``tmp-checkpoint-N`` and renamed to ``checkpoint-N`` at the end,
  so a crash or a full disk mid-write leaves the previous checkpoint as the latest one; a full disk is reported
  in plain words (`sage_trl.run_folder.writes`).

This module holds the file formats and takes what it writes as arguments; it never calls the trainer back. The
order of a save (what is gathered on which process, when to wait, when to push) is the trainer's
(`sage_trl.run_folder_trainer.RunFolderTrainerMixin`).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from sage_env.rewards.base import reward_name
from sage_trl.lora import load_lora_state, save_lora_adapter
from sage_trl.run_folder import RunFolder, layout, load_state, save_state

__all__ = [
    "load_model_weights",
    "read_state",
    "replace_directory",
    "run_record",
    "survivor",
    "write_model_files",
    "write_state",
]


def _library_version() -> str:
    try:
        return importlib.metadata.version("sage-grpo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _hub_id(name_or_path: str | None) -> str | None:
    """The Hub id a run's model came from: the id itself, or the repo of a Hub cache folder; None for the toy or
    a plain local folder (the card then asks for ``base_model``)."""
    if not name_or_path or name_or_path == "toy":
        return None
    match = re.search(r"models--([^/]+)--([^/]+)/snapshots/", str(Path(name_or_path).resolve()))
    if match:
        return f"{match.group(1)}/{match.group(2)}"
    if Path(name_or_path).exists() or name_or_path.count("/") != 1:
        return None
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return None
    return name_or_path


def _reward_source(reward_fn: Any) -> str:
    described = getattr(reward_fn, "reward_model_description", None)
    if isinstance(described, str):
        return described
    kind = reward_fn if callable(reward_fn) and hasattr(reward_fn, "__qualname__") else type(reward_fn)
    return f"{kind.__module__}:{kind.__qualname__}"


def run_record(
    *, model_name_or_path: str | None, pipeline_class: str | None, reward_funcs: list[Any],
    reward_weights: list[float], dataset: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The ``run`` block of ``sage_config.json``: what the run trained, on what, with which rewards."""
    return {
        "base_model": {
            "name_or_path": model_name_or_path,
            "pipeline_class": pipeline_class,
            "hub_id": _hub_id(model_name_or_path),
        },
        "rewards": [
            {
                "name": reward_name(fn),
                "source": _reward_source(fn),
                "components": dict(getattr(fn, "component_descriptions", None) or {}),
            }
            for fn in reward_funcs
        ],
        "reward_weights": reward_weights,
        "dataset": dataset,
        "library_version": _library_version(),
    }


def write_model_files(
    output_dir: str, backbone: Any, *, lora: bool, config: dict[str, Any],
    state_dict: dict[str, torch.Tensor] | None,
) -> None:  # fmt: skip
    """Write the adapter (diffusers LoRA format, ``lora`` True) or the transformer folder of ``backbone``, and
    ``config`` as ``sage_config.json``. ``state_dict``: the weights to write instead of the module's own (the full
    state dict transformers gathered under FSDP)."""
    os.makedirs(output_dir, exist_ok=True)
    parts = backbone.trained_parts()
    weights = list(backbone.lora_files().values()) if lora else [_part_folder(prefix) for prefix in parts]
    RunFolder(output_dir).record(*weights, layout.CONFIG_FILE)
    if lora:
        save_lora_adapter(backbone, output_dir, state_dict=state_dict)
    else:
        for prefix, module in parts.items():
            part_state = _part_state(state_dict, prefix)
            _save_transformer(module, os.path.join(output_dir, _part_folder(prefix)), part_state)
    text = json.dumps(_strict_json(config), indent=2, default=str, allow_nan=False)
    Path(output_dir, layout.CONFIG_FILE).write_text(text + "\n")


def _part_folder(prefix: str) -> str:
    """The folder of a trained part after full fine-tuning: `layout.TRANSFORMER_FOLDER` for the whole transformer,
    else the part's name (Wan 2.2's ``transformer`` and ``transformer_2``: the pipeline's own folders)."""
    return prefix.rstrip(".") or layout.TRANSFORMER_FOLDER


def _part_state(state_dict: dict[str, torch.Tensor] | None, prefix: str) -> dict[str, torch.Tensor] | None:
    """The entries of ``state_dict`` (of the whole trainable module) under ``prefix``, without it."""
    if state_dict is None or not prefix:
        return state_dict
    return {name.removeprefix(prefix): value for name, value in state_dict.items() if name.startswith(prefix)}


def _strict_json(value: Any) -> Any:
    """``value`` with non-finite floats (REINFORCE's ``epsilon: inf``) as strings: JSON has no Infinity or NaN, and
    strict readers (the Hub's, other languages') refuse Python's extension."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    return value


def _save_transformer(
    transformer: torch.nn.Module, folder: str, state_dict: dict[str, torch.Tensor] | None
) -> None:
    """diffusers' ``save_pretrained`` of ``transformer``, with ``state_dict`` as its weights when given.

    diffusers saves the module's own state dict and has no argument for another one; under FSDP2 that one is
    sharded, and the full state dict transformers gathered must be saved instead. It is assigned to an empty
    (meta) instance of the same class built from the same config, without copying, and saved from there.
    """
    if state_dict is not None:
        with torch.device("meta"):
            holder = type(transformer).from_config(transformer.config)
        holder.load_state_dict(state_dict, assign=True)
        transformer = holder
    transformer.save_pretrained(folder)


def survivor(run_dir: str | os.PathLike) -> str:
    """What a failed write leaves the user: the run's latest checkpoint, in words."""
    latest = RunFolder(run_dir).latest_checkpoint()
    return f"the last good checkpoint is {latest}" if latest else "no earlier checkpoint was written"


def load_model_weights(backbone: Any, folder: str | os.PathLike, *, lora: bool) -> None:
    """Load the adapter (``lora`` True) or the full transformer saved in ``folder`` into ``backbone``."""
    if lora:
        load_lora_state(backbone, folder)
        return
    for prefix, module in backbone.trained_parts().items():
        loaded = type(module).from_pretrained(os.path.join(folder, _part_folder(prefix)))
        # torch's loader of a full state dict: it cuts each tensor into the module's shards when FSDP2 sharded it.
        set_model_state_dict(module, loaded.state_dict(), options=StateDictOptions(full_state_dict=True))


def write_state(folder: str | os.PathLike, state: dict[str, Any], process: int | None = None) -> None:
    """Write the trainer's shared state (``process`` None) or one process's own state into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    save_state(state, *_state_files(folder, process))


def read_state(
    folder: str | os.PathLike, device: torch.device | str, process: int | None = None
) -> dict[str, Any] | None:
    """The state `write_state` wrote into ``folder`` (None when that process's files are absent), on ``device``."""
    files = _state_files(folder, process)
    if process is not None and not Path(files[0]).is_file():
        return None
    # A multi-process CPU run's device is "cpu:<rank>", which safetensors refuses.
    return load_state(*files, "cpu" if torch.device(device).type == "cpu" else device)


def _state_files(folder: str | os.PathLike, process: int | None = None) -> tuple[str, str]:
    """The JSON and safetensors files of the shared state (``process`` None) or of one process's own state."""
    if process is None:
        return os.path.join(folder, layout.STATE_FILE), os.path.join(folder, layout.STATE_TENSORS_FILE)
    stem = os.path.join(folder, layout.PROCESS_STATE_STEM.format(index=process))
    return f"{stem}.json", f"{stem}.safetensors"


def replace_directory(source: str, target: str) -> None:
    """Move ``source`` to ``target``; an existing ``target`` is removed only after the move is staged."""
    if os.path.exists(target):
        retired = f"{target}.old"
        RunFolder(os.path.dirname(target)).record(os.path.basename(retired))
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(target, retired)
        os.replace(source, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(source, target)
