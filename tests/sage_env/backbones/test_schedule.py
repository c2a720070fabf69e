"""`VideoBackbone.sigmas` and the declared defaults, with the pipeline itself as the oracle: the sigmas a
backbone returns are the ones ``pipe.scheduler`` holds after ``pipe(..., num_inference_steps=N)``."""

from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from sage_env import sde
from sage_env.backbones import load_backbone, sampling_defaults
from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
from sage_env.backbones.pipeline import PipelineBackbone
from sage_env.backbones.wan import WanBackbone
from tests.fixtures.tiny_pipelines import (
    TINY_VIDEO_SIZE,
    build_tiny_hunyuan_pipeline,
    build_tiny_wan_pipeline,
)

PROMPT = "a red ball rolls left"


def unipc_wan() -> WanBackbone:
    """The tiny Wan with the scheduler the released Wan checkpoints ship (UniPC, flow shift 3)."""
    pipeline = build_tiny_wan_pipeline()
    pipeline.scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
    )
    return WanBackbone(pipeline)


BACKBONES = {
    "wan-flow-match-euler": lambda: WanBackbone(build_tiny_wan_pipeline()),
    "wan-unipc": unipc_wan,
    "hunyuan": lambda: HunyuanVideo15Backbone(build_tiny_hunyuan_pipeline()),
}


def sigmas_after_call(backbone: PipelineBackbone, num_steps: int) -> torch.Tensor:
    backbone.pipeline(prompt=PROMPT, num_inference_steps=num_steps, output_type="latent", **TINY_VIDEO_SIZE)
    return backbone.pipeline.scheduler.sigmas


@pytest.mark.parametrize("num_steps", [1, 4, 20])
@pytest.mark.parametrize("name", list(BACKBONES))
def test_sigmas_are_the_ones_the_pipeline_sets(name: str, num_steps: int) -> None:
    backbone = BACKBONES[name]()
    sigmas = backbone.sigmas(num_steps)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (num_steps + 1,) and sigmas[-1] == 0
    assert torch.equal(sigmas, sigmas_after_call(backbone, num_steps))


@pytest.mark.parametrize("name", list(BACKBONES))
def test_an_explicit_shift_is_the_scheduler_rebuilt_with_that_shift(name: str) -> None:
    backbone = BACKBONES[name]()
    scheduler = backbone.pipeline.scheduler
    sigmas = backbone.sigmas(4, shift=7.0)
    assert scheduler is backbone.pipeline.scheduler
    # What diffusers users do: from_config with the shift replaced ("flow_shift" for UniPC).
    setting = "flow_shift" if isinstance(scheduler, UniPCMultistepScheduler) else "shift"
    backbone.pipeline.scheduler = type(scheduler).from_config(scheduler.config, **{setting: 7.0})
    assert torch.equal(sigmas, sigmas_after_call(backbone, 4))
    assert not torch.equal(sigmas, backbone.sigmas(4, shift=3.0))


def test_sigmas_leave_the_pipeline_scheduler_alone() -> None:
    backbone = WanBackbone(build_tiny_wan_pipeline())
    before = dict(backbone.pipeline.scheduler.config)
    backbone.sigmas(4, shift=7.0)
    assert dict(backbone.pipeline.scheduler.config) == before


def test_a_scheduler_without_a_static_shift_refuses_an_explicit_shift() -> None:
    pipeline = build_tiny_wan_pipeline()
    pipeline.scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="no static flow-matching shift"):
        WanBackbone(pipeline).sigmas(4, shift=5.0)
    with pytest.raises(ValueError, match="num_steps must be a positive integer"):
        WanBackbone(build_tiny_wan_pipeline()).sigmas(0)


def test_the_toy_schedule_is_flow_match_sigmas_at_its_declared_shift() -> None:
    backbone = load_backbone("toy")
    declared = sampling_defaults("toy")
    assert torch.equal(backbone.sigmas(10), sde.flow_match_sigmas(10, declared.shift))
    assert torch.equal(backbone.sigmas(4, shift=1.0), sde.flow_match_sigmas(4, 1.0))


def test_defaults_come_from_the_declaration_or_the_pipeline(tiny_wan_backbone, tiny_hunyuan_backbone) -> None:
    toy = load_backbone("toy")
    assert toy.default_fps == sampling_defaults("toy").fps and toy.default_guidance_scale == 1.0
    assert tiny_wan_backbone.default_fps == sampling_defaults("WanPipeline").fps
    assert tiny_hunyuan_backbone.default_fps == sampling_defaults("HunyuanVideo15Pipeline").fps
    # Declared None: the pipeline's own default (WanPipeline.__call__'s 5.0, HunyuanVideo 1.5's guider).
    assert tiny_wan_backbone.default_guidance_scale == 5.0
    assert (
        tiny_hunyuan_backbone.default_guidance_scale == tiny_hunyuan_backbone.pipeline.guider.guidance_scale
    )
