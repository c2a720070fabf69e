"""Shared constants, the independent reference computations and checkpoint editors of the VideoAlign tests.

Scores are checked against an independent computation: the merged model built directly in memory by
`tests.fixtures.videoalign` (installed transformers layout, no conversion), fed token ids tokenised from the
expected chat text and pixels patched with the transformers-4.45 processor's reshape/transpose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sage_env.rewards.videoalign import REWARD_TOKENS, VideoAlignReward
from tests.fixtures.videoalign import STAND_IN_TEMPLATE, TinyVideoAlign
from tests.sage_env.rewards.conftest import TEST_MIN_PIXELS

CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
PROMPTS = ["a cat", "a red fox jumps over a fence at dusk", "x"]
# 8 frames at 4 fps read at 2 fps -> 4 frames (indices 0, 2, 5, 7); 64x88 -> 56x84 (the fixture's budget).
FRAMES, FPS, HEIGHT, WIDTH = 8, 4.0, 64, 88
SAMPLED, RESIZED = [0, 2, 5, 7], (56, 84)
VIDEO_TOKENS = 2 * (4 * 6) // 4  # grid (2, 4, 6), 2x2 merge


def make_videos(batch: int = 3, seed: int = 0, frames: int = FRAMES) -> torch.Tensor:
    """``(batch, frames, 3, HEIGHT, WIDTH)`` uniform noise in [0, 1], seeded."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, frames, 3, HEIGHT, WIDTH, generator=generator)


def load_reward(path: Path, **overrides: Any) -> VideoAlignReward:
    """`VideoAlignReward` on ``path`` for tests: CPU, float32, the tests' pixel floor (overridable)."""
    options = {"device": "cpu", "dtype": torch.float32, "min_pixels": TEST_MIN_PIXELS, **overrides}
    return VideoAlignReward(path, **options)


def raw_scores(scores: dict[str, torch.Tensor]) -> torch.Tensor:
    """The ``(B, 3)`` raw VQ / MQ / TA scores of a reward's output."""
    return torch.stack([scores[f"{metric}_raw"] for metric in REWARD_TOKENS], dim=1)


# -- independent computations ----------------------------------------------------------------------


def reference_pixels(video: torch.Tensor) -> torch.Tensor:
    """Sampled, resized, CLIP-normalised frames patched with the 4.45 Qwen2-VL processor's reshape/transpose."""
    frames = (video[SAMPLED] * 255).round()
    frames = F.interpolate(frames, size=RESIZED, mode="bicubic", align_corners=False, antialias=True)
    frames = ((frames.clamp(0, 255).round() / 255 - CLIP_MEAN) / CLIP_STD).numpy()
    t, c, h, w = frames.shape
    patches = frames.reshape(t // 2, 2, c, h // 28, 2, 14, w // 28, 2, 14)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return torch.from_numpy(np.ascontiguousarray(patches).reshape(-1, c * 2 * 14 * 14))


def expected_text(prompt: str, video_tokens: int = VIDEO_TOKENS) -> str:
    """The chat text the fixture's Qwen2-VL-style chat template produces, with the video placeholder expanded."""
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
        + "<|video_pad|>" * video_tokens
        + "<|vision_end|>"
        + STAND_IN_TEMPLATE.replace("{text_prompt}", prompt)
        + "<|im_end|>\n<|im_start|>assistant\n"
    )


def reference_inputs(
    tiny: TinyVideoAlign, videos: torch.Tensor, prompts: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded token ids of the expected chat texts, their mask, reference pixels and grids."""
    sequences = [tiny.tokenizer(expected_text(prompt))["input_ids"] for prompt in prompts]
    length = max(map(len, sequences))
    pad = tiny.tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([ids + [pad] * (length - len(ids)) for ids in sequences]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in sequences]),
        "pixel_values_videos": torch.cat([reference_pixels(video) for video in videos]),
        "video_grid_thw": torch.tensor([[2, 4, 6]] * len(prompts)),
    }


@torch.no_grad()
def reference_raw(tiny: TinyVideoAlign, inputs: dict[str, torch.Tensor], position_ids=None) -> torch.Tensor:
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
            scores[row, metric] = tiny.rm_head(hidden[row, position])[metric].float()
    return scores


def edit_weights(folder: Path, edit: Callable[[dict], Any]) -> None:
    """Apply ``edit`` to the latest step's ``model.pth`` of a checkpoint copy."""
    path = folder / "checkpoint-10" / "model.pth"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def edit_model_config(folder: Path, edit: Callable[[dict], Any]) -> None:
    """Apply ``edit`` to a checkpoint copy's parsed ``model_config.json``."""
    path = folder / "model_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def replace_tokenizer(folder: Path, tokenizer: Any) -> None:
    """Save ``tokenizer`` in place of the latest step's tokenizer folder."""
    target = folder / "checkpoint-10" / "tokenizer"
    for child in target.iterdir():
        child.unlink()
    tokenizer.save_pretrained(target)
