"""Publish trained video adapters to the Hugging Face Hub: the upload folder, its model card, pushes, `sage-push`.

What is uploaded is assembled from an allow-list, never by uploading the output folder as is:

* the weights: ``pytorch_lora_weights.safetensors`` (diffusers LoRA format, what ``pipe.load_lora_weights(repo_id)``
  loads) or, after full fine-tuning, the diffusers ``transformer/`` folder;
* ``sage_adapter.json``: the adapter's ``LoraConfig`` (rank, alpha, target modules) and how to load it. It is not
  named ``adapter_config.json`` on purpose: that name makes loaders treat the folder as a peft checkpoint;
* ``sage_config.json`` (the resolved `SageGRPOConfig`), ``metrics.jsonl``, ``eval_results.json``, ``summary.md``,
  the reward curves ``reward_*.png`` and ``samples_before_after.gif`` when the run wrote them;
* ``README.md``: the model card, rendered from ``sage_trl/templates/model_card.md``.

Checkpoints (``checkpoint-*/``), optimizer and RNG state are never part of it. Pushing checks the environment first
(offline mode, token, a reachable endpoint) so that each problem is one clear `HubPushError` in seconds, instead of
huggingface_hub's retries (about 20 s) or an HTTP client without timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import CommitInfo, HfApi, ModelCard, ModelCardData, constants, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers, get_session, validate_repo_id
from safetensors import safe_open

from sage_env.rewards import REWARD_PRESETS
from sage_trl.lora import LORA_WEIGHT_NAME

if TYPE_CHECKING:
    from transformers import TrainingArguments

__all__ = [
    "ADAPTER_INFO_FILE",
    "TRAINING_COMPLETE_FILE",
    "HubPushError",
    "RunRecord",
    "build_upload_folder",
    "check_output_dir",
    "connect_to_hub",
    "init_hub_repo",
    "mark_training_complete",
    "prepare_hub_repo",
    "push_checkpoint",
    "push_main",
    "push_output_dir",
    "push_training_output",
    "read_run",
    "render_model_card",
    "resolve_base_model",
]

logger = logging.getLogger(__name__)

ADAPTER_INFO_FILE = "sage_adapter.json"
TRAINING_COMPLETE_FILE = "training_complete.json"
CONFIG_FILE = (
    "sage_config.json"  # the name `sage_trl.trainer` writes (not imported: the trainer imports this module)
)
METRICS_FILE = "metrics.jsonl"
EVAL_RESULTS_FILE = "eval_results.json"
SUMMARY_FILE = "summary.md"
SAMPLES_FILE = "samples_before_after.gif"
TRAINER_STATE_FILE = "trainer_state.json"
TRANSFORMER_FOLDER = "transformer"
README_FILE = "README.md"
TEMPLATE_FILE = "model_card.md"
LORA_PREFIX = "transformer"
DEFAULT_COMMIT_MESSAGE = "Upload SAGE-GRPO video model"

CITATION = """@article{zheng2026sagegrpo,
  title   = {Manifold-Aware Exploration for Reinforcement Learning in Video Generation},
  author  = {Zheng, Mingzhe and Kong, Weijie and Wu, Yue and Jiang, Dengyang and Ma, Yue and He, Xuanhua and Lin, Bin and Gong, Kaixiong and Zhong, Zhao and Bo, Liefeng and Chen, Qifeng and Yang, Harry},
  journal = {arXiv preprint arXiv:2603.21872},
  year    = {2026}
}"""

_ALGORITHM_NAMES = {
    "sage_grpo": ("SAGE-GRPO", "manifold-aware SDE, temporal gradient equalizer, dual moving KL"),
    "flow_grpo": ("Flow-GRPO", "the Flow-GRPO baseline"),
    "dance_grpo": ("DanceGRPO", "the DanceGRPO baseline"),
    "cps": ("CPS", "coefficients-preserving sampling"),
    "ddpo": ("DDPO", None),
    "reinforce": ("REINFORCE", None),
}
_SDE_NOTES = {
    "sage": "manifold-aware variance, Eq. 5-7 of the paper",
    "flow_grpo": "Flow-GRPO's variance",
    "dance_grpo": "DanceGRPO's variance",
    "cps": "coefficients-preserving",
    "ode": "deterministic",
}
_VIDEOALIGN_COMPONENTS = {"vq": "visual quality", "mq": "motion quality", "ta": "text alignment"}
_PIPELINE_LOADERS = {"WanPipeline": "wan", "HunyuanVideo15Pipeline": "hunyuan", "toy": "toy"}
_EXAMPLE_PROMPT = "A cat walks on the grass, realistic style."
_LICENSE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}


class HubPushError(RuntimeError):
    """A push cannot happen: offline mode, no or a rejected token, an unreachable endpoint, a Hub refusal.

    The message says what went wrong and what to do; nothing was uploaded when it is raised before the commit.
    """


# ------------------------------------------------------------------------------------------------
# What a run's output folder holds
# ------------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """What a training output folder (or a ``checkpoint-N`` folder) says about its run.

    Args:
        directory: the folder.
        config: the resolved `SageGRPOConfig` as saved in ``sage_config.json``.
        lora_config: the adapter's ``LoraConfig`` as a dict (LoRA runs), read from the weights file's metadata.
        transformer_class: the diffusers class of the fully fine-tuned transformer (full fine-tuning runs).
        eval_results: ``eval_results.json`` (``before``/``after`` means on held-out prompts), when written.
        metrics: the logged records (``metrics.jsonl``, else ``trainer_state.json``'s log history).
        summary: ``summary.md``, when written.
        curves: file names of the reward curve images.
        samples: file name of the before/after sample GIF, when written.
        global_step: optimizer steps trained, when known.
        max_steps: the planned number of optimizer steps, when known.
    """

    directory: Path
    config: dict[str, Any]
    lora_config: dict[str, Any] | None = None
    transformer_class: str | None = None
    eval_results: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None
    curves: list[str] = field(default_factory=list)
    samples: str | None = None
    global_step: int | None = None
    max_steps: int | None = None

    @property
    def is_lora(self) -> bool:
        """True for a LoRA adapter, False for a fully fine-tuned transformer."""
        return self.lora_config is not None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}); was the run interrupted while writing it?"
        ) from error


def _lora_config_from_weights(path: Path) -> dict[str, Any]:
    """The ``LoraConfig`` dict diffusers stores in the safetensors header (``lora_adapter_metadata``)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            header, keys = handle.metadata() or {}, list(handle.keys())
    except Exception as error:  # safetensors raises its own error types for a truncated or foreign file
        raise ValueError(f"{path} is not a readable safetensors file ({error}).") from error
    if not keys or not all(key.startswith(f"{LORA_PREFIX}.") for key in keys):
        raise ValueError(f"{path} holds no diffusers-format LoRA weights (keys prefixed '{LORA_PREFIX}.').")
    raw = header.get("lora_adapter_metadata")
    if not raw:
        raise ValueError(
            f"{path} has no LoRA metadata (rank, alpha, target modules), so it would not reload exactly; save it "
            "with sage_trl.lora.save_lora_adapter (SageGRPOTrainer.save_model does)."
        )
    packed = json.loads(raw)
    return {key.removeprefix(f"{LORA_PREFIX}."): value for key, value in packed.items()}


def _transformer_class(folder: Path) -> str:
    config_path = folder / "config.json"
    if not config_path.is_file() or not any(folder.glob("*.safetensors")):
        raise ValueError(f"{folder} is not a diffusers model folder (config.json and *.safetensors weights).")
    return str(_read_json(config_path).get("_class_name", "AutoModel"))


def _read_metrics(directory: Path) -> list[dict[str, Any]]:
    metrics_path = directory / METRICS_FILE
    if metrics_path.is_file():
        return [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    state_path = directory / TRAINER_STATE_FILE
    if state_path.is_file():
        return list(_read_json(state_path).get("log_history", []))
    return []


def _training_progress(directory: Path, metrics: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """``(global_step, max_steps)`` from the completion marker, the trainer state or the last logged step."""
    for name in (TRAINING_COMPLETE_FILE, TRAINER_STATE_FILE):
        if (directory / name).is_file():
            state = _read_json(directory / name)
            return state.get("global_step"), state.get("max_steps")
    steps = [record["step"] for record in metrics if isinstance(record.get("step"), int)]
    return (max(steps) if steps else None), None


def read_run(directory: str | os.PathLike) -> RunRecord:
    """Read a training output folder (or a checkpoint folder) written by `SageGRPOTrainer` / ``sage-train``.

    Raises ``ValueError`` when the folder has no trained weights, no ``sage_config.json``, or both a LoRA file
    and a ``transformer/`` folder (which one would be meant is then unknowable).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a folder; pass the output_dir of a training run.")
    weights, transformer = directory / LORA_WEIGHT_NAME, directory / TRANSFORMER_FOLDER
    if not weights.is_file() and not transformer.is_dir():
        raise ValueError(
            f"{directory} holds no trained model ({LORA_WEIGHT_NAME} or {TRANSFORMER_FOLDER}/): did training fail "
            "before saving? Nothing is pushed without trained weights."
        )
    if weights.is_file() and transformer.is_dir():
        raise ValueError(
            f"{directory} holds both {LORA_WEIGHT_NAME} and {TRANSFORMER_FOLDER}/; keep the one to push."
        )
    if not (directory / CONFIG_FILE).is_file():
        raise ValueError(f"{directory} has no {CONFIG_FILE}; it was not written by SageGRPOTrainer.")
    metrics = _read_metrics(directory)
    global_step, max_steps = _training_progress(directory, metrics)
    eval_path, summary_path = directory / EVAL_RESULTS_FILE, directory / SUMMARY_FILE
    return RunRecord(
        directory=directory,
        config=_read_json(directory / CONFIG_FILE),
        lora_config=_lora_config_from_weights(weights) if weights.is_file() else None,
        transformer_class=_transformer_class(transformer) if transformer.is_dir() else None,
        eval_results=_read_json(eval_path) if eval_path.is_file() else None,
        metrics=metrics,
        summary=summary_path.read_text() if summary_path.is_file() else None,
        curves=sorted(
            (p.name for p in directory.glob("reward_*.png")), key=lambda n: (n != "reward_total.png", n)
        ),
        samples=SAMPLES_FILE if (directory / SAMPLES_FILE).is_file() else None,
        global_step=global_step,
        max_steps=max_steps,
    )


def mark_training_complete(
    output_dir: str | os.PathLike, global_step: int, max_steps: int | None = None
) -> Path:
    """Write ``training_complete.json``: the marker that a run finished and its ``output_dir`` may be pushed.

    Call it on the main process after the final ``save_model`` (``sage-train`` also accepts ``eval_results.json``,
    written after the final evaluation, as the marker).
    """
    path = Path(output_dir) / TRAINING_COMPLETE_FILE
    path.write_text(json.dumps({"global_step": int(global_step), "max_steps": max_steps}, indent=2) + "\n")
    return path


def check_output_dir(output_dir: str | os.PathLike) -> RunRecord:
    """Refuse a folder whose training did not finish: trained weights, the config and a completion marker
    (``training_complete.json`` or ``eval_results.json``) must all be there. Returns the run's record."""
    run = read_run(output_dir)
    if not any((run.directory / name).is_file() for name in (TRAINING_COMPLETE_FILE, EVAL_RESULTS_FILE)):
        raise ValueError(
            f"{run.directory} has weights but neither {TRAINING_COMPLETE_FILE} nor {EVAL_RESULTS_FILE}: the run did "
            "not finish, so nothing is pushed. If you saved this folder yourself after a successful "
            "trainer.train(), call sage_trl.hub.mark_training_complete(output_dir, trainer.state.global_step) first."
        )
    return run


# ------------------------------------------------------------------------------------------------
# Model card
# ------------------------------------------------------------------------------------------------


def _is_hub_id(name: str) -> bool:
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def resolve_base_model(config: dict[str, Any], base_model: str | None = None) -> str | None:
    """The Hub id of the base model for the card's ``base_model`` metadata, or None when there is none.

    ``base_model`` wins when given. Otherwise ``model_name_or_path`` is used when it is a Hub id. The built-in toy
    world (``"toy"``) ships inside the package and has no Hub repository, and a local folder does not say which Hub
    model it was copied from: both give None (the card then explains the base model in words, and no ``base_model``
    metadata is written, because the Hub only accepts ids of existing models there).
    """
    if base_model is not None:
        if not _is_hub_id(base_model):
            raise ValueError(
                f"base_model must be a Hub model id like 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers', got {base_model!r}."
            )
        return base_model
    name = str(config.get("model_name_or_path") or "")
    if name == "toy":
        return None
    if _is_hub_id(name) and not Path(name).is_dir():
        return name
    logger.warning(
        "model_name_or_path %r is not a Hub id: pass base_model to name the base model on the card.", name
    )
    return None


def _pipeline_class(config: dict[str, Any], pipeline_class: str | None) -> str | None:
    """The diffusers pipeline class the adapter is for: explicit, the config's ``backbone``, the local folder's
    ``model_index.json``, or guessed from the model name."""
    if pipeline_class or config.get("backbone"):
        return pipeline_class or config["backbone"]
    name = str(config.get("model_name_or_path") or "")
    if name == "toy":
        return "toy"
    index = Path(name) / "model_index.json"
    if index.is_file():
        return _read_json(index).get("_class_name")
    lowered = name.lower()
    if "hunyuan" in lowered:
        return "HunyuanVideo15Pipeline"
    return "WanPipeline" if "wan" in lowered else None


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format_value(item) for item in value) if value else "none"
    return "none" if value is None else str(value)


_HYPERPARAMETERS = (
    ("algorithm", "algorithm"),
    ("SDE", "sde"),
    ("eta (exploration scale)", "eta"),
    ("denoising steps", "num_inference_steps"),
    ("time shift", "shift"),
    ("SDE window [start, end)", "sde_window"),
    ("group size G", "num_generations"),
    ("videos per device and step", "per_device_train_batch_size"),
    ("gradient accumulation steps", "gradient_accumulation_steps"),
    ("optimizer passes per rollout", "num_iterations"),
    ("learning rate", "learning_rate"),
    ("clip range epsilon", "epsilon"),
    ("advantage clip", "adv_clip_max"),
    ("temporal gradient equalizer", "equalizer"),
    ("KL strategy", "kl_strategy"),
    ("KL coefficient (max)", "beta"),
    ("KL coefficient schedule", "kl_coef_schedule"),
    ("KL coefficient min", "kl_coef_min"),
    ("KL target", "kl_target"),
    ("position KL weight", "beta_pos"),
    ("velocity KL weight", "beta_vel"),
    ("anchor refresh (optimizer steps)", "anchor_update_steps"),
    ("guidance scale", "guidance_scale"),
    ("frames", "num_frames"),
    ("height", "height"),
    ("width", "width"),
    ("bf16", "bf16"),
    ("seed", "seed"),
)


def _hyperparameter_rows(run: RunRecord) -> list[tuple[str, str]]:
    rows = [(label, _format_value(run.config[key])) for label, key in _HYPERPARAMETERS if key in run.config]
    if run.lora_config is not None:
        rows += [
            ("LoRA rank r", _format_value(run.lora_config.get("r"))),
            ("LoRA alpha", _format_value(run.lora_config.get("lora_alpha"))),
            ("LoRA target modules", _format_value(sorted(run.lora_config.get("target_modules") or []))),
        ]
    else:
        rows.append(("fine-tuning", f"full ({run.transformer_class})"))
    rows.append(("optimizer steps trained", _format_value(run.global_step)))
    return rows


def _reward_components(run: RunRecord) -> list[str]:
    resolved = run.config.get("resolved_reward_weights")
    if resolved:  # what entered the total reward (reported-only components such as *_raw are left out)
        return sorted(resolved)
    if run.eval_results and isinstance(run.eval_results.get("after"), dict):
        names = set(run.eval_results["after"])
    else:
        names = {
            key.split("/", 1)[1] for record in run.metrics for key in record if key.startswith("reward/")
        }
    return sorted(names - {"total", "total_std", "invalid_count"})


def _reward_weights(config: dict[str, Any], components: Sequence[str]) -> tuple[dict[str, str], str]:
    """``({component: weight}, how the weights were chosen)`` as the trainer resolved them."""
    resolved = config.get("resolved_reward_weights")
    if resolved:
        return {name: _format_value(float(w)) for name, w in resolved.items()}, "as resolved by the trainer"
    explicit = config.get("reward_component_weights")
    if isinstance(explicit, str):
        explicit = json.loads(explicit)
    if explicit:
        return {name: _format_value(float(w)) for name, w in explicit.items()}, "explicit component weights"
    if config.get("reward_weights"):
        weights = ", ".join(_format_value(float(w)) for w in config["reward_weights"])
        return {}, f"one weight per reward function: {weights}"
    preset = config.get("reward_preset")
    if preset in REWARD_PRESETS:
        return {n: _format_value(w) for n, w in REWARD_PRESETS[preset].items()}, f"preset `{preset}`"
    default = {name: _format_value(REWARD_PRESETS["setting_b"].get(name, 1.0)) for name in components}
    return (
        default,
        "the default: paper Setting B (VQ 0.5, MQ 0.5, TA 1) for VideoAlign, 1.0 for other rewards",
    )


def _reward_context(run: RunRecord, reward_model: str | None) -> dict[str, Any]:
    components = _reward_components(run)
    weights, source = _reward_weights(run.config, components)
    videoalign = bool(components) and set(components) <= set(_VIDEOALIGN_COMPONENTS)
    model = (
        reward_model
        or run.config.get("reward_model")
        or (
            "[VideoAlign](https://huggingface.co/KwaiVGI/VideoReward) (Qwen2-VL reward model)"
            if videoalign
            else None
        )
    )
    names = [_VIDEOALIGN_COMPONENTS.get(name, name) for name in components]
    # CompositeReward reports components without a weight but leaves them out of the total.
    missing = (
        "per function, see above" if run.config.get("reward_weights") else "reported only (not in the total)"
    )
    text = (
        f"Reward model: {model}."
        if model
        else "Reward functions: " + (", ".join(components) or "not recorded") + "."
    )
    text += f" The training reward is the weighted sum of its components (paper Eq. 33); weights: {source}."
    rows = [
        (
            f"{name} ({_VIDEOALIGN_COMPONENTS[name]})" if name in _VIDEOALIGN_COMPONENTS else name,
            weights.get(name, missing),
        )
        for name in components
    ]
    return {"reward_text": text, "reward_rows": rows, "reward_short": " and ".join(names) or "its reward"}


def _signed(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.4f}"


def _metrics_context(run: RunRecord) -> dict[str, Any]:
    """Final metrics: held-out before/after means, else ``summary.md``, else the last logged rewards."""
    results = run.eval_results or {}
    before, after = results.get("before"), results.get("after")
    if isinstance(before, dict) and isinstance(after, dict):
        names = sorted(set(before) & set(after), key=lambda n: (n == "total", n))
        rows = [
            (n, f"{before[n]:.4f}", f"{after[n]:.4f}", _signed(float(after[n]) - float(before[n])))
            for n in names
        ]
        count = len(results.get("prompts") or [])
        text = f"Mean reward on {count or 'the'} held-out videos (fixed prompts and seeds, deterministic sampling):"
        return {"metric_rows": rows, "metrics_text": text}
    if run.summary:
        return {
            "summary_table": run.summary.strip(),
            "metrics_text": "Held-out evaluation before and after training:",
        }
    last = next((r for r in reversed(run.metrics) if any(k.startswith("reward/") for k in r)), None)
    if last is None:
        return {}
    rows = [
        (k, f"{v:.4f}")
        for k, v in sorted(last.items())
        if k.startswith(("reward/", "kl/")) and isinstance(v, float)
    ]
    return {
        "last_rows": rows,
        "metrics_text": f"Training rollouts at the last logged step ({last.get('step')}):",
    }


def _usage_context(run: RunRecord, base_model: str | None, pipeline_class: str | None) -> dict[str, Any]:
    pipeline = _pipeline_class(run.config, pipeline_class)
    if pipeline == "toy":
        loader = "toy"
    else:
        loader = _PIPELINE_LOADERS.get(pipeline or "", "generic") if run.is_lora else "full"
        if base_model is None:
            logger.warning(
                "No Hub id for the base model: the usage snippet shows a placeholder; pass base_model."
            )
    prompts = (run.eval_results or {}).get("prompts") or []
    config = run.config
    return {
        "loader": loader,
        "pipeline_class": pipeline if pipeline and pipeline != "toy" else "DiffusionPipeline",
        "base_model_id": base_model or "<base-model-id>",
        "example_prompt": (prompts[0] if prompts else _EXAMPLE_PROMPT).replace('"', '\\"'),
        "fps": _format_value(config.get("fps") or 16),
        **{
            key: _format_value(config.get(key)) for key in ("num_frames", "height", "width", "guidance_scale")
        },
        "num_inference_steps": _format_value(config.get("num_inference_steps")),
    }


def _base_model_text(config: dict[str, Any], base_model: str | None) -> str:
    if base_model is not None:
        return f"[{base_model}](https://huggingface.co/{base_model})"
    if config.get("model_name_or_path") == "toy":
        return 'the toy text-to-video world built into sage-grpo (`load_backbone("toy")`, shipped with the package)'
    return f"a local copy of a diffusers pipeline (`{config.get('model_name_or_path')}`)"


def _versions() -> list[tuple[str, str]]:
    versions = []
    for package in ("sage-grpo", "diffusers", "torch", "trl", "peft", "transformers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append((package, importlib.metadata.version(package)))
    return versions


def _card_data(run: RunRecord, base_model: str | None, license: str) -> ModelCardData:
    algorithm, sde = str(run.config.get("algorithm", "sage_grpo")), str(run.config.get("sde", "sage"))
    tags = ["lora"] if run.is_lora else []
    tags += ["sage-grpo", "text-to-video", "diffusers", "reinforcement-learning", "trl"]
    tags += [algorithm.replace("_", "-"), f"{sde.replace('_', '-')}-sde"]
    if run.config.get("model_name_or_path") == "toy":
        tags.append("toy-world")
    relation = {"base_model_relation": "adapter" if run.is_lora else "finetune"} if base_model else {}
    return ModelCardData(
        base_model=base_model,
        library_name="diffusers",
        pipeline_tag="text-to-video",
        license=license,
        tags=tags,
        **relation,
    )


def _method_context(run: RunRecord) -> dict[str, Any]:
    """What was trained: algorithm, SDE, adapter or full model, steps."""
    algorithm = str(run.config.get("algorithm", "sage_grpo"))
    name, note = _ALGORITHM_NAMES.get(algorithm, (algorithm, None))
    sde = str(run.config.get("sde", "sage"))
    lora = run.lora_config or {}
    steps = f"{run.global_step} optimizer steps" if run.global_step is not None else "steps not recorded"
    return {
        "algorithm_name": name,
        "algorithm_note": note,
        "sde": sde,
        "sde_note": _SDE_NOTES.get(sde),
        "is_lora": run.is_lora,
        "lora_rank": lora.get("r"),
        "lora_alpha": lora.get("lora_alpha"),
        "target_modules": ", ".join(sorted(lora.get("target_modules") or [])),
        "weight_name": LORA_WEIGHT_NAME,
        "adapter_info_file": ADAPTER_INFO_FILE,
        "transformer_class": run.transformer_class,
        "steps_text": f"{steps}, group size {run.config.get('num_generations')}",
        "max_steps": run.max_steps,
        "hyperparameters": _hyperparameter_rows(run),
    }


def render_model_card(
    run: RunRecord,
    *,
    repo_id: str,
    license: str,
    base_model: str | None = None,
    pipeline_class: str | None = None,
    reward_model: str | None = None,
    in_progress_step: int | None = None,
) -> ModelCard:
    """The model card (README.md) of ``run`` from the project's template, with Hub metadata.

    Args:
        run: the run, from `read_run`.
        repo_id: ``user/name`` the card is for (used in the usage snippet).
        license: a Hub license id (``apache-2.0``, ``mit``, ``other``, ...).
        base_model: Hub id of the base model; default from ``model_name_or_path`` (see `resolve_base_model`).
        pipeline_class: diffusers pipeline class for the usage snippet; default from the config and model name.
        reward_model: a description of the reward model, when the config does not say.
        in_progress_step: for intermediate pushes during training: the step of the checkpoint.
    """
    base_model = resolve_base_model(run.config, base_model)
    context = {
        "model_name": repo_id.split("/")[-1],
        "repo_id": repo_id,
        "base_model_text": _base_model_text(run.config, base_model),
        "in_progress_step": in_progress_step,
        "samples": run.samples,
        "curves": [(Path(c).stem.removeprefix("reward_"), c) for c in run.curves],
        "config_file": CONFIG_FILE,
        "metrics_file": METRICS_FILE,
        "has_metrics_file": (run.directory / METRICS_FILE).is_file(),
        "versions": _versions(),
        "citation": CITATION,
        **_method_context(run),
        **_usage_context(run, base_model, pipeline_class),
        **_reward_context(run, reward_model),
        **_metrics_context(run),
    }
    template = files("sage_trl").joinpath("templates", TEMPLATE_FILE).read_text(encoding="utf-8")
    card = ModelCard.from_template(_card_data(run, base_model, license), template_str=template, **context)
    # The template's optional sections leave runs of blank lines; markdown needs at most one.
    return ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))


# ------------------------------------------------------------------------------------------------
# The upload folder
# ------------------------------------------------------------------------------------------------


def _check_license(license: str | None) -> str:
    if not license:
        raise ValueError(
            "A license is required to publish: pass --license (sage-push) or license= / hub_license (trainer) with "
            "a Hub license id, e.g. apache-2.0, mit, openrail, cc-by-nc-4.0, or 'other'. Check the base model's "
            "license: an adapter usually inherits its terms."
        )
    if not _LICENSE_PATTERN.match(license):
        raise ValueError(f"license must be a lowercase Hub license id like 'apache-2.0', got {license!r}.")
    return license


def _check_repo_id(repo_id: str, require_namespace: bool = True) -> str:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"Invalid repo id {repo_id!r}: {error}") from error
    if require_namespace and repo_id.count("/") != 1:
        raise ValueError(f"repo id must be 'user/name' (or 'organization/name'), got {repo_id!r}.")
    return repo_id


