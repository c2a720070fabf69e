"""The parts `SageGRPOTrainer` builds from a `SageGRPOConfig`, declared once.

The trainer builds its backbone, reward, prompt dataset, rollout environment and memory savers with these
functions, and `sage_trl.preflight` builds the same parts at full size under fake tensors, so a plan traces what a
run will do.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from datasets import Dataset

from sage_env.backbones import VideoBackbone, backbone_class, load_backbone
from sage_env.env import DenoisingVectorEnv
from sage_env.models import pipeline_class_of
from sage_env.rewards import CompositeReward
from sage_trl import activation_offload

__all__ = [
    "TEXT_ENCODER_NAMES",
    "check_expert_launch",
    "check_video_size",
    "composite_reward",
    "enable_memory_savers",
    "evaluation_reward",
    "expert_options",
    "held_out_prompts",
    "load_training_backbone",
    "parked_while_encoding",
    "pipeline_class_name",
    "precompute_prompt_embeddings",
    "prompt_dataset",
    "refuse_unsupported_arguments",
    "text_encoders",
    "text_encoders_alone_on",
    "training_env",
    "videos_per_round",
]

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
    parameter dtype (`SageGRPOConfig.parameter_dtype`) on the run's device; on the host when prompts are
    precomputed, which moves it to the device afterwards (`precompute_prompt_embeddings`)."""
    if config.offload_idle_expert and not lora:
        raise ValueError(
            "offload_idle_expert swaps the idle expert's frozen weights, and full fine-tuning freezes none: train "
            "LoRA adapters (use_peft: true), or drop offload_idle_expert."
        )
    loaded = load_backbone(
        model if model is not None else config.model_name_or_path,
        backbone=config.backbone,
        torch_dtype=config.parameter_dtype(lora),
        device="cpu" if config.precompute_prompt_embeddings else config.device,
        **_expert_options(model, config),
    )
    if config.expert is not None and getattr(loaded, "expert", None) != config.expert:
        raise ValueError(
            f"expert is {config.expert!r} but the {type(loaded).__name__} passed trains "
            f"{getattr(loaded, 'expert', 'no chosen expert')!r}: build it with expert={config.expert!r}, or leave "
            "expert unset."
        )
    return loaded


def _expert_options(model: VideoBackbone | str | None, config: Any) -> dict[str, Any]:
    """The backbone's expert options (``expert``, ``offload_idle_expert``) when set; refused for a backbone whose
    ``from_pretrained`` takes none (only Wan 2.2 A14B has experts)."""
    if config.expert is None or isinstance(model, VideoBackbone):
        return {}
    name = config.backbone or pipeline_class_of(model if model is not None else config.model_name_or_path, download=True)
    if "expert" not in inspect.signature(backbone_class(name).from_pretrained).parameters:
        raise ValueError(
            f"expert is set but {name} has no experts to choose from (Wan 2.2 A14B's WanPipeline has two): leave "
            "expert unset."
        )
    return expert_options(config)


def check_expert_launch(backbone: VideoBackbone, config: Any, num_processes: int, deepspeed: bool) -> None:
    """Refuse the launches the expert options do not support: both experts under DeepSpeed (its engine takes one
    backward per step; each expert runs its own micro-batches), and the idle expert swapped with several processes
    (its weights would leave the device under DDP's and FSDP's wrappers, untested: FSDP2 shards both experts
    instead)."""
    if deepspeed and len(backbone.trained_experts) > 1:
        raise ValueError(
            "expert: both runs each expert's micro-batches apart, which DeepSpeed's one-backward-per-step engine "
            "cannot: launch with DDP or FSDP2 (examples/configs/accelerate), or train one expert."
        )
    if config.offload_idle_expert and num_processes > 1:
        raise ValueError(
            "offload_idle_expert is for one process: over several GPUs, FSDP2 shards both experts instead "
            "(examples/configs/wan22_a14b_lora_8gpu_fsdp.yaml); drop offload_idle_expert."
        )


def expert_options(config: Any) -> dict[str, Any]:
    """The config's expert options as backbone arguments (``expert``, ``offload_idle_expert``), {} when unset."""
    if config.expert is None:
        return {}
    return {"expert": config.expert, "offload_idle_expert": config.offload_idle_expert}


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


def held_out_prompts(config: Any, eval_dataset: Any) -> Dataset | None:
    """The held-out prompts as a Dataset (None without), checked before the model loads: an evaluation schedule
    (``eval_strategy``, ``eval_on_start``) needs them."""
    strategy = getattr(config.eval_strategy, "value", config.eval_strategy)
    if (strategy != "no" or config.eval_on_start) and eval_dataset is None:
        raise ValueError(
            f"eval_strategy={strategy!r} (eval_on_start={config.eval_on_start}) evaluates held-out prompts during "
            "training, and there are none: pass eval_dataset (a list of prompts, or a Dataset with a 'prompt' "
            "column), or set eval_strategy to 'no' and eval_on_start to False."
        )
    return prompt_dataset(eval_dataset, "eval_dataset") if eval_dataset is not None else None


