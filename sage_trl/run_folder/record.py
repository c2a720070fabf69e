"""`RunRecord`: what a run folder (or one of its checkpoints) says about its run, read without loading a model.

The record is what the model card and ``sage-push`` are built from: the resolved config and the ``run`` block the
trainer writes beside it in ``sage_config.json`` (the base model it loaded, the reward functions and the weights
they entered the total with, the dataset), the adapter's ``LoraConfig`` from the weights file's own metadata,
the metrics, the held-out evaluation and the completion record. Nothing is guessed from names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import safe_open

from sage_trl.alarms import Alarm, read_alarms
from sage_trl.run_folder import layout
from sage_trl.run_folder.folder import RunFolder, RunFolderError

__all__ = ["LORA_PREFIX", "RunRecord", "check_inside", "read_run"]

LORA_PREFIX = "transformer"
"""Key prefix of the transformer's weights in a diffusers LoRA file (``transformer.<module>.lora_A.weight``)."""


@dataclass
class RunRecord:
    """What a training output folder (or a ``checkpoint-N`` folder) says about its run.

    Args:
        directory: the folder.
        config: the resolved `SageGRPOConfig` as saved in ``sage_config.json`` (without its ``run`` block).
        run: the ``run`` block: ``base_model`` (``name_or_path``, ``pipeline_class``, ``hub_id``), ``rewards``
            (name, source and components of each reward function), ``reward_weights`` (as the trainer resolved
            them), ``dataset``. Empty for folders written by other tools.
        lora_config: the adapter's ``LoraConfig`` as a dict (LoRA runs), read from the weights file's metadata.
        transformer_class: the diffusers class of the fully fine-tuned transformer (full fine-tuning runs).
        eval_results: ``eval_results.json`` (``before``/``after`` means on held-out prompts), when written.
        metrics: the logged records (``metrics.jsonl``, else ``trainer_state.json``'s log history).
        summary: ``summary.md``, when written.
        curves: file names of the reward curve images.
        samples: file name of the before/after sample GIF, when written.
        global_step: optimizer steps trained, when known.
        max_steps: the planned number of optimizer steps, when known.
        complete: the run ended and saved its model (``training_complete.json``; `completion` says how).
        completion: ``training_complete.json``'s record (``status`` ``finished`` or ``stopped_on_alarm``,
            ``train_runtime``, ...), when written.
        alarms: the alarms that fired during training (``alarms.jsonl``, `sage_trl.alarms`).
        second_expert: both Wan 2.2 A14B experts trained (``expert: both``): the low-noise expert's adapter
            (`layout.EXPERT_2_LORA_WEIGHT_NAME`) or model folder (`layout.EXPERT_2_FOLDER`) is there too.
    """

    directory: Path
    config: dict[str, Any]
    run: dict[str, Any] = field(default_factory=dict)
    lora_config: dict[str, Any] | None = None
    transformer_class: str | None = None
    eval_results: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None
    curves: list[str] = field(default_factory=list)
    samples: str | None = None
    global_step: int | None = None
    max_steps: int | None = None
    complete: bool = False
    second_expert: bool = False
    completion: dict[str, Any] | None = None
    alarms: list[Alarm] = field(default_factory=list)

    @property
    def is_lora(self) -> bool:
        """True for a LoRA adapter, False for a fully fine-tuned transformer."""
        return self.lora_config is not None

    @property
    def base_model(self) -> dict[str, Any]:
        """``{name_or_path, pipeline_class, hub_id}`` of the model the run trained (empty when unrecorded)."""
        return dict(self.run.get("base_model") or {})


def check_inside(directory: Path, path: Path) -> Path:
    """``path`` if it is a regular file or folder inside ``directory`` reached without a symbolic link; a
    `RunFolderError` otherwise. What is read from a run folder for a model card, or uploaded, stays inside it: a
    ``summary.md`` that links to a token file must not publish the token."""
    relative = path.relative_to(directory)
    for depth in range(1, len(relative.parts) + 1):
        part = directory.joinpath(*relative.parts[:depth])
        if part.is_symlink():
            raise RunFolderError(
                f"{part} is a symbolic link (to {os.readlink(part)}); a run folder is read and uploaded only as the "
                "regular files inside it. Replace the link by a copy of the file, or delete it."
            )
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise RunFolderError(
            f"{path} is not a regular file; a run folder holds regular files and folders only."
        )
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RunFolderError(
            f"{path} is not valid JSON ({error}); was the run interrupted while writing it?"
        ) from error


