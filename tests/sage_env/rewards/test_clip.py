"""Tests for the CLIP text-video alignment reward on a tiny random CLIP saved to disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from sage_env.rewards import CompositeReward
from sage_env.rewards.clip import ClipAlignmentReward, clip_preprocess

PROMPTS = ["a red cat", "a dog running through a long grassy field", "sea"]


def _tiny_clip_tokenizer() -> CLIPTokenizer:
    characters = list(bytes_to_unicode().values())
    vocabulary = {character: index for index, character in enumerate(characters)}
    vocabulary.update(
        {f"{character}</w>": len(characters) + index for index, character in enumerate(characters)}
    )
    vocabulary["<|startoftext|>"] = len(vocabulary)
    vocabulary["<|endoftext|>"] = len(vocabulary)
    return CLIPTokenizer(vocab=vocabulary, merges=[])


@pytest.fixture(scope="module")
def tiny_clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random CLIP (2 layers x 32, 32x32 images, patch 8) with tokenizer and preprocessor config."""
    tokenizer = _tiny_clip_tokenizer()
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 64, "pad_token_id": tokenizer.pad_token_id, **special,
        },
        vision_config={
            "image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37,
            "num_hidden_layers": 2, "num_attention_heads": 2,
        },
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_clip")
    CLIPModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    preprocessor = {
        "size": {"shortest_edge": 32},
        "crop_size": {"height": 32, "width": 32},
        "image_mean": [0.5] * 3,
    }
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return path


@pytest.fixture(scope="module")
def clip_reward(tiny_clip_path: Path) -> ClipAlignmentReward:
    return ClipAlignmentReward(tiny_clip_path, num_frames=3, device="cpu", batch_size=2)


def _videos(batch: int = 3, frames: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, frames, 3, 40, 56, generator=torch.Generator().manual_seed(seed))


def test_preprocessing_matches_transformers_clip_image_processor() -> None:
    y, x = torch.meshgrid(torch.linspace(0, 1, 48), torch.linspace(0, 1, 80), indexing="ij")
    image = torch.stack([x, y, (torch.sin(6 * x) * torch.cos(4 * y) + 1) / 2])  # smooth: resamplers agree
    uint8 = (image * 255).round().to(torch.uint8)
    processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    expected = processor(images=[uint8.permute(1, 2, 0).numpy()], return_tensors="pt")["pixel_values"]
    ours = clip_preprocess(uint8[None].float() / 255, 32, (32, 32))
    # PIL's bicubic kernel (a = -0.5) differs slightly from torch's (a = -0.75).
    torch.testing.assert_close(ours, expected, atol=0.03, rtol=0)


def test_preprocessing_keeps_the_centre_of_portrait_frames() -> None:
    frames = torch.zeros(1, 3, 80, 40)
    frames[..., 30:50, :] = 1.0  # a bright band across the middle
    processed = clip_preprocess(frames, 20, (20, 20), mean=(0, 0, 0), std=(1, 1, 1))
    assert processed.shape == (1, 3, 20, 20)
    assert processed[..., 8:12, :].min() > 0.9 and processed[..., :2, :].max() < 0.1


def test_preprocessor_config_is_read(clip_reward: ClipAlignmentReward) -> None:
    assert clip_reward.preprocessing["mean"] == (0.5, 0.5, 0.5)
    assert clip_reward.preprocessing["crop_size"] == (32, 32)


def test_scores_equal_mean_cosine_of_clip_embeddings(clip_reward, tiny_clip_path: Path) -> None:
    videos = _videos()
    scores = clip_reward(videos, PROMPTS, fps=8)
    model = CLIPModel.from_pretrained(tiny_clip_path).eval()
    tokenizer = CLIPTokenizer.from_pretrained(tiny_clip_path)
    expected = []
    with torch.no_grad():
        for video, prompt in zip(videos, PROMPTS):
            frames = video[[0, 3, 6]]
            pixels = clip_preprocess(frames, 32, (32, 32), mean=(0.5, 0.5, 0.5))
            image = model.get_image_features(pixel_values=pixels).pooler_output
            text = model.get_text_features(**tokenizer([prompt], return_tensors="pt")).pooler_output
            expected.append(F.cosine_similarity(image, text).mean())
    torch.testing.assert_close(scores, torch.stack(expected), atol=1e-5, rtol=1e-5)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and scores.abs().max() <= 1


def test_frame_sampling(clip_reward: ClipAlignmentReward) -> None:
    assert clip_reward.frame_indices(7).tolist() == [0, 3, 6]
    assert clip_reward.frame_indices(2).tolist() == [0, 1]


def test_long_prompts_are_truncated(clip_reward: ClipAlignmentReward) -> None:
    scores = clip_reward(_videos(1), ["a very long prompt " * 20])
    assert torch.isfinite(scores).all()


def test_composite_weights_clip_by_its_name(clip_reward: ClipAlignmentReward) -> None:
    videos = _videos()
    output = CompositeReward([clip_reward])(videos, PROMPTS, fps=8)
    assert output.weights == {"clip": 1.0}
    torch.testing.assert_close(output.total, clip_reward(videos, PROMPTS))


def test_bad_inputs(clip_reward: ClipAlignmentReward, tiny_clip_path: Path) -> None:
    with pytest.raises(ValueError, match="Got 3 videos but 2 prompts"):
        clip_reward(_videos(), PROMPTS[:2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        clip_reward(_videos() * 255, PROMPTS)
    with pytest.raises(ValueError, match="at least 1"):
        ClipAlignmentReward(tiny_clip_path, num_frames=0, device="cpu")


def test_offload_and_to(tiny_clip_path: Path) -> None:
    reward = ClipAlignmentReward(tiny_clip_path, device="cpu")
    assert reward.offload() is reward and reward.device == torch.device("cpu")
    assert reward.to("cpu") is reward
    assert torch.isfinite(reward(_videos(1), PROMPTS[:1])).all()
