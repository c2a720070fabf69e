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
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from transformers.utils import logging

from sage_env.rewards.base import reward_name
from sage_trl import _trl_compat
from sage_trl.lora import load_lora_state, save_lora_adapter
from sage_trl.run_folder import RunFolder, layout, load_state, save_state
from sage_trl.run_folder.writes import guarded_write

if TYPE_CHECKING:
    from sage_trl.trainer import SageGRPOTrainer

logger = logging.get_logger(__name__)

__all__ = [
    "load_checkpoint",
    "load_model_weights",
    "load_trainer_state",
    "run_record",
    "save_checkpoint",
    "save_model_files",
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


def run_record(trainer: SageGRPOTrainer) -> dict[str, Any]:
    """The ``run`` block of ``sage_config.json``: what the run trained, on what, with which rewards."""
    return {
        "base_model": {
            "name_or_path": trainer.model_name_or_path,
            "pipeline_class": trainer.pipeline_class,
            "hub_id": _hub_id(trainer.model_name_or_path),
        },
        "rewards": [
            {
                "name": reward_name(fn),
                "source": _reward_source(fn),
                "components": dict(getattr(fn, "component_descriptions", None) or {}),
            }
            for fn in trainer.reward.reward_funcs
        ],
        "reward_weights": trainer.resolved_reward_weights,
        "dataset": trainer.dataset_name,
        "library_version": _library_version(),
    }


def save_model_files(
    trainer: SageGRPOTrainer, output_dir: str, state_dict: dict[str, torch.Tensor] | None
) -> None:
    """Write the adapter (diffusers LoRA format) or the transformer folder, and ``sage_config.json``.

    Main process only: under FSDP, transformers calls this on every process with the state dict it gathered,
    which is full on the main process and empty on the others.
    """
    if not trainer.args.should_save:
        return
    os.makedirs(output_dir, exist_ok=True)
    if trainer.peft_config is not None:
        save_lora_adapter(trainer.backbone, output_dir, state_dict=state_dict)
    else:
        _save_transformer(
            trainer.backbone.transformer, os.path.join(output_dir, layout.TRANSFORMER_FOLDER), state_dict
        )
    config = {**trainer.args.to_dict(), "run": run_record(trainer)}
    Path(output_dir, layout.CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")


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


def _survivor(run_dir: str) -> str:
    latest = RunFolder(run_dir).latest_checkpoint()
    return f"the last good checkpoint is {latest}" if latest else "no earlier checkpoint was written"


def save_checkpoint(trainer: SageGRPOTrainer, trial: Any) -> None:
    """Write ``checkpoint-N`` atomically (see the module docstring); push it if ``hub_strategy`` asks."""
    run_dir = trainer._get_output_dir(trial=trial)
    name = layout.checkpoint_name(trainer.state.global_step)
    final = os.path.join(run_dir, name)
    staging = os.path.join(run_dir, f"{layout.STAGING_PREFIX}-{trainer.state.global_step}")
    if trainer.args.should_save and os.path.exists(staging):
        shutil.rmtree(staging)
    trainer.accelerator.wait_for_everyone()
    trainer.store_flos()
    state = trainer.checkpoint_state()  # on every process: a sharded (FSDP2) anchor is gathered
    with guarded_write(name, staging, survived=_survivor(run_dir), cleanup=Path(staging)):
        trainer.save_model(staging, _internal_call=True)
        _trl_compat.save_trainer_checkpoint_parts(trainer, staging)
        if trainer.args.should_save:
            save_state(state, *_state_files(staging))
        if trainer.accelerator.num_processes > 1:
            os.makedirs(staging, exist_ok=True)
            save_state(trainer.process_state(), *_state_files(staging, trainer.accelerator.process_index))
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        _replace_directory(staging, final)
        if trainer.args.push_to_hub:
            trainer._push_from_checkpoint(final)
        _trl_compat.rotate_checkpoints(trainer, run_dir)
    trainer.accelerator.wait_for_everyone()


def load_model_weights(trainer: SageGRPOTrainer, folder: str | os.PathLike) -> None:
    """Load the adapter (or the full transformer) saved in ``folder`` into the trainer's backbone."""
    if trainer.peft_config is not None:
        load_lora_state(trainer.backbone.transformer, folder)
        return
    transformer = trainer.backbone.transformer
    loaded = type(transformer).from_pretrained(os.path.join(folder, layout.TRANSFORMER_FOLDER))
    # torch's loader of a full state dict: it cuts each tensor into the module's shards when FSDP2 sharded it.
    set_model_state_dict(transformer, loaded.state_dict(), options=StateDictOptions(full_state_dict=True))


def load_checkpoint(trainer: SageGRPOTrainer, checkpoint: str | os.PathLike) -> None:
    """Restore the weights and the trainer's own state from ``checkpoint`` (transformers restores the rest)."""
    load_model_weights(trainer, checkpoint)
    load_trainer_state(trainer, checkpoint)


def load_trainer_state(trainer: SageGRPOTrainer, checkpoint: str | os.PathLike) -> None:
    """Restore the trainer's own state from ``checkpoint``: the shared one (`SageGRPOTrainer.checkpoint_state`),
    then this process's own (`SageGRPOTrainer.process_state`) where the checkpoint has it."""
    device = trainer.accelerator.device
    # A multi-process CPU run's device is "cpu:<rank>", which safetensors refuses.
    device = "cpu" if device.type == "cpu" else device
    trainer.load_checkpoint_state(load_state(*_state_files(checkpoint), device))
    if trainer.accelerator.num_processes == 1:
        return
    own = _state_files(checkpoint, trainer.accelerator.process_index)
    if Path(own[0]).is_file():
        trainer.load_process_state(load_state(*own, device))
    else:
        logger.warning(
            "%s has no state of process %d (it was written by fewer processes): this process resumes with the "
            "main process's buffered rollouts and timestep generator.",
            checkpoint,
            trainer.accelerator.process_index,
        )


def _state_files(folder: str | os.PathLike, process: int | None = None) -> tuple[str, str]:
    """The JSON and safetensors files of the shared state (``process`` None) or of one process's own state."""
    if process is None:
        return os.path.join(folder, layout.STATE_FILE), os.path.join(folder, layout.STATE_TENSORS_FILE)
    stem = os.path.join(folder, layout.PROCESS_STATE_STEM.format(index=process))
    return f"{stem}.json", f"{stem}.safetensors"


def _replace_directory(source: str, target: str) -> None:
    """Move ``source`` to ``target``; an existing ``target`` is removed only after the move is staged."""
    if os.path.exists(target):
        retired = f"{target}.old"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(target, retired)
        os.replace(source, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(source, target)
