"""Small, fully analytic stand-ins used by unit tests that need a backbone but not a real video model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.loaders import PeftAdapterMixin

from sage_env.backbones import PromptConditioning, VideoBackbone


class LinearVideoModel(ModelMixin, ConfigMixin, PeftAdapterMixin):
    """velocity = W x + b + prompt embedding: enough parameters to train, cheap enough for every test.

    A diffusers model (config, ``save_pretrained``/``from_pretrained``, LoRA through ``add_adapter``) like the
    real video transformers.
    """

    @register_to_config
    def __init__(self, channels: int = 3, embed_dim: int = 8) -> None:
        super().__init__()
        self.mix = torch.nn.Conv3d(channels, channels, kernel_size=1)
        self.prompt_proj = torch.nn.Linear(embed_dim, channels)
        self.sigma_proj = torch.nn.Linear(1, channels)

    def forward(
        self, latents: torch.Tensor, sigma: torch.Tensor, prompt_embeds: torch.Tensor
    ) -> torch.Tensor:
        bias = self.prompt_proj(prompt_embeds) + self.sigma_proj(sigma[:, None])
        return self.mix(latents) + bias[:, :, None, None, None]


class LinearBackbone(VideoBackbone):
    """A `VideoBackbone` whose latents are pixels ``(3, F, H, W)`` in [-1, 1] and whose model is linear.

    Prompt embeddings are a deterministic hash of the prompt text; ``encode_calls`` counts real encodings.
    """

    default_lora_target_modules = ("prompt_proj", "sigma_proj")
    default_fps = 8.0

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.transformer = LinearVideoModel()
        self.encode_calls = 0

    @classmethod
    def from_pretrained(
        cls, model: str, *, torch_dtype: Any = None, device: Any = None, **kwargs: Any
    ) -> LinearBackbone:
        return cls(**kwargs)

    def _encode_uncached(self, prompts: Sequence[str], negative_prompt: str | None) -> PromptConditioning:
        self.encode_calls += 1
        embeds = torch.stack([self._embed(p) for p in prompts])
        negative = self._embed(negative_prompt or "").expand(len(prompts), -1)
        return PromptConditioning(prompts, {"prompt_embeds": embeds, "negative_prompt_embeds": negative})

    @staticmethod
    def _embed(prompt: str) -> torch.Tensor:
        generator = torch.Generator().manual_seed(sum(ord(c) * (i + 1) for i, c in enumerate(prompt)) % 2**31)
        return torch.randn(8, generator=generator)

    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        conditioning: PromptConditioning,
        guidance_scale: float | None = 1.0,
        *,
        transformer: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        guidance_scale = self.default_guidance_scale if guidance_scale is None else guidance_scale
        module = transformer if transformer is not None else self.transformer
        cond = conditioning.tensors["prompt_embeds"].to(latents.device)
        velocity = module(latents, sigma, cond)
        if guidance_scale > 1:
            uncond = module(latents, sigma, conditioning.tensors["negative_prompt_embeds"].to(latents.device))
            velocity = uncond + guidance_scale * (velocity - uncond)
        return velocity.float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.clamp(-1, 1) + 1) / 2).permute(0, 2, 1, 3, 4).float()

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, ...]:
        if min(num_frames, height, width) < 1:
            raise ValueError("num_frames, height and width must be positive.")
        return (3, num_frames, height, width)

    def offload_text_encoders(self, device: torch.device | str = "cpu") -> None:
        """No text encoder to move: prompt embeddings are a hash."""


def mean_brightness(videos: torch.Tensor, prompts: Sequence[str], **kwargs: Any) -> torch.Tensor:
    """A reward that prefers bright videos."""
    return videos.mean(dim=(1, 2, 3, 4))
