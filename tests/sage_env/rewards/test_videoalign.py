"""Tests for the VideoAlign reward: frame sampling, pixels, patching, checkpoint loading, scores, errors.

Scores are checked against an independent computation: the merged model built directly in memory by
`tests.fixtures.videoalign` (installed transformers layout, no conversion), fed token ids tokenised from the
expected chat text and pixels patched with the transformers-4.45 processor's reshape/transpose.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import Qwen2VLConfig
from transformers.conversion_mapping import get_checkpoint_conversion_mapping

from sage_env.rewards import CompositeReward
from sage_env.rewards.videoalign import (
    REWARD_TOKENS,
    VideoAlignReward,
    VideoAlignVideoProcessor,
    convert_videoalign_state_dict,
    find_videoalign_checkpoint,
    load_prompt_template,
    merge_lora_weight,
    num_sampled_frames,
    patchify_video,
    read_video_file,
    remap_qwen2_vl_key,
    resize_frames,
    sample_frame_indices,
    smart_resize,
)
from tests.fixtures.videoalign import (
    NORMALIZATION,
    STAND_IN_TEMPLATE,
    TinyVideoAlign,
    tiny_videoalign_tokenizer,
)
from tests.sage_env.rewards.conftest import TEST_MIN_PIXELS

CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
PROMPTS = ["a cat", "a red fox jumps over a fence at dusk", "x"]
# 8 frames at 4 fps read at 2 fps -> 4 frames (indices 0, 2, 5, 7); 64x88 -> 56x84 (the fixture's budget).
FRAMES, FPS, HEIGHT, WIDTH = 8, 4.0, 64, 88
SAMPLED, RESIZED = [0, 2, 5, 7], (56, 84)
VIDEO_TOKENS = 2 * (4 * 6) // 4  # grid (2, 4, 6), 2x2 merge


def _videos(batch: int = 3, seed: int = 0, frames: int = FRAMES) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, frames, 3, HEIGHT, WIDTH, generator=generator)


def _reward(path: Path, **overrides: object) -> VideoAlignReward:
    options = {"device": "cpu", "dtype": torch.float32, "min_pixels": TEST_MIN_PIXELS, **overrides}
    return VideoAlignReward(path, **options)


def _raw(scores: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([scores[f"{metric}_raw"] for metric in REWARD_TOKENS], dim=1)


# -- independent computations ----------------------------------------------------------------------


def _reference_pixels(video: torch.Tensor) -> torch.Tensor:
    """Sampled, resized, CLIP-normalised frames patched with the 4.45 Qwen2-VL processor's reshape/transpose."""
    frames = (video[SAMPLED] * 255).round()
    frames = F.interpolate(frames, size=RESIZED, mode="bicubic", align_corners=False, antialias=True)
    frames = ((frames.clamp(0, 255).round() / 255 - CLIP_MEAN) / CLIP_STD).numpy()
    t, c, h, w = frames.shape
    patches = frames.reshape(t // 2, 2, c, h // 28, 2, 14, w // 28, 2, 14)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return torch.from_numpy(np.ascontiguousarray(patches).reshape(-1, c * 2 * 14 * 14))


def _expected_text(prompt: str, video_tokens: int = VIDEO_TOKENS) -> str:
    """The chat text the fixture's Qwen2-VL-style chat template produces, with the video placeholder expanded."""
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
        + "<|video_pad|>" * video_tokens
        + "<|vision_end|>"
        + STAND_IN_TEMPLATE.replace("{text_prompt}", prompt)
        + "<|im_end|>\n<|im_start|>assistant\n"
    )


def _reference_inputs(
    tiny: TinyVideoAlign, videos: torch.Tensor, prompts: list[str]
) -> dict[str, torch.Tensor]:
    sequences = [tiny.tokenizer(_expected_text(prompt))["input_ids"] for prompt in prompts]
    length = max(map(len, sequences))
    pad = tiny.tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([ids + [pad] * (length - len(ids)) for ids in sequences]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in sequences]),
        "pixel_values_videos": torch.cat([_reference_pixels(video) for video in videos]),
        "video_grid_thw": torch.tensor([[2, 4, 6]] * len(prompts)),
    }