def _place(source: Path, target: Path, link: bool) -> None:
    """Copy ``source`` to ``target``; with ``link``, hard-link where possible (large weights stage for free)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if link:
        with contextlib.suppress(OSError):
            os.link(source, target)
            return
    shutil.copyfile(source, target)


def _adapter_info(run: RunRecord, base_model: str | None, pipeline_class: str | None) -> dict[str, Any]:
    lora = dict(run.lora_config or {})
    return {
        "format": "diffusers-lora",
        "weight_name": LORA_WEIGHT_NAME,
        "prefix": LORA_PREFIX,
        "r": lora.get("r"),
        "lora_alpha": lora.get("lora_alpha"),
        "target_modules": sorted(lora.get("target_modules") or []),
        "base_model": base_model,
        "pipeline_class": _pipeline_class(run.config, pipeline_class),
        "lora_config": lora,
    }


def _redacted_config(path: Path) -> bytes:
    """``sage_config.json``'s bytes, with any token value replaced (`TrainingArguments.to_dict` already masks
    ``*_token`` fields; a config written another way must not leak a secret to a public repo)."""
    content = path.read_bytes()
    config = json.loads(content)
    leaked = [
        k for k, v in config.items() if k.endswith("_token") and isinstance(v, str) and not v.startswith("<")
    ]
    if not leaked:
        return content
    for key in leaked:
        config[key] = f"<{key.upper()}>"
    return (json.dumps(config, indent=2) + "\n").encode()


def _empty_folder(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"{path} must be an empty or new folder: the upload folder is written there.")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_upload_folder(
    output_dir: str | os.PathLike,
    staging_dir: str | os.PathLike,
    *,
    repo_id: str,
    license: str | None,
    base_model: str | None = None,
    pipeline_class: str | None = None,
    reward_model: str | None = None,
    in_progress_step: int | None = None,
    link: bool = False,
) -> Path:
    """Write into ``staging_dir`` (new or empty) exactly the files to upload for the run in ``output_dir``.

    The weights (diffusers LoRA file or ``transformer/``), ``sage_adapter.json`` (LoRA runs), ``sage_config.json``,
    the metrics, evaluation, curves and sample GIF that exist, and the model card ``README.md``. Never checkpoints,
    optimizer or RNG state. ``link`` hard-links large files instead of copying them (for temporary staging).
    Returns ``staging_dir``.
    """
    license = _check_license(license)
    _check_repo_id(repo_id)
    run = read_run(output_dir)
    staging = _empty_folder(staging_dir)
    if run.is_lora:
        _place(run.directory / LORA_WEIGHT_NAME, staging / LORA_WEIGHT_NAME, link)
        resolved = resolve_base_model(run.config, base_model)
        info = _adapter_info(run, resolved, pipeline_class)
        (staging / ADAPTER_INFO_FILE).write_text(
            json.dumps(info, indent=2, sort_keys=True, default=str) + "\n"
        )
    else:
        for source in sorted((run.directory / TRANSFORMER_FOLDER).rglob("*")):
            if source.is_file():
                _place(source, staging / source.relative_to(run.directory), link)
    (staging / CONFIG_FILE).write_bytes(_redacted_config(run.directory / CONFIG_FILE))
    optional = [
        METRICS_FILE,
        EVAL_RESULTS_FILE,
        SUMMARY_FILE,
        *run.curves,
        *([run.samples] if run.samples else []),
    ]
    for name in optional:
        if (run.directory / name).is_file():
            _place(run.directory / name, staging / name, link)
    card = render_model_card(
        run,
        repo_id=repo_id,
        license=license,
        base_model=base_model,
        pipeline_class=pipeline_class,
        reward_model=reward_model,
        in_progress_step=in_progress_step,
    )
    (staging / README_FILE).write_text(str(card), encoding="utf-8")
    return staging


# ------------------------------------------------------------------------------------------------
# Talking to the Hub
# ------------------------------------------------------------------------------------------------


def _offline_mode() -> bool:
    """huggingface_hub reads HF_HUB_OFFLINE once at import; the environment is read again here so that setting it
    later (e.g. in a launcher script) is honoured too."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((value or "").upper() in _TRUE_VALUES for value in flags)


