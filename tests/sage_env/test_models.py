"""`sage_env.models`: the per-model defaults and finding a model's pipeline class without loading it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from sage_env.backbones import BACKBONES
from sage_env.backbones.toy import TOY_PRIOR_PATH
from sage_env.models import (
    SAMPLING_DEFAULTS,
    SamplingDefaults,
    pipeline_class_of,
    register_sampling_defaults,
    sampling_defaults,
)
from sage_env.registration import ENV_IDS
from sage_env.toy import TOY_HEIGHT, TOY_NUM_FRAMES, TOY_WIDTH
from sage_env.toy.env import TOY_ENV_DEFAULTS


def test_every_built_in_backbone_declares_its_defaults() -> None:
    assert set(SAMPLING_DEFAULTS) == set(BACKBONES)
    wan, hunyuan = sampling_defaults("WanPipeline"), sampling_defaults("HunyuanVideo15Pipeline")
    assert (wan.num_frames, wan.height, wan.width, wan.num_steps, wan.fps) == (81, 480, 832, 20, 16.0)
    assert (hunyuan.num_frames, hunyuan.height, hunyuan.width, hunyuan.fps) == (81, 480, 848, 24.0)
    assert wan.shift is None and hunyuan.shift is None  # the checkpoint's own scheduler
    with pytest.raises(dataclasses.FrozenInstanceError):
        wan.num_steps = 50  # type: ignore[misc]


def test_registry_toy_world_and_toy_env_read_the_declaration() -> None:
    for env_id, pipeline_class in (
        ("sage_env/Wan-v0", "WanPipeline"),
        ("sage_env/HunyuanVideo15-v0", "HunyuanVideo15Pipeline"),
    ):
        kwargs = ENV_IDS[env_id]["kwargs"]
        declared = sampling_defaults(pipeline_class)
        assert kwargs["pipeline_class"] == pipeline_class and "shift" not in kwargs
        assert (kwargs["num_frames"], kwargs["num_steps"], kwargs["fps"]) == (
            81,
            declared.num_steps,
            declared.fps,
        )
    toy = sampling_defaults("toy")
    assert (toy.num_frames, toy.height, toy.width) == (TOY_NUM_FRAMES, TOY_HEIGHT, TOY_WIDTH)
    assert (
        (TOY_ENV_DEFAULTS["num_steps"], TOY_ENV_DEFAULTS["shift"]) == (toy.num_steps, toy.shift) == (10, 3.0)
    )


def test_unknown_classes_are_named() -> None:
    with pytest.raises(
        ValueError, match="No sampling defaults for pipeline class 'CogVideoXPipeline'; known: Wan"
    ):
        sampling_defaults("CogVideoXPipeline")


def test_register_sampling_defaults_refuses_silent_overwrites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sage_env.models.SAMPLING_DEFAULTS", dict(SAMPLING_DEFAULTS))
    mine = SamplingDefaults(
        num_frames=9, height=32, width=32, num_steps=8, shift=2.0, guidance_scale=1.0, fps=12.0
    )
    register_sampling_defaults("MyPipeline", mine)
    assert sampling_defaults("MyPipeline") == mine
    with pytest.raises(ValueError, match="already has sampling defaults"):
        register_sampling_defaults("WanPipeline", mine)
    assert mine.env_kwargs() == {
        "num_frames": 9,
        "height": 32,
        "width": 32,
        "num_steps": 8,
        "shift": 2.0,
        "fps": 12.0,
    }


def test_pipeline_class_of_reads_model_index_without_loading(
    tiny_wan_path, tiny_hunyuan_path, tmp_path
) -> None:
    assert pipeline_class_of("toy") == pipeline_class_of(TOY_PRIOR_PATH) == "toy"
    assert pipeline_class_of(str(tiny_wan_path)) == "WanPipeline"
    assert pipeline_class_of(tiny_hunyuan_path) == "HunyuanVideo15Pipeline"
    assert pipeline_class_of("sage-grpo-tests/not-in-the-cache") is None  # a Hub id, not downloaded
    with pytest.raises(ValueError, match="model: /no/such/folder does not exist"):
        pipeline_class_of("/no/such/folder")
    with pytest.raises(ValueError, match=r"has no model_index\.json"):
        pipeline_class_of(tmp_path)


def test_importing_the_declaration_imports_no_diffusers_model() -> None:
    code = "import sys, sage_env.models; print(any(m.startswith('diffusers.models') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
