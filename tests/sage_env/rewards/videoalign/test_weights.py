"""VideoAlign's weights: key remapping, LoRA merging, conversion errors, and the released dtype numerics."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.models.qwen2_vl.modeling_qwen2_vl import (
    Qwen2VLRotaryEmbedding,
    Qwen2VLVisionRotaryEmbedding,
)

from sage_env.rewards.videoalign import (
    ReleasedVisionRotaryEmbedding,
    VideoAlignReward,
    convert_videoalign_state_dict,
    merge_lora_weight,
    remap_qwen2_vl_key,
)
from tests.fixtures.videoalign import TinyVideoAlign
from tests.sage_env.rewards.videoalign.helpers import (
    FPS,
    PROMPTS,
    edit_model_config,
    edit_weights,
    load_reward,
    make_videos,
    raw_scores,
)

# -- weights -------------------------------------------------------------------------------------


def test_key_remapping_agrees_with_transformers_conversion_rules(tiny_videoalign: TinyVideoAlign) -> None:
    rules = get_checkpoint_conversion_mapping("Qwen2VLForConditionalGeneration")
    for new_key in tiny_videoalign.reference.state_dict():
        old_key = new_key.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        converted = old_key
        for rule in rules:
            converted = re.sub(rule.source_patterns[0], rule.target_patterns[0], converted)
        assert remap_qwen2_vl_key(old_key) == converted == new_key
    with pytest.raises(ValueError, match=r"Unexpected key 'vision_tower\.proj\.weight'"):
        remap_qwen2_vl_key("vision_tower.proj.weight")


class _TinyDecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(6, 5)
        self.mlp = nn.Module()
        self.mlp.down_proj = nn.Linear(5, 6, bias=False)


class _TinyQwenLike(nn.Module):
    """Module names of a 4.45 Qwen2-VL: model.layers.N..., visual..., rm_head."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([_TinyDecoderLayer()])
        self.visual = nn.Module()
        self.visual.proj = nn.Linear(4, 4)
        self.rm_head = nn.Linear(6, 3, bias=False)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_conversion_of_a_real_peft_state_dict_equals_peft_merge(use_rslora: bool) -> None:
    torch.manual_seed(0)
    peft_model = get_peft_model(
        _TinyQwenLike(),
        LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj", "down_proj"], use_rslora=use_rslora),
    )
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # peft starts B at zero, which would hide the merge
    state = {key: value.clone() for key, value in peft_model.state_dict().items()}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in state
    converted = convert_videoalign_state_dict(state, lora_alpha=3, lora_rank=2, use_rslora=use_rslora)
    merged = peft_model.merge_and_unload().state_dict()
    expected = {remap_qwen2_vl_key(key): value for key, value in merged.items()}
    assert converted.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(converted[key], value, atol=1e-6, rtol=1e-6)


def test_merge_lora_weight_formula() -> None:
    base, lora_a, lora_b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 2)
    torch.testing.assert_close(merge_lora_weight(base, lora_a, lora_b, 1.5), base + 1.5 * lora_b @ lora_a)


def test_loaded_weights_equal_the_merged_reference(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    loaded = videoalign_reward.model.state_dict()
    expected = {
        k: v for k, v in tiny_videoalign.reference.state_dict().items() if not k.startswith("lm_head.")
    }
    expected["rm_head.weight"] = tiny_videoalign.rm_head.weight
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value, atol=2e-6, rtol=1e-5, msg=key)
    # The vocabulary comes from the checkpoint (resized to the tokenizer), not from the base config's 300.
    assert videoalign_reward.model.config.text_config.vocab_size == len(tiny_videoalign.tokenizer) != 300


_Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s.pop("base_model.model.model.norm.weight"),
            r"missing keys \['model.language_model.norm.weight'\]",
        ),
        (
            lambda s: s.update({"base_model.model.model.layers.0.extra.weight": torch.zeros(1)}),
            r"unexpected keys \['model.language_model.layers.0.extra.weight'\]",
        ),
        (
            lambda s: s.update({"base_model.model.rm_head.weight": torch.zeros(3, 16)}),
            r"Reward head shape \(3, 16\)",
        ),
        (
            lambda s: s.update({f"{_Q}.lora_A.default.weight": torch.zeros(4, 31)}),
            "LoRA shape mismatch at model.layers.0",
        ),
        (
            lambda s: s.update(
                {
                    f"{_Q}.lora_A.default.weight": torch.zeros(8, 32),
                    f"{_Q}.lora_B.default.weight": torch.zeros(32, 8),
                }
            ),
            "weights have r=8 but model_config.json says lora_r=4",
        ),
        (lambda s: s.pop(f"{_Q}.lora_B.default.weight"), "have lora_A or lora_B but not both"),
        (lambda s: s.pop(f"{_Q}.base_layer.weight"), "has no base weight"),
        (
            lambda s: s.update({"base_model.model.visual.merger.mlp.0.base_layer.weight": torch.zeros(1)}),
            "base layer without lora_A/lora_B",
        ),
        (lambda s: s.update({f"{_Q}.lora_A.other.weight": torch.zeros(4, 32)}), "several LoRA adapters"),
        (lambda s: s.update({"model.norm.weight": torch.zeros(32)}), "Mixed key layout"),
        (
            lambda s: s.update({"base_model.model.model.embed_tokens.weight": torch.zeros(273, 16)}),
            r"Shape mismatch .* model.language_model.embed_tokens.weight: checkpoint \(273, 16\)",
        ),
    ],
)
def test_checkpoint_errors(videoalign_copy: Path, edit, message: str) -> None:
    edit_weights(videoalign_copy, edit)
    with pytest.raises(ValueError, match=message):
        load_reward(videoalign_copy)


