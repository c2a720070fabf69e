"""The small protocol every flow-matching text-to-video model implements for sage_env.

A backbone wraps a video model (a diffusers pipeline, or the built-in toy model) behind six things an
environment and a learner need:

* `VideoBackbone.encode_prompts`: prompt strings -> `PromptConditioning` (cached per prompt, no graph);
* `VideoBackbone.predict_velocity`: latents at per-sample sigmas -> velocity after classifier-free guidance
  (differentiable: learners call it with gradients enabled);
* `VideoBackbone.decode`: latents -> videos ``(B, F, 3, H, W)`` float32 in [0, 1];
* `VideoBackbone.latent_shape`: the per-sample latent shape for (frames, height, width);
* `VideoBackbone.transformer`: the trainable ``torch.nn.Module`` (LoRA goes here);
* `VideoBackbone.default_lora_target_modules`: module names LoRA targets by default;
* `VideoBackbone.sigmas`: the noise levels a rollout of N steps visits (the model's own schedule).

Defaults (video size, steps, shift, guidance, fps) are the class's `VideoBackbone.sampling_defaults`.

Velocities follow the diffusers flow-matching convention ``v = noise - x0`` (the Euler step is
``x + (sigma' - sigma) * v``), which is what `sage_env.sde` expects.
"""

from __future__ import annotations

import os
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError

from sage_env import sde
from sage_env.models import GENERIC_SAMPLING_DEFAULTS, SamplingDefaults, check_local_reference

__all__ = ["PromptConditioning", "VideoBackbone"]


@dataclass
class PromptConditioning:
    """Batched prompt conditioning: backbone-specific tensors, all batch-first with the same batch size.

    Args:
        prompts: the prompt strings, one per row.
        tensors: named tensors (e.g. ``prompt_embeds``, ``negative_prompt_embeds``, attention masks), each of
            shape ``(B, ...)``. Their meaning belongs to the backbone that produced them.
    """

    prompts: tuple[str, ...]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prompts = tuple(self.prompts)
        for name, tensor in self.tensors.items():
            if tensor.shape[0] != len(self.prompts):
                raise ValueError(
                    f"Conditioning tensor {name!r} has batch size {tensor.shape[0]} but there are "
                    f"{len(self.prompts)} prompts."
                )

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, index: torch.Tensor | Sequence[int]) -> PromptConditioning:
        """Rows ``index`` (any order, repeats allowed) as a new conditioning."""
        index = torch.as_tensor(index, dtype=torch.long)
        tensors = {name: tensor[index.to(tensor.device)] for name, tensor in self.tensors.items()}
        return PromptConditioning(prompts=tuple(self.prompts[i] for i in index.tolist()), tensors=tensors)

    def to(self, device: torch.device | str) -> PromptConditioning:
        """A copy with every tensor on ``device``."""
        return PromptConditioning(self.prompts, {name: t.to(device) for name, t in self.tensors.items()})

    @classmethod
    def concat(cls, parts: Sequence[PromptConditioning]) -> PromptConditioning:
        """Stack conditionings of the same backbone along the batch dimension."""
        if not parts:
            raise ValueError("Cannot concatenate an empty list of conditionings.")
        names = parts[0].tensors.keys()
        if any(part.tensors.keys() != names for part in parts):
            raise ValueError("All conditionings must carry the same tensors to be concatenated.")
        prompts = tuple(prompt for part in parts for prompt in part.prompts)
        return cls(prompts, {name: torch.cat([part.tensors[name] for part in parts]) for name in names})


