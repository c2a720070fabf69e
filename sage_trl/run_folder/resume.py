"""Whether a checkpoint fits the command that resumes it, decided from its files before anything is loaded.

A checkpoint holds more than weights: the buffered rollout (latents of a given video size, steps and SDE), the
sampler's position (batch sizes, seed), the KL strategy's anchor and the algorithm's own state. Resuming it with
another algorithm, model, adapter shape or rollout settings would fail late (a size mismatch after the model
loaded) or, worse, train on silently inconsistent state. `check_resume` compares the checkpoint's recorded
config (its ``sage_config.json``) and adapter (the LoRA file's own metadata) with the command's, and names every
difference and the way on. Fields that may change on resume (``max_steps``, the learning rate, logging and saving)
are not compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sage_trl.run_folder import layout
from sage_trl.run_folder.folder import RunFolderError, _read_json
from sage_trl.run_folder.record import lora_config_from_weights

__all__ = ["RESUME_FIXED_FIELDS", "check_resume"]

RESUME_FIXED_FIELDS = (
    "algorithm",
    "model_name_or_path",
    "backbone",
    "num_generations",
    "per_device_train_batch_size",
    "steps_per_generation",
    "gradient_accumulation_steps",
    "num_iterations",
    "timestep_fraction",
    "num_frames",
    "height",
    "width",
    "num_inference_steps",
    "shift",
    "sde",
    "eta",
    "sde_window",
    "log_prob_kind",
    "guidance_scale",
    "kl_strategy",
    "seed",
)
"""Config fields a resumed run must share with its checkpoint: the algorithm and its state, the model, the buffered
rollout's video size and SDE, the batch layout, the passes over each rollout and the share of steps trained, and
the seed (a resume continues the same prompts, noise and timestep draws). Every other field may change on resume;
the rewards and prompts are the command's (docs/runs.md)."""


def _comparable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _config_differences(saved: dict[str, Any], config: Any) -> list[str]:
    differences = []
    for name in RESUME_FIXED_FIELDS:
        current = getattr(config, name, None)
        if name not in saved or current is None:
            continue
        if _comparable(current) != saved[name]:
            differences.append(
                f"{name} is {saved[name]!r} in the checkpoint but {_comparable(current)!r} now"
            )
    return differences


def _adapter_differences(checkpoint: Path, peft_config: Any) -> list[str]:
    lora_file = checkpoint / layout.LORA_WEIGHT_NAME
    if not lora_file.is_file():
        return (
            ["the checkpoint is a full fine-tuning run (use_peft false) but LoRA is on now"]
            if peft_config
            else []
        )
    if peft_config is None:
        return ["the checkpoint trained a LoRA adapter (use_peft true) but use_peft is false now"]
    saved = lora_config_from_weights(lora_file)
    differences = [
        f"{name} is {saved.get(name)!r} in the checkpoint but {getattr(peft_config, name)!r} now"
        for name in ("r", "lora_alpha")
        if saved.get(name) is not None and saved.get(name) != getattr(peft_config, name)
    ]
    targets = getattr(peft_config, "target_modules", None)
    if targets and saved.get("target_modules") and set(targets) != set(saved["target_modules"]):
        differences.append(
            f"lora_target_modules are {sorted(saved['target_modules'])} in the checkpoint but {sorted(targets)} now"
        )
    return differences


def check_resume(checkpoint: str | Path, config: Any, peft_config: Any) -> None:
    """Raise `RunFolderError` naming every way ``checkpoint`` does not fit ``config`` and ``peft_config`` (None: full
    fine-tuning); reads two small files, loads no model, changes nothing."""
    checkpoint = Path(checkpoint)
    config_path = checkpoint / layout.CONFIG_FILE
    if not config_path.is_file():
        raise RunFolderError(
            f"{checkpoint} has no {layout.CONFIG_FILE}: it is not a complete SageGRPOTrainer checkpoint."
        )
    saved = _read_json(config_path)
    differences = _config_differences(saved, config) + _adapter_differences(checkpoint, peft_config)
    if differences:
        raise RunFolderError(
            f"{checkpoint} cannot be resumed by this command: {'; '.join(differences)}. Resume with the checkpoint's "
            "settings (its run folder's run_config.yaml works with --config), or start a new run in another "
            "--output_dir."
        )
