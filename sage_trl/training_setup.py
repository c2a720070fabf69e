"""The parts `SageGRPOTrainer` builds from a `SageGRPOConfig`, declared once.

The trainer builds its backbone, reward, prompt dataset, rollout environment and memory savers with these
functions, and `sage_trl.preflight` builds the same parts at full size under fake tensors, so a plan traces what a
run will do.
"""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset

from sage_env.backbones import VideoBackbone, load_backbone
from sage_env.env import DenoisingVectorEnv
from sage_env.rewards import CompositeReward

__all__ = [
    "PROMPT_ENCODE_CHUNK",
    "check_video_size",
    "composite_reward",
    "enable_memory_savers",
    "load_training_backbone",
    "pipeline_class_name",
    "precompute_prompt_embeddings",
    "prompt_dataset",
    "refuse_unsupported_arguments",
    "training_env",
    "videos_per_round",
]

PROMPT_ENCODE_CHUNK = 64
"""Distinct prompts encoded per call when ``precompute_prompt_embeddings`` is on: bounds the text encoders'
activations (the encode phase is the peak of the example configs, see ``sage-train --preflight``)."""

_UNSUPPORTED_ARGUMENTS = {
    "processing_class": "video backbones bring their own text encoders",
    "reward_processing_classes": "reward functions take decoded videos",
    "tools": "tool calling is for language models",
    "rollout_func": "rollouts run through sage_env's denoising environment",
    "environment_factory": "the environment is sage_env's DenoisingVectorEnv",
    "quantization_config": "quantised video transformers are not supported yet",
}


def refuse_unsupported_arguments(arguments: dict[str, Any]) -> None:
    """Raise for a GRPOTrainer argument that has no meaning for video models (given, i.e. not None)."""
    for name, reason in _UNSUPPORTED_ARGUMENTS.items():
        if arguments.get(name) is not None:
            raise ValueError(f"SageGRPOTrainer does not take {name}: {reason}.")


def load_training_backbone(model: VideoBackbone | str | None, config: Any, lora: bool) -> VideoBackbone:
    """``model`` (a backbone, a folder or Hub id; None: ``config.model_name_or_path``) loaded in the run's
    parameter dtype (`SageGRPOConfig.parameter_dtype`) on the run's device."""
    return load_backbone(
        model if model is not None else config.model_name_or_path,
        backbone=config.backbone,
        torch_dtype=config.parameter_dtype(lora),
        device=config.device,
    )


def pipeline_class_name(backbone: VideoBackbone) -> str | None:
    """The name a backbone's class is found by (its declared ``pipeline_class``), None when it declares none."""
    return type(backbone).pipeline_class


def check_video_size(config: Any) -> None:
    """Raise unless the video size and step count are known (set, or declared by the model)."""
    names = ("num_frames", "height", "width", "num_inference_steps")
    missing = [name for name in names if getattr(config, name) is None]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} must be set: the model declares no default (see sage_env.models for the models "
            "that do)."
        )


def composite_reward(reward_funcs: Any, config: Any) -> CompositeReward:
    """The reward functions weighted as the config says (a `CompositeReward` is taken as it is)."""
    if isinstance(reward_funcs, CompositeReward):
        return reward_funcs
    return CompositeReward(reward_funcs, config.reward_weights_for_composite())


def prompt_dataset(train_dataset: Any) -> Dataset:
    """A `datasets.Dataset` with a ``prompt`` column, or a list of prompts made into one."""
    if train_dataset is None:
        raise ValueError(
            "train_dataset is required: a datasets.Dataset with a 'prompt' column or a list of prompts."
        )
    if isinstance(train_dataset, Dataset):
        if "prompt" not in train_dataset.column_names:
            raise ValueError(f"train_dataset needs a 'prompt' column, it has {train_dataset.column_names}.")
        return train_dataset
    prompts = list(train_dataset)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(
            "train_dataset must be a non-empty list of prompt strings or a Dataset with 'prompt'."
        )
    return Dataset.from_dict({"prompt": prompts})


def videos_per_round(config: Any) -> int:
    """Videos one process rolls out per generation round: ``per_device_train_batch_size x steps_per_generation``
    (TRL generates for that many training steps at once); the size of the process's environment."""
    return config.per_device_train_batch_size * config.steps_per_generation


def training_env(
    backbone: VideoBackbone, reward_fn: Any, config: Any, device: torch.device | str | None = None
) -> DenoisingVectorEnv:
    """The environment one process rolls out in: `videos_per_round` videos, the config's video size, schedule and
    SDE settings, torch arrays on ``device``."""
    return DenoisingVectorEnv(
        backbone,
        reward_fn,
        num_envs=videos_per_round(config),
        group_size=1,
        **config.sampling().env_kwargs(),
        sde=config.sde,
        eta=config.eta,
        sde_window=tuple(config.sde_window) if config.sde_window else None,
        log_prob_kind=config.log_prob_kind,
        device=device,
        array_mode="torch",
    )


def enable_memory_savers(backbone: VideoBackbone, config: Any) -> None:
    """Gradient checkpointing and the VAE's tiling and slicing, as configured (docs/training_on_gpus.md); each
    leaves the training result unchanged."""
    if config.diffusers_gradient_checkpointing:
        backbone.transformer.enable_gradient_checkpointing()
    backbone.enable_vae_memory_savers(tiling=config.vae_tiling, slicing=config.vae_slicing)


def precompute_prompt_embeddings(
    backbone: VideoBackbone, prompts: list[str], negative_prompt: str | None
) -> None:
    """Encode every distinct prompt once, `PROMPT_ENCODE_CHUNK` per call, into the backbone's prompt cache, then
    move the text encoders off the device (``precompute_prompt_embeddings``)."""
    distinct = list(dict.fromkeys(prompts))
    for start in range(0, len(distinct), PROMPT_ENCODE_CHUNK):
        backbone.encode_prompts(distinct[start : start + PROMPT_ENCODE_CHUNK], negative_prompt)
    backbone.offload_text_encoders()
