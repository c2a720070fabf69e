"""HunyuanVideo15Backbone on the tiny random pipeline: inputs, guider arithmetic, prompts, decoding, LoRA."""

from __future__ import annotations

import pytest
import torch
from diffusers.guiders import ClassifierFreeGuidance, ClassifierFreeZeroStarGuidance
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file

from sage_env.backbones import PromptConditioning
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from tests.fixtures.tiny_pipelines import LATENT_CHANNELS, TINY_VIDEO_SIZE, build_tiny_hunyuan_pipeline
from tests.sage_env.backbones.forward_calls import recorded_calls

PROMPTS = ["a red ball rolls left", 'a sign that says "OPEN"']


def random_latents(backbone: HunyuanVideo15Backbone, batch_size: int = 2, seed: int = 0) -> torch.Tensor:
    shape = backbone.latent_shape(**TINY_VIDEO_SIZE)
    return torch.randn(batch_size, *shape, generator=torch.Generator().manual_seed(seed))


def direct_prediction(pipeline, latents, sigma, embeds) -> torch.Tensor:
    """The transformer called by hand as HunyuanVideo15Pipeline calls it for text-to-video."""
    batch_size = latents.shape[0]
    zeros = torch.zeros(batch_size, LATENT_CHANNELS + 1, *latents.shape[2:])
    with torch.no_grad():
        return pipeline.transformer(
            hidden_states=torch.cat([latents, zeros], dim=1),
            timestep=sigma * 1000,
            encoder_hidden_states=embeds[0],
            encoder_attention_mask=embeds[1],
            encoder_hidden_states_2=embeds[2],
            encoder_attention_mask_2=embeds[3],
            image_embeds=torch.zeros(batch_size, 729, pipeline.transformer.config.image_embed_dim),
            return_dict=False,
        )[0]


def reference_embeds(
    pipeline, prompts: list[str]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    with torch.no_grad():
        positive = pipeline.encode_prompt(prompts, batch_size=len(prompts))
        negative = pipeline.encode_prompt(None, batch_size=len(prompts))
    return positive, negative


# -- sizes and decoding --------------------------------------------------------------------------


def test_latent_shape_follows_vae_factors(tiny_hunyuan_backbone):
    assert tiny_hunyuan_backbone.latent_shape(5, 16, 16) == (LATENT_CHANNELS, 2, 1, 1)
    assert tiny_hunyuan_backbone.latent_shape(9, 32, 48) == (LATENT_CHANNELS, 3, 2, 3)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ((4, 16, 16), r"4k\+1 frames.*use 1 or 5"),
        ((5, 16, 40), r"width to be a multiple of 16.*use 32 or 48"),
    ],
)
def test_latent_shape_rejects_sizes_the_vae_cannot_make(tiny_hunyuan_backbone, size, message):
    with pytest.raises(ValueError, match=message):
        tiny_hunyuan_backbone.latent_shape(*size)


def test_decode_divides_by_the_scaling_factor(tiny_hunyuan_backbone):
    latents = torch.randn(
        2, *tiny_hunyuan_backbone.latent_shape(5, 32, 16), generator=torch.Generator().manual_seed(1)
    )
    videos = tiny_hunyuan_backbone.decode(latents)
    assert videos.shape == (2, 5, 3, 32, 16) and videos.dtype == torch.float32
    assert videos.min() >= 0 and videos.max() <= 1
    vae = tiny_hunyuan_backbone.pipeline.vae
    for row in range(2):
        with torch.no_grad():
            pixels = vae.decode(latents[row : row + 1] / 0.8, return_dict=False)[0]
        expected = (pixels / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)
        torch.testing.assert_close(videos[row : row + 1], expected, atol=1e-6, rtol=0)


# -- prompts -------------------------------------------------------------------------------------


def test_encode_prompts_matches_pipeline_and_caches(tiny_hunyuan_backbone):
    pipeline = tiny_hunyuan_backbone.pipeline
    with (
        recorded_calls(pipeline.text_encoder) as qwen_calls,
        recorded_calls(pipeline.text_encoder_2) as byt5_calls,
    ):
        conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    assert [call["input_ids"].shape[0] for call in qwen_calls] == [2, 1]
    assert len(byt5_calls) == 1  # only the prompt with quoted text runs the glyph encoder
    positive, negative = reference_embeds(pipeline, PROMPTS)
    names = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2")
    for name, expected, expected_negative in zip(names, positive, negative):
        torch.testing.assert_close(conditioning.tensors[name], expected, atol=0, rtol=0)
        torch.testing.assert_close(
            conditioning.tensors[f"negative_{name}"], expected_negative, atol=0, rtol=0
        )
    glyph_mask = conditioning.tensors["prompt_embeds_mask_2"]
    assert glyph_mask[0].sum() == 0 and glyph_mask[1].sum() > 0

    with recorded_calls(pipeline.text_encoder) as qwen_calls:
        tiny_hunyuan_backbone.encode_prompts(PROMPTS[::-1])
    assert qwen_calls == []
    with torch.enable_grad():
        fresh = tiny_hunyuan_backbone.encode_prompts(["another prompt"])
    assert all(tensor.grad_fn is None for tensor in fresh.tensors.values())


