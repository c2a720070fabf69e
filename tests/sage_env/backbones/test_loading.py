"""Loading the diffusers backbones: load_backbone on saved folders, constructors, dtype/device and options."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanPipeline

from sage_env.backbones import load_backbone
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from sage_env.backbones.wan import WanBackbone
from tests.fixtures.tiny_pipelines import (
    TINY_VIDEO_SIZE,
    build_tiny_hunyuan_pipeline,
    build_tiny_wan_pipeline,
    save_tiny_pipeline,
)


def assert_same_weights(module: torch.nn.Module, reference: torch.nn.Module) -> None:
    state, expected = module.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, atol=0, rtol=0, msg=name)


def test_load_backbone_reads_model_index_of_a_saved_wan(tiny_wan_path, tiny_wan_backbone):
    assert (tiny_wan_path / "model_index.json").is_file()
    assert isinstance(tiny_wan_backbone, WanBackbone)
    assert_same_weights(tiny_wan_backbone.transformer, build_tiny_wan_pipeline().transformer)
    assert tiny_wan_backbone.default_fps == 16.0
    assert tiny_wan_backbone.device.type == "cpu" and tiny_wan_backbone.dtype == torch.float32


def test_load_backbone_reads_model_index_of_a_saved_hunyuan(tiny_hunyuan_backbone):
    assert isinstance(tiny_hunyuan_backbone, HunyuanVideo15Backbone)
    assert_same_weights(tiny_hunyuan_backbone.transformer, build_tiny_hunyuan_pipeline().transformer)
    assert tiny_hunyuan_backbone.pipeline.guider.guidance_scale == 6.0


def test_tiny_pipelines_are_reproducible_and_seeded():
    assert_same_weights(
        build_tiny_wan_pipeline(seed=4).transformer, build_tiny_wan_pipeline(seed=4).transformer
    )
    different = build_tiny_wan_pipeline(seed=5).transformer.state_dict()
    same_seed = build_tiny_wan_pipeline(seed=4).transformer.state_dict()
    assert any(not torch.equal(different[name], tensor) for name, tensor in same_seed.items())


def test_backbones_wrap_loaded_pipelines():
    pipeline = build_tiny_wan_pipeline()
    for backbone in (WanBackbone(pipeline), WanBackbone.from_pipeline(pipeline, max_sequence_length=64)):
        assert backbone.pipeline is pipeline and backbone.transformer is pipeline.transformer
    hunyuan = build_tiny_hunyuan_pipeline()
    assert HunyuanVideo15Backbone.from_pipeline(hunyuan).transformer is hunyuan.transformer


def test_wrong_pipeline_class_is_rejected():
    with pytest.raises(ValueError, match="wraps a diffusers WanPipeline, got HunyuanVideo15Pipeline"):
        WanBackbone(build_tiny_hunyuan_pipeline())
    with pytest.raises(ValueError, match="wraps a diffusers HunyuanVideo15Pipeline, got WanPipeline"):
        HunyuanVideo15Backbone(build_tiny_wan_pipeline())


def test_backbone_options_pass_through_load_backbone(tiny_wan_path):
    backbone = load_backbone(str(tiny_wan_path), max_sequence_length=64)
    conditioning = backbone.encode_prompts(["a cat"])
    assert conditioning.tensors["prompt_embeds"].shape == (1, 64, 32)


def test_torch_dtype_sets_the_model_dtype_and_velocities_stay_float32(tiny_wan_path):
    backbone = load_backbone(str(tiny_wan_path), torch_dtype=torch.bfloat16, device="cpu")
    assert backbone.dtype == torch.bfloat16 and backbone.pipeline.vae.dtype == torch.bfloat16
    reference = load_backbone(str(tiny_wan_path))
    latents = torch.randn(
        1, *backbone.latent_shape(**TINY_VIDEO_SIZE), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        velocity = backbone.predict_velocity(
            latents, torch.tensor([0.5]), backbone.encode_prompts(["a cat"]), 5.0
        )
        expected = reference.predict_velocity(
            latents, torch.tensor([0.5]), reference.encode_prompts(["a cat"]), 5.0
        )
    assert velocity.dtype == torch.float32
    torch.testing.assert_close(velocity, expected, atol=0.1, rtol=0.05)
    assert backbone.decode(latents).dtype == torch.float32


def test_wan22_pipeline_round_trips_through_save_and_load(tmp_path):
    pipeline = build_tiny_wan_pipeline(two_experts=True, boundary_ratio=0.4)
    backbone = load_backbone(str(save_tiny_pipeline(pipeline, tmp_path)), expert="transformer_2")
    assert isinstance(backbone.pipeline, WanPipeline) and backbone.pipeline.config.boundary_ratio == 0.4
    assert_same_weights(backbone.transformer, pipeline.transformer_2)


def test_a_swapping_two_expert_backbone_loads_without_the_idle_experts_weights_on_the_device(tiny_wan22_path):
    """With ``offload_idle_expert`` both A14B experts (53.4 GiB in bf16) must never be on the device together, not
    even while loading: the pipeline moves there without the idle one. The meta device stands in for the GPU."""
    backbone = load_backbone(str(tiny_wan22_path), device="meta", expert="both", offload_idle_expert=True)
    pipeline = backbone.pipeline
    devices = {name: {t.device.type for t in (*module.parameters(), *module.buffers())}
               for name, module in pipeline.components.items() if isinstance(module, torch.nn.Module)}
    assert devices == {"transformer": {"meta"}, "transformer_2": {"cpu"}, "text_encoder": {"meta"}, "vae": {"meta"}}
    everything_moved = load_backbone(str(tiny_wan22_path), device="meta", expert="both")
    assert {p.device.type for p in everything_moved.pipeline.transformer_2.parameters()} == {"meta"}


def test_model_must_be_a_path_or_hub_id():
    with pytest.raises(ValueError, match="local diffusers folder or a Hub id"):
        WanBackbone.from_pretrained("")