def _offline_error(endpoint: str) -> HubPushError:
    return HubPushError(
        f"Cannot push to {endpoint}: offline mode is on (HF_HUB_OFFLINE=1). Unset HF_HUB_OFFLINE on a machine with "
        "network access, or write the upload folder with `sage-push OUTPUT_DIR --repo-id USER/NAME --dry-run DIR` "
        "and upload it later with `hf upload USER/NAME DIR`."
    )


def _resolve_token(token: str | None) -> str:
    token = token or get_token()  # HF_TOKEN, then the login cache (`hf auth login`)
    if not token:
        raise HubPushError(
            "No Hugging Face token: run `hf auth login`, set the HF_TOKEN environment variable, or pass --token "
            "(hub_token for the trainer). The token needs write access: https://huggingface.co/settings/tokens"
        )
    return token


def _whoami(endpoint: str, token: str, timeout: float) -> dict[str, Any]:
    """One quick authenticated request: checks the endpoint answers and the token is valid and can write.

    huggingface_hub's own client has no timeout, and its upload step retries for ~20 s: this request fails
    within ``timeout`` seconds instead.
    """
    url = f"{endpoint}/api/whoami-v2"
    try:
        response = get_session().get(url, headers=build_hf_headers(token=token), timeout=timeout)
    except OfflineModeIsEnabled as error:
        raise _offline_error(endpoint) from error
    except Exception as error:  # the HTTP backend's connection and timeout errors (httpx or requests)
        raise HubPushError(
            f"Cannot reach the Hugging Face Hub at {endpoint} ({type(error).__name__}: {error}). Check the network, "
            "proxy settings (HTTPS_PROXY) or --endpoint / HF_ENDPOINT; on a machine without network use --dry-run."
        ) from error
    if response.status_code == 401:
        raise HubPushError(
            f"The Hub at {endpoint} rejected the token (401 Unauthorized): it is invalid or expired. Create a write "
            "token at https://huggingface.co/settings/tokens and run `hf auth login` or set HF_TOKEN."
        )
    if response.status_code >= 400:
        raise HubPushError(
            f"The Hub at {endpoint} answered {response.status_code} to {url}: {response.text[:300]}"
        )
    user = response.json()
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubPushError("The token is read-only; pushing needs a token with write access (role 'write').")
    return user


