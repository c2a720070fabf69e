"""LoRA adapters on diffusers video transformers: add, save in the diffusers format, reload.

The diffusers format (``pytorch_lora_weights.safetensors``, keys prefixed ``transformer.``, the ``LoraConfig``
stored as metadata) is what users load with ``pipe.load_lora_weights(path)`` for Wan and
``pipe.transformer.load_lora_adapter(path, prefix="transformer")`` for HunyuanVideo 1.5. peft's own
``save_pretrained`` output does not load into diffusers, so it is never used here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from sage_env.backbones import VideoBackbone

__all__ = ["LORA_WEIGHT_NAME", "add_lora", "load_lora_state", "lora_config", "save_lora_adapter"]

LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
_PREFIX = "transformer."


def add_lora(backbone: VideoBackbone, peft_config: LoraConfig) -> LoraConfig:
    """Inject ``peft_config`` into ``backbone.transformer`` (targets default to the backbone's) and freeze the rest.

    Returns the config actually used.
    """
    if not isinstance(peft_config, LoraConfig):
        raise ValueError(f"peft_config must be a peft.LoraConfig, got {type(peft_config).__name__}.")
    if not peft_config.target_modules:
        peft_config.target_modules = list(backbone.default_lora_target_modules)
    transformer = backbone.transformer
    if not hasattr(transformer, "add_adapter"):
        raise ValueError(
            f"{type(transformer).__name__} has no add_adapter(); LoRA needs a diffusers ModelMixin."
        )
    transformer.requires_grad_(False)
    transformer.add_adapter(peft_config)
    trainable = [p for p in transformer.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError(
            f"LoRA target modules {peft_config.target_modules} matched nothing in the transformer."
        )
    # LoRA weights train in fp32 even when the base model runs in bf16 (stable Adam updates).
    for parameter in trainable:
        parameter.data = parameter.data.float()
    return peft_config


def lora_config(transformer: torch.nn.Module) -> LoraConfig:
    """The ``LoraConfig`` of the (single) adapter injected into ``transformer``."""
    configs: dict[str, Any] = getattr(transformer, "peft_config", {}) or {}
    if len(configs) != 1:
        raise ValueError(f"Expected exactly one LoRA adapter on the transformer, found {sorted(configs)}.")
    return next(iter(configs.values()))


def save_lora_adapter(
    backbone: VideoBackbone, directory: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Save the adapter of ``backbone.transformer`` in the diffusers format; returns the weights file.

    Args:
        backbone: the trained backbone.
        directory: output folder (created).
        state_dict: a full state dict of the transformer (e.g. gathered from FSDP); the live module's when None.
    """
    transformer = backbone.transformer
    config = lora_config(transformer)
    layers = get_peft_model_state_dict(transformer, state_dict=state_dict)
    layers = {name: tensor.detach().cpu().contiguous() for name, tensor in layers.items()}
    metadata = config.to_dict()
    metadata["target_modules"] = sorted(metadata.get("target_modules") or [])
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # One file per part of the transformer (`VideoBackbone.lora_files`: both Wan 2.2 experts get their own).
    for prefix, weight_name in backbone.lora_files().items():
        part = {name.removeprefix(prefix): tensor for name, tensor in layers.items() if name.startswith(prefix)}
        backbone.save_lora_weights(directory, part, metadata, weight_name=weight_name)
    return directory / LORA_WEIGHT_NAME


def load_lora_state(backbone: VideoBackbone, directory: str | os.PathLike) -> None:
    """Load saved adapter weights (`save_lora_adapter`'s files) into the adapter already injected into
    ``backbone.transformer`` (resume).

    Raises ``ValueError`` when a file or key is missing or unexpected, so a wrong checkpoint never loads silently.
    """
    transformer, saved = backbone.transformer, {}
    for prefix, weight_name in backbone.lora_files().items():
        path = Path(directory) / weight_name
        if not path.is_file():
            raise ValueError(f"No {weight_name} in {directory}; is this a LoRA checkpoint of this trainer?")
        try:
            saved |= {prefix + key.removeprefix(_PREFIX): value for key, value in load_file(path).items()}
        except SafetensorError as error:
            raise ValueError(
                f"{path} is not a readable safetensors file ({error}); the checkpoint is damaged."
            ) from error
    expected = set(get_peft_model_state_dict(transformer))
    if set(saved) != expected:
        missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
        raise ValueError(
            f"LoRA checkpoint does not match the adapter: missing {missing[:5]}, unexpected {unexpected[:5]}."
        )
    set_peft_model_state_dict(transformer, saved)