def lora_config_from_weights(path: Path) -> dict[str, Any]:
    """The ``LoraConfig`` dict diffusers stores in the safetensors header (``lora_adapter_metadata``)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            header, keys = handle.metadata() or {}, list(handle.keys())
    except Exception as error:  # safetensors raises its own error types for a truncated or foreign file
        raise RunFolderError(f"{path} is not a readable safetensors file ({error}).") from error
    if not keys or not all(key.startswith(f"{LORA_PREFIX}.") for key in keys):
        raise RunFolderError(
            f"{path} holds no diffusers-format LoRA weights (keys prefixed '{LORA_PREFIX}.')."
        )
    raw = header.get("lora_adapter_metadata")
    if not raw:
        raise RunFolderError(
            f"{path} has no LoRA metadata (rank, alpha, target modules), so it would not reload exactly; save it "
            "with sage_trl.lora.save_lora_adapter (SageGRPOTrainer.save_model does)."
        )
    packed = json.loads(raw)
    return {key.removeprefix(f"{LORA_PREFIX}."): value for key, value in packed.items()}


def _transformer_class(folder: Path) -> str:
    config_path = folder / "config.json"
    if not config_path.is_file() or not any(folder.glob("*.safetensors")):
        raise RunFolderError(
            f"{folder} is not a diffusers model folder (config.json and *.safetensors weights)."
        )
    return str(_read_json(config_path).get("_class_name", "AutoModel"))


def _read_metrics(directory: Path) -> list[dict[str, Any]]:
    records = RunFolder(directory).read_metrics()
    if records:
        return records
    state_path = directory / layout.TRAINER_STATE_FILE
    return list(_read_json(state_path).get("log_history", [])) if state_path.is_file() else []


def _training_progress(directory: Path, metrics: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """``(global_step, max_steps)`` from the completion record, the trainer state or the last logged step."""
    for name in (layout.COMPLETE_FILE, layout.TRAINER_STATE_FILE):
        if (directory / name).is_file():
            state = _read_json(directory / name)
            return state.get("global_step"), state.get("max_steps")
    steps = [record["step"] for record in metrics if isinstance(record.get("step"), int)]
    return (max(steps) if steps else None), None


def _check_weights(directory: Path) -> tuple[Path, Path]:
    weights, transformer = directory / layout.LORA_WEIGHT_NAME, directory / layout.TRANSFORMER_FOLDER
    if not weights.is_file() and not transformer.is_dir():
        raise RunFolderError(
            f"{directory} holds no trained model ({layout.LORA_WEIGHT_NAME} or {layout.TRANSFORMER_FOLDER}/): did "
            "training fail before saving? Nothing is pushed without trained weights."
        )
    if weights.is_file() and transformer.is_dir():
        raise RunFolderError(
            f"{directory} holds both {layout.LORA_WEIGHT_NAME} and {layout.TRANSFORMER_FOLDER}/; keep the one to "
            "push."
        )
    if not (directory / layout.CONFIG_FILE).is_file():
        raise RunFolderError(
            f"{directory} has no {layout.CONFIG_FILE}; it was not written by SageGRPOTrainer."
        )
    return weights, transformer


def read_run(directory: str | os.PathLike) -> RunRecord:
    """Read a training output folder (or a checkpoint folder) written by `SageGRPOTrainer` / ``sage-train``.

    Raises `RunFolderError` when the folder has no trained weights, no ``sage_config.json``, or both a LoRA file
    and a ``transformer/`` folder (which one would be meant is then unknowable).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise RunFolderError(f"{directory} is not a folder; pass the output_dir of a training run.")
    for entry in directory.iterdir():
        # what a card reads or a push sends
        if entry.name in layout.RUN_FILES or entry.match(layout.REWARD_CURVE_GLOB):
            check_inside(directory, entry)
    weights, transformer = _check_weights(directory)
    config = dict(_read_json(directory / layout.CONFIG_FILE))
    run = config.pop("run", None) or {}
    metrics = _read_metrics(directory)
    global_step, max_steps = _training_progress(directory, metrics)
    eval_path, summary_path = directory / layout.EVAL_RESULTS_FILE, directory / layout.SUMMARY_FILE
    return RunRecord(
        directory=directory,
        config=config,
        run=run,
        lora_config=lora_config_from_weights(weights) if weights.is_file() else None,
        second_expert=(directory / layout.EXPERT_2_LORA_WEIGHT_NAME).is_file()
        or (directory / layout.EXPERT_2_FOLDER).is_dir(),
        transformer_class=_transformer_class(transformer) if transformer.is_dir() else None,
        eval_results=_read_json(eval_path) if eval_path.is_file() else None,
        metrics=metrics,
        summary=summary_path.read_text() if summary_path.is_file() else None,
        curves=sorted(
            (p.name for p in directory.glob(layout.REWARD_CURVE_GLOB)),
            key=lambda n: (n != "reward_total.png", n),
        ),
        samples=layout.SAMPLES_FILE if (directory / layout.SAMPLES_FILE).is_file() else None,
        global_step=global_step,
        max_steps=max_steps,
        complete=(directory / layout.COMPLETE_FILE).is_file(),
        completion=RunFolder(directory).completion(),
        alarms=read_alarms(directory / layout.ALARMS_FILE),
    )
