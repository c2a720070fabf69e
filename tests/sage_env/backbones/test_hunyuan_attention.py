"""The key-padding attention of HunyuanVideo 1.5: same velocities as diffusers' dense mask, O(N) mask memory."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

from sage_env.backbones import _hunyuan_attention
from sage_env.backbones._hunyuan_attention import KeyPaddingAttnProcessor, use_key_padding_attention
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE, build_tiny_hunyuan_pipeline

# Prompts of different lengths, one with quoted text (ByT5 tokens) and one without (an all-padding ByT5 row).
PROMPTS = ["a red ball rolls left across a long wooden table", 'a sign that says "OPEN"']


def velocities(backbone: HunyuanVideo15Backbone, *, requires_grad: bool = False) -> torch.Tensor:
    latents = torch.randn(2, *backbone.latent_shape(**TINY_VIDEO_SIZE), generator=torch.Generator().manual_seed(0))
    conditioning = backbone.encode_prompts(PROMPTS)
    sigma = torch.tensor([0.9, 0.4])
    with torch.set_grad_enabled(requires_grad):
        return backbone.predict_velocity(latents, sigma, conditioning, 6.0)


def processors(backbone: HunyuanVideo15Backbone) -> list[object]:
    return [block.attn.processor for block in backbone.transformer.transformer_blocks]


def test_key_padding_attention_reproduces_the_dense_mask_velocities():
    dense = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline(), key_padding_attention=False)
    key_padding = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline())
    assert all(isinstance(p, HunyuanVideo15AttnProcessor2_0) for p in processors(dense))
    assert all(isinstance(p, KeyPaddingAttnProcessor) for p in processors(key_padding))
    conditioning = key_padding.encode_prompts(PROMPTS).tensors
    # The test is only meaningful when some text tokens are padding.
    assert not conditioning["prompt_embeds_mask"].bool().all()
    difference = (velocities(dense) - velocities(key_padding)).abs().max().item()
    assert difference <= 1e-5


def test_gradients_match_the_dense_mask():
    dense = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline(), key_padding_attention=False)
    key_padding = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline())
    gradients = []
    for backbone in (dense, key_padding):
        velocities(backbone, requires_grad=True).square().mean().backward()
        gradients.append(torch.cat([p.grad.flatten() for p in backbone.transformer.parameters() if p.grad is not None]))
    assert gradients[0].shape == gradients[1].shape
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-4, atol=1e-6)


def test_attention_kernel_gets_a_per_key_mask_not_a_square_one(monkeypatch: pytest.MonkeyPatch):
    backbone = HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline())
    mask_shapes: list[tuple[int, ...]] = []
    original = _hunyuan_attention.dispatch_attention_fn

    def recording_dispatch(query, key, value, attn_mask=None, **kwargs):
        mask_shapes.append(tuple(attn_mask.shape))
        return original(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(_hunyuan_attention, "dispatch_attention_fn", recording_dispatch)
    velocities(backbone)
    # One call per block per CFG branch; each mask is (batch, tokens): one entry per key.
    assert len(mask_shapes) == 2 * len(backbone.transformer.transformer_blocks)
    assert all(len(shape) == 2 and shape[0] == 2 for shape in mask_shapes)


def test_installing_on_a_model_without_joint_blocks_fails_clearly():
    with pytest.raises(ValueError, match="HunyuanVideo15Transformer3DModel"):
        use_key_padding_attention(torch.nn.Linear(2, 2))