class VideoBackbone(ABC):
    """A flow-matching text-to-video model as sage_env sees it.

    Subclasses set `transformer` (the trainable module), `default_lora_target_modules` and `pipeline_class`,
    and implement the abstract methods. Prompt encodings are cached per prompt string by
    `encode_prompts` (implemented here on top of `_encode_uncached`), so a training loop encodes every
    prompt once.
    """

    transformer: torch.nn.Module
    default_lora_target_modules: tuple[str, ...] = ()
    pipeline_class: ClassVar[str | None] = None
    """This backbone's name in `sage_env.backbones.BACKBONES` (a pipeline's ``_class_name``, or a plug-in's name)."""
    sampling_defaults: ClassVar[SamplingDefaults] = GENERIC_SAMPLING_DEFAULTS
    """How the model samples by default: video size, steps, schedule shift, guidance, fps (declared once, here)."""

    def __init__(self) -> None:
        self._prompt_cache: dict[tuple[str, str | None], PromptConditioning] = {}

    @classmethod
    def check_video_size(
        cls, configs: Mapping[str, Any], num_frames: int, height: int, width: int
    ) -> tuple[int, int] | None:
        """Raise ``ValueError`` unless the model described by its component ``configs`` (``{"transformer": ...,
        "vae": ...}``, read from the model's files without its weights) can make a video of this size; returns the
        VAE's ``(temporal, spatial)`` compression. The default knows nothing and checks nothing (None)."""
        return None

    @classmethod
    @abstractmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        torch_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> VideoBackbone:
        """Load from a local diffusers folder or a Hub id (``torch_dtype``/``device`` as in diffusers)."""

    # -- defaults and schedule ---------------------------------------------------------------------

    @property
    def default_fps(self) -> float:
        """Frame rate of the model's videos (`sampling_defaults`)."""
        return self.sampling_defaults.fps

    @property
    def default_guidance_scale(self) -> float:
        """The CFG scale ``predict_velocity(..., guidance_scale=None)`` applies: the declared one (1 if none)."""
        declared = self.sampling_defaults.guidance_scale
        return 1.0 if declared is None else declared

    def sigmas(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """Noise levels ``1 = sigma_0 > ... > sigma_N = 0`` of an ``N``-step rollout: float32 ``(N + 1,)``.

        Here `sage_env.sde.flow_match_sigmas` ``(num_steps, shift)``, ``shift=None`` meaning the declared shift
        of `sampling_defaults`; backbones over a diffusers pipeline return the pipeline's own schedule instead.
        """
        shift = self.sampling_defaults.shift if shift is None else shift
        if shift is None:
            raise ValueError(f"{type(self).__name__} declares no schedule shift; pass shift=... (e.g. 5.0).")
        return sde.flow_match_sigmas(num_steps, shift)

    # -- prompts ---------------------------------------------------------------------------------

    def encode_prompts(
        self, prompts: Sequence[str], negative_prompt: str | None = None
    ) -> PromptConditioning:
        """Encode prompts (with the negative prompt for CFG), caching each prompt's rows; never builds a graph."""
        if isinstance(prompts, str):
            raise ValueError("encode_prompts takes a list of prompts; wrap a single prompt in a list.")
        missing = list(dict.fromkeys(p for p in prompts if (p, negative_prompt) not in self._prompt_cache))
        if missing:
            with torch.no_grad():
                encoded = self._encode_uncached(missing, negative_prompt).to("cpu")
            # The cache lives on the CPU: a long prompt list must not fill the accelerator.
            for row, prompt in enumerate(missing):
                self._prompt_cache[(prompt, negative_prompt)] = encoded.select([row])
        cached = PromptConditioning.concat([self._prompt_cache[(p, negative_prompt)] for p in prompts])
        return cached.to(self.device)

    def clear_prompt_cache(self) -> None:
        """Forget every cached prompt encoding."""
        self._prompt_cache.clear()

    @abstractmethod
    def _encode_uncached(self, prompts: Sequence[str], negative_prompt: str | None) -> PromptConditioning:
        """Encode ``prompts`` (distinct strings) in one batch; called without gradients."""

    # -- model -----------------------------------------------------------------------------------

    @abstractmethod
    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        conditioning: PromptConditioning,
        guidance_scale: float | None = 1.0,
        *,
        transformer: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """Velocity for ``latents`` ``(B, *latent_shape)`` at per-sample ``sigma`` ``(B,)``, after CFG
        (``guidance_scale=None``: `default_guidance_scale`).

        Returns a float32 tensor shaped like ``latents``. Differentiable with respect to the parameters of
        `transformer` when called with gradients enabled. ``transformer`` overrides the module that is
        *called* (e.g. the DDP-wrapped `transformer` during distributed training, so gradients synchronise);
        its configuration and dtype are still read from `transformer`.
        """

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode final latents to videos ``(B, F, 3, H, W)``, float32 in [0, 1]."""

    @abstractmethod
    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, ...]:
        """Per-sample latent shape (e.g. ``(C, F', H', W')``) for a video of the given size.

        Raises ``ValueError`` naming the allowed sizes when the model cannot produce that size.
        """

    # -- LoRA adapters in the diffusers format -----------------------------------------------------

    def trained_parts(self) -> dict[str, torch.nn.Module]:
        """``{prefix of trainable parameter names: module}``: the parts of `transformer` saved apart, each as a
        diffusers model folder after full fine-tuning (`transformer` itself, under ``""``, by default)."""
        return {"": self.transformer}

    def lora_files(self) -> dict[str, str]:
        """``{prefix of trainable parameter names: adapter file}``: where `save_lora_weights` writes the adapter of
        each part of `transformer` (one file, ``pytorch_lora_weights.safetensors``, for every part by default; Wan
        2.2 A14B with both experts trained has one per expert)."""
        from diffusers.loaders.lora_base import LORA_WEIGHT_NAME_SAFE

        return {"": LORA_WEIGHT_NAME_SAFE}

    def save_lora_weights(
        self,
        save_directory: str | os.PathLike,
        transformer_lora_layers: dict[str, torch.Tensor],
        adapter_metadata: dict[str, Any] | None = None,
        weight_name: str | None = None,
    ) -> None:
        """Write ``weight_name`` (``pytorch_lora_weights.safetensors`` when None) with ``transformer.``-prefixed
        keys, loadable with ``pipe.load_lora_weights(path)`` (pipelines with LoRA loaders) or
        ``transformer.load_lora_adapter(path, prefix="transformer")``. ``adapter_metadata`` (the ``LoraConfig`` as a
        dict) is stored in the file so a non-default alpha reloads exactly.
        """
        from diffusers.loaders import WanLoraLoaderMixin

        # The Wan mixin's writer is generic: it prefixes "transformer." and stores the metadata.
        WanLoraLoaderMixin.save_lora_weights(
            save_directory,
            transformer_lora_layers=transformer_lora_layers,
            transformer_lora_adapter_metadata=adapter_metadata,
            safe_serialization=True,
            weight_name=weight_name,
        )

    def load_lora_weights(self, path: str | os.PathLike, adapter_name: str = "default") -> None:
        """Load a diffusers-format LoRA file or folder into `transformer` as a new adapter ``adapter_name``
        (``transformer.load_lora_adapter(path, prefix="transformer", use_safetensors=True)``).

        Raises ``ValueError`` naming the adapter when ``path`` is a local path that does not exist, when diffusers
        refuses the file, or when it matches no module of `transformer` (where diffusers only warns).
        """
        self._load_adapter(
            path,
            adapter_name,
            lambda: self.transformer.load_lora_adapter(
                str(path), prefix="transformer", adapter_name=adapter_name, use_safetensors=True
            ),
        )

    def _load_adapter(
        self,
        path: str | os.PathLike,
        adapter_name: str,
        load: Callable[[], None],
        module: torch.nn.Module | None = None,
    ) -> None:
        """Run ``load`` (the diffusers loader call) with the checks diffusers does not make.

        Raises ``ValueError`` naming the adapter when ``path`` is a local path that does not exist, when loading
        fails, or when the adapter matches no module of ``module`` (`transformer` when None; e.g. keys without the
        ``transformer.`` prefix: diffusers only warns and loads nothing).
        """
        check_local_reference(path, "adapter")
        try:
            load()
        except (ValueError, OSError, SafetensorError, pickle.UnpicklingError) as error:
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            raise ValueError(
                f"adapter: {path} does not load into this model ({type(error).__name__}: {first_line}). Adapters are "
                "read as safetensors (or tensors-only .bin files, never unpickled): pass the folder sage-train saved."
            ) from error
        self._check_adapter_matches(path, adapter_name, module if module is not None else self.transformer)

    @staticmethod
    def _check_adapter_matches(path: str | os.PathLike, adapter_name: str, transformer: torch.nn.Module) -> None:
        """Raise (and remove an empty adapter) unless some module of ``transformer`` named in the file now carries
        the adapter."""
        from diffusers.loaders import WanLoraLoaderMixin
        from peft.tuners.tuners_utils import BaseTunerLayer

        # The Wan mixin's reader is generic (and converts community Wan formats to the diffusers keys).
        keys = list(WanLoraLoaderMixin.lora_state_dict(str(path)))
        targets = sorted({key.removeprefix("transformer.").split(".lora_")[0] for key in keys})
        modules = dict(transformer.named_modules())
        if any(
            isinstance(modules.get(name), BaseTunerLayer) and adapter_name in modules[name].lora_A
            for name in targets
        ):
            return
        if adapter_name in (getattr(transformer, "peft_config", None) or {}):
            transformer.delete_adapters(adapter_name)
        reason = (
            f"it names modules such as {targets[:2]} that this {type(transformer).__name__} does not have"
            if any(key.startswith("transformer.") for key in keys)
            else "none of its keys starts with 'transformer.' (the diffusers LoRA format sage-train writes)"
        )
        raise ValueError(
            f"adapter: {path} matches no module of the model: {reason}. Pass an adapter saved for this model."
        )

    # -- decoding memory -------------------------------------------------------------------------

    @property
    def vae(self) -> torch.nn.Module | None:
        """The autoencoder that decodes latents; None for pixel-space models."""
        return None

    def enable_vae_memory_savers(self, tiling: bool = False, slicing: bool = False) -> None:
        """Decode in spatial tiles and/or one video at a time (diffusers' ``enable_tiling``/``enable_slicing``)
        to bound the memory of decoding rollouts. Same videos up to the tiles' blending."""
        if not (tiling or slicing):
            return
        if self.vae is None:
            raise ValueError(
                f"{type(self).__name__} decodes without a VAE; vae_tiling/vae_slicing do not apply."
            )
        for wanted, method in ((tiling, "enable_tiling"), (slicing, "enable_slicing")):
            if wanted and not hasattr(self.vae, method):
                raise ValueError(f"{type(self.vae).__name__} has no {method}(); turn that saver off.")
            if wanted:
                getattr(self.vae, method)()

    def enable_sequential_cfg(self) -> None:
        """Backpropagate the two CFG branches of a training forward one after the other (``sequential_cfg``);
        backbones that compute CFG their own way raise."""
        raise ValueError(
            f"{type(self).__name__} computes its guidance its own way; sequential_cfg applies to the diffusers "
            "backbones (WanBackbone, HunyuanVideo15Backbone): turn it off."
        )

    # -- experts -----------------------------------------------------------------------------------

    @property
    def expert_names(self) -> tuple[str, ...]:
        """The model's experts (transformers that denoise different noise ranges); one for most models."""
        return ("transformer",)

    @property
    def trained_experts(self) -> tuple[int, ...]:
        """Indices into `expert_names` of the experts `transformer` holds (the ones that train)."""
        return (0,)

    def park_idle_experts(self) -> None:  # noqa: B027 (an optional hook: most models have nothing to park)
        """Move what waits for its turn off the device before training starts (Wan 2.2 A14B with
        ``offload_idle_expert``: the low-noise expert); nothing for single-expert models."""

    def expert_of(self, sigma: torch.Tensor) -> torch.Tensor:
        """Index into `expert_names` of the expert computing at each ``sigma`` (same shape, long): all 0 here."""
        return torch.zeros(sigma.shape, dtype=torch.long, device=sigma.device)

    # -- placement -------------------------------------------------------------------------------

    _compute_device: torch.device | None = None

    @property
    def device(self) -> torch.device:
        """Where the backbone computes: the trainable module's device, or the device `computing_on` names."""
        if self._compute_device is not None:
            return self._compute_device
        # The module's own answer first: both Wan 2.2 experts (`WanExperts`) compute where their adapters are,
        # whichever expert waits on the host.
        device = getattr(self.transformer, "device", None)
        return device if isinstance(device, torch.device) else next(self.transformer.parameters()).device

    @contextmanager
    def computing_on(self, device: torch.device | str) -> Iterator[None]:
        """Compute on ``device`` in the block (`device` says so) wherever the transformer is: how prompts are
        encoded on the accelerator before the transformer occupies it
        (`sage_trl.training_setup.precompute_prompt_embeddings`). Backbones encode on `device`, so plug-ins that do
        the same need nothing more."""
        previous = self._compute_device
        self._compute_device = torch.device(device)
        try:
            yield
        finally:
            self._compute_device = previous

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype of the trainable module (diffusers' ``ModelMixin.dtype``, which ignores the norms some
        models keep in float32; else the first parameter's dtype)."""
        dtype = getattr(self.transformer, "dtype", None)
        return dtype if isinstance(dtype, torch.dtype) else next(self.transformer.parameters()).dtype

    @abstractmethod
    def offload_text_encoders(self, device: torch.device | str = "cpu") -> None:
        """Move the text encoders to ``device`` (CPU by default) once prompts are cached, to free accelerator
        memory for training; `encode_prompts` moves them back when it meets a new prompt."""
