"""Pieces shared by the backbones over diffusers video pipelines (`WanBackbone`, `HunyuanVideo15Backbone`).

Private to `sage_env.backbones`: input checks for `predict_velocity`, moving text encoders on and off the
accelerator, and loading a pipeline folder with the ``torch_dtype``/``device`` arguments of the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import diffusers
import torch
from torch.utils.checkpoint import checkpoint

from sage_env.backbones.base import PromptConditioning

# diffusers 0.42 renamed from_pretrained's ``torch_dtype`` to ``dtype`` (the old name warns); older releases
# only know ``torch_dtype``.
_DIFFUSERS_MINOR = tuple(int(part) for part in diffusers.__version__.split(".")[:2])
_DTYPE_ARGUMENT = "dtype" if _DIFFUSERS_MINOR >= (0, 42) else "torch_dtype"


def load_pipeline(
    pipeline_class: type,
    model: str,
    torch_dtype: torch.dtype | None,
    device: torch.device | str | None,
    **kwargs: Any,
) -> Any:
    """``pipeline_class.from_pretrained(model, torch_dtype=...)`` moved to ``device`` (CPU when None)."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a local diffusers folder or a Hub id (a string), got {model!r}.")
    if torch_dtype is not None:
        kwargs[_DTYPE_ARGUMENT] = torch_dtype
    pipeline = pipeline_class.from_pretrained(model, **kwargs)
    if device is not None:
        pipeline.to(device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def check_pipeline(pipeline: Any, expected: type, backbone_name: str) -> None:
    """Raise ``ValueError`` unless ``pipeline`` is an instance of ``expected``."""
    if not isinstance(pipeline, expected):
        raise ValueError(
            f"{backbone_name} wraps a diffusers {expected.__name__}, got {type(pipeline).__name__}; load one with "
            f"{expected.__name__}.from_pretrained(...) or use {backbone_name}.from_pretrained(path)."
        )


def freeze(modules: Sequence[torch.nn.Module | None]) -> None:
    """Turn off gradients of the frozen parts (text encoders, VAE): they are never trained here."""
    for module in modules:
        if module is not None:
            module.requires_grad_(False)


def module_device(module: torch.nn.Module) -> torch.device:
    """Device of a module's first parameter (CPU for a module without parameters)."""
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


@contextmanager
def modules_on(modules: Sequence[torch.nn.Module], device: torch.device) -> Iterator[None]:
    """Run the block with ``modules`` on ``device``, then put every moved module back where it was.

    Text encoders offloaded to the CPU come to the accelerator only for the time of an encoding.
    """
    homes = [module_device(module) for module in modules]
    moved = [module for module, home in zip(modules, homes) if home != device]
    for module in moved:
        module.to(device)
    try:
        yield
    finally:
        for module, home in zip(modules, homes):
            if home != device:
                module.to(home)


def check_velocity_inputs(
    latents: torch.Tensor,
    sigma: torch.Tensor | float,
    conditioning: PromptConditioning,
    latent_channels: int,
    required: Sequence[str],
) -> torch.Tensor:
    """Validate ``predict_velocity`` arguments; return ``sigma`` as float32 ``(B,)`` on the latents' device."""
    if not isinstance(latents, torch.Tensor) or latents.ndim != 5 or latents.shape[1] != latent_channels:
        shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
        raise ValueError(
            f"latents must be a tensor (B, {latent_channels}, F', H', W') as given by latent_shape(...), got {shape}."
        )
    batch_size = latents.shape[0]
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device)
    if sigma.ndim == 0:
        sigma = sigma.expand(batch_size)
    if sigma.shape != (batch_size,):
        raise ValueError(f"sigma must have shape (B,) = ({batch_size},), got {tuple(sigma.shape)}.")
    if not torch.all((sigma >= 0) & (sigma <= 1)):
        raise ValueError(f"sigma must lie in [0, 1] (a flow-matching noise level), got {sigma.tolist()}.")
    if not isinstance(conditioning, PromptConditioning) or len(conditioning) != batch_size:
        count = (
            len(conditioning) if isinstance(conditioning, PromptConditioning) else type(conditioning).__name__
        )
        raise ValueError(
            f"conditioning must be a PromptConditioning with one row per latent ({batch_size}), got {count}; "
            "build it with backbone.encode_prompts(prompts) and select/repeat rows to match the batch."
        )
    missing = [name for name in required if name not in conditioning.tensors]
    if missing:
        raise ValueError(f"conditioning lacks {missing}: it was not made by this backbone's encode_prompts.")
    return sigma


def check_guidance_scale(guidance_scale: float) -> float:
    """Return ``guidance_scale`` as a float; raise ``ValueError`` unless it is finite."""
    if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float)):
        raise ValueError(f"guidance_scale must be a number, got {guidance_scale!r}.")
    if not math.isfinite(guidance_scale):
        raise ValueError(f"guidance_scale must be finite, got {guidance_scale!r}.")
    return float(guidance_scale)


def check_video_size(
    num_frames: int, height: int, width: int, temporal_factor: int, spatial_multiple: int, model_name: str
) -> None:
    """Raise ``ValueError`` naming the allowed sizes unless the VAE and patching can produce this video."""
    for name, value in (("num_frames", num_frames), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if (num_frames - 1) % temporal_factor != 0:
        lower = (num_frames - 1) // temporal_factor * temporal_factor + 1
        raise ValueError(
            f"{model_name} makes videos of {temporal_factor}k+1 frames (its VAE compresses time by "
            f"{temporal_factor} after the first frame); got num_frames={num_frames}, use {lower} or "
            f"{lower + temporal_factor}."
        )
    for name, value in (("height", height), ("width", width)):
        if value % spatial_multiple != 0:
            lower = max(value // spatial_multiple, 1) * spatial_multiple
            raise ValueError(
                f"{model_name} needs {name} to be a multiple of {spatial_multiple} (VAE downsampling x patch "
                f"size); got {value}, use {lower} or {lower + spatial_multiple}."
            )


def postprocess_video(pipeline: Any, video: torch.Tensor) -> torch.Tensor:
    """VAE output ``(B, 3, F, H, W)`` in [-1, 1] -> ``(B, F, 3, H, W)`` float32 in [0, 1], as the pipeline does."""
    frames = pipeline.video_processor.postprocess_video(video, output_type="pt")
    return frames.float()


def branch_prediction(model: Any, sequential: bool, **inputs: Any) -> torch.Tensor:
    """One CFG branch's prediction, ``model(**inputs)[0]``.

    ``sequential`` (`PipelineBackbone.sequential_cfg`, with gradients on): the whole branch is checkpointed
    (non-reentrant ``torch.utils.checkpoint``), so its forward keeps only its inputs, and the backward recomputes
    and backpropagates one branch after the other: the conditional and unconditional branches' saved activations
    (with gradient checkpointing, the block inputs) never exist together. Same gradients; one more forward per
    branch."""
    if sequential and torch.is_grad_enabled():
        return checkpoint(_first_output, model, use_reentrant=False, **inputs)
    return model(**inputs)[0]


def _first_output(model: Any, **inputs: Any) -> torch.Tensor:
    return model(**inputs)[0]

