"""The rollout loop: `BackbonePolicy` (a backbone as the policy) and `run_episode`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sage_env.backbones import VideoBackbone
from sage_env.env.trajectory import Trajectory
from sage_env.env.vector import DenoisingVectorEnv

__all__ = ["BackbonePolicy", "run_episode"]


class BackbonePolicy:
    """A backbone used as the policy: observation -> velocity (with classifier-free guidance), no gradients.

    Args:
        backbone: the video model.
        guidance_scale: CFG scale (None: the backbone's default).
        negative_prompt: negative prompt for CFG (None: the backbone's default).
        batch_size: videos per transformer forward (None: the whole batch at once).
    """

    def __init__(
        self,
        backbone: VideoBackbone,
        guidance_scale: float | None = 1.0,
        negative_prompt: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}.")
        self.backbone, self.guidance_scale = backbone, guidance_scale
        self.negative_prompt, self.batch_size = negative_prompt, batch_size

    @torch.no_grad()
    def __call__(self, observation: dict[str, Any]) -> torch.Tensor:
        """The velocity for an observation (numpy or torch values): a batched one of a `DenoisingVectorEnv`, or a
        single video's of a `DenoisingEnv` (then the velocity of that one video, without a batch dimension)."""
        if isinstance(observation["prompt"], str):
            batched = {
                "latents": torch.as_tensor(observation["latents"])[None],
                "sigma": torch.as_tensor(observation["sigma"]).reshape(1),
                "prompt": (observation["prompt"],),
            }
            return self(batched)[0]
        latents = torch.as_tensor(observation["latents"], device=self.backbone.device)
        sigma = torch.as_tensor(observation["sigma"], device=self.backbone.device)
        conditioning = self.backbone.encode_prompts(list(observation["prompt"]), self.negative_prompt)
        size = self.batch_size or len(latents)
        parts = [
            self.backbone.predict_velocity(
                latents[start : start + size],
                sigma[start : start + size],
                conditioning.select(range(start, min(start + size, len(latents)))),
                self.guidance_scale,
            )
            for start in range(0, len(latents), size)
        ]
        return torch.cat(parts)


def run_episode(
    env: DenoisingVectorEnv,
    policy: Callable[[dict[str, Any]], torch.Tensor],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Trajectory:
    """Reset ``env``, step it with ``policy(observation) -> velocity`` until the episode ends, return the
    recorded `Trajectory`."""
    observation, _ = env.reset(seed=seed, options=options)
    while True:
        observation, _, terminated, _, _ = env.step(policy(observation))
        if bool(terminated.all()):
            return env.trajectory