def test_rslora_scaling_is_read_from_the_config(videoalign_copy: Path) -> None:
    edit_model_config(videoalign_copy, lambda c: c["peft_lora_config"].update(use_rslora=True))
    videos = make_videos(1)
    rslora = load_reward(videoalign_copy)
    q_proj = rslora.model.model.language_model.layers[0].self_attn.q_proj.weight
    state = torch.load(videoalign_copy / "checkpoint-10" / "model.pth", weights_only=True)
    expected = state[f"{_Q}.base_layer.weight"] + 6.0 / math.sqrt(4) * (
        state[f"{_Q}.lora_B.default.weight"] @ state[f"{_Q}.lora_A.default.weight"]
    )
    torch.testing.assert_close(q_proj, expected)
    assert torch.isfinite(raw_scores(rslora(videos, PROMPTS[:1], fps=FPS))).all()


def test_a_bfloat16_checkpoint_loads(tmp_path: Path) -> None:
    from tests.fixtures.videoalign import build_tiny_videoalign

    tiny = build_tiny_videoalign(tmp_path, steps=(3,), weights_dtype=torch.bfloat16)
    reward = load_reward(tiny.path)
    q_proj = reward.model.model.language_model.layers[1].mlp.down_proj.weight
    reference = tiny.reference.model.language_model.layers[1].mlp.down_proj.weight
    torch.testing.assert_close(q_proj, reference, atol=0.02, rtol=0.02)


# -- the released dtype numerics ------------------------------------------------------------------


def _floating_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: tensor for name, tensor in tensors.items() if tensor.is_floating_point()}


def test_bfloat16_casts_the_whole_model_rotary_buffers_included(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    """VideoAlign's inference calls ``model.to(torch.bfloat16)``: every parameter and buffer is bfloat16."""
    reward = load_reward(tiny_videoalign.path, dtype=torch.bfloat16)
    tensors = _floating_tensors(reward.model)
    assert "model.language_model.rotary_emb.inv_freq" in tensors
    assert "model.visual.rotary_pos_emb.inv_freq" in tensors
    assert {name for name, tensor in tensors.items() if tensor.dtype != torch.bfloat16} == set()
    assert {tensor.dtype for tensor in _floating_tensors(videoalign_reward.model).values()} == {torch.float32}
    # The text rotary embedding is then exactly transformers' own module cast the released way.
    config = reward.model.config.text_config
    released = Qwen2VLRotaryEmbedding(config).to(torch.bfloat16)
    ours = reward.model.model.language_model.rotary_emb
    assert torch.equal(ours.inv_freq, released.inv_freq)
    x, positions = torch.zeros(1, 1, dtype=torch.bfloat16), torch.arange(900).expand(3, 1, 900)
    for got, want in zip(ours(x, positions), released(x, positions)):
        assert torch.equal(got, want)
    float32 = Qwen2VLRotaryEmbedding(config)(x.float(), positions)[0]
    assert not torch.equal(
        float32.to(torch.bfloat16), ours(x, positions)[0]
    )  # the cast matters at 900 tokens


def test_vision_rotary_is_transformers_own_in_float32(tiny_videoalign: TinyVideoAlign) -> None:
    config = tiny_videoalign.config.vision_config
    positions = torch.stack(torch.meshgrid(torch.arange(40), torch.arange(60), indexing="ij")).flatten(1)
    x = torch.zeros(1)
    ours, theirs = ReleasedVisionRotaryEmbedding(config), Qwen2VLVisionRotaryEmbedding(config)
    for got, want in zip(ours(x, positions), theirs(x, positions)):
        assert got.dtype == torch.float32 and torch.equal(got, want)


def test_vision_rotary_angles_are_computed_in_bfloat16_when_cast(tiny_videoalign: TinyVideoAlign) -> None:
    """transformers 4.45 (VideoAlign's stack) took the angles and their cos / sin in the buffer's dtype."""
    config = tiny_videoalign.config.vision_config
    positions = torch.stack(torch.meshgrid(torch.arange(40), torch.arange(60), indexing="ij")).flatten(1)
    x = torch.zeros(1, dtype=torch.bfloat16)
    ours = ReleasedVisionRotaryEmbedding(config).to(torch.bfloat16)
    transformers5 = Qwen2VLVisionRotaryEmbedding(config).to(torch.bfloat16)
    (cos, _), (cos5, _) = ours(x, positions), transformers5(x, positions)
    assert cos.dtype == torch.bfloat16 and cos5.dtype == torch.float32
    assert 0 < (cos.float() - cos5).abs().max() < 0.1  # bfloat16 angles (up to ~60 rad) are coarse


class _Payload:
    """A pickle that creates a file when unpickled: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_a_planted_pickle_in_model_pth_is_refused_and_runs_nothing(videoalign_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    weights = videoalign_copy / "checkpoint-10" / "model.pth"
    state = torch.load(weights, weights_only=True)
    torch.save({**state, "payload": _Payload(marker)}, weights)
    with pytest.raises(ValueError, match=r"model\.pth holds pickled objects other than tensors, which are refused"):
        load_reward(videoalign_copy)(make_videos(1), PROMPTS[:1], fps=FPS)
    assert not marker.exists()
