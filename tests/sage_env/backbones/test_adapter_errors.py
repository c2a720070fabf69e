"""`VideoBackbone.load_lora_weights` refuses what diffusers lets through: a missing local path (diffusers takes it
for a Hub id) and an adapter whose keys match no module (diffusers warns and loads nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from peft import LoraConfig
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sage_env.backbones import VideoBackbone, load_backbone
from sage_trl.lora import LORA_WEIGHT_NAME, add_lora, save_lora_adapter


def unprefixed_adapter(backbone: VideoBackbone, directory: Path) -> Path:
    """An adapter of ``backbone`` saved without the ``transformer.`` prefix (peft's own key layout)."""
    add_lora(backbone, LoraConfig(r=2, lora_alpha=2))
    save_lora_adapter(backbone, directory)
    weights = directory / LORA_WEIGHT_NAME
    with safe_open(weights, "pt") as handle:
        metadata = handle.metadata()
    tensors = {key.removeprefix("transformer."): value for key, value in load_file(weights).items()}
    save_file(tensors, weights, metadata=metadata)
    return directory


@pytest.mark.parametrize("fixture", ["tiny_wan_path", "tiny_hunyuan_path"])
def test_an_adapter_matching_no_module_is_an_error_and_leaves_no_adapter(fixture, request, tmp_path) -> None:
    model = str(request.getfixturevalue(fixture))
    adapter = unprefixed_adapter(load_backbone(model), tmp_path / "adapter")
    backbone = load_backbone(model)
    with pytest.raises(
        ValueError, match=r"adapter: .* matches no module of the model: none of its keys starts"
    ):
        backbone.load_lora_weights(adapter)
    assert not getattr(backbone.transformer, "peft_config", None)


@pytest.mark.parametrize("missing", ["/no/such/adapter", "./no-such-adapter", "a/b/c"])
def test_a_missing_adapter_path_says_so(tiny_wan_backbone, missing: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"adapter: {missing} does not exist")):
        tiny_wan_backbone.load_lora_weights(missing)
    with pytest.raises(ValueError, match=re.escape(f"adapter: {missing} does not exist")):
        load_backbone("toy").load_lora_weights(missing)


@pytest.mark.parametrize("missing", ["/no/such/model", "./no-such-model", "a/b/c"])
def test_load_backbone_says_when_a_local_model_path_does_not_exist(missing: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"model: {missing} does not exist")):
        load_backbone(missing)
    with pytest.raises(ValueError, match=re.escape(f"model: {missing} does not exist")):
        load_backbone(missing, backbone="WanPipeline")