@contextlib.contextmanager
def _hub_errors(action: str, repo_id: str) -> Iterator[None]:
    """Turn huggingface_hub's errors during ``action`` into one `HubPushError` that says what to do."""
    try:
        yield
    except OfflineModeIsEnabled as error:
        raise _offline_error(constants.ENDPOINT) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        hint = {
            401: "the token was rejected; log in again with a write token",
            403: f"the token cannot write to {repo_id}; check the namespace and the token's permissions",
            404: f"{repo_id} was not found; check the repo id",
        }.get(status, "see the Hub's message above")
        raise HubPushError(f"Could not {action} {repo_id} ({status}): {hint}.\n{error}") from error


def connect_to_hub(
    repo_id: str, *, token: str | None = None, endpoint: str | None = None, timeout: float = 10.0
) -> tuple[HfApi, str]:
    """Check that a push can happen, without creating anything; returns ``(api, full repo id)``.

    Fails at once with one `HubPushError` when offline mode is on (``HF_HUB_OFFLINE=1``), no token is found
    (argument, ``HF_TOKEN``, login cache), the endpoint does not answer within ``timeout`` seconds, or the token is
    rejected or read-only. A bare ``name`` resolves to the token owner's namespace.
    """
    _check_repo_id(repo_id, require_namespace=False)
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    if _offline_mode():
        raise _offline_error(endpoint)
    token = _resolve_token(token)
    user = _whoami(endpoint, token, timeout)
    full_id = repo_id if "/" in repo_id else f"{user['name']}/{repo_id}"
    return HfApi(
        endpoint=endpoint, token=token, library_name="sage-grpo", library_version=_package_version()
    ), full_id


