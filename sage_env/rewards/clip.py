"""A CLIP text-video alignment reward: how well sampled frames match the prompt in CLIP's embedding space.

A lightweight alternative (or complement) to VideoAlign's text-alignment score: each video is read as
``num_frames`` evenly spaced frames, each frame goes through CLIP's image preprocessing (shortest side resized
to the model's size with antialiased bicubic interpolation, centre crop, mean/std normalisation; in torch, on
the float frames), and the reward is the mean cosine similarity between the frames' and the prompt's
projected CLIP embeddings, in [-1, 1].
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, CLIPModel
from transformers.utils import cached_file

from sage_env.rewards.base import check_videos

__all__ = ["ClipAlignmentReward", "clip_preprocess"]

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_preprocess(
    frames: torch.Tensor,
    size: int,
    crop_size: tuple[int, int],
    mean: Sequence[float] = OPENAI_CLIP_MEAN,
    std: Sequence[float] = OPENAI_CLIP_STD,
) -> torch.Tensor:
    """CLIP's image preprocessing of ``(N, 3, H, W)`` frames in [0, 1]: resize, centre crop, normalise.

    The shortest side becomes ``size`` (the other ``int(size * long / short)``, as transformers'
    ``CLIPImageProcessor``), then the centre ``crop_size`` (height, width) is kept.
    """
    height, width = frames.shape[-2:]
    short, long = min(height, width), max(height, width)
    new_long = int(size * long / short)
    resized_size = (size, new_long) if height <= width else (new_long, size)
    frames = F.interpolate(
        frames.float(), size=resized_size, mode="bicubic", align_corners=False, antialias=True
    )
    crop_height, crop_width = crop_size
    if crop_height > resized_size[0] or crop_width > resized_size[1]:
        raise ValueError(f"Cannot crop {crop_size} from frames resized to {resized_size}.")
    top, left = (resized_size[0] - crop_height) // 2, (resized_size[1] - crop_width) // 2
    frames = frames[..., top : top + crop_height, left : left + crop_width].clamp(0, 1)
    mean_tensor = frames.new_tensor(mean).view(1, 3, 1, 1)
    std_tensor = frames.new_tensor(std).view(1, 3, 1, 1)
    return (frames - mean_tensor) / std_tensor


def _preprocessor_settings(model_name_or_path: str | os.PathLike, image_size: int) -> dict[str, Any]:
    """Resize / crop / normalisation from ``preprocessor_config.json`` (CLIP's defaults when the file is absent)."""
    settings: dict[str, Any] = {
        "size": image_size,
        "crop_size": (image_size, image_size),
        "mean": OPENAI_CLIP_MEAN,
        "std": OPENAI_CLIP_STD,
    }
    path = cached_file(
        str(model_name_or_path), "preprocessor_config.json", _raise_exceptions_for_missing_entries=False
    )
    if path is None:
        return settings
    with open(path, encoding="utf-8") as file:
        config = json.load(file)
    size, crop = config.get("size", image_size), config.get("crop_size", image_size)
    settings["size"] = size.get("shortest_edge", image_size) if isinstance(size, dict) else int(size)
    if isinstance(crop, dict):
        settings["crop_size"] = (crop["height"], crop["width"])
    else:
        settings["crop_size"] = (int(crop), int(crop))
    settings["mean"] = tuple(config.get("image_mean", OPENAI_CLIP_MEAN))
    settings["std"] = tuple(config.get("image_std", OPENAI_CLIP_STD))
    return settings


class ClipAlignmentReward:
    """Mean cosine similarity between CLIP embeddings of sampled frames and of the prompt, per video.

    A reward function (``videos, prompts, *, fps -> (B,)``) named ``clip``: with default weights
    `CompositeReward` weights it 1.0.

    Args:
        model_name_or_path: a ``CLIPModel`` folder or Hub id with its tokenizer (e.g.
            ``openai/clip-vit-large-patch14``).
        num_frames: frames read per video, evenly spaced from first to last (fewer if the video is shorter).
        device: where scoring runs; None: CUDA when available.
        dtype: weight dtype.
        batch_size: videos per forward pass.
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike,
        *,
        num_frames: int = 8,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 8,
    ) -> None:
        if num_frames < 1 or batch_size < 1:
            raise ValueError(
                f"num_frames and batch_size must be at least 1, got {num_frames} and {batch_size}."
            )
        self.__name__ = "clip"
        self.reward_model_description = f"CLIP text-video alignment ({model_name_or_path})"
        self.component_descriptions = {"clip": "CLIP cosine similarity of frames and prompt"}
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = CLIPModel.from_pretrained(model_name_or_path, dtype=dtype).to(self.device).eval()
        self.model.requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        self.num_frames, self.batch_size = num_frames, batch_size
        self.preprocessing = _preprocessor_settings(
            model_name_or_path, self.model.config.vision_config.image_size
        )
        self.max_text_length = self.model.config.text_config.max_position_embeddings

    def to(self, device: str | torch.device) -> ClipAlignmentReward:
        """Score on ``device`` from now on."""
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def offload(self) -> ClipAlignmentReward:
        """Move the weights to the CPU (call `to` before scoring again) and free cached GPU memory."""
        self.model.to("cpu")
        self.device = torch.device("cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self

    def frame_indices(self, total_frames: int) -> torch.Tensor:
        """The frames read from a video of ``total_frames`` frames."""
        count = min(self.num_frames, total_frames)
        return torch.linspace(0, total_frames - 1, count).round().long()

    @torch.no_grad()
    def _score_batch(self, videos: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        batch, total_frames = videos.shape[:2]
        frames = videos[:, self.frame_indices(total_frames).to(videos.device)].flatten(0, 1).to(self.device)
        pixels = clip_preprocess(frames, **self.preprocessing).to(self.model.dtype)
        text = self.tokenizer(
            list(prompts), padding=True, truncation=True, max_length=self.max_text_length, return_tensors="pt"
        ).to(self.device)
        outputs = self.model(
            input_ids=text["input_ids"], attention_mask=text["attention_mask"], pixel_values=pixels
        )
        image_embeds = outputs.image_embeds.float().view(batch, -1, outputs.image_embeds.shape[-1])
        return torch.einsum("bfd,bd->bf", image_embeds, outputs.text_embeds.float()).mean(dim=1).cpu()

    def __call__(self, videos: torch.Tensor, prompts: Sequence[str], **kwargs: Any) -> torch.Tensor:
        """``(B,)`` float32 mean frame-prompt cosine similarity of ``(B, F, 3, H, W)`` videos in [0, 1]."""
        check_videos(videos, len(prompts))
        scores = [
            self._score_batch(
                videos[start : start + self.batch_size], prompts[start : start + self.batch_size]
            )
            for start in range(0, videos.shape[0], self.batch_size)
        ]
        return torch.cat(scores) if scores else torch.zeros(0)