@torch.no_grad()
def _reference_raw(tiny: TinyVideoAlign, inputs: dict[str, torch.Tensor], position_ids=None) -> torch.Tensor:
    """The in-memory merged model: hidden states at each reward token through the head, diagonal read-out."""
    batch, length = inputs["input_ids"].shape
    if position_ids is None:
        position_ids = torch.arange(length).expand(batch, length)
    hidden = tiny.reference.model(**inputs, position_ids=position_ids).last_hidden_state
    scores = torch.zeros(batch, 3)
    for row in range(batch):
        ids = inputs["input_ids"][row].tolist()
        for metric, token in enumerate(REWARD_TOKENS.values()):
            position = ids.index(tiny.tokenizer.convert_tokens_to_ids(token))
            scores[row, metric] = tiny.rm_head(hidden[row, position])[metric]
    return scores


# -- frame sampling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "video_fps", "sample_fps", "expected"),
    [
        (81, 16, 2, 10),  # paper: 81 frames at 16 fps -> 10.125 -> 10
        (49, 8, 2, 12),  # 12.25 -> 12
        (8, 4, 2, 4),
        (10, 4, 2, 4),  # 5 frames -> round(2.5) * 2 = 4 (Python's round, as qwen-vl-utils)
        (14, 4, 2, 8),  # 7 frames -> round(3.5) * 2 = 8
        (33, 16, 2, 4),  # 4.125 -> at least 4
        (5, 16, 2, 4),
        (7, 1, 2, 6),  # 14 wanted, at most the video's length rounded down to even
        (3000, 30, 2, 200),
        (2000, 1, 2, 768),  # at most 768
        (81, 16, 4, 20),
    ],
)
def test_num_sampled_frames(total: int, video_fps: float, sample_fps: float, expected: int) -> None:
    assert num_sampled_frames(total, video_fps, sample_fps) == expected


def test_sampled_counts_are_even_at_least_four_and_within_the_video() -> None:
    for total in range(4, 130, 3):
        for video_fps in (1, 7.5, 8, 16, 24, 30):
            count = num_sampled_frames(total, video_fps, 2.0)
            assert count % 2 == 0 and 4 <= count <= total


def test_sample_frame_indices_spread_from_first_to_last() -> None:
    assert sample_frame_indices(81, 16).tolist() == [0, 9, 18, 27, 36, 44, 53, 62, 71, 80]
    assert sample_frame_indices(FRAMES, FPS).tolist() == SAMPLED


def test_fixed_frame_count() -> None:
    assert num_sampled_frames(81, 16, num_frames=16) == 16
    assert num_sampled_frames(81, 16, num_frames=9) == 8
    with pytest.raises(ValueError, match="num_frames=32 needs 32 frames but the video has 20"):
        num_sampled_frames(20, 16, num_frames=32)


@pytest.mark.parametrize("total", [0, 1, 3])
def test_too_few_frames(total: int) -> None:
    with pytest.raises(ValueError, match=f"at least 4 frames, got {total}"):
        num_sampled_frames(total, 16)


def test_non_positive_fps() -> None:
    with pytest.raises(ValueError, match="fps must be positive"):
        num_sampled_frames(16, 0)


# -- pixels ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "min_pixels", "max_pixels", "expected"),
    [
        ((480, 848), 100352, 200704, (336, 588)),  # paper resolution, 448 * 448 budget: shrink, round down
        ((64, 88), 784, 56 * 84, (56, 84)),  # nearest multiples already fit
        ((16, 16), 100352, 200704, (336, 336)),  # below the floor: grow, round up
        ((10, 1000), 784, 200704, (28, 1008)),  # a side never drops below 28
    ],
)
def test_smart_resize(
    size: tuple[int, int], min_pixels: int, max_pixels: int, expected: tuple[int, int]
) -> None:
    assert smart_resize(*size, 28, min_pixels, max_pixels) == expected


def test_smart_resize_gives_multiples_of_28_within_budget() -> None:
    generator = torch.Generator().manual_seed(0)
    for height, width in torch.randint(20, 1500, (200, 2), generator=generator).tolist():
        if max(height, width) / min(height, width) > 50:
            continue
        resized = smart_resize(height, width, 28, 28 * 28 * 16, 448 * 448)
        assert resized[0] % 28 == 0 and resized[1] % 28 == 0
        assert resized[0] * resized[1] <= 448 * 448


def test_smart_resize_rejects_extreme_aspect_ratios() -> None:
    with pytest.raises(ValueError, match="aspect ratio below 200"):
        smart_resize(10, 3000)


