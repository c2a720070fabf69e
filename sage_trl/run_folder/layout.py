"""The names of everything a training run writes into its ``output_dir``: declared here once.

The trainer, ``sage-train``, ``sage-push`` and the model card read these names from here; the weights file and
the checkpoint prefix are the clients' own constants (diffusers' LoRA file name, transformers' checkpoint
folders), so a run folder stays loadable by ``pipe.load_lora_weights`` and `transformers.Trainer`.
"""

from __future__ import annotations

import re

from diffusers.loaders.lora_base import LORA_WEIGHT_NAME_SAFE
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from sage_env.backbones.wan import LORA_WEIGHT_NAMES
from sage_env.backbones.wan_experts import EXPERT_NAMES

__all__ = [
    "ALARMS_FILE",
    "CHECKPOINT_PATTERN",
    "COMPLETE_FILE",
    "CONFIG_FILE",
    "EVAL_RESULTS_FILE",
    "EVAL_SAMPLES_FOLDER",
    "EXPERT_2_FOLDER",
    "EXPERT_2_LORA_WEIGHT_NAME",
    "HUB_DRY_RUN_FOLDER",
    "LOCK_FILE",
    "LORA_WEIGHT_NAME",
    "MANIFEST_FILE",
    "METRICS_FILE",
    "PROCESS_STATE_STEM",
    "REWARD_CURVE_GLOB",
    "RUN_CONFIG_FILE",
    "RUN_FILES",
    "SAMPLES_FILE",
    "STAGING_PREFIX",
    "STATE_FILE",
    "STATE_TENSORS_FILE",
    "SUMMARY_FILE",
    "TRAINER_STATE_FILE",
    "TRANSFORMER_FOLDER",
    "checkpoint_name",
    "checkpoint_step",
    "eval_samples_name",
    "eval_samples_step",
    "is_run_entry",
]

LORA_WEIGHT_NAME = LORA_WEIGHT_NAME_SAFE
"""``pytorch_lora_weights.safetensors``: the trained adapter in the diffusers format (``pipe.load_lora_weights``)."""
TRANSFORMER_FOLDER = "transformer"
"""After full fine-tuning: the transformer as a diffusers model folder (``save_pretrained``); with both Wan 2.2 A14B
experts trained, the high-noise one."""
EXPERT_2_LORA_WEIGHT_NAME = LORA_WEIGHT_NAMES["transformer_2"]
"""With both Wan 2.2 A14B experts trained (``expert: both``): the low-noise expert's adapter, loaded with
``pipe.load_lora_weights(folder, weight_name=..., load_into_transformer_2=True)``."""
EXPERT_2_FOLDER = EXPERT_NAMES[1]
"""With both Wan 2.2 A14B experts fully fine-tuned: the low-noise expert's model folder (the pipeline's own)."""
CONFIG_FILE = "sage_config.json"
"""The resolved `SageGRPOConfig` and the run's record (base model, rewards and their weights, dataset)."""
RUN_CONFIG_FILE = "run_config.yaml"
"""``sage-train``'s resolved arguments (training config and script arguments), re-usable with ``--config``."""
METRICS_FILE = "metrics.jsonl"
"""One JSON line per logged optimizer step, each step exactly once (cut back to the checkpoint on resume)."""
ALARMS_FILE = "alarms.jsonl"
"""One JSON line per alarm that fired during training (`sage_trl.alarms`), cut back to the checkpoint on resume."""
COMPLETE_FILE = "training_complete.json"
"""Written last: the run finished (``global_step`` of ``max_steps``); only a complete run can be pushed."""
EVAL_RESULTS_FILE = "eval_results.json"
"""``sage-train``'s held-out evaluation before and after training."""
EVAL_SAMPLES_FOLDER = "eval_samples"
"""The held-out videos of every evaluation during training (``eval_strategy``): one GIF per evaluation, named by
`eval_samples_name`, a row per prompt and a column per seed."""
_EVAL_SAMPLES_PATTERN = re.compile(r"^(\w+)-step-(\d+)\.gif$")
SUMMARY_FILE = "summary.md"
"""The held-out evaluation as a markdown table."""
SAMPLES_FILE = "samples_before_after.gif"
"""Held-out videos before (left) and after (right) training."""
REWARD_CURVE_GLOB = "reward_*.png"
"""One reward curve per component, drawn from the metrics file."""
LOCK_FILE = ".sage-run.lock"
"""Held (``flock``) by the process that trains into the folder; the operating system releases it on exit."""
MANIFEST_FILE = ".sage-run.json"
"""The run folder's manifest: written when a run first claims the folder, it lists every top-level entry this
library wrote there, so that overwriting or restarting deletes those and nothing else (`sage_trl.run_folder.manifest`)."""
STATE_FILE = "sage_state.json"
"""In a checkpoint: the algorithm's counters, the KL controller and the rollout buffer (JSON, no pickle)."""
STATE_TENSORS_FILE = "sage_state.safetensors"
"""In a checkpoint: the tensors of the state (moving anchor, generator states, buffered rollouts)."""
PROCESS_STATE_STEM = "sage_state.process-{index}"
"""In a checkpoint of a multi-process run: ``<stem>.json`` / ``<stem>.safetensors``, process ``index``'s own state
(its buffered rollouts and timestep generator), beside the shared state above."""
TRAINER_STATE_FILE = TRAINER_STATE_NAME
"""In a checkpoint: transformers' ``trainer_state.json`` (global step, log history)."""
STAGING_PREFIX = f"tmp-{PREFIX_CHECKPOINT_DIR}"
"""A checkpoint being written; renamed to ``checkpoint-N`` only once complete (never resumed from)."""
HUB_DRY_RUN_FOLDER = "hub-dry-run"
"""``sage-push --dry-run``'s default upload folder."""
CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
"""``checkpoint-N``: transformers' checkpoint folder names."""

RUN_FILES: tuple[str, ...] = (
    LORA_WEIGHT_NAME,
    TRANSFORMER_FOLDER,
    EXPERT_2_LORA_WEIGHT_NAME,
    EXPERT_2_FOLDER,
    CONFIG_FILE,
    RUN_CONFIG_FILE,
    METRICS_FILE,
    ALARMS_FILE,
    COMPLETE_FILE,
    EVAL_RESULTS_FILE,
    SUMMARY_FILE,
    SAMPLES_FILE,
    EVAL_SAMPLES_FOLDER,
    TRAINER_STATE_FILE,
    HUB_DRY_RUN_FOLDER,
)
"""Top-level names a run writes (besides checkpoints, staging folders and reward curves)."""


def checkpoint_name(step: int) -> str:
    """``checkpoint-<step>``."""
    return f"{PREFIX_CHECKPOINT_DIR}-{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a ``checkpoint-N`` folder name, None for any other name."""
    match = CHECKPOINT_PATTERN.match(name)
    return int(match.group(1)) if match else None


def eval_samples_name(prefix: str, step: int) -> str:
    """``eval-step-000040.gif``: the videos of the evaluation logged with ``prefix`` at ``step``."""
    return f"{prefix}-step-{step:06d}.gif"


def eval_samples_step(name: str) -> int | None:
    """The step of an `eval_samples_name`, None for any other name."""
    match = _EVAL_SAMPLES_PATTERN.match(name)
    return int(match.group(2)) if match else None


def is_run_entry(name: str) -> bool:
    """True for a name the library may write into a run folder (what it did write is the manifest's record)."""
    return (
        name in RUN_FILES
        or checkpoint_step(name) is not None
        or name.startswith(STAGING_PREFIX)
        or (name.startswith("reward_") and name.endswith(".png"))
    )
