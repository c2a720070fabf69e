"""HunyuanVideo 1.5 text-to-video (diffusers ``HunyuanVideo15Pipeline``, the paper's base model) as a `VideoBackbone`.

Every computation mirrors ``HunyuanVideo15Pipeline.__call__`` (diffusers 0.42), so a hand-written Euler loop
over `HunyuanVideo15Backbone.predict_velocity` reproduces ``pipe(..., output_type="latent")``:

* prompts: ``pipe.encode_prompt`` gives the Qwen2.5-VL embeddings (chat template, 1000 tokens after cropping
  the system prompt) and the ByT5 glyph embeddings (256 tokens; zeros with a zero mask when the prompt has no
  quoted text), each with its attention mask, in the transformer's dtype. The negative prompt defaults to
  ``""`` as in the pipeline.
* velocity: the transformer input is ``cat[latents, zero cond latents, zero mask]`` (``in_channels = 2C + 1``),
  the timestep ``sigma * 1000`` in the model dtype, zero image embeddings (729 tokens, text-to-video);
  guidance is the pipeline's ``guider`` (``ClassifierFreeGuidance``) arithmetic: ``uncond + g * (cond - uncond)``
  (``cond + g * (cond - uncond)`` with ``use_original_formulation``), then ``guidance_rescale``; no
  unconditional pass when ``g`` is 1 (0 for the original formulation). The pipeline takes its scale from
  ``pipe.guider.guidance_scale`` (and skips CFG when the guider is disabled): pass ``guidance_scale=None``
  for exactly that default, or a number to choose the scale. Returned as float32.
* decoding: ``latents / vae.config.scaling_factor``, VAE decode, the pipeline's post-processing.

Schedule: `HunyuanVideo15Backbone.sigmas` is what the pipeline sets with
``set_timesteps(sigmas=linspace(1, 0, N + 1)[:-1])``: ``sage_env.sde.flow_match_sigmas(N, scheduler.config.shift)``
up to float32 rounding (no ``sigma_min``; the last sigma before 0 is ``shift(1/N)``). A bare
``scheduler.set_timesteps(N)`` would give another schedule (see `sage_env.backbones.wan`).

Precision: the pipeline keeps latents in the transformer's dtype (bf16 for the released weights) and feeds
a bf16 timestep; the env keeps latents in float32, so bf16 rollouts agree with ``pipe(...)`` only to bf16
accuracy (float32 models agree to ~1e-6).

LoRA: the pipeline has no LoRA loader. `save_lora_weights` (inherited) writes
``pytorch_lora_weights.safetensors`` with keys ``transformer.<module>.lora_A.weight`` and the ``LoraConfig``
as metadata; `load_lora_weights` (inherited) reloads it with
``pipe.transformer.load_lora_adapter(path, prefix="transformer", use_safetensors=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from diffusers import HunyuanVideo15Pipeline
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.guiders.guider_utils import rescale_noise_cfg
from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import retrieve_timesteps

from sage_env.backbones import _diffusers
from sage_env.backbones._hunyuan_attention import use_key_padding_attention
from sage_env.backbones.base import PromptConditioning
from sage_env.backbones.pipeline import PipelineBackbone
from sage_env.models import SamplingDefaults

__all__ = ["HunyuanVideo15Backbone"]

_PROMPT_TENSORS = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2")
_TRANSFORMER_ARGUMENTS = (
    "encoder_hidden_states",
    "encoder_attention_mask",
    "encoder_hidden_states_2",
    "encoder_attention_mask_2",
)


class HunyuanVideo15Backbone(PipelineBackbone):
    """A diffusers ``HunyuanVideo15Pipeline`` behind the `VideoBackbone` protocol.

    Args:
        pipeline: a loaded ``HunyuanVideo15Pipeline`` (any device and dtype) whose ``guider`` is a
            ``ClassifierFreeGuidance`` active on every step (``start=0``, ``stop=1``): the backbone sees one
            step at a time and cannot apply a per-step guidance window.
        key_padding_attention: replace the joint attention's dense ``(B, N, N)`` token mask, which diffusers
            builds in every attention call (~1.2 GB of booleans per video at 480p x 81 frames, more as the
            SDPA bias), by a ``(B, N)`` key-padding mask. The video output is the same (padded text queries
            are never read; see `sage_env.backbones._hunyuan_attention`). The processors of the pipeline's
            transformer are replaced in place.

    Example:
        ```python
        backbone = HunyuanVideo15Backbone.from_pretrained(
            "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v", torch_dtype=torch.bfloat16, device="cuda"
        )
        conditioning = backbone.encode_prompts(["a cat surfing"])
        latents = torch.randn(1, *backbone.latent_shape(121, 480, 848), device="cuda")
        velocity = backbone.predict_velocity(latents, torch.ones(1, device="cuda"), conditioning, None)
        ```
    """

    default_lora_target_modules = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    )
    pipeline_class = "HunyuanVideo15Pipeline"
    sampling_defaults = SamplingDefaults(
        num_frames=81, height=480, width=848, num_steps=20, shift=None, guidance_scale=None, fps=24.0
    )
    """HunyuanVideo 1.5 480p T2V, the paper's base model (Sec. 4.1; ``None``: the pipeline's schedule and guider)."""

    def __init__(self, pipeline: HunyuanVideo15Pipeline, *, key_padding_attention: bool = True) -> None:
        super().__init__()
        _diffusers.check_pipeline(pipeline, HunyuanVideo15Pipeline, type(self).__name__)
        self._check_guider(pipeline.guider)
        channels = pipeline.num_channels_latents
        if pipeline.transformer.config.in_channels != 2 * channels + 1:
            raise ValueError(
                f"HunyuanVideo15Pipeline's transformer takes {pipeline.transformer.config.in_channels} channels; "
                f"text-to-video needs 2 * {channels} + 1 (latents, condition latents, mask)."
            )
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        if key_padding_attention:
            use_key_padding_attention(self.transformer)
        _diffusers.freeze([pipeline.text_encoder, pipeline.text_encoder_2, pipeline.vae])

    @staticmethod
    def _check_guider(guider: Any) -> None:
        if type(guider) is not ClassifierFreeGuidance:
            raise ValueError(
                f"HunyuanVideo15Backbone reproduces ClassifierFreeGuidance only, got {type(guider).__name__}; set "
                "pipe.guider = ClassifierFreeGuidance(guidance_scale=...)."
            )
        if guider.config.start != 0.0 or guider.config.stop != 1.0:
            raise ValueError(
                f"The pipeline's guider applies CFG only on steps in [{guider.config.start}, {guider.config.stop}) "
                "of the run; a backbone sees single steps. Set pipe.guider = pipe.guider.new(start=0.0, stop=1.0)."
            )

    @classmethod
    def from_pipeline(
        cls, pipeline: HunyuanVideo15Pipeline, *, key_padding_attention: bool = True
    ) -> HunyuanVideo15Backbone:
        """Wrap an already-loaded ``HunyuanVideo15Pipeline`` (same as ``HunyuanVideo15Backbone(pipeline)``)."""
        return cls(pipeline, key_padding_attention=key_padding_attention)

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        torch_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        key_padding_attention: bool = True,
        **kwargs: Any,
    ) -> HunyuanVideo15Backbone:
        """Load ``HunyuanVideo15Pipeline.from_pretrained(model, torch_dtype=..., **kwargs)``, on ``device``.

        ``torch_dtype=None`` keeps diffusers' default (float32); use ``torch.bfloat16`` on GPUs.
        ``key_padding_attention``: see the class arguments.
        """
        pipeline = _diffusers.load_pipeline(HunyuanVideo15Pipeline, model, torch_dtype, device, **kwargs)
        return cls(pipeline, key_padding_attention=key_padding_attention)

    # -- sizes -----------------------------------------------------------------------------------

    @property
    def num_latent_channels(self) -> int:
        """Channels of the denoised latents (the VAE's ``latent_channels``; the transformer takes ``2C + 1``)."""
        return self.pipeline.num_channels_latents

    def _pipeline_guidance_scale(self) -> float:
        """The CFG scale ``pipe(...)`` applies: the guider's ``guidance_scale``, or 1 (no CFG) when it is disabled."""
        guider = self.pipeline.guider
        if not guider.get_state()["enabled"]:
            return 0.0 if guider.use_original_formulation else 1.0
        return float(guider.guidance_scale)

    @classmethod
    def check_video_size(
        cls, configs: Mapping[str, Any], num_frames: int, height: int, width: int
    ) -> tuple[int, int]:
        """Raise unless the VAE (``temporal_``/``spatial_compression_ratio``) and the patch size can make this video;
        returns the VAE's ``(temporal, spatial)`` factors (the pipeline's own defaults, 4 and 16, without a VAE)."""
        vae, transformer = configs.get("vae") or {}, configs["transformer"]
        temporal, spatial = vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 16)
        multiple = spatial * transformer.get("patch_size", 1)
        _diffusers.check_video_size(num_frames, height, width, temporal, multiple, "HunyuanVideo 1.5")
        return temporal, spatial

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(C, (F - 1) / t + 1, H / s, W / s)``; frames ``t*k + 1``, height/width multiples of ``s * patch``."""
        configs = {"vae": self.pipeline.vae.config, "transformer": self.transformer.config}
        temporal, spatial = self.check_video_size(configs, num_frames, height, width)
        return (
            self.num_latent_channels,
            (num_frames - 1) // temporal + 1,
            height // spatial,
            width // spatial,
        )

    # -- prompts ---------------------------------------------------------------------------------

    def _text_encoders(self) -> list[torch.nn.Module]:
        return [self.pipeline.text_encoder, self.pipeline.text_encoder_2]

    def _encode_uncached(self, prompts: Sequence[str], negative_prompt: str | None) -> PromptConditioning:
        """Qwen2.5-VL + ByT5 embeddings and masks of the prompts and of the negative prompt (``""`` when None)."""
        with _diffusers.modules_on(self._text_encoders(), self.device):
            positive = self._embeds(list(prompts))
            negative = self._embeds([negative_prompt or ""])
        tensors = dict(zip(_PROMPT_TENSORS, positive))
        for name, tensor in zip(_PROMPT_TENSORS, negative):
            tensors[f"negative_{name}"] = tensor.expand(len(prompts), *tensor.shape[1:])
        return PromptConditioning(prompts, tensors)

    def _embeds(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        return self.pipeline.encode_prompt(
            prompt=prompts, device=self.device, dtype=self.transformer.dtype, batch_size=len(prompts)
        )

    def offload_text_encoders(self, device: torch.device | str = "cpu") -> None:
        """Move both text encoders to ``device``; new prompts are encoded on the transformer's device."""
        for encoder in self._text_encoders():
            encoder.to(device)

    def _set_timesteps(self, scheduler: Any, num_steps: int) -> None:
        # HunyuanVideo15Pipeline.__call__, "4. Prepare timesteps" (sigmas=None there).
        retrieve_timesteps(scheduler, num_steps, sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1])

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
        """Velocity ``(B, C, F', H', W')`` float32 for ``latents`` at per-sample ``sigma`` ``(B,)``, with CFG.

        ``guidance_scale=None`` applies the pipeline's own guidance (``pipe.guider``); a number replaces its scale
        and keeps its formulation and rescale.
        """
        required = _PROMPT_TENSORS + tuple(f"negative_{name}" for name in _PROMPT_TENSORS)
        sigma = _diffusers.check_velocity_inputs(
            latents, sigma, conditioning, self.num_latent_channels, required
        )
        scale = _diffusers.check_guidance_scale(
            self.default_guidance_scale if guidance_scale is None else guidance_scale
        )
        model = transformer if transformer is not None else self.transformer
        dtype = self.transformer.dtype
        inputs = self._model_inputs(latents, sigma, dtype)
        sequential = self.sequential_cfg and self._cfg_on(scale)  # only two branches can take turns
        positive = self._prompt_arguments(conditioning, "", dtype)
        prediction = _diffusers.branch_prediction(model, sequential, **inputs, **positive)
        guided = self._guide(model, inputs, conditioning, prediction, scale, sequential)
        return guided.float()

    def _cfg_on(self, scale: float) -> bool:
        """Whether the guider runs the unconditional branch at ``scale`` (not at 1, or 0 for the original
        formulation)."""
        return not math.isclose(scale, 0.0 if self.pipeline.guider.use_original_formulation else 1.0)

    def _model_inputs(self, latents: torch.Tensor, sigma: torch.Tensor, dtype: torch.dtype) -> dict[str, Any]:
        """Transformer inputs besides the prompt: ``cat[latents, 0, 0]``, timestep, zero image embeddings."""
        latents = latents.to(self.device, dtype)
        batch_size, channels, frames, height, width = latents.shape
        # Text-to-video: zero condition latents and a zero mask fill the extra C + 1 input channels.
        condition = torch.zeros(
            batch_size, channels + 1, frames, height, width, dtype=dtype, device=self.device
        )
        # The pipeline casts the scheduler's float32 timestep (sigma * 1000) to the model dtype.
        timestep = (sigma * self.pipeline.scheduler.config.num_train_timesteps).to(self.device, dtype)
        image_embeds = torch.zeros(
            batch_size,
            self.pipeline.vision_num_semantic_tokens,
            self.pipeline.vision_states_dim,
            dtype=dtype,
            device=self.device,
        )
        hidden_states = torch.cat([latents, condition], dim=1)
        return {
            "hidden_states": hidden_states,
            "timestep": timestep,
            "image_embeds": image_embeds,
            "return_dict": False,
        }

    def _prompt_arguments(
        self, conditioning: PromptConditioning, prefix: str, dtype: torch.dtype
    ) -> dict[str, Any]:
        tensors = (conditioning.tensors[prefix + name] for name in _PROMPT_TENSORS)
        return {
            argument: tensor.to(self.device, dtype)
            for argument, tensor in zip(_TRANSFORMER_ARGUMENTS, tensors)
        }

    def _guide(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        conditioning: PromptConditioning,
        prediction: torch.Tensor,
        scale: float,
        sequential: bool = False,
    ) -> torch.Tensor:
        """``ClassifierFreeGuidance.forward`` on the conditional prediction (and the unconditional one if CFG is on)."""
        guider = self.pipeline.guider
        original = guider.use_original_formulation
        guided = prediction
        if self._cfg_on(scale):
            negative = self._prompt_arguments(conditioning, "negative_", prediction.dtype)
            unconditional = _diffusers.branch_prediction(model, sequential, **inputs, **negative)
            shift = prediction - unconditional
            guided = (prediction if original else unconditional) + scale * shift
        if guider.guidance_rescale > 0.0:
            guided = rescale_noise_cfg(guided, prediction, guider.guidance_rescale)
        return guided

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, F, 3, H, W)`` float32 in [0, 1]: ``latents / scaling_factor``, VAE decode, post-process."""
        vae = self.pipeline.vae
        latents = latents.to(_diffusers.module_device(vae), vae.dtype) / vae.config.scaling_factor
        # One video at a time: the VAE's causal attention mask (diffusers 0.42) breaks for batches > 1
        # (what vae.enable_slicing() also does), and it bounds the decoder's memory.
        video = torch.cat([vae.decode(sample, return_dict=False)[0] for sample in latents.split(1)])
        return _diffusers.postprocess_video(self.pipeline, video)