def test_offloaded_text_encoders_still_encode_new_prompts(tiny_hunyuan_backbone):
    before = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    tiny_hunyuan_backbone.offload_text_encoders("cpu")
    tiny_hunyuan_backbone.clear_prompt_cache()
    after = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    for name, tensor in before.tensors.items():
        torch.testing.assert_close(after.tensors[name], tensor, atol=0, rtol=0)


# -- velocity and guidance -----------------------------------------------------------------------


def test_transformer_input_is_latents_zero_condition_and_zero_mask(tiny_hunyuan_backbone):
    latents, sigma = random_latents(tiny_hunyuan_backbone), torch.tensor([0.9, 0.25])
    conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    with recorded_calls(tiny_hunyuan_backbone.transformer) as calls, torch.no_grad():
        tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, 1.0)
    (call,) = calls
    hidden_states = call["hidden_states"]
    assert hidden_states.shape[1] == 2 * LATENT_CHANNELS + 1
    torch.testing.assert_close(hidden_states[:, :LATENT_CHANNELS], latents, atol=0, rtol=0)
    assert not hidden_states[:, LATENT_CHANNELS:].any()
    torch.testing.assert_close(call["timestep"], sigma * 1000, atol=0, rtol=0)
    assert call["image_embeds"].shape == (2, 729, 12) and not call["image_embeds"].any()


def test_timestep_is_cast_to_the_model_dtype(tiny_hunyuan_path):
    backbone = HunyuanVideo15Backbone.from_pretrained(str(tiny_hunyuan_path), torch_dtype=torch.bfloat16)
    conditioning = backbone.encode_prompts(PROMPTS[:1])
    with recorded_calls(backbone.transformer) as calls, torch.no_grad():
        velocity = backbone.predict_velocity(
            random_latents(backbone, 1), torch.tensor([0.7]), conditioning, 1.0
        )
    assert calls[0]["timestep"].dtype == torch.bfloat16 and calls[0]["hidden_states"].dtype == torch.bfloat16
    assert velocity.dtype == torch.float32


@pytest.mark.parametrize(
    "guider",
    [
        ClassifierFreeGuidance(guidance_scale=3.0),
        ClassifierFreeGuidance(guidance_scale=3.0, guidance_rescale=0.7),
        ClassifierFreeGuidance(guidance_scale=3.0, use_original_formulation=True),
    ],
    ids=["cfg", "rescaled", "original-formulation"],
)
def test_guidance_reproduces_the_pipeline_guider(guider):
    pipeline = build_tiny_hunyuan_pipeline()
    pipeline.guider = guider
    backbone = HunyuanVideo15Backbone(pipeline)
    latents, sigma = random_latents(backbone), torch.tensor([1.0, 0.4])
    positive, negative = reference_embeds(pipeline, PROMPTS)
    cond = direct_prediction(pipeline, latents, sigma, positive)
    uncond = direct_prediction(pipeline, latents, sigma, negative)
    expected = guider.forward(cond, uncond).pred
    with recorded_calls(pipeline.transformer) as calls, torch.no_grad():
        velocity = backbone.predict_velocity(latents, sigma, backbone.encode_prompts(PROMPTS), None)
    assert len(calls) == 2
    torch.testing.assert_close(velocity, expected, atol=1e-6, rtol=0)


def test_guidance_scale_argument_overrides_the_guider_scale(tiny_hunyuan_backbone):
    pipeline = tiny_hunyuan_backbone.pipeline
    assert tiny_hunyuan_backbone.default_guidance_scale == 6.0
    latents, sigma = random_latents(tiny_hunyuan_backbone), torch.tensor([0.8, 0.8])
    conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    positive, negative = reference_embeds(pipeline, PROMPTS)
    cond = direct_prediction(pipeline, latents, sigma, positive)
    uncond = direct_prediction(pipeline, latents, sigma, negative)
    with torch.no_grad():
        for scale in (0.5, 2.0):
            velocity = tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, scale)
            torch.testing.assert_close(velocity, uncond + scale * (cond - uncond), atol=1e-6, rtol=0)


