"""The model card (``README.md``) of a run, rendered from what the run recorded, never from guesses.

Each fact comes from the module that owns it: the base model, the reward functions and their weights and the
dataset from the run record (`sage_trl.run_folder.RunRecord`, written by the trainer), the algorithm's name from
its config class (`agents.ALGORITHM_CONFIGS`), the SDE's notes from its unit (`sage_env.sde.get_sde`), how an
adapter loads from the diffusers pipeline class itself (whether it has ``load_lora_weights``). The Hub metadata
(``base_model``, ``library_name``, ``pipeline_tag``, ``license``, ``tags``) is a `huggingface_hub.ModelCardData`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import diffusers
from huggingface_hub import ModelCard, ModelCardData

from agents import ALGORITHM_CONFIGS
from sage_env import sde
from sage_trl.hub.connection import check_repo_id
from sage_trl.run_folder import RunRecord, layout

__all__ = ["ADAPTER_INFO_FILE", "CITATION", "render_model_card", "resolve_base_model"]

logger = logging.getLogger(__name__)

ADAPTER_INFO_FILE = "sage_adapter.json"
"""The adapter's ``LoraConfig`` and how to load it (not ``adapter_config.json``: loaders would take the repo for a
peft checkpoint)."""
TEMPLATE_FILE = "model_card.md"
CITATION = """@article{zheng2026sagegrpo,
  title   = {Manifold-Aware Exploration for Reinforcement Learning in Video Generation},
  author  = {Zheng, Mingzhe and Kong, Weijie and Wu, Yue and Jiang, Dengyang and Ma, Yue and He, Xuanhua and Lin, Bin and Gong, Kaixiong and Zhong, Zhao and Bo, Liefeng and Chen, Qifeng and Yang, Harry},
  journal = {arXiv preprint arXiv:2603.21872},
  year    = {2026}
}"""
_EXAMPLE_PROMPT = "A cat walks on the grass, realistic style."
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


def resolve_base_model(run: RunRecord, base_model: str | None = None) -> str | None:
    """The Hub id for the card's ``base_model`` metadata: ``base_model`` when given, else the one the run recorded
    (a Hub id it loaded, or a Hub cache folder it came from); None for the toy world or a plain local folder (the
    Hub only accepts ids of existing models there)."""
    if base_model is not None:
        if base_model.count("/") != 1:
            raise ValueError(
                f"base_model must be a Hub model id like 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers', got {base_model!r}."
            )
        return check_repo_id(base_model)
    return run.base_model.get("hub_id")


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format_value(item) for item in value) if value else "none"
    return "none" if value is None else str(value)


def _hyperparameter_rows(run: RunRecord) -> list[tuple[str, str]]:
    rows = [(label, _format_value(run.config[key])) for label, key in _HYPERPARAMETERS if key in run.config]
    own = run.config.get("algorithm_args") or {}
    rows += [(f"{name} (the algorithm's own)", _format_value(value)) for name, value in sorted(own.items())]
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


def _reward_context(run: RunRecord) -> dict[str, Any]:
    """The reward section: each function the run trained with, and each component's weight as resolved."""
    rewards = run.run.get("rewards") or []
    weights = run.run.get("reward_weights") or {}
    descriptions = {
        name: text for reward in rewards for name, text in (reward.get("components") or {}).items()
    }
    lines = [f"`{reward['name']}`: {reward['source']}" for reward in rewards]
    text = ("Reward functions: " + "; ".join(lines) + ".") if lines else "The run did not record its rewards."
    if weights:
        text += " The training reward is the weighted sum of the components below (paper Eq. 33)."
    rows = [
        (f"{name} ({descriptions[name]})" if name in descriptions else name, _format_value(float(weight)))
        for name, weight in weights.items()
    ]
    names = [descriptions.get(name, name) for name, weight in weights.items() if weight]
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


def _loader(run: RunRecord, pipeline_class: str | None) -> str:
    """How the usage snippet loads the weights, decided by the pipeline class itself."""
    if pipeline_class == "toy":
        return "toy"
    if not run.is_lora:
        return "full"
    pipeline = getattr(diffusers, pipeline_class or "", None)
    if pipeline is None:
        return "generic"
    return "lora_loader" if hasattr(pipeline, "load_lora_weights") else "transformer_adapter"


def _usage_context(run: RunRecord, base_model: str | None) -> dict[str, Any]:
    pipeline = run.base_model.get("pipeline_class")
    if base_model is None and pipeline != "toy":
        logger.warning(
            "No Hub id for the base model: the usage snippet shows a placeholder; pass base_model."
        )
    prompts = (run.eval_results or {}).get("prompts") or []
    config = run.config
    return {
        "loader": _loader(run, pipeline),
        "pipeline_class": pipeline if pipeline and pipeline != "toy" else "DiffusionPipeline",
        "base_model_id": base_model or "<base-model-id>",
        "example_prompt": (prompts[0] if prompts else _EXAMPLE_PROMPT).replace('"', '\\"'),
        "fps": _format_value(config.get("fps") or 16),
        **{
            key: _format_value(config.get(key)) for key in ("num_frames", "height", "width", "guidance_scale")
        },
        "num_inference_steps": _format_value(config.get("num_inference_steps")),
    }


