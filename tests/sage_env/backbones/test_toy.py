"""ToyBackbone: construction, sizes, prompt cache, velocity with coordinate channels and CFG, decode, saving, LoRA."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from sage_env.backbones import PromptConditioning, load_backbone
from sage_env.backbones.toy import TOY_PRIOR_PATH, ToyBackbone, build_toy_transformer, coordinate_channels
from tests.sage_env.backbones.forward_calls import recorded_calls

PROMPTS = ["a red square moving left", "a blue circle moving up"]


@pytest.fixture
def backbone() -> ToyBackbone:
    return ToyBackbone.from_scratch(seed=3)


def random_latents(batch_size: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch_size, 3, 8, 16, 16, generator=torch.Generator().manual_seed(seed))


def direct_prediction(backbone: ToyBackbone, latents, sigma, embeds) -> torch.Tensor:
    """The transformer called by hand: pixels + (t, y, x) ramps, timestep = 1000 sigma."""
    ramps = coordinate_channels(*latents.shape[2:]).expand(latents.shape[0], -1, -1, -1, -1)
    with torch.no_grad():
        return backbone.transformer(
            hidden_states=torch.cat([latents, ramps], dim=1),
            timestep=sigma * 1000,
            encoder_hidden_states=embeds,
            return_dict=False,
        )[0]


# -- architecture and sizes --------------------------------------------------------------------------


def test_architecture_matches_the_design(backbone):
    config = backbone.transformer.config
    assert (config.in_channels, config.out_channels, tuple(config.patch_size)) == (6, 3, (1, 2, 2))
    assert (config.num_layers, config.num_attention_heads, config.attention_head_dim, config.ffn_dim) == (
        2,
        2,
        32,
        128,
    )
    assert sum(p.numel() for p in backbone.transformer.parameters()) == 143_308
    assert not any(p.requires_grad for p in backbone.text_encoder.parameters())
    assert backbone.default_fps == 8.0 and backbone.default_guidance_scale == 1.0


def test_coordinate_channels_are_ramps_along_time_rows_and_columns():
    ramps = coordinate_channels(8, 16, 12)
    assert ramps.shape == (3, 8, 16, 12)
    torch.testing.assert_close(ramps[0, :, 0, 0], torch.linspace(-1, 1, 8))
    torch.testing.assert_close(ramps[1, 0, :, 0], torch.linspace(-1, 1, 16))
    torch.testing.assert_close(ramps[2, 0, 0, :], torch.linspace(-1, 1, 12))
    assert (ramps[0].flatten(1).std(dim=1) == 0).all()  # the time ramp is constant within a frame
    assert torch.equal(coordinate_channels(1, 2, 2)[0], torch.zeros(1, 2, 2))


def test_latent_shape_is_the_pixels(backbone):
    assert backbone.latent_shape(8, 16, 16) == (3, 8, 16, 16)
    assert backbone.latent_shape(5, 24, 32) == (3, 5, 24, 32)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ((8, 15, 16), "even height"),
        ((8, 16, 66), "width up to 64"),
        ((33, 16, 16), "up to 32 frames"),
        ((0, 16, 16), "positive integer"),
    ],
)
def test_latent_shape_rejects_sizes_the_model_cannot_make(backbone, size, message):
    with pytest.raises(ValueError, match=message):
        backbone.latent_shape(*size)


def test_constructor_rejects_wrong_modules(backbone):
    with pytest.raises(ValueError, match="3 pixel \\+ 3 coordinate channels"):
        ToyBackbone(build_toy_transformer().__class__(in_channels=3, out_channels=3, num_layers=1, num_attention_heads=2,
                                                      attention_head_dim=8, text_dim=32, ffn_dim=8, freq_dim=8),
                    backbone.text_encoder, backbone.tokenizer)  # fmt: skip
    with pytest.raises(ValueError, match="UMT5EncoderModel"):
        ToyBackbone(backbone.transformer, torch.nn.Linear(2, 2), backbone.tokenizer)
    with pytest.raises(ValueError, match="max_sequence_length"):
        ToyBackbone(backbone.transformer, backbone.text_encoder, backbone.tokenizer, max_sequence_length=1)


# -- prompts -------------------------------------------------------------------------------------------


def test_encode_prompts_zeroes_padding_and_caches_each_prompt(backbone):
    with recorded_calls(backbone.text_encoder) as calls:
        first = backbone.encode_prompts(PROMPTS)
        again = backbone.encode_prompts([PROMPTS[1], PROMPTS[0], PROMPTS[1]])
    assert len(calls) == 1
    embeds = first.tensors["prompt_embeds"]
    assert embeds.shape == (2, 32, 32) and not embeds.requires_grad
    length = len(PROMPTS[0].encode()) + 1  # bytes + </s>
    assert embeds[0, :length].abs().sum(dim=-1).min() > 0 and (embeds[0, length:] == 0).all()
    assert torch.equal(again.tensors["prompt_embeds"][0], embeds[1])
    negative = first.tensors["negative_prompt_embeds"]
    assert (negative[:, 1:] == 0).all() and torch.equal(negative[0], negative[1])  # "" is just </s>


def test_negative_prompt_changes_only_the_negative_embeddings(backbone):
    plain = backbone.encode_prompts(PROMPTS)
    other = backbone.encode_prompts(PROMPTS, negative_prompt="a static blur")
    assert torch.equal(plain.tensors["prompt_embeds"], other.tensors["prompt_embeds"])
    assert not torch.equal(plain.tensors["negative_prompt_embeds"], other.tensors["negative_prompt_embeds"])


def test_offloaded_text_encoder_still_encodes_new_prompts(backbone):
    backbone.offload_text_encoders("cpu")
    assert next(backbone.text_encoder.parameters()).device.type == "cpu"
    assert len(backbone.encode_prompts(["a green circle moving down"])) == 1


# -- velocity ------------------------------------------------------------------------------------------


def test_velocity_without_guidance_is_one_pass_on_pixels_plus_coordinates(backbone):
    latents, sigma = random_latents(), torch.tensor([0.9, 0.3])
    conditioning = backbone.encode_prompts(PROMPTS)
    with recorded_calls(backbone.transformer) as calls, torch.no_grad():
        velocity = backbone.predict_velocity(latents, sigma, conditioning)
    assert len(calls) == 1 and calls[0]["hidden_states"].shape == (2, 6, 8, 16, 16)
    assert torch.equal(
        calls[0]["hidden_states"][:, 3:], coordinate_channels(8, 16, 16).expand(2, -1, -1, -1, -1)
    )
    torch.testing.assert_close(calls[0]["timestep"], sigma * 1000)
    assert velocity.shape == latents.shape and velocity.dtype == torch.float32
    expected = direct_prediction(backbone, latents, sigma, conditioning.tensors["prompt_embeds"])
    torch.testing.assert_close(velocity, expected)


def test_velocity_with_guidance_combines_conditional_and_unconditional(backbone):
    latents, sigma = random_latents(), torch.tensor([0.7, 0.2])
    conditioning = backbone.encode_prompts(PROMPTS)
    with torch.no_grad():
        guided = backbone.predict_velocity(latents, sigma, conditioning, 4.0)
    cond = direct_prediction(backbone, latents, sigma, conditioning.tensors["prompt_embeds"])
    uncond = direct_prediction(backbone, latents, sigma, conditioning.tensors["negative_prompt_embeds"])
    torch.testing.assert_close(guided, uncond + 4.0 * (cond - uncond), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert torch.equal(backbone.predict_velocity(latents, sigma, conditioning, None),
                           backbone.predict_velocity(latents, sigma, conditioning, 1.0))  # fmt: skip


def test_velocity_is_differentiable_in_the_transformer(backbone):
    conditioning = backbone.encode_prompts(PROMPTS)
    velocity = backbone.predict_velocity(random_latents(), torch.tensor([0.5, 0.5]), conditioning, 2.0)
    velocity.square().mean().backward()
    gradients = [p.grad for p in backbone.transformer.parameters()]
    assert all(g is not None for g in gradients) and sum(g.abs().sum() for g in gradients) > 0
    assert all(p.grad is None for p in backbone.text_encoder.parameters())


def test_transformer_argument_replaces_the_called_module(backbone):
    replacement = build_toy_transformer(seed=9)
    conditioning = backbone.encode_prompts(PROMPTS)
    with (
        recorded_calls(replacement) as replaced,
        recorded_calls(backbone.transformer) as own,
        torch.no_grad(),
    ):
        backbone.predict_velocity(
            random_latents(), torch.tensor([0.5, 0.5]), conditioning, transformer=replacement
        )
    assert len(replaced) == 1 and not own


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"latents": torch.zeros(2, 4, 8, 16, 16)}, r"latents must be a tensor \(B, 3"),
        ({"sigma": torch.tensor([0.5, 1.5])}, r"sigma must lie in \[0, 1\]"),
        ({"sigma": torch.tensor([0.5])}, r"sigma must have shape"),
        ({"guidance_scale": float("nan")}, "guidance_scale must be finite"),
        ({"conditioning": PromptConditioning(PROMPTS, {})}, "lacks"),
    ],
)
def test_predict_velocity_rejects_bad_input(backbone, change, message):
    arguments = {"latents": random_latents(), "sigma": torch.tensor([0.5, 0.5]),
                 "conditioning": backbone.encode_prompts(PROMPTS), "guidance_scale": 1.0, **change}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        backbone.predict_velocity(**arguments)


# -- decode --------------------------------------------------------------------------------------------


def test_decode_clamps_maps_to_unit_range_and_puts_frames_first(backbone):
    latents = 1.5 * random_latents()
    videos = backbone.decode(latents)
    assert videos.shape == (2, 8, 3, 16, 16) and videos.dtype == torch.float32
    assert videos.min() == 0 and videos.max() == 1
    index = (1, 2, 5, 7)  # sample, channel, frame, row, column 3
    value = latents[index[0], index[1], index[2], index[3], 3].clamp(-1, 1)
    assert videos[index[0], index[2], index[1], index[3], 3] == (value + 1) / 2
    with pytest.raises(ValueError, match=r"pixel latents \(B, 3, F, H, W\)"):
        backbone.decode(torch.zeros(2, 8, 3, 16, 16))


# -- saving, loading, LoRA -----------------------------------------------------------------------------


def test_save_and_load_round_trip_through_load_backbone(backbone, tmp_path):
    backbone.save_pretrained(tmp_path, extra_metadata={"num_frames": 8})
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["_class_name"] == "toy" and index["transformer"] == ["diffusers", "WanTransformer3DModel"]
    reloaded = load_backbone(str(tmp_path))
    assert isinstance(reloaded, ToyBackbone)
    latents, sigma = random_latents(), torch.tensor([0.6, 0.1])
    with torch.no_grad():
        expected = backbone.predict_velocity(latents, sigma, backbone.encode_prompts(PROMPTS))
        actual = reloaded.predict_velocity(latents, sigma, reloaded.encode_prompts(PROMPTS))
    assert torch.equal(actual, expected)


def test_from_pretrained_rejects_other_folders(backbone, tmp_path):
    backbone.save_pretrained(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    with pytest.raises(ValueError, match="not the toy model"):
        ToyBackbone.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=r"has no model_index\.json"):
        ToyBackbone.from_pretrained(str(tmp_path / "transformer"))
    with pytest.raises(ValueError, match="Unexpected arguments"):
        ToyBackbone.from_pretrained("toy", guidance=2)


def test_shipped_prior_loads_small_and_in_float32():
    backbone = load_backbone("toy")
    assert isinstance(backbone, ToyBackbone) and backbone.dtype == torch.float32
    total_bytes = sum(f.stat().st_size for f in TOY_PRIOR_PATH.rglob("*") if f.is_file())
    assert total_bytes < 2_000_000
    assert json.loads((TOY_PRIOR_PATH / "model_index.json").read_text())["_class_name"] == "toy"
    half = ToyBackbone.from_pretrained("toy", torch_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.text_encoder.dtype == torch.float32


def add_random_lora(backbone: ToyBackbone) -> LoraConfig:
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(backbone.default_lora_target_modules))
    backbone.transformer.add_adapter(config)
    torch.manual_seed(5)
    for name, parameter in backbone.transformer.named_parameters():
        if "lora_B" in name:  # B starts at zero: make the adapter change the output
            parameter.data.normal_(0, 0.5)
    return config


def test_lora_targets_attention_and_round_trips_in_the_diffusers_format(backbone, tmp_path):
    backbone.save_pretrained(tmp_path / "base")
    latents, sigma = random_latents(), torch.tensor([0.8, 0.3])
    conditioning = backbone.encode_prompts(PROMPTS)
    config = add_random_lora(backbone)
    adapted_modules = {
        n.rsplit(".lora_A", 1)[0] for n, _ in backbone.transformer.named_parameters() if "lora_A" in n
    }
    assert adapted_modules == {f"blocks.{i}.{a}.{p}" for i in range(2) for a in ("attn1", "attn2")
                               for p in ("to_q", "to_k", "to_v", "to_out.0")}  # fmt: skip
    with torch.no_grad():
        adapted = backbone.predict_velocity(latents, sigma, conditioning)
    backbone.save_lora_weights(
        tmp_path / "lora", get_peft_model_state_dict(backbone.transformer), config.to_dict()
    )
    reloaded = load_backbone(str(tmp_path / "base"))
    reloaded.load_lora_weights(tmp_path / "lora")
    with torch.no_grad():
        velocity = reloaded.predict_velocity(latents, sigma, reloaded.encode_prompts(PROMPTS))
    torch.testing.assert_close(velocity, adapted)