def test_resize_frames_lands_on_the_uint8_grid_in_range() -> None:
    frames = torch.rand(2, 3, 40, 60)
    resized = resize_frames(frames, (28, 56))
    assert resized.shape == (2, 3, 28, 56)
    assert resized.min() >= 0 and resized.max() <= 1
    torch.testing.assert_close(resized * 255, (resized * 255).round(), atol=1e-4, rtol=0)


def test_resize_frames_keeps_constant_frames_and_same_size_frames() -> None:
    constant = torch.full((1, 3, 50, 70), 100 / 255)
    torch.testing.assert_close(resize_frames(constant, (28, 56)), constant[..., :28, :56])
    frames = torch.rand(1, 3, 28, 56)
    torch.testing.assert_close(resize_frames(frames, (28, 56)), (frames * 255).round() / 255)


def test_resize_frames_is_antialiased() -> None:
    # A one-pixel checkerboard shrunk 3x: antialiasing averages it to grey, plain bicubic sampling aliases.
    checker = ((torch.arange(84)[:, None] + torch.arange(84)[None, :]) % 2).float().expand(1, 3, 84, 84)
    resized = resize_frames(checker, (28, 28))
    assert (resized[..., 2:-2, 2:-2] - 0.5).abs().max() < 0.02
    aliased = F.interpolate(checker * 255, size=(28, 28), mode="bicubic", antialias=False) / 255
    assert (aliased - 0.5).abs().max() > 0.4


# -- patching -------------------------------------------------------------------------------------


def test_patchify_matches_the_patch_embedding_conv3d() -> None:
    """Rows fed through the patch embedding equal a Conv3d over the whole video, in merge-window order."""
    torch.manual_seed(0)
    frames = torch.randn(4, 3, 56, 84)
    conv = nn.Conv3d(3, 5, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=False)
    patches, grid = patchify_video(frames)
    assert grid == (2, 4, 6) and patches.shape == (48, 3 * 2 * 14 * 14)
    embedded = patches @ conv.weight.reshape(5, -1).T
    direct = conv(frames.permute(1, 0, 2, 3).unsqueeze(0))[0]  # (5, t, h, w)
    direct = direct.permute(1, 2, 3, 0).reshape(2, 2, 2, 3, 2, 5).permute(0, 1, 3, 2, 4, 5).reshape(48, 5)
    torch.testing.assert_close(embedded, direct, atol=1e-4, rtol=1e-4)


def test_patchify_matches_transformers_image_patching_for_a_still_video() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = torch.randn(3, 56, 84)
    expected, grid_h, grid_w = Qwen2VLImageProcessorPil().patchify(
        image.numpy(), patch_size=14, merge_size=2, temporal_patch_size=2
    )
    patches, grid = patchify_video(image.expand(2, 3, 56, 84))
    assert grid == (1, grid_h, grid_w)
    torch.testing.assert_close(patches, torch.from_numpy(np.ascontiguousarray(expected)))


def test_patchify_rejects_sizes_that_do_not_tile() -> None:
    with pytest.raises(ValueError, match="multiples of 2 and sides in multiples of 28"):
        patchify_video(torch.zeros(3, 3, 56, 56))
    with pytest.raises(ValueError, match="multiples of 28"):
        patchify_video(torch.zeros(4, 3, 50, 56))


def test_video_processor_matches_the_reference_pipeline() -> None:
    video = _videos(1)[0]
    processor = VideoAlignVideoProcessor(min_pixels=TEST_MIN_PIXELS, max_pixels=56 * 84)
    patches, grid = processor(video, FPS)
    assert grid.tolist() == [2, 4, 6]
    torch.testing.assert_close(patches, _reference_pixels(video), atol=1e-5, rtol=0)


# -- prompt template and checkpoint folder ----------------------------------------------------------