def test_no_unconditional_pass_at_scale_one_or_with_a_disabled_guider(tiny_hunyuan_backbone):
    latents, sigma = random_latents(tiny_hunyuan_backbone), torch.tensor([0.5, 0.3])
    conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    positive, _ = reference_embeds(tiny_hunyuan_backbone.pipeline, PROMPTS)
    expected = direct_prediction(tiny_hunyuan_backbone.pipeline, latents, sigma, positive)
    with recorded_calls(tiny_hunyuan_backbone.transformer) as calls, torch.no_grad():
        at_one = tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, 1.0)
        tiny_hunyuan_backbone.pipeline.guider.disable()
        assert tiny_hunyuan_backbone.default_guidance_scale == 1.0
        default = tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, None)
    assert len(calls) == 2
    torch.testing.assert_close(at_one, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(default, expected, atol=1e-6, rtol=0)


def test_velocity_is_differentiable_in_the_transformer(tiny_hunyuan_backbone):
    conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    velocity = tiny_hunyuan_backbone.predict_velocity(
        random_latents(tiny_hunyuan_backbone), torch.tensor([0.6, 0.2]), conditioning, 3.0
    )
    velocity.square().mean().backward()
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in tiny_hunyuan_backbone.transformer.parameters()
    )
    pipeline = tiny_hunyuan_backbone.pipeline
    frozen = [
        *pipeline.text_encoder.parameters(),
        *pipeline.text_encoder_2.parameters(),
        *pipeline.vae.parameters(),
    ]
    assert all(p.grad is None and not p.requires_grad for p in frozen)


def test_predict_velocity_rejects_foreign_conditioning(tiny_hunyuan_backbone):
    foreign = PromptConditioning(
        tuple(PROMPTS), {"prompt_embeds": torch.zeros(2, 3), "negative_prompt_embeds": torch.zeros(2, 3)}
    )
    with pytest.raises(ValueError, match="lacks"):
        tiny_hunyuan_backbone.predict_velocity(
            random_latents(tiny_hunyuan_backbone), torch.tensor([0.5, 0.5]), foreign
        )


@pytest.mark.parametrize(
    ("guider", "message"),
    [
        (ClassifierFreeGuidance(guidance_scale=5.0, start=0.2), "Set pipe.guider = pipe.guider.new"),
        (ClassifierFreeZeroStarGuidance(guidance_scale=5.0), "reproduces ClassifierFreeGuidance only"),
    ],
)
def test_guiders_it_cannot_reproduce_are_rejected(guider, message):
    pipeline = build_tiny_hunyuan_pipeline()
    pipeline.guider = guider
    with pytest.raises(ValueError, match=message):
        HunyuanVideo15Backbone(pipeline)


# -- LoRA ----------------------------------------------------------------------------------------


def test_lora_save_and_load_round_trip_reproduces_the_velocity(
    tiny_hunyuan_backbone, tiny_hunyuan_path, tmp_path
):
    latents, sigma = random_latents(tiny_hunyuan_backbone), torch.tensor([0.8, 0.3])
    conditioning = tiny_hunyuan_backbone.encode_prompts(PROMPTS)
    with torch.no_grad():
        base = tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, 3.0)
    config = LoraConfig(
        r=2, lora_alpha=6, target_modules=list(tiny_hunyuan_backbone.default_lora_target_modules)
    )
    tiny_hunyuan_backbone.transformer.add_adapter(config)
    torch.manual_seed(5)
    for name, parameter in tiny_hunyuan_backbone.transformer.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.5)
    with torch.no_grad():
        adapted = tiny_hunyuan_backbone.predict_velocity(latents, sigma, conditioning, 3.0)
    assert (adapted - base).abs().max() > 1e-3

    layers = get_peft_model_state_dict(tiny_hunyuan_backbone.transformer)
    assert any(".attn.add_q_proj." in key for key in layers) and any("token_refiner" in key for key in layers)
    tiny_hunyuan_backbone.save_lora_weights(tmp_path, layers, config.to_dict())
    weights = load_file(tmp_path / "pytorch_lora_weights.safetensors")
    assert {key.removeprefix("transformer.") for key in weights} == set(layers)

    reloaded = HunyuanVideo15Backbone.from_pretrained(str(tiny_hunyuan_path))
    reloaded.load_lora_weights(tmp_path)
    with torch.no_grad():
        velocity = reloaded.predict_velocity(latents, sigma, reloaded.encode_prompts(PROMPTS), 3.0)
    torch.testing.assert_close(velocity, adapted, atol=1e-6, rtol=0)