def _create_repo(api: HfApi, repo_id: str, private: bool | None) -> str:
    with _hub_errors("create the repository", repo_id):
        return api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id


def prepare_hub_repo(
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    endpoint: str | None = None,
    timeout: float = 10.0,
) -> tuple[HfApi, str]:
    """`connect_to_hub`, then create ``repo_id`` (a model repo; an existing one is fine); returns
    ``(api, full repo id)``. ``private`` has no effect on an existing repository."""
    api, full_id = connect_to_hub(repo_id, token=token, endpoint=endpoint, timeout=timeout)
    return api, _create_repo(api, full_id, private)


def _package_version() -> str:
    try:
        return importlib.metadata.version("sage-grpo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def push_output_dir(
    output_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    license: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    endpoint: str | None = None,
    dry_run_dir: str | os.PathLike | None = None,
    base_model: str | None = None,
    pipeline_class: str | None = None,
    reward_model: str | None = None,
    revision: str | None = None,
    require_complete: bool = True,
    timeout: float = 10.0,
) -> CommitInfo | Path:
    """Publish a finished run's ``output_dir`` to ``repo_id`` (created if needed); returns the commit.

    With ``dry_run_dir``, writes there exactly the folder that would be uploaded, contacts nothing and returns that
    folder. ``require_complete`` refuses a run without a completion marker (see `check_output_dir`); the trainer
    passes False for the folder it has just saved. Token: ``token``, else ``HF_TOKEN``, else the login cache.
    ``private=True`` creates a private repo, None leaves visibility to the Hub (public unless the organization
    defaults to private); an existing repo keeps its visibility.
    Environment problems raise one `HubPushError` (see `prepare_hub_repo`); bad arguments raise ``ValueError``.
    """
    _check_license(license)
    if require_complete:
        check_output_dir(output_dir)
    options = {
        "license": license,
        "base_model": base_model,
        "pipeline_class": pipeline_class,
        "reward_model": reward_model,
    }
    if dry_run_dir is not None:
        return build_upload_folder(output_dir, dry_run_dir, repo_id=_check_repo_id(repo_id), **options)
    api, full_id = connect_to_hub(repo_id, token=token, endpoint=endpoint, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="sage-push-") as staging:
        # Assembled before the repo is created: a folder that cannot be published leaves nothing on the Hub.
        folder = build_upload_folder(
            output_dir, Path(staging) / "upload", repo_id=full_id, link=True, **options
        )
        _create_repo(api, full_id, private)
        with _hub_errors("upload to", full_id):
            return api.upload_folder(
                repo_id=full_id, folder_path=folder, commit_message=commit_message, revision=revision
            )


