"""`sage_env.models` and the backbones' declared defaults: one declaration per model, found without loading it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import gymnasium as gym
import pytest

from sage_env.backbones import BACKBONES, backbone_class, sampling_defaults
from sage_env.backbones.toy import TOY_PRIOR_PATH
from sage_env.models import TOY_SAMPLING_DEFAULTS, SamplingDefaults, pipeline_class_of
from sage_env.plugins import PluginError, own_names
from sage_env.registration import ENV_IDS
from sage_env.toy import TOY_HEIGHT, TOY_NUM_FRAMES, TOY_WIDTH
from sage_env.toy.env import TOY_ENV_DEFAULTS


def test_every_built_in_backbone_declares_its_defaults_on_its_class() -> None:
    assert set(own_names("backbones")) <= set(BACKBONES.names())
    for name in own_names("backbones"):
        declared = backbone_class(name).sampling_defaults
        assert isinstance(declared, SamplingDefaults) and sampling_defaults(name) is declared
        assert "sampling_defaults" in vars(backbone_class(name)), name  # its own declaration, not inherited
    wan, hunyuan = sampling_defaults("WanPipeline"), sampling_defaults("HunyuanVideo15Pipeline")
    assert (wan.num_frames, wan.height, wan.width, wan.num_steps, wan.fps) == (81, 480, 832, 20, 16.0)
    assert (hunyuan.num_frames, hunyuan.height, hunyuan.width, hunyuan.fps) == (81, 480, 848, 24.0)
    assert wan.shift is None and hunyuan.shift is None  # the checkpoint's own scheduler
    with pytest.raises(dataclasses.FrozenInstanceError):
        wan.num_steps = 50  # type: ignore[misc]


def test_the_gym_ids_toy_world_and_toy_env_read_the_declaration(tiny_wan_path) -> None:
    for env_id, pipeline_class in (
        ("sage_env/Wan-v0", "WanPipeline"),
        ("sage_env/HunyuanVideo15-v0", "HunyuanVideo15Pipeline"),
    ):
        assert ENV_IDS[env_id]["kwargs"] == {
            "pipeline_class": pipeline_class
        }  # sizes: the class's, when made
    env = gym.make("sage_env/Wan-v0", backbone=str(tiny_wan_path), reward_fn=lambda v, p, **k: v.mean((1, 2, 3, 4)),
                   num_frames=5, height=16, width=16)  # fmt: skip
    assert env.unwrapped._vector.num_steps == sampling_defaults("WanPipeline").num_steps
    toy = sampling_defaults("toy")
    assert toy is TOY_SAMPLING_DEFAULTS
    assert (toy.num_frames, toy.height, toy.width) == (TOY_NUM_FRAMES, TOY_HEIGHT, TOY_WIDTH)
    assert (
        (TOY_ENV_DEFAULTS["num_steps"], TOY_ENV_DEFAULTS["shift"]) == (toy.num_steps, toy.shift) == (10, 3.0)
    )


def test_unknown_classes_are_named() -> None:
    with pytest.raises(PluginError, match=r"Unknown backbone 'CogVideoXPipeline'; known: .*WanPipeline"):
        sampling_defaults("CogVideoXPipeline")


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
