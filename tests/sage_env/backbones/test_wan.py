"""WanBackbone on the tiny random WanPipeline: shapes, prompt cache, offload, velocity/CFG, Wan 2.2 experts, LoRA."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file

from sage_env.backbones import PromptConditioning
from sage_env.backbones.wan import WanBackbone
from tests.fixtures.tiny_pipelines import LATENT_CHANNELS, TINY_VIDEO_SIZE, build_tiny_wan_pipeline
from tests.sage_env.backbones.forward_calls import recorded_calls

PROMPTS = ["a red ball rolls left", "a blue cube jumps"]


def random_latents(backbone: WanBackbone, batch_size: int = 2, seed: int = 0) -> torch.Tensor:
    shape = backbone.latent_shape(**TINY_VIDEO_SIZE)
    return torch.randn(batch_size, *shape, generator=torch.Generator().manual_seed(seed))


def direct_prediction(backbone: WanBackbone, model, latents, sigma, embeds) -> torch.Tensor:
    """The transformer called by hand the way WanPipeline calls it (timestep = 1000 sigma)."""
    with torch.no_grad():
        return model(
            hidden_states=latents, timestep=sigma * 1000, encoder_hidden_states=embeds, return_dict=False
        )[0]


def reference_embeds(
    backbone: WanBackbone, prompts: list[str], negative: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return backbone.pipeline.encode_prompt(prompts, negative_prompt=negative, max_sequence_length=512)


# -- sizes ---------------------------------------------------------------------------------------


def test_latent_shape_follows_vae_factors(tiny_wan_backbone):
    assert tiny_wan_backbone.latent_shape(5, 16, 16) == (LATENT_CHANNELS, 2, 2, 2)
    assert tiny_wan_backbone.latent_shape(9, 32, 48) == (LATENT_CHANNELS, 3, 4, 6)
    assert tiny_wan_backbone.latent_shape(1, 16, 32) == (LATENT_CHANNELS, 1, 2, 4)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ((6, 16, 16), r"4k\+1 frames.*use 5 or 9"),
        ((5, 24, 16), r"height to be a multiple of 16.*use 16 or 32"),
        ((5, 16, 8), r"width to be a multiple of 16"),
        ((0, 16, 16), "positive integer"),
        ((5, 16.0, 16), "positive integer"),
    ],
)
def test_latent_shape_rejects_sizes_the_vae_cannot_make(tiny_wan_backbone, size, message):
    with pytest.raises(ValueError, match=message):
        tiny_wan_backbone.latent_shape(*size)


# -- decoding ------------------------------------------------------------------------------------


def test_decode_unnormalises_per_channel_then_decodes(tiny_wan_backbone):
    latents = random_latents(tiny_wan_backbone)
    videos = tiny_wan_backbone.decode(latents)
    assert videos.shape == (2, 5, 3, 16, 16) and videos.dtype == torch.float32
    assert videos.min() >= 0 and videos.max() <= 1
    vae = tiny_wan_backbone.pipeline.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        pixels = vae.decode(latents * std + mean, return_dict=False)[0]
    expected = (pixels / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)
    torch.testing.assert_close(videos, expected, atol=1e-5, rtol=0)


# -- prompts -------------------------------------------------------------------------------------


def test_encode_prompts_matches_pipeline_and_caches_each_prompt(tiny_wan_backbone):
    encoder = tiny_wan_backbone.pipeline.text_encoder
    with recorded_calls(encoder) as calls:
        conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    # One batch for the new prompts, one for the negative prompt.
    assert [call["args"][0].shape[0] for call in calls] == [2, 1]
    embeds, negative = reference_embeds(tiny_wan_backbone, PROMPTS)
    torch.testing.assert_close(conditioning.tensors["prompt_embeds"], embeds, atol=0, rtol=0)
    torch.testing.assert_close(conditioning.tensors["negative_prompt_embeds"], negative, atol=0, rtol=0)

    with recorded_calls(encoder) as calls:
        again = tiny_wan_backbone.encode_prompts([PROMPTS[1], PROMPTS[0], PROMPTS[1]])
    assert calls == []
    assert again.prompts == (PROMPTS[1], PROMPTS[0], PROMPTS[1])
    torch.testing.assert_close(again.tensors["prompt_embeds"][1], embeds[0], atol=0, rtol=0)

    with recorded_calls(encoder) as calls:
        tiny_wan_backbone.encode_prompts([PROMPTS[0], "a new prompt"])
    assert [call["args"][0].shape[0] for call in calls] == [1, 1]


def test_cached_encodings_carry_no_autograd_graph(tiny_wan_backbone):
    tiny_wan_backbone.pipeline.text_encoder.requires_grad_(True)
    with torch.enable_grad():
        conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    for tensor in conditioning.tensors.values():
        assert tensor.grad_fn is None and not tensor.requires_grad


def test_negative_prompt_is_encoded_like_the_pipeline(tiny_wan_backbone):
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS, negative_prompt="blurry, static")
    _, negative = reference_embeds(tiny_wan_backbone, PROMPTS, negative="blurry, static")
    torch.testing.assert_close(conditioning.tensors["negative_prompt_embeds"], negative, atol=0, rtol=0)


def test_offloaded_text_encoder_still_encodes_new_prompts(tiny_wan_backbone):
    before = tiny_wan_backbone.encode_prompts(PROMPTS[:1])
    tiny_wan_backbone.offload_text_encoders("cpu")
    tiny_wan_backbone.clear_prompt_cache()
    with recorded_calls(tiny_wan_backbone.pipeline.text_encoder) as calls:
        after = tiny_wan_backbone.encode_prompts(PROMPTS[:1])
    assert len(calls) == 2
    torch.testing.assert_close(
        after.tensors["prompt_embeds"], before.tensors["prompt_embeds"], atol=0, rtol=0
    )
    assert next(tiny_wan_backbone.pipeline.text_encoder.parameters()).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to offload from")
def test_offload_moves_the_encoder_off_the_accelerator_and_back_for_new_prompts(tiny_wan_path):
    backbone = WanBackbone.from_pretrained(str(tiny_wan_path), device="cuda")
    backbone.offload_text_encoders("cpu")
    encoder = backbone.pipeline.text_encoder
    assert next(encoder.parameters()).device.type == "cpu"
    with recorded_calls(encoder) as calls:
        conditioning = backbone.encode_prompts(PROMPTS)
    assert all(call["args"][0].device.type == "cuda" for call in calls)
    assert conditioning.tensors["prompt_embeds"].device.type == "cuda"
    assert next(encoder.parameters()).device.type == "cpu"


# -- velocity ------------------------------------------------------------------------------------


def test_velocity_without_guidance_is_one_conditional_pass(tiny_wan_backbone):
    latents, sigma = random_latents(tiny_wan_backbone), torch.tensor([0.9, 0.3])
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    embeds, _ = reference_embeds(tiny_wan_backbone, PROMPTS)
    expected = direct_prediction(tiny_wan_backbone, tiny_wan_backbone.transformer, latents, sigma, embeds)
    for scale in (1.0, 0.5):
        with recorded_calls(tiny_wan_backbone.transformer) as calls, torch.no_grad():
            velocity = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, scale)
        assert len(calls) == 1
        assert velocity.dtype == torch.float32 and velocity.shape == latents.shape
        torch.testing.assert_close(velocity, expected, atol=1e-6, rtol=0)


def test_velocity_with_guidance_combines_both_passes(tiny_wan_backbone):
    latents, sigma = random_latents(tiny_wan_backbone), torch.tensor([1.0, 0.5])
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    embeds, negative = reference_embeds(tiny_wan_backbone, PROMPTS)
    model = tiny_wan_backbone.transformer
    cond = direct_prediction(tiny_wan_backbone, model, latents, sigma, embeds)
    uncond = direct_prediction(tiny_wan_backbone, model, latents, sigma, negative)
    with recorded_calls(model) as calls, torch.no_grad():
        velocity = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, 3.0)
        default = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, None)
    assert len(calls) == 4
    torch.testing.assert_close(velocity, uncond + 3.0 * (cond - uncond), atol=1e-6, rtol=0)
    torch.testing.assert_close(default, uncond + 5.0 * (cond - uncond), atol=1e-6, rtol=0)


def test_velocity_uses_each_samples_own_sigma(tiny_wan_backbone):
    latents, sigma = random_latents(tiny_wan_backbone), torch.tensor([0.8, 0.2])
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    with torch.no_grad():
        batched = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, 2.0)
        first = tiny_wan_backbone.predict_velocity(latents[:1], sigma[:1], conditioning.select([0]), 2.0)
        second = tiny_wan_backbone.predict_velocity(latents[1:], sigma[1:], conditioning.select([1]), 2.0)
    torch.testing.assert_close(batched, torch.cat([first, second]), atol=1e-5, rtol=0)
    assert not torch.allclose(
        first, tiny_wan_backbone.predict_velocity(latents[:1], sigma[1:], conditioning.select([0]))
    )


def test_velocity_is_differentiable_in_the_transformer_only(tiny_wan_backbone):
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    velocity = tiny_wan_backbone.predict_velocity(
        random_latents(tiny_wan_backbone), torch.tensor([0.7, 0.4]), conditioning, 4.0
    )
    velocity.square().mean().backward()
    gradients = [p.grad for p in tiny_wan_backbone.transformer.parameters() if p.grad is not None]
    assert gradients and any(g.abs().sum() > 0 for g in gradients)
    frozen = [
        *tiny_wan_backbone.pipeline.text_encoder.parameters(),
        *tiny_wan_backbone.pipeline.vae.parameters(),
    ]
    assert all(p.grad is None and not p.requires_grad for p in frozen)


def test_transformer_argument_replaces_the_called_module(tiny_wan_backbone):
    latents, sigma = random_latents(tiny_wan_backbone), torch.tensor([0.6, 0.6])
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    replacement = build_tiny_wan_pipeline(seed=1).transformer
    with recorded_calls(replacement) as calls, torch.no_grad():
        velocity = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, transformer=replacement)
    assert len(calls) == 1
    embeds, _ = reference_embeds(tiny_wan_backbone, PROMPTS)
    torch.testing.assert_close(
        velocity, direct_prediction(tiny_wan_backbone, replacement, latents, sigma, embeds)
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"latents": torch.zeros(2, 3, 2, 2, 2)}, r"latents must be a tensor \(B, 4"),
        ({"sigma": torch.ones(3)}, r"sigma must have shape \(B,\)"),
        ({"sigma": torch.tensor([0.5, 1.5])}, r"sigma must lie in \[0, 1\]"),
        ({"conditioning": "prompts"}, "PromptConditioning with one row per latent"),
        ({"conditioning": PromptConditioning(("a",), {})}, "one row per latent"),
        ({"conditioning": PromptConditioning(("a", "b"), {"prompt_embeds": torch.zeros(2, 3)})}, "lacks"),
        ({"guidance_scale": float("nan")}, "guidance_scale must be finite"),
    ],
)
def test_predict_velocity_rejects_bad_input(tiny_wan_backbone, change, message):
    arguments = {
        "latents": random_latents(tiny_wan_backbone),
        "sigma": torch.tensor([0.5, 0.5]),
        "conditioning": tiny_wan_backbone.encode_prompts(PROMPTS),
        "guidance_scale": 1.0,
    }
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        tiny_wan_backbone.predict_velocity(**arguments)


# -- Wan 2.2 A14B: two experts -------------------------------------------------------------------


def test_two_experts_are_chosen_per_sample_by_sigma():
    pipeline = build_tiny_wan_pipeline(two_experts=True, boundary_ratio=0.5)
    backbone = WanBackbone(pipeline, guidance_scale_2=2.0)
    assert backbone.transformer is pipeline.transformer
    latents, sigma = random_latents(backbone, 3), torch.tensor([0.9, 0.2, 0.5])
    conditioning = backbone.encode_prompts([*PROMPTS, "a third prompt"])
    embeds, negative = reference_embeds(backbone, [*PROMPTS, "a third prompt"])
    with torch.no_grad():
        velocity = backbone.predict_velocity(latents, sigma, conditioning, 4.0)
    for row, (model, scale) in enumerate(
        [(pipeline.transformer, 4.0), (pipeline.transformer_2, 2.0), (pipeline.transformer, 4.0)]
    ):
        index = slice(row, row + 1)
        cond = direct_prediction(backbone, model, latents[index], sigma[index], embeds[index])
        uncond = direct_prediction(backbone, model, latents[index], sigma[index], negative[index])
        # Batch composition changes float32 reductions by ~1e-6.
        torch.testing.assert_close(velocity[index], uncond + scale * (cond - uncond), atol=1e-5, rtol=0)


def test_low_noise_expert_can_be_the_trainable_one():
    pipeline = build_tiny_wan_pipeline(two_experts=True)
    backbone = WanBackbone(pipeline, expert="transformer_2")
    assert backbone.transformer is pipeline.transformer_2
    assert not any(p.requires_grad for p in pipeline.transformer.parameters())
    replacement = build_tiny_wan_pipeline(seed=3).transformer
    conditioning = backbone.encode_prompts(PROMPTS)
    with recorded_calls(replacement) as low, recorded_calls(pipeline.transformer) as high, torch.no_grad():
        backbone.predict_velocity(
            random_latents(backbone), torch.tensor([0.9, 0.1]), conditioning, transformer=replacement
        )
    assert len(low) == 1 and len(high) == 1


def frozen_devices(module: torch.nn.Module) -> set[str]:
    return {p.device.type for p in module.parameters() if not p.requires_grad} | {b.device.type for b in module.buffers()}


@pytest.mark.parametrize("with_lora", [False, True], ids=["before-lora", "with-lora"])
def test_whole_module_moves_leave_the_idle_experts_weights_on_the_host(with_lora):
    """The prompt precompute's move back (before LoRA exists) and accelerate's ``prepare`` (after) move the whole
    `WanExperts`: with the idle expert swapped out, its weights must stay on the host, or a card smaller than both
    experts runs out of memory before the first step. The meta device stands in for the accelerator."""
    pipeline = build_tiny_wan_pipeline(two_experts=True)
    backbone = WanBackbone(pipeline, expert="both", offload_idle_expert=True)
    if with_lora:
        add_random_lora(backbone)
    backbone.transformer.to(torch.float64).to("meta")
    assert frozen_devices(pipeline.transformer) == {"meta"}  # the high-noise expert computes first
    assert frozen_devices(pipeline.transformer_2) == {"cpu"}
    assert {p.dtype for p in pipeline.transformer_2.parameters()} == {torch.float64}  # dtype changes do apply
    trainable = [p for p in backbone.transformer.parameters() if p.requires_grad]
    assert bool(trainable) == with_lora
    assert {p.device.type for p in trainable} <= {"meta"}  # adapters never wait on the host


@pytest.mark.parametrize(
    ("two_experts", "options", "message"),
    [
        (False, {"expert": "transformer_2"}, "needs a two-expert"),
        (True, {"expert": "vae"}, "expert must be one of"),
        (False, {"guidance_scale_2": 2.0}, "only used by two-expert"),
        (False, {"max_sequence_length": 0}, "max_sequence_length must be a positive integer"),
    ],
)
def test_bad_options_are_rejected(two_experts, options, message):
    with pytest.raises(ValueError, match=message):
        WanBackbone(build_tiny_wan_pipeline(two_experts=two_experts), **options)


# -- LoRA ----------------------------------------------------------------------------------------


def add_random_lora(backbone: WanBackbone) -> LoraConfig:
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(backbone.default_lora_target_modules))
    backbone.transformer.add_adapter(config)
    torch.manual_seed(5)
    for name, parameter in backbone.transformer.named_parameters():
        if "lora_B" in name:  # B starts at zero: make the adapter change the output
            parameter.data.normal_(0, 0.5)
    return config


def test_default_lora_targets_are_the_attention_projections(tiny_wan_backbone):
    config = add_random_lora(tiny_wan_backbone)
    adapted = {
        name.rsplit(".lora_A", 1)[0]
        for name, _ in tiny_wan_backbone.transformer.named_parameters()
        if "lora_A" in name
    }
    num_layers = tiny_wan_backbone.transformer.config.num_layers
    expected = {
        f"blocks.{i}.{attn}.{proj}"
        for i in range(num_layers)
        for attn in ("attn1", "attn2")
        for proj in ("to_q", "to_k", "to_v", "to_out.0")
    }
    assert adapted == expected and config.r == 4


def test_lora_save_and_load_round_trip_reproduces_the_velocity(tiny_wan_backbone, tiny_wan_path, tmp_path):
    latents, sigma = random_latents(tiny_wan_backbone), torch.tensor([0.8, 0.3])
    conditioning = tiny_wan_backbone.encode_prompts(PROMPTS)
    with torch.no_grad():
        base = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, 3.0)
    config = add_random_lora(tiny_wan_backbone)
    with torch.no_grad():
        adapted = tiny_wan_backbone.predict_velocity(latents, sigma, conditioning, 3.0)
    assert (adapted - base).abs().max() > 1e-3

    layers = get_peft_model_state_dict(tiny_wan_backbone.transformer)
    tiny_wan_backbone.save_lora_weights(tmp_path, layers, config.to_dict())
    weights = load_file(tmp_path / "pytorch_lora_weights.safetensors")
    assert all(key.startswith("transformer.blocks.") for key in weights)

    reloaded = WanBackbone.from_pretrained(str(tiny_wan_path))
    reloaded.load_lora_weights(tmp_path)
    with torch.no_grad():
        velocity = reloaded.predict_velocity(latents, sigma, reloaded.encode_prompts(PROMPTS), 3.0)
    torch.testing.assert_close(velocity, adapted, atol=1e-6, rtol=0)