# ------------------------------------------------------------------------------------------------
# Trainer integration (`SageGRPOTrainer` calls these on the main process)
# ------------------------------------------------------------------------------------------------


def _trainer_repo_id(args: TrainingArguments, repo_id: str | None) -> str:
    """TRL / transformers convention: ``hub_model_id``, else the output folder's name (in the token's namespace)."""
    return repo_id or args.hub_model_id or Path(args.output_dir).absolute().name


def _is_main_process(args: TrainingArguments) -> bool:
    return getattr(args, "process_index", 0) == 0


def init_hub_repo(
    args: TrainingArguments,
    *,
    license: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> str | None:
    """Before training (``push_to_hub=True``): check license, token and network, create the repo; returns its id.

    Replaces `transformers.Trainer.init_hf_repo` so that a push that cannot happen fails before hours of training,
    not after. ``license`` defaults to ``args.hub_license``. Returns None on processes other than the main one.
    """
    if not _is_main_process(args):
        return None
    _check_license(license or getattr(args, "hub_license", None))
    _, full_id = prepare_hub_repo(
        _trainer_repo_id(args, None),
        token=token or args.hub_token,
        private=args.hub_private_repo,
        endpoint=endpoint,
    )
    return full_id


def push_training_output(
    args: TrainingArguments,
    *,
    repo_id: str | None = None,
    commit_message: str = "End of training",
    token: str | None = None,
    license: str | None = None,
    private: bool | None = None,
    endpoint: str | None = None,
    **card_options: Any,
) -> CommitInfo | None:
    """Push the trainer's ``args.output_dir`` (just saved with ``save_model``) at the end of training.

    ``repo_id`` defaults to ``args.hub_model_id`` (then the output folder's name), ``token`` to ``args.hub_token``
    (then ``HF_TOKEN`` and the login cache), ``license`` to ``args.hub_license``, ``private`` to
    ``args.hub_private_repo``; ``card_options`` go to `build_upload_folder` (``base_model``, ``pipeline_class``,
    ``reward_model``). Only the main process pushes; the others return None.
    """
    if not _is_main_process(args):
        return None
    return push_output_dir(
        args.output_dir,
        _trainer_repo_id(args, repo_id),
        private=private if private is not None else args.hub_private_repo,
        token=token or args.hub_token,
        license=license or getattr(args, "hub_license", None),
        commit_message=commit_message,
        endpoint=endpoint,
        revision=getattr(args, "hub_revision", None),
        require_complete=True,  # SageGRPOTrainer.train() writes the marker only when training finished
        **card_options,
    )


def _checkpoint_step(checkpoint_dir: Path) -> int | None:
    match = re.fullmatch(r"checkpoint-(\d+)", checkpoint_dir.name)
    return int(match.group(1)) if match else None


def push_checkpoint(
    args: TrainingArguments,
    checkpoint_dir: str | os.PathLike,
    *,
    repo_id: str | None = None,
    token: str | None = None,
    license: str | None = None,
    endpoint: str | None = None,
    raise_on_error: bool = False,
    **card_options: Any,
) -> list[CommitInfo]:
    """Intermediate push of a saved ``checkpoint-N`` folder, following ``args.hub_strategy`` (TRL conventions).

    ``every_save``, ``checkpoint`` and ``all_checkpoints`` upload the checkpoint's diffusers-format adapter (or
    transformer), ``sage_adapter.json``, ``sage_config.json`` and a "training in progress" card to the repo root;
    ``checkpoint`` also uploads the whole checkpoint (optimizer state included, to resume) to ``last-checkpoint/``
    and ``all_checkpoints`` to ``checkpoint-N/``. ``end`` and ``push_to_hub=False`` push nothing. Blocking.

    A failed intermediate push logs a warning and returns ``[]`` (training goes on; the final push uploads the
    final model) unless ``raise_on_error``. Only the main process pushes.
    """
    strategy = str(getattr(args.hub_strategy, "value", args.hub_strategy))
    if not _is_main_process(args) or not args.push_to_hub or strategy == "end":
        return []
    checkpoint_dir = Path(checkpoint_dir)
    try:
        api, full_id = connect_to_hub(
            _trainer_repo_id(args, repo_id), token=token or args.hub_token, endpoint=endpoint
        )
        with tempfile.TemporaryDirectory(prefix="sage-push-") as staging:
            folder = build_upload_folder(
                checkpoint_dir,
                Path(staging) / "upload",
                repo_id=full_id,
                in_progress_step=_checkpoint_step(checkpoint_dir),
                link=True,
                license=license or getattr(args, "hub_license", None),
                **card_options,
            )
            _create_repo(api, full_id, args.hub_private_repo)
            return _upload_checkpoint(api, full_id, folder, checkpoint_dir, strategy, args)
    except (HubPushError, ValueError) as error:
        if raise_on_error:
            raise
        logger.warning("Intermediate push of %s skipped: %s", checkpoint_dir, error)
        return []


def _upload_checkpoint(
    api: HfApi, repo_id: str, folder: Path, checkpoint_dir: Path, strategy: str, args: TrainingArguments
) -> list[CommitInfo]:
    """The adapter and card to the repo root; for ``checkpoint`` / ``all_checkpoints`` the resumable checkpoint
    to ``last-checkpoint/`` / ``checkpoint-N/`` too (as `transformers.Trainer` does)."""
    message = f"Training in progress, step {_checkpoint_step(checkpoint_dir)}"
    revision = getattr(args, "hub_revision", None)
    with _hub_errors("upload to", repo_id):
        commits = [
            api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=message, revision=revision)
        ]
        if strategy in ("checkpoint", "all_checkpoints"):
            path_in_repo = "last-checkpoint" if strategy == "checkpoint" else checkpoint_dir.name
            commits.append(
                api.upload_folder(
                    repo_id=repo_id,
                    folder_path=checkpoint_dir,
                    path_in_repo=path_in_repo,
                    commit_message=f"{message}, checkpoint",
                    revision=revision,
                )
            )
    return commits


