"""Backbones and rollouts the performance benchmarks share.

* `toy_backbone`: the toy world's backbone, either the shipped prior (``"prior"``, 143k parameters) or a
  randomly initialised wider/deeper ``WanTransformer3DModel`` of the same architecture family (``"wide"``,
  ``"large"``) whose compute dominates a step on a CPU;
* `tiny_wan_backbone`: the library's `WanBackbone` on the tiny random ``WanPipeline`` of the test fixtures
  (a real diffusers pipeline with its VAE);
* `agent_rollout`: one episode of a `DenoisingVectorEnv` driven by an agent's ``act``, the library's own loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers import WanTransformer3DModel
from transformers import ByT5Tokenizer

from agents import Agent
from sage_env.backbones import VideoBackbone, load_backbone
from sage_env.backbones.toy import (
    COORDINATE_CHANNELS,
    PIXEL_CHANNELS,
    ToyBackbone,
    build_toy_text_encoder,
)
from sage_env.env import DenoisingVectorEnv, Trajectory

__all__ = [
    "TOY_SIZES",
    "ToySize",
    "add_lora_adapter",
    "agent_rollout",
    "brightness",
    "count_parameters",
    "tiny_wan_backbone",
    "toy_backbone",
]


@dataclass(frozen=True)
class ToySize:
    """Width and depth of a toy transformer (the prior is 2 layers, 2 heads x 32, ffn 128)."""

    num_layers: int
    num_heads: int
    head_dim: int
    ffn_dim: int


TOY_SIZES: dict[str, ToySize] = {
    "wide": ToySize(num_layers=4, num_heads=4, head_dim=64, ffn_dim=1024),
    "large": ToySize(num_layers=6, num_heads=8, head_dim=64, ffn_dim=2048),
}
"""Random-init toy transformers bigger than the prior: ``wide`` ~4M parameters, ``large`` ~25M."""


def _toy_transformer(size: ToySize, seed: int) -> WanTransformer3DModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=size.num_heads,
            attention_head_dim=size.head_dim,
            in_channels=PIXEL_CHANNELS + COORDINATE_CHANNELS,
            out_channels=PIXEL_CHANNELS,
            text_dim=32,  # the toy text encoder's d_model
            freq_dim=64,
            ffn_dim=size.ffn_dim,
            num_layers=size.num_layers,
            rope_max_seq_len=32,
        ).eval()


def toy_backbone(name: str = "prior", seed: int = 0) -> ToyBackbone:
    """``"prior"``: the shipped toy prior; a key of `TOY_SIZES`: a random-init toy backbone of that size."""
    if name == "prior":
        return load_backbone("toy")
    if name not in TOY_SIZES:
        raise ValueError(f"Unknown toy backbone {name!r}; choose 'prior' or one of {', '.join(TOY_SIZES)}.")
    return ToyBackbone(_toy_transformer(TOY_SIZES[name], seed), build_toy_text_encoder(seed), ByT5Tokenizer())


def tiny_wan_backbone(seed: int = 0) -> VideoBackbone:
    """The library's `WanBackbone` on the tiny random ``WanPipeline`` of ``tests/fixtures`` (CPU, float32)."""
    from sage_env.backbones.wan import WanBackbone
    from tests.fixtures.tiny_pipelines import build_tiny_wan_pipeline

    return WanBackbone(build_tiny_wan_pipeline(seed), max_sequence_length=32)


def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of (trainable) parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def brightness(videos: torch.Tensor, prompts: Sequence[str], **kwargs: object) -> torch.Tensor:
    """A reward with spread for any model, even a random one: the mean brightness of each video.

    Benchmarks of memory and speed need every group to carry a learning signal; the toy reward of a random
    transformer's videos is often identical (0) across a group, which would skip the update.
    """
    return videos.mean(dim=(1, 2, 3, 4))


def add_lora_adapter(backbone: VideoBackbone, rank: int = 8, alpha: int = 16) -> None:
    """Inject a rank-``rank`` LoRA adapter on the backbone's default targets, as ``sage-train`` does."""
    from peft import LoraConfig

    from sage_trl.lora import add_lora

    add_lora(backbone, LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=True))


def agent_rollout(
    env: DenoisingVectorEnv,
    agent: Agent,
    seed: int | None = None,
    prompts: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
) -> Trajectory:
    """One episode: ``reset``, then ``step(agent.act(observation))`` until every video is scored.

    ``prompts`` (one per group) and ``seeds`` (one per video) fix what the env would otherwise sample.
    """
    options = {}
    if prompts is not None:
        options["prompts"] = list(prompts)
    if seeds is not None:
        options["seeds"] = list(seeds)
    observation, _ = env.reset(seed=seed, options=options or None)
    while True:
        observation, _, terminated, _, _ = env.step(agent.act(observation))
        if bool(terminated.all()):
            return env.trajectory