def evaluation_reward(eval_reward_funcs: Any) -> CompositeReward | None:
    """The evaluation rewards as one `CompositeReward` with its own default weights (None when there are none)."""
    if eval_reward_funcs is None or isinstance(eval_reward_funcs, CompositeReward):
        return eval_reward_funcs
    funcs = [eval_reward_funcs] if callable(eval_reward_funcs) or isinstance(eval_reward_funcs, str) else eval_reward_funcs
    return CompositeReward(list(funcs)) if funcs else None


def prompt_dataset(dataset: Any, name: str = "train_dataset") -> Dataset:
    """A `datasets.Dataset` with a ``prompt`` column, or a list of prompts made into one (``name``: the argument's,
    for errors)."""
    if dataset is None:
        raise ValueError(f"{name} is required: a datasets.Dataset with a 'prompt' column or a list of prompts.")
    if isinstance(dataset, Dataset):
        if "prompt" not in dataset.column_names:
            raise ValueError(f"{name} needs a 'prompt' column, it has {dataset.column_names}.")
        return dataset
    if isinstance(dataset, str):
        raise ValueError(f"{name} is one string; pass a list of prompts (or a Dataset with a 'prompt' column).")
    prompts = list(dataset)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(f"{name} must be a non-empty list of prompt strings or a Dataset with 'prompt'.")
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
    """Gradient checkpointing (its block inputs on the host with ``activation_offload``), the CFG branches one after
    the other (``sequential_cfg``), the VAE's tiling and slicing, and the idle expert on the host
    (``offload_idle_expert``), as configured (docs/training_on_gpus.md); each leaves the training result unchanged."""
    if config.activation_offload:  # diffusers' hook for the checkpointing function
        function = activation_offload.offloaded_checkpoint
        backbone.transformer.enable_gradient_checkpointing(gradient_checkpointing_func=function)
    elif config.diffusers_gradient_checkpointing:
        backbone.transformer.enable_gradient_checkpointing()
    if config.sequential_cfg:
        backbone.enable_sequential_cfg()
    backbone.enable_vae_memory_savers(tiling=config.vae_tiling, slicing=config.vae_slicing)
    backbone.park_idle_experts()  # offload_idle_expert


TEXT_ENCODER_NAMES = ("text_encoder", "text_encoder_2")
"""Where a backbone (or its diffusers pipeline) keeps its text encoders."""


def text_encoders(backbone: VideoBackbone) -> list[torch.nn.Module]:
    """The backbone's text encoders (`TEXT_ENCODER_NAMES` of its pipeline, or of itself without one)."""
    owner = getattr(backbone, "pipeline", backbone)
    modules = [getattr(owner, name, None) for name in TEXT_ENCODER_NAMES]
    return [module for module in modules if isinstance(module, torch.nn.Module)]


def parked_while_encoding(backbone: VideoBackbone) -> list[torch.nn.Module]:
    """What waits on the host while prompts are precomputed: every module of the backbone but its text encoders
    (the transformer, a second expert, the VAE). A module inside another one moves with it, through its owner's
    ``.to``: both Wan 2.2 experts through `WanExperts`, which keeps the idle one's weights on the host."""
    encoders = {id(module) for module in text_encoders(backbone)}
    components = getattr(getattr(backbone, "pipeline", None), "components", None) or {}
    modules = [backbone.transformer, backbone.vae, *components.values()]
    unique = {id(module): module for module in modules if isinstance(module, torch.nn.Module)}
    inside = {id(child) for module in unique.values() for child in module.children()}
    return [module for key, module in unique.items() if key not in encoders and key not in inside]


@contextmanager
def text_encoders_alone_on(backbone: VideoBackbone, device: torch.device | str) -> Iterator[list[torch.nn.Module]]:
    """In the block the text encoders are on ``device`` and the backbone computes there, while everything else
    (`parked_while_encoding`, yielded) waits on the host; afterwards the text encoders go to the host and the rest
    to ``device``."""
    parked = parked_while_encoding(backbone)
    for module in parked:
        module.to("cpu")
    backbone.offload_text_encoders(device)
    try:
        with backbone.computing_on(device):
            yield parked
    finally:
        backbone.offload_text_encoders()
        for module in parked:
            module.to(device)


def precompute_prompt_embeddings(
    backbone: VideoBackbone,
    prompts: list[str],
    negative_prompt: str | None,
    device: torch.device | str,
    batch_size: int,
) -> None:
    """Encode every distinct prompt once into the backbone's prompt cache (on the host), before the transformer
    occupies ``device`` (``precompute_prompt_embeddings``): the text encoders alone on ``device``
    (`text_encoders_alone_on`), ``batch_size`` prompts per call (``prompt_encode_batch_size``). So encoding, a
    one-time phase, never holds the text encoders and the transformer on the device together
    (docs/training_on_gpus.md)."""
    distinct = list(dict.fromkeys(prompts))
    with text_encoders_alone_on(backbone, device):
        for start in range(0, len(distinct), batch_size):
            backbone.encode_prompts(distinct[start : start + batch_size], negative_prompt)