# ------------------------------------------------------------------------------------------------
# sage-push
# ------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sage-push",
        description="Publish a finished sage-train run (adapter, config, curves, samples, model card) to the Hub.",
    )
    parser.add_argument("output_dir", help="The output_dir of a finished training run.")
    parser.add_argument("--repo-id", required=True, help="Target model repository, USER/NAME or ORG/NAME.")
    parser.add_argument(
        "--license", help="Hub license id of the published weights (e.g. apache-2.0). Required."
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="Write the exact upload folder to DIR (default: OUTPUT_DIR/hub-dry-run) and upload nothing.",
    )
    parser.add_argument(
        "--token", help="Hub token; default: HF_TOKEN, then the login cache (`hf auth login`)."
    )
    parser.add_argument(
        "--endpoint", help="Hub endpoint URL; default: HF_ENDPOINT or https://huggingface.co."
    )
    parser.add_argument("--base-model", help="Hub id of the base model, when model_name_or_path is not one.")
    parser.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE, help="Commit message.")
    return parser


def _dry_run_dir(output_dir: str, requested: str) -> Path:
    if requested:
        return Path(requested)
    default = Path(output_dir) / "hub-dry-run"
    shutil.rmtree(
        default, ignore_errors=True
    )  # ours from an earlier dry run; never uploaded (not allow-listed)
    return default


def push_main(argv: Sequence[str] | None = None) -> int:
    """``sage-push OUTPUT_DIR --repo-id USER/NAME [--license L] [--private] [--dry-run [DIR]] [--token T]
    [--endpoint URL] [--base-model ID]``: publish a finished run. Returns the exit status (0 on success)."""
    args = _parser().parse_args(argv)
    dry_run = _dry_run_dir(args.output_dir, args.dry_run) if args.dry_run is not None else None
    try:
        result = push_output_dir(
            args.output_dir,
            args.repo_id,
            private=True if args.private else None,
            token=args.token,
            license=args.license,
            commit_message=args.commit_message,
            endpoint=args.endpoint,
            dry_run_dir=dry_run,
            base_model=args.base_model,
        )
    except (ValueError, HubPushError) as error:
        print(f"sage-push: error: {error}", file=sys.stderr)
        return 1
    if isinstance(result, Path):
        names = sorted(p.relative_to(result).as_posix() for p in result.rglob("*") if p.is_file())
        print(f"Dry run: nothing uploaded. The upload folder is {result}:\n  " + "\n  ".join(names))
    else:
        print(f"Pushed {args.output_dir} to {result.repo_url} ({result.commit_url})")
    return 0