def test_prompt_template_is_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "template.txt"
    path.write_text(STAND_IN_TEMPLATE.replace("\n", "\r\n"), encoding="utf-8", newline="")
    assert load_prompt_template(path) == STAND_IN_TEMPLATE.replace("\n", "\r\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no placeholder <|VQ_reward|> <|MQ_reward|> <|TA_reward|>", r"\{text_prompt\} exactly once"),
        ("{text_prompt} <|VQ_reward|> <|TA_reward|>", "exactly once, in that order"),
        ("{text_prompt} <|MQ_reward|> <|VQ_reward|> <|TA_reward|>", "exactly once, in that order"),
        ("{text_prompt} <|VQ_reward|> <|VQ_reward|> <|MQ_reward|> <|TA_reward|>", "exactly once"),
    ],
)
def test_bad_prompt_templates(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "template.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_prompt_template(path)


def test_missing_template_explains_where_to_get_it(videoalign_copy: Path) -> None:
    (videoalign_copy / "prompt_template.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"prompt_template.py, see docs/rewards.md"):
        _reward(videoalign_copy)


def test_template_path_argument(videoalign_copy: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "my_template.txt"
    (videoalign_copy / "prompt_template.txt").rename(elsewhere)
    assert _reward(videoalign_copy, template_path=elsewhere, lazy=True).template == STAND_IN_TEMPLATE


def test_latest_step_is_the_default_and_steps_sort_numerically(tiny_videoalign: TinyVideoAlign) -> None:
    assert tiny_videoalign.steps == (9, 10)
    assert find_videoalign_checkpoint(tiny_videoalign.path).step == 10
    checkpoint = find_videoalign_checkpoint(tiny_videoalign.path, step=9)
    assert checkpoint.weights_path == tiny_videoalign.path / "checkpoint-9" / "model.pth"
    with pytest.raises(FileNotFoundError, match=r"No checkpoint-7 .* available steps: \[9, 10\]"):
        find_videoalign_checkpoint(tiny_videoalign.path, step=7)


def test_step_picks_the_checkpoint(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = _videos(2)
    older = _reward(tiny_videoalign.path, step=9)
    # The fixture stores the older step's head negated.
    torch.testing.assert_close(
        _raw(older(videos, PROMPTS[:2], fps=FPS)), -_raw(videoalign_reward(videos, PROMPTS[:2], fps=FPS))
    )


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("model_config.json", "model_config.json not found"),
        ("checkpoint-10/model.pth", "model.pth not found"),
        ("checkpoint-10/tokenizer", "Tokenizer folder .* not found"),
    ],
)
def test_missing_files(videoalign_copy: Path, remove: str, message: str) -> None:
    target = videoalign_copy / remove
    if target.is_dir():
        for child in target.iterdir():
            child.unlink()
        target.rmdir()
    else:
        target.unlink()
    with pytest.raises(FileNotFoundError, match=message):
        _reward(videoalign_copy)


def test_no_checkpoint_folders(tmp_path: Path) -> None:
    (tmp_path / "model_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="No checkpoint-<step> folder"):
        find_videoalign_checkpoint(tmp_path)


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


def _edit_weights(folder: Path, edit) -> None:
    path = folder / "checkpoint-10" / "model.pth"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_model_config(folder: Path, edit) -> None:
    path = folder / "model_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


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
    _edit_weights(videoalign_copy, edit)
    with pytest.raises(ValueError, match=message):
        _reward(videoalign_copy)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["model_config"].update(output_dim=1), "output_dim=1 but the reward head has 3 outputs"),
        (lambda c: c["peft_lora_config"].pop("lora_alpha"), "no peft_lora_config.lora_alpha"),
        (lambda c: c["model_config"].update(use_special_tokens=False), "use_special_tokens is false"),
        (lambda c: c["data_config"].update(sample_type="multi_pts"), "only 'uniform'"),
        (lambda c: c["inference_config"].pop("TA_std"), r"lacks \['TA_std'\]"),
        (lambda c: c["inference_config"].update(MQ_std=0.0), "must be positive"),
    ],
)
def test_model_config_errors(videoalign_copy: Path, edit, message: str) -> None:
    _edit_model_config(videoalign_copy, edit)
    with pytest.raises(ValueError, match=message):
        _reward(videoalign_copy)


def test_rslora_scaling_is_read_from_the_config(videoalign_copy: Path) -> None:
    _edit_model_config(videoalign_copy, lambda c: c["peft_lora_config"].update(use_rslora=True))
    videos = _videos(1)
    rslora = _reward(videoalign_copy)
    q_proj = rslora.model.model.language_model.layers[0].self_attn.q_proj.weight
    state = torch.load(videoalign_copy / "checkpoint-10" / "model.pth", weights_only=True)
    expected = state[f"{_Q}.base_layer.weight"] + 6.0 / math.sqrt(4) * (
        state[f"{_Q}.lora_B.default.weight"] @ state[f"{_Q}.lora_A.default.weight"]
    )
    torch.testing.assert_close(q_proj, expected)
    assert torch.isfinite(_raw(rslora(videos, PROMPTS[:1], fps=FPS))).all()


