"""Checks that need the model's facts, run once its configuration is read and before any weight loads.

A video size the VAE cannot make, a LoRA target that matches no layer or a rank larger than the layers it adapts
used to surface after the weights loaded (minutes for a real model), as a raw error or a multi-gigabyte
allocation. `check_model_facts` reads the model's configuration files (a local folder, the Hugging Face cache, the
configs shipped with the preflight; never a download), asks the backbone class for its size rule
(`VideoBackbone.check_video_size`) and builds the transformer on the ``meta`` device (no memory, no weights) to
match the LoRA targets the way peft does. A Hub model whose configuration is not on this machine is checked by the
backbone after it downloads.
"""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["check_model_facts", "check_video_settings", "model_components"]


def model_components(model_name_or_path: str) -> dict[str, Any] | None:
    """The model's component configs (``model_index``, ``transformer``, ``vae``, ...), None when not on this machine."""
    from sage_env.backbones.toy import TOY_PRIOR_PATH
    from sage_trl.preflight.models import resolve_model_configs

    reference = str(TOY_PRIOR_PATH) if model_name_or_path == "toy" else model_name_or_path
    try:
        return resolve_model_configs(reference).components
    except ValueError:
        return None


def _backbone_class(components: dict[str, Any], forced: str | None) -> type | None:
    from sage_env.backbones import BACKBONES, backbone_class

    name = forced or components["model_index"].get("_class_name")
    return backbone_class(name) if name in BACKBONES or (forced and ":" in forced) else None


def _meta_transformer(components: dict[str, Any]) -> torch.nn.Module | None:
    from sage_trl.preflight.models import build_component

    entry = components["model_index"].get("transformer")
    if not isinstance(entry, list) or "transformer" not in components:
        return None
    with torch.device("meta"):
        return build_component(entry[0], entry[1], dict(components["transformer"]), torch.float32)


def _matches(name: str, target: str, regex: bool) -> bool:
    """peft's rule: a regex (``target_modules`` given as one string) matches the whole name; a name of a list
    matches itself or a dotted suffix."""
    return re.fullmatch(target, name) is not None if regex else name == target or name.endswith(f".{target}")


def _check_lora(transformer: torch.nn.Module, targets: str | list[str], rank: int) -> None:
    regex = isinstance(targets, str)
    patterns = [targets] if regex else list(targets)
    linear = {n: m for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    unmatched = [p for p in patterns if not any(_matches(name, p, regex) for name in linear)]
    if unmatched:
        raise ValueError(
            f"lora_target_modules {unmatched} match no linear layer of the {type(transformer).__name__}; name layers "
            "it has (e.g. to_q, to_k, to_v, to_out.0), or leave it unset for the backbone's defaults."
        )
    layers = {n: m for n, m in linear.items() if any(_matches(n, p, regex) for p in patterns)}
    smallest = min(layers.items(), key=lambda item: min(item[1].in_features, item[1].out_features))
    limit = min(smallest[1].in_features, smallest[1].out_features)
    if rank > limit:
        raise ValueError(
            f"lora_r {rank} is larger than the smallest adapted layer ({smallest[0]}: {smallest[1].in_features} x "
            f"{smallest[1].out_features}); a LoRA rank is at most min(in, out) of the layers it adapts, use <= {limit}."
        )


def check_video_settings(
    model_name_or_path: str,
    backbone: str | None,
    num_frames: int | None,
    height: int | None,
    width: int | None,
) -> None:
    """Raise ``ValueError`` naming the sizes when the model cannot make a video of this size (see the module
    docstring); nothing is checked when the model's configuration is not on this machine or a size is unset."""
    components = model_components(model_name_or_path)
    backbone_class = _backbone_class(components, backbone) if components is not None else None
    sizes = (num_frames, height, width)
    if backbone_class is None or None in sizes or "transformer" not in components:
        return
    try:
        backbone_class.check_video_size(components, *sizes)
    except ValueError as error:
        raise ValueError(f"num_frames={sizes[0]}, height={sizes[1]}, width={sizes[2]}: {error}") from None


def check_model_facts(config: Any, peft_config: Any = None, model_name_or_path: str | None = None) -> None:
    """Raise ``ValueError`` when the run's video size or LoRA settings cannot work with the model, from its
    configuration alone (see the module docstring); nothing is checked when the configuration is unavailable.

    ``config``: a `SageGRPOConfig` (its model, backbone and video size); ``model_name_or_path`` replaces its model.
    """
    model = model_name_or_path or config.model_name_or_path
    check_video_settings(model, config.backbone, config.num_frames, config.height, config.width)
    components = model_components(model)
    if peft_config is None or components is None:
        return
    backbone_class = _backbone_class(components, config.backbone)
    transformer = _meta_transformer(components)
    targets = peft_config.target_modules or list(getattr(backbone_class, "default_lora_target_modules", ()))
    if transformer is not None and targets:
        _check_lora(transformer, targets if isinstance(targets, str) else list(targets), peft_config.r)
