"""Flow-matching video backbones behind one protocol (`VideoBackbone`), and `load_backbone` to pick one.

Backbones are plug-ins (`sage_env.plugins`, entry-point group ``sage_grpo.backbones``), found by the
``_class_name`` of a diffusers ``model_index.json``; the built-ins, declared in this library's pyproject:

========================  ===============================================  ==========================
pipeline class            backbone                                         models
========================  ===============================================  ==========================
``WanPipeline``           `sage_env.backbones.wan.WanBackbone`              Wan 2.1 / 2.2 T2V
``HunyuanVideo15Pipeline`` `sage_env.backbones.hunyuan.HunyuanVideo15Backbone` HunyuanVideo 1.5 T2V
``toy``                   `sage_env.backbones.toy.ToyBackbone`              the built-in toy world
========================  ===============================================  ==========================

Backbone modules are imported on first use, so importing sage_env stays cheap. Each backbone class declares its
own sampling defaults (`VideoBackbone.sampling_defaults`: size, steps, schedule shift, guidance, fps); backbones
over a diffusers pipeline derive from `sage_env.backbones.pipeline.PipelineBackbone` (the pipeline's own schedule).
"""

from __future__ import annotations

from typing import Any

import torch

from sage_env.backbones.base import PromptConditioning, VideoBackbone
from sage_env.models import SamplingDefaults, check_local_reference, pipeline_class_of
from sage_env.plugins import GROUPS, PluginGroup, load_object

__all__ = [
    "BACKBONES",
    "TORCH_DTYPES",
    "PromptConditioning",
    "VideoBackbone",
    "backbone_class",
    "load_backbone",
    "register_backbone",
    "resolve_torch_dtype",
    "sampling_defaults",
]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The parameter dtypes a video model loads in, by the names configs and command lines use."""


def resolve_torch_dtype(value: torch.dtype | str | None, name: str = "torch_dtype") -> torch.dtype | None:
    """``value`` as a torch dtype: a dtype of `TORCH_DTYPES`, one of its names, or None (the model's default)."""
    if value is None or (isinstance(value, torch.dtype) and value in TORCH_DTYPES.values()):
        return value
    if isinstance(value, str) and value in TORCH_DTYPES:
        return TORCH_DTYPES[value]
    raise ValueError(
        f"{name} must be one of {', '.join(TORCH_DTYPES)} (or a torch dtype of them), got {value!r}."
    )


def _as_backbone_class(loaded: Any, name: str) -> type[VideoBackbone]:
    """What a ``sage_grpo.backbones`` entry point loads: a `VideoBackbone` subclass registered under its own name."""
    if not (isinstance(loaded, type) and issubclass(loaded, VideoBackbone)):
        raise TypeError(f"a backbone entry point must load a VideoBackbone subclass, got {loaded!r}")
    if loaded.pipeline_class not in (None, name) and ":" not in name:
        raise ValueError(
            f"{loaded.__name__}.pipeline_class is {loaded.pipeline_class!r}; declare it under that name"
        )
    return loaded


BACKBONES = PluginGroup("backbone", GROUPS["backbones"], _as_backbone_class)
"""Every backbone by pipeline class name (the ``_class_name`` of a diffusers ``model_index.json``, or ``toy``): the
built-ins, an installed package's (entry-point group ``sage_grpo.backbones``), or ``"package.module:Class"``."""


def backbone_class(name: str) -> type[VideoBackbone]:
    """The backbone class of a pipeline class name (see `BACKBONES`; its module is imported on first use)."""
    return BACKBONES.load(name)


def sampling_defaults(pipeline_class: str) -> SamplingDefaults:
    """The `SamplingDefaults` of a pipeline class (``"WanPipeline"``, ``"HunyuanVideo15Pipeline"``, ``"toy"``, or an
    installed backbone plug-in's name): its backbone class's declaration. Imports that backbone's module."""
    return backbone_class(pipeline_class).sampling_defaults


def register_backbone(name: str, target: type[VideoBackbone] | str, *, overwrite: bool = False) -> None:
    """Register a backbone class (or ``"module:Class"``) under a pipeline class name in this process; a package
    declares it as an entry point instead."""
    cls = load_object(target, "backbone") if isinstance(target, str) else target
    BACKBONES.register(name, _as_backbone_class(cls, name if cls.pipeline_class is None else cls.pipeline_class),
                       overwrite=overwrite)  # fmt: skip


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
    torch_dtype = resolve_torch_dtype(torch_dtype)
    if model != "toy":
        check_local_reference(model, "model")
    name = backbone or pipeline_class_of(model, download=True)
    return backbone_class(name).from_pretrained(model, torch_dtype=torch_dtype, device=device, **kwargs)