def test_a_bfloat16_checkpoint_loads(tmp_path: Path) -> None:
    from tests.fixtures.videoalign import build_tiny_videoalign

    tiny = build_tiny_videoalign(tmp_path, steps=(3,), weights_dtype=torch.bfloat16)
    reward = _reward(tiny.path)
    q_proj = reward.model.model.language_model.layers[1].mlp.down_proj.weight
    reference = tiny.reference.model.language_model.layers[1].mlp.down_proj.weight
    torch.testing.assert_close(q_proj, reference, atol=0.02, rtol=0.02)


# -- base config, tokenizer, chat template ------------------------------------------------------------


def test_base_config_sources(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _edit_model_config(
        videoalign_copy, lambda c: c["model_config"].update(model_name_or_path="/nowhere/qwen")
    )
    with pytest.raises(OSError, match="Could not load the Qwen2-VL config from '/nowhere/qwen'"):
        _reward(videoalign_copy, lazy=True)
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    assert (
        _reward(videoalign_copy, base_config=config, lazy=True).config.video_token_id == config.video_token_id
    )
    assert (
        _reward(videoalign_copy, base_config=tiny_videoalign.base_path, lazy=True).config.model_type
        == "qwen2_vl"
    )
    (videoalign_copy / "config.json").write_text((tiny_videoalign.base_path / "config.json").read_text())
    assert _reward(videoalign_copy, lazy=True).config.text_config.hidden_size == 32


def test_wrong_base_model_type(tmp_path: Path, videoalign_copy: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    with pytest.raises(ValueError, match="'qwen2_5_vl' config; VideoAlign is built on Qwen2-VL"):
        _reward(videoalign_copy, base_config=tmp_path, lazy=True)


def test_wrong_base_architecture_is_caught_by_shapes(
    tiny_videoalign: TinyVideoAlign, videoalign_copy: Path
) -> None:
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    config.text_config.intermediate_size = 64
    with pytest.raises(ValueError, match=r"mlp.gate_proj.weight: checkpoint \(48, 32\), model \(64, 32\)"):
        _reward(videoalign_copy, base_config=config)


def _replace_tokenizer(folder: Path, tokenizer) -> None:
    target = folder / "checkpoint-10" / "tokenizer"
    for child in target.iterdir():
        child.unlink()
    tokenizer.save_pretrained(target)


def test_tokenizer_without_reward_tokens(videoalign_copy: Path) -> None:
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocabulary = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    plain = Qwen2Tokenizer(vocab=vocabulary, merges=[], chat_template="{{ messages }}")
    _replace_tokenizer(videoalign_copy, plain)
    with pytest.raises(ValueError, match=r"no token <\|VQ_reward\|>"):
        _reward(videoalign_copy, lazy=True)


def test_chat_template_missing_or_given(videoalign_copy: Path, tmp_path: Path) -> None:
    tokenizer = tiny_videoalign_tokenizer()
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    _replace_tokenizer(videoalign_copy, tokenizer)
    with pytest.raises(ValueError, match="has no chat template; pass chat_template="):
        _reward(videoalign_copy, lazy=True)
    jinja = tmp_path / "chat_template.json"
    jinja.write_text(json.dumps({"chat_template": template}))
    reward = _reward(videoalign_copy, chat_template=jinja, lazy=True)
    assert reward.build_text("a cat").startswith("<|im_start|>system\n")


def test_video_token_must_match_the_config(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path) -> None:
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    config.video_token_id = 5
    with pytest.raises(ValueError, match="differs from the config's video_token_id 5"):
        _reward(videoalign_copy, base_config=config, lazy=True)


# -- scores -------------------------------------------------------------------------------------


def test_model_inputs_match_the_expected_tokens_and_pixels(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = _videos()
    inputs = videoalign_reward.prepare_inputs(list(videos), PROMPTS, [FPS] * 3)
    expected = _reference_inputs(tiny_videoalign, videos, PROMPTS)
    assert inputs.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(inputs[key], value, atol=1e-5, rtol=0, msg=key)
    lengths = inputs["attention_mask"].sum(dim=1)
    assert lengths[1] > lengths[0] > lengths[2]  # right padding exercised


def test_scores_equal_the_in_memory_merged_model(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = _videos()
    scores = videoalign_reward(videos, PROMPTS, fps=FPS)
    expected_raw = _reference_raw(tiny_videoalign, _reference_inputs(tiny_videoalign, videos, PROMPTS))
    torch.testing.assert_close(_raw(scores), expected_raw, atol=1e-5, rtol=1e-5)
    for index, metric in enumerate(REWARD_TOKENS):
        mean, std = NORMALIZATION[f"{metric.upper()}_mean"], NORMALIZATION[f"{metric.upper()}_std"]
        torch.testing.assert_close(
            scores[metric], (expected_raw[:, index] - mean) / std, atol=1e-5, rtol=1e-5
        )
    torch.testing.assert_close(scores["overall"], scores["vq"] + scores["mq"] + scores["ta"])
    assert list(scores) == ["vq", "mq", "ta", "vq_raw", "mq_raw", "ta_raw", "overall"]
    assert all(value.dtype == torch.float32 and value.shape == (3,) for value in scores.values())
    assert expected_raw.std(dim=0).min() > 1e-4  # the videos/prompts are told apart


def test_sequential_position_ids_are_what_decide_the_scores(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    inputs = videoalign_reward.prepare_inputs(list(_videos(2)), PROMPTS[:2], [FPS] * 2)
    model, tokens = videoalign_reward.model, videoalign_reward.reward_token_ids
    with torch.no_grad():
        default = model(**inputs, reward_token_ids=tokens)
        length = inputs["input_ids"].shape[1]
        sequential = model(
            **inputs, reward_token_ids=tokens, position_ids=torch.arange(length).expand(2, length)
        )
        mm_types = (inputs["input_ids"] == videoalign_reward.video_token_id).int() * 2
        rope_3d, _ = model.model.get_rope_index(
            inputs["input_ids"],
            mm_types,
            video_grid_thw=inputs["video_grid_thw"],
            attention_mask=inputs["attention_mask"],
        )
        with_3d_rope = model(**inputs, reward_token_ids=tokens, position_ids=rope_3d)
    torch.testing.assert_close(default, sequential)
    assert (default - with_3d_rope).abs().max() > 1e-3  # transformers 5's default ids would change the scores


def test_batched_scoring_with_padding_equals_one_at_a_time(videoalign_reward: VideoAlignReward) -> None:
    videos = _videos(seed=3)
    batched = _raw(videoalign_reward(videos, PROMPTS, fps=FPS))
    single = torch.cat(
        [_raw(videoalign_reward(videos[i : i + 1], PROMPTS[i : i + 1], fps=FPS)) for i in range(3)]
    )
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


def test_batch_size_chunks_give_the_same_scores(tiny_videoalign: TinyVideoAlign, videoalign_reward) -> None:
    videos = _videos(seed=4)
    chunked = _reward(tiny_videoalign.path, batch_size=2)(videos, PROMPTS, fps=FPS)
    torch.testing.assert_close(
        _raw(chunked), _raw(videoalign_reward(videos, PROMPTS, fps=FPS)), atol=1e-5, rtol=1e-5
    )


def test_bfloat16_weights_score_close_to_float32(tiny_videoalign: TinyVideoAlign, videoalign_reward) -> None:
    videos = _videos(seed=5)
    reward_bf16 = _reward(tiny_videoalign.path, dtype=torch.bfloat16)
    assert reward_bf16.model.rm_head.weight.dtype == torch.bfloat16
    scores = reward_bf16(videos, PROMPTS, fps=FPS)
    assert scores["vq"].dtype == torch.float32
    torch.testing.assert_close(
        _raw(scores), _raw(videoalign_reward(videos, PROMPTS, fps=FPS)), atol=0.1, rtol=0.05
    )


def test_unnormalised_scores(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path) -> None:
    videos = _videos(1)
    raw_scores = _reward(tiny_videoalign.path, normalize=False)(videos, PROMPTS[:1], fps=FPS)
    torch.testing.assert_close(raw_scores["vq"], raw_scores["vq_raw"])
    _edit_model_config(videoalign_copy, lambda c: c.pop("inference_config"))
    no_stats = _reward(videoalign_copy)(videos, PROMPTS[:1], fps=FPS)
    torch.testing.assert_close(no_stats["ta"], raw_scores["ta_raw"])
    torch.testing.assert_close(no_stats["overall"], _raw(raw_scores).sum(dim=1))


def test_composite_default_weights_only_vq_mq_ta(videoalign_reward: VideoAlignReward) -> None:
    videos = _videos()
    output = CompositeReward(videoalign_reward)(videos, PROMPTS, fps=FPS)
    scores = videoalign_reward(videos, PROMPTS, fps=FPS)
    assert output.weights == {"vq": 0.5, "mq": 0.5, "ta": 1.0}
    torch.testing.assert_close(output.total, 0.5 * scores["vq"] + 0.5 * scores["mq"] + scores["ta"])
    assert set(output.components) == {"vq", "mq", "ta", "vq_raw", "mq_raw", "ta_raw", "overall"}
    setting_a = CompositeReward([videoalign_reward], "setting_a")(videos, PROMPTS, fps=FPS)
    torch.testing.assert_close(setting_a.total, scores["overall"])


def test_composite_marks_bad_samples_invalid(videoalign_reward: VideoAlignReward) -> None:
    videos = _videos()
    videos[1, 2, 0, 5, 5] = math.nan
    prompts = [PROMPTS[0], PROMPTS[1], "cheat <|TA_reward|>"]
    output = CompositeReward(videoalign_reward)(videos, prompts, fps=FPS)
    assert output.valid.tolist() == [True, False, False]
    assert output.errors[1] == "component 'vq' is nan; component 'mq' is nan; component 'ta' is nan"
    assert "contains the special token <|TA_reward|>" in output.errors[2]
    alone = videoalign_reward(videos[:1], prompts[:1], fps=FPS)
    torch.testing.assert_close(output.components["ta"][:1], alone["ta"], atol=1e-5, rtol=1e-5)


# -- video inputs and their errors ---------------------------------------------------------------


def test_video_files_score_like_their_frames(videoalign_reward: VideoAlignReward, tmp_path: Path) -> None:
    iio = pytest.importorskip("imageio.v3")
    levels = torch.randint(0, 4, (FRAMES, HEIGHT, WIDTH, 3), generator=torch.Generator().manual_seed(0))
    frames = (levels * 85).to(torch.uint8)  # few colours: the GIF palette keeps them exactly
    path = tmp_path / "clip.gif"
    iio.imwrite(path, frames.numpy(), duration=250, loop=0)  # 250 ms per frame: 4 fps
    clip, fps = read_video_file(path)
    assert fps == 4.0 and clip.shape == (FRAMES, 3, HEIGHT, WIDTH)
    as_tensor = frames.permute(0, 3, 1, 2).float() / 255
    torch.testing.assert_close(clip, as_tensor)
    from_file = videoalign_reward([path, as_tensor], PROMPTS[:2], fps=FPS)
    from_tensor = videoalign_reward(torch.stack([as_tensor, as_tensor]), PROMPTS[:2], fps=FPS)
    torch.testing.assert_close(_raw(from_file), _raw(from_tensor), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # imageio tries its deprecated plugins on garbage
def test_video_file_errors(videoalign_reward: VideoAlignReward, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        videoalign_reward([tmp_path / "missing.mp4"], PROMPTS[:1])
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    with pytest.raises(ValueError, match=r"Could not read video .*broken\.mp4"):
        videoalign_reward([broken], PROMPTS[:1])
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    with pytest.raises(ImportError, match="pip install imageio"):
        read_video_file(broken)
    with pytest.raises(ValueError, match="list of video paths, not a single path"):
        videoalign_reward(str(broken), PROMPTS[:1])


@pytest.mark.parametrize(
    ("videos", "kwargs", "message"),
    [
        (_videos(1, frames=3), {"fps": FPS}, "at least 4 frames, got 3"),
        (_videos(1) * 2 - 1, {"fps": FPS}, r"must lie in \[0, 1\]"),
        (_videos(1).permute(0, 2, 1, 3, 4), {"fps": FPS}, r"layout \(B, F, 3, H, W\)"),
        (_videos(1), {}, "Pass fps="),
        ([_videos(1)[0].permute(0, 2, 3, 1)], {"fps": FPS}, "layout"),
    ],
)
def test_bad_videos(videoalign_reward: VideoAlignReward, videos, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        videoalign_reward(videos, PROMPTS[:1], **kwargs)


def test_prompt_count_must_match(videoalign_reward: VideoAlignReward) -> None:
    with pytest.raises(ValueError, match="Got 2 videos but 1 prompts"):
        videoalign_reward(_videos(2), PROMPTS[:1], fps=FPS)


def test_non_finite_video_gets_nan_and_leaves_the_others_alone(videoalign_reward: VideoAlignReward) -> None:
    videos = _videos()
    clean = _raw(videoalign_reward(videos, PROMPTS, fps=FPS))
    videos[0, 1, 1, 0, 0] = math.inf
    scores = _raw(videoalign_reward(videos, PROMPTS, fps=FPS))
    assert torch.isnan(scores[0]).all()
    torch.testing.assert_close(scores[1:], clean[1:], atol=1e-5, rtol=1e-5)


def test_videos_of_different_sizes_and_rates_in_one_call(videoalign_reward: VideoAlignReward) -> None:
    short = torch.rand(6, 3, 30, 60)
    long = _videos(1)[0]
    together = _raw(videoalign_reward([short, long], PROMPTS[:2], fps=FPS))
    apart = torch.cat(
        [
            _raw(videoalign_reward([clip], [p], fps=FPS))
            for clip, p in ((short, PROMPTS[0]), (long, PROMPTS[1]))
        ]
    )
    torch.testing.assert_close(together, apart, atol=1e-5, rtol=1e-5)


# -- loading on demand and offloading -------------------------------------------------------------


def test_lazy_loading_and_offloading(tiny_videoalign: TinyVideoAlign, videoalign_reward, monkeypatch) -> None:
    reward = _reward(tiny_videoalign.path, lazy=True, offload_between_calls=True)
    assert not reward.is_loaded and "loaded=False" in repr(reward)
    offloads = []
    original = reward.offload
    monkeypatch.setattr(reward, "offload", lambda: offloads.append(1) or original())
    videos = _videos(1)
    scores = reward(videos, PROMPTS[:1], fps=FPS)
    assert reward.is_loaded and offloads == [1]
    assert reward.model.rm_head.weight.device.type == "cpu"
    torch.testing.assert_close(_raw(scores), _raw(videoalign_reward(videos, PROMPTS[:1], fps=FPS)))
    with pytest.raises(ValueError):
        reward(videos, ["bad <|VQ_reward|>"], fps=FPS)
    assert offloads == [1, 1]  # offloaded even when scoring fails
    assert reward.to("cpu") is reward and reward.device == torch.device("cpu")
    assert reward.__name__ == "videoalign"


def test_batch_size_must_be_positive(tiny_videoalign: TinyVideoAlign) -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        _reward(tiny_videoalign.path, batch_size=0)


# -- fidelity to VideoAlign's original stack (opt-in) ---------------------------------------------


@pytest.mark.slow
def test_videoalign_matches_transformers_445(
    tiny_videoalign: TinyVideoAlign, videoalign_reward, tmp_path
) -> None:
    """VideoAlign's own path on transformers 4.45 + peft gives the same inputs and scores as this loader.

    Opt-in: set ``SAGE_TRANSFORMERS_445`` to a folder holding transformers 4.45 (e.g.
    ``pip install --target DIR --no-deps transformers==4.45.2 tokenizers==0.20.3 huggingface_hub==0.25.2``).
    """
    transformers_445 = os.environ.get("SAGE_TRANSFORMERS_445")
    if not transformers_445:
        pytest.skip(
            "set SAGE_TRANSFORMERS_445 to a transformers-4.45 install to compare with VideoAlign's stack"
        )
    videos = _videos()
    frames = [resize_frames(video[SAMPLED], RESIZED) * 255 for video in videos]  # qwen-vl-utils' output
    saved = {
        "path": str(tiny_videoalign.path),
        "prompts": PROMPTS,
        "template": STAND_IN_TEMPLATE,
        "frames": frames,
    }
    torch.save(saved, tmp_path / "inputs.pt")
    script = Path(__file__).with_name("transformers445_reference.py")
    environment = {**os.environ, "PYTHONPATH": transformers_445}
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "inputs.pt"), str(tmp_path / "out.json")],
        check=True,
        env=environment,
        cwd=tmp_path,
    )
    reference = json.loads((tmp_path / "out.json").read_text())
    inputs = videoalign_reward.prepare_inputs(list(videos), PROMPTS, [FPS] * 3)
    for key in ("input_ids", "attention_mask", "video_grid_thw"):
        assert inputs[key].tolist() == reference[key], key
    torch.testing.assert_close(inputs["pixel_values_videos"], torch.tensor(reference["pixel_values_videos"]))
    scores = _raw(videoalign_reward(videos, PROMPTS, fps=FPS))
    torch.testing.assert_close(scores, torch.tensor(reference["rewards"]), atol=1e-5, rtol=1e-5)
