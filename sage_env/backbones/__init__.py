"""Flow-matching video backbones behind one protocol (`VideoBackbone`), and `load_backbone` to pick one.

Built-in backbones, by the ``_class_name`` of a diffusers ``model_index.json``:

========================  ===============================================  ==========================
pipeline class            backbone                                         models
========================  ===============================================  ==========================
``WanPipeline``           `sage_env.backbones.wan.WanBackbone`              Wan 2.1 / 2.2 T2V
``HunyuanVideo15Pipeline`` `sage_env.backbones.hunyuan.HunyuanVideo15Backbone` HunyuanVideo 1.5 T2V
``toy``                   `sage_env.backbones.toy.ToyBackbone`              the built-in toy world
========================  ===============================================  ==========================

Backbone modules are imported on first use, so importing sage_env stays cheap. Each backbone's sampling
defaults (size, steps, schedule shift, guidance, fps) are declared under the same key in
`sage_env.models.SAMPLING_DEFAULTS`; backbones over a diffusers pipeline derive from
`sage_env.backbones.pipeline.PipelineBackbone` (the pipeline's own schedule).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from sage_env.backbones.base import PromptConditioning, VideoBackbone
from sage_env.models import check_local_reference, pipeline_class_of

__all__ = ["BACKBONES", "PromptConditioning", "VideoBackbone", "load_backbone", "register_backbone"]

BACKBONES: dict[str, str] = {
    "WanPipeline": "sage_env.backbones.wan:WanBackbone",
    "HunyuanVideo15Pipeline": "sage_env.backbones.hunyuan:HunyuanVideo15Backbone",
    "toy": "sage_env.backbones.toy:ToyBackbone",
}
"""Pipeline class name (or short name) -> ``"module:Class"`` of the backbone that loads it."""


def register_backbone(name: str, target: str, *, overwrite: bool = False) -> None:
    """Register a backbone class, given as ``"module:Class"``, for a pipeline class name."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:ClassName', got {target!r}.")
    if name in BACKBONES and not overwrite and BACKBONES[name] != target:
        raise ValueError(
            f"A backbone is already registered for {name!r} ({BACKBONES[name]}); pass overwrite=True."
        )
    BACKBONES[name] = target


def _backbone_class(name: str) -> type[VideoBackbone]:
    if name not in BACKBONES:
        raise ValueError(
            f"No backbone for pipeline class {name!r}; supported: {', '.join(BACKBONES)}. "
            "Register one with sage_env.backbones.register_backbone."
        )
    module_name, class_name = BACKBONES[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_backbone(
    model: str | VideoBackbone,
    *,
    backbone: str | None = None,
    torch_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    **kwargs: Any,
) -> VideoBackbone:
    """Load a backbone from a local diffusers folder, a Hub id, or ``"toy"`` (the built-in toy world).

    Args:
        model: a path, a Hub id, ``"toy"``, or an already-built `VideoBackbone` (returned as is). A local path
            that does not exist is a ``ValueError`` saying so.
        backbone: force a backbone by pipeline class name instead of reading ``model_index.json``.
        torch_dtype: parameter dtype (e.g. ``torch.bfloat16`` on GPU); the backbone's default when None.
        device: where to put the model; CPU when None.
        **kwargs: passed to the backbone's ``from_pretrained``.
    """
    if isinstance(model, VideoBackbone):
        return model
    if model != "toy":
        check_local_reference(model, "model")
    name = backbone or pipeline_class_of(model, download=True)
    return _backbone_class(name).from_pretrained(model, torch_dtype=torch_dtype, device=device, **kwargs)
