"""``sequential_cfg``: each CFG branch of a forward with gradients is checkpointed as a whole, so the backward
recomputes and backpropagates the branches one after the other. The gradients must be the plain ones."""

from __future__ import annotations

import pytest
import torch

from sage_env.backbones import VideoBackbone
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from sage_env.backbones.wan import WanBackbone
from tests.doubles import LinearBackbone
from tests.fixtures.tiny_pipelines import (
    TINY_VIDEO_SIZE,
    build_tiny_hunyuan_pipeline,
    build_tiny_wan_pipeline,
)

BACKBONES = {
    "wan": lambda: WanBackbone(build_tiny_wan_pipeline()),
    "hunyuan": lambda: HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline()),
}


def gradients(backbone: VideoBackbone, guidance_scale: float) -> tuple[list[torch.Tensor], int]:
    """The transformer's gradients of a loss on the guided velocity, and how many transformer forwards ran."""
    backbone.transformer.requires_grad_(True)
    calls, forward = [], backbone.transformer.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    backbone.transformer.forward = counting  # (a forward hook does not see checkpoint's recomputation)
    conditioning = backbone.encode_prompts(["a red ball", "a blue cube"])
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, *backbone.latent_shape(**TINY_VIDEO_SIZE), generator=generator)
    velocity = backbone.predict_velocity(latents, torch.tensor([0.9, 0.4]), conditioning, guidance_scale)
    velocity.square().mean().backward()
    return [p.grad.clone() for p in backbone.transformer.parameters() if p.grad is not None], len(calls)


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_the_branches_taking_turns_give_the_plain_gradients(name: str) -> None:
    plain, plain_calls = gradients(BACKBONES[name](), 5.0)
    backbone = BACKBONES[name]()
    backbone.enable_sequential_cfg()
    turns, turn_calls = gradients(backbone, 5.0)
    assert len(turns) == len(plain) > 0
    for mine, reference in zip(turns, plain, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    assert (plain_calls, turn_calls) == (2, 4)  # each branch recomputed once in the backward


def test_without_cfg_nothing_is_recomputed() -> None:
    backbone = BACKBONES["wan"]()
    backbone.enable_sequential_cfg()
    assert gradients(backbone, 1.0)[1] == 1  # one branch: checkpointing it would only cost a forward


def test_a_backbone_with_its_own_guidance_refuses_it() -> None:
    with pytest.raises(ValueError, match="sequential_cfg applies to the diffusers backbones"):
        LinearBackbone().enable_sequential_cfg()
