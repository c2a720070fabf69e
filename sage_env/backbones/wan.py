"""Wan 2.1 / 2.2 text-to-video (diffusers ``WanPipeline``) as a sage_env `VideoBackbone`.

Every computation mirrors ``WanPipeline.__call__`` (diffusers 0.42), so a hand-written Euler loop over
`WanBackbone.predict_velocity` with the pipeline's sigmas reproduces ``pipe(..., output_type="latent")``:

* prompts: ``pipe.encode_prompt`` (UMT5, padded to ``max_sequence_length`` = 512 like ``__call__``); the
  negative prompt defaults to ``""`` as in the pipeline;
* velocity: ``timestep = sigma * num_train_timesteps`` (1000) per sample, latents and prompt embeddings cast
  to the transformer's dtype, CFG ``uncond + g * (cond - uncond)`` in that dtype, no unconditional pass when
  ``g <= 1``; returned as float32;
* decoding: ``latents * std + mean`` per channel (the VAE's ``latents_mean``/``latents_std``), VAE decode,
  the pipeline's video post-processing.

Model variants:

* Wan 2.1 T2V and Wan 2.2 TI2V-5B (``expand_timesteps=True``: one timestep per latent token, handled).
* Wan 2.2 A14B: two experts. ``pipe.transformer`` denoises high noise (``timestep >= boundary_ratio * 1000``)
  with ``guidance_scale``, ``pipe.transformer_2`` low noise with ``guidance_scale_2`` (defaults to
  ``guidance_scale``; CFG is on for both iff ``guidance_scale > 1``, as in the pipeline). The expert is
  chosen per sample from its sigma (`WanBackbone.expert_of`). `WanBackbone.transformer` is ``pipe.transformer``
  (``expert="transformer"``, the default: RL explores at high noise) or ``pipe.transformer_2``
  (``expert="transformer_2"``), the other one running frozen; or, with ``expert="both"``, both experts as one
  trainable `sage_env.backbones.wan_experts.WanExperts` (each sample computed by its own expert, gradients reaching
  only that expert), optionally with the idle expert's frozen weights on the host (``offload_idle_expert``).

Schedule: `WanBackbone.sigmas` is what ``WanPipeline.__call__`` sets with ``scheduler.set_timesteps(N)``.
With ``FlowMatchEulerDiscreteScheduler`` that is ``sigma_i = shift(u_i)``, ``u = linspace(1, shift(1/1000), N)``
(the scheduler shifts its own ``sigma_min`` once more) and a final 0, not `sage_env.sde.flow_match_sigmas`,
and an ``ode`` rollout reproduces ``pipe(...)``. The released Wan checkpoints ship
``UniPCMultistepScheduler`` (``flow_shift`` 3), a multistep solver: a rollout uses its sigmas but not its
multistep update, so it does not reproduce ``pipe(...)`` (see `sage_env.backbones.pipeline`).

Precision: in bf16 the pipeline keeps latents in bf16 after the first step; the env keeps them in float32,
so bf16 rollouts agree with ``pipe(...)`` only to bf16 accuracy (float32 models agree to ~1e-6).

LoRA: `WanBackbone.save_lora_weights` writes ``pytorch_lora_weights.safetensors`` through
``WanPipeline.save_lora_weights`` (keys ``transformer.<module>.lora_A.weight``, the ``LoraConfig`` as
metadata); `WanBackbone.load_lora_weights` loads it (or a community Wan LoRA) with
``pipe.load_lora_weights``, into ``transformer_2`` when that is the trainable expert. With ``expert="both"`` each
expert has its own adapter file: `LORA_WEIGHT_NAMES` (the high-noise one under diffusers' default name, so
``pipe.load_lora_weights(folder)`` loads it, the low-noise one loaded with ``weight_name=...,
load_into_transformer_2=True``, diffusers' convention for Wan 2.2 LoRAs).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from diffusers import WanPipeline
from diffusers.loaders.lora_base import LORA_WEIGHT_NAME_SAFE

from sage_env.backbones import _diffusers
from sage_env.backbones.base import PromptConditioning
from sage_env.backbones.pipeline import PipelineBackbone
from sage_env.backbones.wan_experts import EXPERT_NAMES, WanExperts
from sage_env.models import SamplingDefaults

__all__ = ["LORA_WEIGHT_NAMES", "WanBackbone"]

_EXPERT_CHOICES = (*EXPERT_NAMES, "both")

LORA_WEIGHT_NAMES = {
    "transformer": LORA_WEIGHT_NAME_SAFE,
    "transformer_2": LORA_WEIGHT_NAME_SAFE.replace(".safetensors", "_transformer_2.safetensors"),
}
"""With ``expert="both"``: each expert's adapter file (``pytorch_lora_weights.safetensors`` and
``pytorch_lora_weights_transformer_2.safetensors``)."""


class WanBackbone(PipelineBackbone):
    """A diffusers ``WanPipeline`` (Wan 2.1 / 2.2 T2V) behind the `VideoBackbone` protocol.

    Args:
        pipeline: a loaded ``WanPipeline`` (any device and dtype).
        max_sequence_length: text tokens per prompt (``WanPipeline.__call__`` uses 512).
        expert: for Wan 2.2 A14B, which expert is `transformer` (trainable): ``"transformer"`` (high noise),
            ``"transformer_2"`` (low noise) or ``"both"`` (a `WanExperts` of the two). Single-expert models need the
            default.
        guidance_scale_2: CFG scale of the low-noise expert (Wan 2.2 A14B); ``None`` uses ``guidance_scale``.
        offload_idle_expert: with ``expert="both"``, keep the frozen weights of the expert not computing on the
            host (`WanExperts.activate`); the adapters stay on the device. The experts' own weights are frozen here
            (only LoRA adapters can train then), so that moves before the adapters exist already leave the idle
            expert's weights on the host.

    Example:
        ```python
        backbone = WanBackbone.from_pretrained("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", torch_dtype=torch.bfloat16,
                                               device="cuda")
        conditioning = backbone.encode_prompts(["a cat surfing"])
        latents = torch.randn(1, *backbone.latent_shape(81, 480, 832), device="cuda")
        velocity = backbone.predict_velocity(latents, torch.ones(1, device="cuda"), conditioning, 5.0)
        ```
    """

    default_lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")
    pipeline_class = "WanPipeline"
    sampling_defaults = SamplingDefaults(
        num_frames=81, height=480, width=832, num_steps=20, shift=None, guidance_scale=None, fps=16.0
    )
    """Wan 2.1 / 2.2 T2V at 480p (``sage_env.models`` explains ``None``: the checkpoint's own schedule and CFG)."""

    def __init__(
        self,
        pipeline: WanPipeline,
        *,
        max_sequence_length: int = 512,
        expert: Literal["transformer", "transformer_2", "both"] = "transformer",
        guidance_scale_2: float | None = None,
        offload_idle_expert: bool = False,
    ) -> None:
        super().__init__()
        _diffusers.check_pipeline(pipeline, WanPipeline, type(self).__name__)
        if (
            isinstance(max_sequence_length, bool)
            or not isinstance(max_sequence_length, int)
            or max_sequence_length < 1
        ):
            raise ValueError(f"max_sequence_length must be a positive integer, got {max_sequence_length!r}.")
        self.pipeline = pipeline
        self.max_sequence_length = max_sequence_length
        self.expert = self._check_expert(pipeline, expert)
        self.guidance_scale_2 = (
            None if guidance_scale_2 is None else _diffusers.check_guidance_scale(guidance_scale_2)
        )
        if guidance_scale_2 is not None and pipeline.config.boundary_ratio is None:
            raise ValueError(
                "guidance_scale_2 is only used by two-expert Wan 2.2 pipelines (boundary_ratio set)."
            )
        if offload_idle_expert and self.expert != "both":
            raise ValueError(
                "offload_idle_expert swaps the idle one of two trained experts: it needs expert='both'."
            )
        self.transformer = (
            WanExperts(pipeline.transformer, pipeline.transformer_2)
            if self.expert == "both"
            else getattr(pipeline, self.expert)
        )
        if self.expert == "both":
            self.transformer.offload_idle = offload_idle_expert
        frozen_expert = {"transformer": pipeline.transformer_2, "transformer_2": pipeline.transformer}
        _diffusers.freeze([pipeline.text_encoder, pipeline.vae, frozen_expert.get(self.expert)])
        if offload_idle_expert:  # what swaps is the frozen weights: frozen from the start, before any move
            _diffusers.freeze([self.transformer])

    @staticmethod
    def _check_expert(pipeline: WanPipeline, expert: str) -> str:
        if expert not in _EXPERT_CHOICES:
            raise ValueError(f"expert must be one of {_EXPERT_CHOICES}, got {expert!r}.")
        if pipeline.transformer is None:
            raise ValueError(
                "WanBackbone needs pipe.transformer (the only expert, or Wan 2.2's high-noise one)."
            )
        two_experts = pipeline.transformer_2 is not None
        if two_experts and pipeline.config.boundary_ratio is None:
            raise ValueError(
                "A WanPipeline with transformer and transformer_2 needs boundary_ratio in its config."
            )
        if expert in ("transformer_2", "both") and not two_experts:
            raise ValueError(
                f"expert={expert!r} needs a two-expert Wan 2.2 pipeline (with transformer_2)."
            )
        return expert

    @classmethod
    def from_pipeline(cls, pipeline: WanPipeline, **kwargs: Any) -> WanBackbone:
        """Wrap an already-loaded ``WanPipeline`` (same as ``WanBackbone(pipeline, **kwargs)``)."""
        return cls(pipeline, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        torch_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        max_sequence_length: int = 512,
        expert: Literal["transformer", "transformer_2", "both"] = "transformer",
        guidance_scale_2: float | None = None,
        offload_idle_expert: bool = False,
        **kwargs: Any,
    ) -> WanBackbone:
        """Load ``WanPipeline.from_pretrained(model, torch_dtype=..., **kwargs)`` from a folder or Hub id, on ``device``.

        ``torch_dtype=None`` keeps diffusers' default (float32); use ``torch.bfloat16`` on GPUs. With
        ``offload_idle_expert`` the idle expert's weights never go to ``device``: the pipeline loads on the host and
        moves there without them (both A14B experts, 53.4 GiB in bf16, exceed the cards this option is for).
        """
        on_host = offload_idle_expert and device is not None
        pipeline = _diffusers.load_pipeline(WanPipeline, model, torch_dtype, None if on_host else device, **kwargs)
        backbone = cls(
            pipeline,
            max_sequence_length=max_sequence_length,
            expert=expert,
            guidance_scale_2=guidance_scale_2,
            offload_idle_expert=offload_idle_expert,
        )
        if on_host:
            for name, component in pipeline.components.items():
                if isinstance(component, torch.nn.Module) and name not in EXPERT_NAMES:
                    component.to(device)
            backbone.transformer.to(device)  # `WanExperts`: the idle expert's weights stay on the host
        return backbone

    # -- experts ---------------------------------------------------------------------------------

    @property
    def expert_names(self) -> tuple[str, ...]:
        """The pipeline's experts, high noise first (one name for single-expert models)."""
        return EXPERT_NAMES if self.pipeline.transformer_2 is not None else EXPERT_NAMES[:1]

    @property
    def trained_experts(self) -> tuple[int, ...]:
        """The experts `transformer` holds: both with ``expert="both"``, else the chosen one."""
        if self.expert == "both":
            return (0, 1)
        return (EXPERT_NAMES.index(self.expert),)

    def park_idle_experts(self) -> None:
        """With ``offload_idle_expert``: the high-noise expert computes first (rollouts start at high noise), so the
        low-noise one goes to the host now."""
        if self.expert == "both":
            self.transformer.activate(EXPERT_NAMES[0])

    def expert_of(self, sigma: torch.Tensor) -> torch.Tensor:
        """Index into `expert_names` of the expert that computes at each ``sigma`` (any shape): 1 (low noise) where
        ``sigma * 1000 < boundary_ratio * 1000``, the pipeline's rule, else 0."""
        boundary_ratio = self.pipeline.config.boundary_ratio
        if boundary_ratio is None:
            return super().expert_of(sigma)
        num_train_timesteps = self.pipeline.scheduler.config.num_train_timesteps
        return (sigma * num_train_timesteps < boundary_ratio * num_train_timesteps).long()

    # -- sizes -----------------------------------------------------------------------------------

    @property
    def num_latent_channels(self) -> int:
        """Latent channels the transformer denoises (``transformer.config.in_channels``, as the pipeline uses)."""
        return self.transformer.config.in_channels

    @classmethod
    def check_video_size(
        cls, configs: Mapping[str, Any], num_frames: int, height: int, width: int
    ) -> tuple[int, int]:
        """Raise unless the VAE (``scale_factor_temporal``/``_spatial``) and the patch size can make this video;
        returns the VAE's ``(temporal, spatial)`` factors (the pipeline's own defaults, 4 and 8, without a VAE)."""
        vae, transformer = configs.get("vae") or {}, configs["transformer"]
        temporal, spatial = vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)
        multiple = spatial * max(transformer.get("patch_size", (1, 2, 2))[1:])
        _diffusers.check_video_size(num_frames, height, width, temporal, multiple, "Wan")
        return temporal, spatial

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(C, (F - 1) / t + 1, H / s, W / s)`` with the VAE's temporal ``t`` and spatial ``s`` factors.

        Frames must be ``t*k + 1`` and height/width multiples of ``s * patch`` (16 for Wan 2.1); the pipeline
        would silently round other sizes, here they are an error.
        """
        configs = {"vae": self.pipeline.vae.config, "transformer": self.transformer.config}
        temporal, spatial = self.check_video_size(configs, num_frames, height, width)
        return (
            self.num_latent_channels,
            (num_frames - 1) // temporal + 1,
            height // spatial,
            width // spatial,
        )

    # -- prompts ---------------------------------------------------------------------------------

    def _encode_uncached(self, prompts: Sequence[str], negative_prompt: str | None) -> PromptConditioning:
        """UMT5 embeddings of the prompts and of the negative prompt (``""`` when None, as the pipeline)."""
        with _diffusers.modules_on([self.pipeline.text_encoder], self.device):
            prompt_embeds = self._t5_embeds(list(prompts))
            negative_embeds = self._t5_embeds([negative_prompt or ""])
        negative_embeds = negative_embeds.expand(len(prompts), -1, -1)
        return PromptConditioning(
            prompts, {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_embeds}
        )

    def _t5_embeds(self, prompts: list[str]) -> torch.Tensor:
        prompt_embeds, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return prompt_embeds

    def offload_text_encoders(self, device: torch.device | str = "cpu") -> None:
        """Move the UMT5 text encoder to ``device``; new prompts are encoded on the transformer's device."""
        self.pipeline.text_encoder.to(device)

    def _set_timesteps(self, scheduler: Any, num_steps: int) -> None:
        scheduler.set_timesteps(num_steps)  # WanPipeline.__call__, "4. Prepare timesteps"

    # -- model -----------------------------------------------------------------------------------

    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        conditioning: PromptConditioning,
        guidance_scale: float | None = 1.0,
        *,
        transformer: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """Velocity ``(B, C, F', H', W')`` float32 for ``latents`` at per-sample ``sigma`` ``(B,)`` with CFG.

        ``guidance_scale=None`` uses `default_guidance_scale` (the pipeline's, 5.0). Wan 2.2 A14B picks the expert
        of each sample from its sigma (see the module docstring); ``transformer`` replaces the trainable expert only.
        """
        sigma = _diffusers.check_velocity_inputs(
            latents,
            sigma,
            conditioning,
            self.num_latent_channels,
            ("prompt_embeds", "negative_prompt_embeds"),
        )
        scale = _diffusers.check_guidance_scale(
            self.default_guidance_scale if guidance_scale is None else guidance_scale
        )
        # The pipeline feeds the scheduler's timesteps, which are sigma * num_train_timesteps in float32.
        timestep = sigma * self.pipeline.scheduler.config.num_train_timesteps
        models = self._expert_models(transformer)
        if self.pipeline.config.boundary_ratio is None:
            return self._guided_velocity(
                models["transformer"], latents, timestep, conditioning, scale, scale
            ).float()
        low_noise_scale = scale if self.guidance_scale_2 is None else self.guidance_scale_2
        return self._two_expert_velocity(
            models, latents, timestep, conditioning, self.expert_of(sigma), (scale, low_noise_scale)
        )

    def _expert_models(self, transformer: torch.nn.Module | None) -> dict[str, Any]:
        """What computes for each expert: the pipeline's, with the trainable one replaced by ``transformer`` (for
        ``expert="both"``: the possibly DDP-wrapped `WanExperts`, called with the expert's name)."""
        models: dict[str, Any] = {"transformer": self.pipeline.transformer, "transformer_2": self.pipeline.transformer_2}
        trainable = transformer if transformer is not None else self.transformer
        if self.expert != "both":
            models[self.expert] = trainable
            return models
        return {name: functools.partial(trainable, name) for name in EXPERT_NAMES}

    def _two_expert_velocity(
        self,
        models: dict[str, torch.nn.Module],
        latents: torch.Tensor,
        timestep: torch.Tensor,
        conditioning: PromptConditioning,
        experts: torch.Tensor,
        scales: tuple[float, float],
    ) -> torch.Tensor:
        """Wan 2.2 A14B: each sample goes to its expert (``experts``: `expert_of` of its sigma, the pipeline's rule)."""
        parts, order = [], []
        for expert, (name, scale) in enumerate(zip(EXPERT_NAMES, scales)):
            index = (experts == expert).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            if self.expert == "both":
                self.transformer.activate(name)
            part = conditioning.select(index)
            # CFG is on for both experts iff the first scale asks for it (WanPipeline.do_classifier_free_guidance).
            parts.append(
                self._guided_velocity(models[name], latents[index], timestep[index], part, scale, scales[0])
            )
            order.append(index)
        velocity = torch.cat(parts)[torch.argsort(torch.cat(order))]
        return velocity.float()

    def _guided_velocity(
        self,
        model: torch.nn.Module,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        conditioning: PromptConditioning,
        scale: float,
        cfg_switch_scale: float,
    ) -> torch.Tensor:
        """One expert's prediction with CFG, in the model dtype (the pipeline's arithmetic, step for step)."""
        dtype = self.transformer.dtype
        hidden_states = latents.to(self.device, dtype)
        if self.pipeline.config.expand_timesteps:
            # Wan 2.2 TI2V: one timestep per latent token (patch 1x2x2), all equal for text-to-video.
            num_tokens = hidden_states[0, 0, :, ::2, ::2].numel()
            timestep = timestep[:, None].expand(-1, num_tokens)
        arguments = {
            "hidden_states": hidden_states,
            "timestep": timestep.to(self.device),
            "return_dict": False,
        }
        prompt_embeds = conditioning.tensors["prompt_embeds"].to(self.device, dtype)
        sequential = self.sequential_cfg and cfg_switch_scale > 1.0  # only two branches can take turns
        prediction = _diffusers.branch_prediction(model, sequential, encoder_hidden_states=prompt_embeds, **arguments)
        if cfg_switch_scale <= 1.0:
            return prediction
        negative_embeds = conditioning.tensors["negative_prompt_embeds"].to(self.device, dtype)
        unconditional = _diffusers.branch_prediction(
            model, sequential, encoder_hidden_states=negative_embeds, **arguments
        )
        return unconditional + scale * (prediction - unconditional)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, F, 3, H, W)`` float32 in [0, 1]: un-normalise per channel, VAE decode, post-process."""
        vae = self.pipeline.vae
        latents = latents.to(_diffusers.module_device(vae), vae.dtype)
        channels = vae.config.z_dim
        mean = (
            torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(latents.device, latents.dtype)
        )
        # Same arithmetic as the pipeline (divide by 1/std) so decoded videos match it bit for bit.
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(
            latents.device, latents.dtype
        )
        video = vae.decode(latents / inverse_std + mean, return_dict=False)[0]
        return _diffusers.postprocess_video(self.pipeline, video)

    # -- LoRA ------------------------------------------------------------------------------------

    def save_lora_weights(
        self,
        save_directory: str | os.PathLike,
        transformer_lora_layers: dict[str, torch.Tensor],
        adapter_metadata: dict[str, Any] | None = None,
        weight_name: str | None = None,
    ) -> None:
        """Write ``weight_name`` (``pytorch_lora_weights.safetensors`` when None) with
        ``WanPipeline.save_lora_weights``.

        ``transformer_lora_layers`` is ``peft.get_peft_model_state_dict`` of one expert; keys are stored with the
        ``transformer.`` prefix and ``adapter_metadata`` (``LoraConfig.to_dict()``) so a non-default alpha reloads
        exactly. Load with ``pipe.load_lora_weights(path)`` (add ``load_into_transformer_2=True`` for an adapter of
        the low-noise expert) or `load_lora_weights`.
        """
        type(self.pipeline).save_lora_weights(
            save_directory,
            transformer_lora_layers=transformer_lora_layers,
            transformer_lora_adapter_metadata=adapter_metadata,
            safe_serialization=True,
            weight_name=weight_name,
        )

    def trained_parts(self) -> dict[str, torch.nn.Module]:
        """With ``expert="both"``, each expert (saved in its pipeline folder, ``transformer/`` and ``transformer_2/``)."""
        if self.expert != "both":
            return super().trained_parts()
        return {f"{name}.": module for name, module in self.transformer.experts().items()}

    def lora_files(self) -> dict[str, str]:
        """With ``expert="both"``, one adapter file per expert (`LORA_WEIGHT_NAMES`, keyed by parameter prefix)."""
        if self.expert != "both":
            return super().lora_files()
        return {f"{name}.": LORA_WEIGHT_NAMES[name] for name in EXPERT_NAMES}

    def load_lora_weights(self, path: str | os.PathLike, adapter_name: str = "default") -> None:
        """Load a Wan LoRA (diffusers or community format) into `transformer` as adapter ``adapter_name``, with
        ``pipe.load_lora_weights``; raises ``ValueError`` as `VideoBackbone.load_lora_weights` does.

        With ``expert="both"``, ``path`` is a folder with `LORA_WEIGHT_NAMES` (what sage-train saves): each file goes
        into its expert (``load_into_transformer_2=True`` for the low-noise one, as diffusers loads Wan 2.2 LoRAs).
        """
        if self.expert != "both":
            self._load_adapter(
                path,
                adapter_name,
                lambda: self.pipeline.load_lora_weights(
                    str(path), adapter_name=adapter_name, load_into_transformer_2=self.expert == "transformer_2"
                ),
            )
            return
        for name in EXPERT_NAMES:
            file = os.path.join(str(path), LORA_WEIGHT_NAMES[name])
            if not os.path.isfile(file):
                raise ValueError(
                    f"adapter: {path} has no {LORA_WEIGHT_NAMES[name]}: an adapter of both Wan 2.2 experts is a "
                    f"folder with {sorted(LORA_WEIGHT_NAMES.values())} (what sage-train writes with expert both)."
                )
            self._load_adapter(
                file,
                adapter_name,
                lambda file=file, name=name: self.pipeline.load_lora_weights(
                    file, adapter_name=adapter_name, load_into_transformer_2=name == "transformer_2"
                ),
                self.transformer.expert(name),
            )