def _base_model_text(run: RunRecord, base_model: str | None) -> str:
    if base_model is not None:
        return f"[{base_model}](https://huggingface.co/{base_model})"
    if run.base_model.get("pipeline_class") == "toy":
        return 'the toy text-to-video world built into sage-grpo (`load_backbone("toy")`, shipped with the package)'
    return f"a local copy of a diffusers pipeline (`{run.base_model.get('name_or_path') or run.config.get('model_name_or_path')}`)"


def _versions() -> list[tuple[str, str]]:
    versions = []
    for package in ("sage-grpo", "diffusers", "torch", "trl", "peft", "transformers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append((package, importlib.metadata.version(package)))
    return versions


def _tag(name: str) -> str:
    return name.replace("_", "-").lower()


def _card_data(run: RunRecord, base_model: str | None, license: str) -> ModelCardData:
    """Hub metadata: the base model and its relation, library, pipeline tag, license and tags (lowercase, dashed)."""
    algorithm, sde_type = str(run.config.get("algorithm", "sage_grpo")), str(run.config.get("sde", "sage"))
    tags = ["lora"] if run.is_lora else []
    tags += ["diffusers", "text-to-video", "reinforcement-learning", "grpo", "trl", "sage-grpo"]
    tags += [_tag(algorithm), f"{_tag(sde_type)}-sde"]
    if run.base_model.get("pipeline_class") == "toy":
        tags.append("toy-world")
    relation = {"base_model_relation": "adapter" if run.is_lora else "finetune"} if base_model else {}
    dataset = run.run.get("dataset")
    datasets = {"datasets": [dataset]} if isinstance(dataset, str) and dataset.count("/") == 1 else {}
    return ModelCardData(
        base_model=base_model,
        library_name="diffusers",
        pipeline_tag="text-to-video",
        license=license,
        tags=list(dict.fromkeys(tags)),
        **relation,
        **datasets,
    )


def _method_context(run: RunRecord) -> dict[str, Any]:
    """What was trained: algorithm, SDE, adapter or full model, steps."""
    algorithm = str(run.config.get("algorithm", "sage_grpo"))
    config_class = ALGORITHM_CONFIGS.get(algorithm)
    sde_type = str(run.config.get("sde", "sage"))
    unit = sde.SDE_REGISTRY.get(sde_type)
    lora = run.lora_config or {}
    steps = f"{run.global_step} optimizer steps" if run.global_step is not None else "steps not recorded"
    return {
        "algorithm_name": config_class.display_name if config_class else algorithm,
        "algorithm_note": config_class.summary if config_class else None,
        "sde": sde_type,
        "sde_note": unit.notes if unit else None,
        "is_lora": run.is_lora,
        "lora_rank": lora.get("r"),
        "lora_alpha": lora.get("lora_alpha"),
        "target_modules": ", ".join(sorted(lora.get("target_modules") or [])),
        "weight_name": layout.LORA_WEIGHT_NAME,
        "second_expert": run.second_expert,
        # A run that trained only Wan 2.2's low-noise expert saved its adapter under the usual name.
        "into_transformer_2": run.config.get("expert") == "transformer_2",
        "expert_2_weight_name": layout.EXPERT_2_LORA_WEIGHT_NAME,
        "expert_2_folder": layout.EXPERT_2_FOLDER,
        "adapter_info_file": ADAPTER_INFO_FILE,
        "transformer_class": run.transformer_class,
        "steps_text": f"{steps}, group size {run.config.get('num_generations')}",
        "max_steps": run.max_steps,
        "hyperparameters": _hyperparameter_rows(run),
        "dataset": run.run.get("dataset"),
    }


def render_model_card(
    run: RunRecord,
    *,
    repo_id: str,
    license: str,
    base_model: str | None = None,
    in_progress_step: int | None = None,
) -> ModelCard:
    """The model card of ``run`` from the project's template, with Hub metadata.

    Args:
        run: the run, from `sage_trl.run_folder.read_run`.
        repo_id: ``user/name`` the card is for (used in the usage snippet).
        license: a Hub license id (``apache-2.0``, ``mit``, ``other``, ...).
        base_model: Hub id of the base model, when the run does not know it (trained from a local folder).
        in_progress_step: for intermediate pushes during training: the step of the checkpoint.
    """
    base_model = resolve_base_model(run, base_model)
    context = {
        "model_name": repo_id.split("/")[-1],
        "repo_id": repo_id,
        "base_model_text": _base_model_text(run, base_model),
        "in_progress_step": in_progress_step,
        "samples": run.samples,
        "curves": [(Path(c).stem.removeprefix("reward_"), c) for c in run.curves],
        "config_file": layout.CONFIG_FILE,
        "metrics_file": layout.METRICS_FILE,
        "has_metrics_file": (run.directory / layout.METRICS_FILE).is_file(),
        "versions": _versions(),
        "citation": CITATION,
        **_method_context(run),
        **_usage_context(run, base_model),
        **_reward_context(run),
        **_metrics_context(run),
        "alarm_lines": [alarm.line() for alarm in run.alarms],
        "stopped_by_alarm": (run.completion or {}).get("stopped_by_alarm"),
    }
    template = files("sage_trl").joinpath("templates", TEMPLATE_FILE).read_text(encoding="utf-8")
    card = ModelCard.from_template(_card_data(run, base_model, license), template_str=template, **context)
    # The template's optional sections leave runs of blank lines; markdown needs at most one.
    return ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))
