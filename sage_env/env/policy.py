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

    Consecutive sub-environments with identical observations (the lanes of a branched rollout's node, see
    `sage_env.env.branching`) share one forward: a tree costs one transformer row per node, not per leaf.

    Args:
        backbone: the video model.
        guidance_scale: CFG scale (None: the backbone's default).
        negative_prompt: negative prompt for CFG (None: the backbone's default).
        batch_size: videos per transformer forward (None: the whole batch at once).
        share_identical_rows: one forward for consecutive identical observations (True), or every row its own
            (False: what `sage_trl`'s preflight traces, whose fake tensors hold no values to compare; the full batch
            bounds the memory either way).
    """

    def __init__(
        self,
        backbone: VideoBackbone,
        guidance_scale: float | None = 1.0,
        negative_prompt: str | None = None,
        batch_size: int | None = None,
        share_identical_rows: bool = True,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}.")
        self.backbone, self.guidance_scale = backbone, guidance_scale
        self.share_identical_rows = share_identical_rows
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
        prompts = list(observation["prompt"])
        if not self.share_identical_rows:
            return self._velocity(latents, sigma, prompts)
        distinct = _differs_from_previous(latents, sigma, prompts)
        if not bool(distinct.all()):  # a branched rollout's shared prefix: one forward per node
            rows = distinct.nonzero().squeeze(1)
            velocity = self._velocity(latents[rows], sigma[rows], [prompts[i] for i in rows.tolist()])
            return velocity[torch.cumsum(distinct, 0) - 1]
        return self._velocity(latents, sigma, prompts)

    def _velocity(self, latents: torch.Tensor, sigma: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        conditioning = self.backbone.encode_prompts(prompts, self.negative_prompt)
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


def _differs_from_previous(latents: torch.Tensor, sigma: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """``(N,)`` bool: row ``i`` is not an exact copy (latents, sigma, prompt) of row ``i - 1`` (row 0 always True).
    The lanes of a branched rollout's node are such copies (`sage_env.env.branching`); other rollouts have none."""
    same = (latents[1:] == latents[:-1]).flatten(1).all(1) & (sigma[1:] == sigma[:-1])
    same &= torch.tensor([a == b for a, b in zip(prompts[1:], prompts[:-1])], device=latents.device, dtype=torch.bool)
    return torch.cat([torch.ones(1, dtype=torch.bool, device=latents.device), ~same])


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
