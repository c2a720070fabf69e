"""VideoAlign (KwaiVGI's VideoReward) as a reward function for generated video tensors.

VideoAlign ("Improving Video Generation with Human Feedback", arXiv 2501.13918) is Qwen2-VL-2B with a bias-free
linear head ``rm_head`` read at the final hidden states of three special tokens ``<|VQ_reward|>``,
``<|MQ_reward|>`` and ``<|TA_reward|>`` placed in the prompt: visual quality, motion quality and text alignment.
It is the paper's terminal reward (SAGE-GRPO Sec. 4.1, Table 2).

`VideoAlignReward` loads a checkpoint folder exactly as released::

    model_config.json                 data / model / LoRA settings and the per-metric mean and std
    checkpoint-<step>/model.pth       a peft state dict: transformers-4.45 key names, LoRA not merged
    checkpoint-<step>/tokenizer/      Qwen2 tokenizer with the three reward tokens
    prompt_template.txt               the prompt template the checkpoint was trained with (user-supplied)

and reproduces the original inference: frames sampled at ~2 fps, resized to multiples of 28 within a pixel
budget (antialiased bicubic, as qwen-vl-utils), CLIP normalisation, Qwen2-VL patching, the chat template,
sequential position ids, the reward head at the reward tokens, optional mean/std normalisation. Everything
is plain torch plus transformers' ``Qwen2VLModel``; no remote code, weights read with ``weights_only=True``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2VLConfig, Qwen2VLModel

from sage_env.rewards.base import check_videos

__all__ = [
    "REWARD_TOKENS",
    "TEMPLATE_FILENAME",
    "VideoAlignCheckpoint",
    "VideoAlignModel",
    "VideoAlignReward",
    "VideoAlignSettings",
    "VideoAlignVideoProcessor",
    "build_videoalign_model",
    "convert_videoalign_state_dict",
    "find_videoalign_checkpoint",
    "load_prompt_template",
    "merge_lora_weight",
    "num_sampled_frames",
    "patchify_video",
    "read_video_file",
    "remap_qwen2_vl_key",
    "resize_frames",
    "sample_frame_indices",
    "smart_resize",
]

REWARD_TOKENS: dict[str, str] = {"vq": "<|VQ_reward|>", "mq": "<|MQ_reward|>", "ta": "<|TA_reward|>"}
"""Metric name -> the special token whose final hidden state the reward head reads (in prompt order)."""

VIDEO_TOKEN = "<|video_pad|>"
TEMPLATE_PLACEHOLDER = "{text_prompt}"
TEMPLATE_FILENAME = "prompt_template.txt"
"""Where the loader looks for the prompt template inside the checkpoint folder when no path is given."""

# qwen-vl-utils' video constants (VideoAlign's vision_process.py uses them unchanged).
FRAME_FACTOR = 2
MIN_FRAMES = 4
MAX_FRAMES = 768
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_TOTAL_PIXELS = 24576 * 28 * 28
MAX_ASPECT_RATIO = 200
# OpenAI CLIP statistics, the image_mean / image_std of Qwen2-VL's processor.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<factor>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")
_BASE_LAYER = ".base_layer."


# -- frame sampling and pixels (qwen-vl-utils semantics, pure torch) ----------------------------------


def _round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


def _floor_by_factor(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def _ceil_by_factor(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def num_sampled_frames(
    total_frames: int, video_fps: float, sample_fps: float = 2.0, num_frames: int | None = None
) -> int:
    """How many frames VideoAlign reads from a video of ``total_frames`` frames at ``video_fps``.

    ``total_frames / video_fps * sample_fps`` rounded to an even number, at least 4 and at most the video's
    length (rounded down to even) or 768, as qwen-vl-utils' ``smart_nframes``; ``num_frames`` fixes the count.
    """
    if total_frames < MIN_FRAMES:
        raise ValueError(
            f"VideoAlign needs videos of at least {MIN_FRAMES} frames, got {total_frames}; generate longer videos."
        )
    if num_frames is not None:
        count = _round_by_factor(num_frames, FRAME_FACTOR)
        if not MIN_FRAMES <= count <= total_frames:
            raise ValueError(
                f"num_frames={num_frames} needs {count} frames but the video has {total_frames} (and at least "
                f"{MIN_FRAMES} are needed); lower num_frames or generate longer videos."
            )
        return count
    if not (video_fps > 0 and sample_fps > 0):
        raise ValueError(f"fps must be positive, got video fps {video_fps} and sampling fps {sample_fps}.")
    max_frames = _floor_by_factor(min(MAX_FRAMES, total_frames), FRAME_FACTOR)
    count = min(
        max(total_frames / video_fps * sample_fps, _ceil_by_factor(MIN_FRAMES, FRAME_FACTOR)), max_frames
    )
    return _round_by_factor(count, FRAME_FACTOR)


def sample_frame_indices(
    total_frames: int, video_fps: float, sample_fps: float = 2.0, num_frames: int | None = None
) -> torch.Tensor:
    """Indices of the frames VideoAlign reads: `num_sampled_frames` evenly spaced from first to last."""
    count = num_sampled_frames(total_frames, video_fps, sample_fps, num_frames)
    return torch.linspace(0, total_frames - 1, count).round().long()


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
) -> tuple[int, int]:
    """The frame size Qwen2-VL sees: both sides multiples of ``factor``, area within the pixel budget.

    Each side is rounded to the nearest multiple; if the area exceeds ``max_pixels`` both sides shrink by the
    same factor and round down, if it is below ``min_pixels`` they grow and round up (aspect ratio kept).
    """
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"Frames of {height}x{width} pixels cannot be scored: sides must be positive with an aspect ratio "
            f"below {MAX_ASPECT_RATIO}."
        )
    resized_height = max(factor, _round_by_factor(height, factor))
    resized_width = max(factor, _round_by_factor(width, factor))
    if resized_height * resized_width > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_height = max(factor, _floor_by_factor(height / beta, factor))
        resized_width = max(factor, _floor_by_factor(width / beta, factor))
    elif resized_height * resized_width < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_height = _ceil_by_factor(height * beta, factor)
        resized_width = _ceil_by_factor(width * beta, factor)
    return resized_height, resized_width


def default_max_pixels(num_frames: int, min_pixels: int = VIDEO_MIN_PIXELS) -> int:
    """qwen-vl-utils' per-frame budget when a checkpoint gives none: a share of the video's total budget."""
    budget = min(VIDEO_MAX_PIXELS, VIDEO_TOTAL_PIXELS / num_frames * FRAME_FACTOR)
    return int(max(budget, int(min_pixels * 1.05)))


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Resize ``(F, 3, H, W)`` frames in [0, 1] to ``size`` as VideoAlign's inference does.

    VideoAlign resizes uint8 frames with torchvision (bicubic, antialias), which computes in float, clamps to
    [0, 255] and rounds back to uint8. Generated videos are float, so they are first put on the same uint8 grid;
    scores then match those of the video written losslessly to a file.
    """
    pixels = (frames.float() * 255).round()
    if tuple(pixels.shape[-2:]) != tuple(size):
        pixels = F.interpolate(pixels, size=size, mode="bicubic", align_corners=False, antialias=True)
    return pixels.clamp(0, 255).round() / 255


def patchify_video(
    frames: torch.Tensor, patch_size: int = 14, temporal_patch_size: int = 2, merge_size: int = 2
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Cut normalised ``(F, C, H, W)`` frames into Qwen2-VL's flat video patches.

    Returns ``(grid_t * grid_h * grid_w, C * temporal_patch_size * patch_size**2)`` rows ordered as the
    Qwen2-VL video processor orders them (time, then merge windows row-major, then the 2x2 patches of a
    window), each row laid out ``(C, t, y, x)`` as the patch embedding's Conv3d reads it, and the grid.
    """
    num_frames, channels, height, width = frames.shape
    window = patch_size * merge_size
    if num_frames % temporal_patch_size or height % window or width % window:
        raise ValueError(
            f"Cannot patch {num_frames} frames of {height}x{width}: frames must come in multiples of "
            f"{temporal_patch_size} and sides in multiples of {window}."
        )
    grid = (num_frames // temporal_patch_size, height // patch_size, width // patch_size)
    patches = frames.reshape(
        grid[0], temporal_patch_size, channels,
        grid[1] // merge_size, merge_size, patch_size,
        grid[2] // merge_size, merge_size, patch_size,
    )  # fmt: skip
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(grid[0] * grid[1] * grid[2], -1), grid


@dataclass
class VideoAlignVideoProcessor:
    """Turns one video into Qwen2-VL's ``pixel_values_videos`` rows and ``video_grid_thw``.

    Args:
        sample_fps: frames per second read from the video (VideoAlign: 2).
        num_frames: a fixed number of frames instead of ``sample_fps`` (None: use ``sample_fps``).
        min_pixels: lower bound of the per-frame pixel budget (qwen-vl-utils: 128 * 28 * 28).
        max_pixels: upper bound (VideoAlign: ``max_frame_pixels`` of model_config.json); None: qwen-vl-utils'
            default share of the total budget.
        patch_size, temporal_patch_size, merge_size: the vision tower's patching (Qwen2-VL: 14, 2, 2).
    """

    sample_fps: float = 2.0
    num_frames: int | None = None
    min_pixels: int = VIDEO_MIN_PIXELS
    max_pixels: int | None = None
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    def frame_size(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        """The resized frame size for a video of ``height`` x ``width`` read as ``num_frames`` frames."""
        max_pixels = (
            self.max_pixels
            if self.max_pixels is not None
            else default_max_pixels(num_frames, self.min_pixels)
        )
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, max_pixels)

    def __call__(self, video: torch.Tensor, fps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``video`` ``(F, 3, H, W)`` in [0, 1] at ``fps`` -> (patches ``(N, 3 * 2 * 14 * 14)``, grid ``(3,)``)."""
        indices = sample_frame_indices(video.shape[0], fps, self.sample_fps, self.num_frames)
        frames = video[indices.to(video.device)]
        frames = resize_frames(frames, self.frame_size(video.shape[-2], video.shape[-1], len(indices)))
        mean = frames.new_tensor(CLIP_MEAN).view(1, 3, 1, 1)
        std = frames.new_tensor(CLIP_STD).view(1, 3, 1, 1)
        patches, grid = patchify_video(
            (frames - mean) / std, self.patch_size, self.temporal_patch_size, self.merge_size
        )
        return patches, torch.tensor(grid, dtype=torch.long)


def read_video_file(path: str | os.PathLike) -> tuple[torch.Tensor, float | None]:
    """Read a video file (gif, or mp4 with an imageio video plugin) as ``(F, 3, H, W)`` in [0, 1] and its fps."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Video file {path} does not exist.")
    try:
        import imageio.v3 as iio
    except ImportError as error:
        raise ImportError(
            "Reading video files needs imageio (pip install imageio imageio-ffmpeg); or pass the frames as a "
            "(B, F, 3, H, W) tensor in [0, 1]."
        ) from error
    try:
        frames = torch.as_tensor(iio.imread(path, index=None))
        metadata = iio.immeta(path)
    except Exception as error:
        raise ValueError(
            f"Could not read video {path}: {error}. For mp4 install a video plugin (pip install imageio-ffmpeg "
            "or av), or pass the frames as a tensor."
        ) from error
    if frames.ndim == 3:  # grayscale
        frames = frames.unsqueeze(-1).expand(-1, -1, -1, 3)
    frames = frames[..., :3].permute(0, 3, 1, 2)
    scale = 255.0 if frames.dtype == torch.uint8 else 1.0
    return frames.float() / scale, _metadata_fps(metadata)


def _metadata_fps(metadata: Mapping[str, Any]) -> float | None:
    if metadata.get("fps"):
        return float(metadata["fps"])
    duration_ms = metadata.get("duration")  # gif: milliseconds per frame
    return 1000.0 / float(duration_ms) if duration_ms else None


# -- checkpoint folder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoAlignCheckpoint:
    """The files of one released VideoAlign checkpoint.

    Args:
        root: the folder holding ``model_config.json``.
        step: the training step of the chosen ``checkpoint-<step>`` subfolder.
        weights_path: ``checkpoint-<step>/model.pth``.
        tokenizer_path: ``checkpoint-<step>/tokenizer``.
        model_config: the parsed ``model_config.json``.
    """

    root: Path
    step: int
    weights_path: Path
    tokenizer_path: Path
    model_config: dict[str, Any]


def find_videoalign_checkpoint(path: str | os.PathLike, step: int | None = None) -> VideoAlignCheckpoint:
    """Locate ``model_config.json`` and ``checkpoint-<step>/{model.pth, tokenizer/}`` (default: the latest step)."""
    root = Path(path)
    config_path = root / "model_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found: point to a VideoAlign checkpoint folder as released "
            "(model_config.json + checkpoint-<step>/model.pth + checkpoint-<step>/tokenizer/)."
        )
    steps = sorted(
        int(match.group(1))
        for child in root.iterdir()
        if child.is_dir() and (match := re.fullmatch(r"checkpoint-(\d+)", child.name))
    )
    if not steps:
        raise FileNotFoundError(f"No checkpoint-<step> folder in {root}.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"No checkpoint-{step} in {root}; available steps: {steps}.")
    folder = root / f"checkpoint-{step}"
    weights_path, tokenizer_path = folder / "model.pth", folder / "tokenizer"
    if not weights_path.is_file():
        raise FileNotFoundError(
            f"{weights_path} not found; only the full-state-dict layout (model.pth) of VideoAlign is supported."
        )
    if not tokenizer_path.is_dir():
        raise FileNotFoundError(f"Tokenizer folder {tokenizer_path} not found.")
    with config_path.open(encoding="utf-8") as file:
        model_config = json.load(file)
    return VideoAlignCheckpoint(root, step, weights_path, tokenizer_path, model_config)


@dataclass(frozen=True)
class VideoAlignSettings:
    """What ``model_config.json`` says about inference.

    Args:
        base_model: ``model_config.model_name_or_path``, where the Qwen2-VL architecture config comes from.
        output_dim: outputs of ``rm_head`` (1 or 3), or None when not given (read from the weights).
        lora_rank: ``peft_lora_config.lora_r`` (checked against the weights), None when not given.
        lora_alpha: ``peft_lora_config.lora_alpha``, None when not given.
        use_rslora: scale LoRA by ``alpha / sqrt(r)`` instead of ``alpha / r``.
        sample_fps: ``data_config.fps``.
        num_frames: ``data_config.num_frames`` (a fixed frame count), usually None.
        max_pixels: ``data_config.max_frame_pixels``.
        normalization: ``{metric: (mean, std)}`` from ``inference_config``, None when absent.
    """

    base_model: str | None
    output_dim: int | None
    lora_rank: int | None
    lora_alpha: float | None
    use_rslora: bool
    sample_fps: float
    num_frames: int | None
    max_pixels: int | None
    normalization: dict[str, tuple[float, float]] | None

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> VideoAlignSettings:
        """Parse and check a ``model_config.json`` dictionary."""
        data = model_config.get("data_config") or {}
        model = model_config.get("model_config") or {}
        lora = model_config.get("peft_lora_config") or {}
        if model.get("use_special_tokens") is False or model.get("reward_token", "special") != "special":
            raise ValueError(
                "This VideoAlign checkpoint does not read its scores at the reward tokens (use_special_tokens is "
                "false); only the released special-token models are supported."
            )
        if data.get("sample_type", "uniform") != "uniform":
            raise ValueError(
                f"Unsupported frame sampling {data['sample_type']!r}; only 'uniform' is supported."
            )
        return cls(
            base_model=model.get("model_name_or_path"),
            output_dim=model.get("output_dim"),
            lora_rank=lora.get("lora_r") if lora.get("lora_enable", True) else None,
            lora_alpha=lora.get("lora_alpha") if lora.get("lora_enable", True) else None,
            use_rslora=bool(lora.get("use_rslora", False)),
            sample_fps=float(data.get("fps") or 2.0),
            num_frames=int(data["num_frames"]) if data.get("num_frames") else None,
            max_pixels=data.get("max_frame_pixels"),
            normalization=_parse_normalization(model_config.get("inference_config")),
        )


def _parse_normalization(inference_config: Mapping[str, Any] | None) -> dict[str, tuple[float, float]] | None:
    if not inference_config:
        return None
    keys = [f"{metric.upper()}_{stat}" for metric in REWARD_TOKENS for stat in ("mean", "std")]
    missing = [key for key in keys if key not in inference_config]
    if missing:
        raise ValueError(f"model_config.json's inference_config lacks {missing}; give all of {keys} or none.")
    stats = {
        m: (float(inference_config[f"{m.upper()}_mean"]), float(inference_config[f"{m.upper()}_std"]))
        for m in REWARD_TOKENS
    }
    if not all(std > 0 for _, std in stats.values()):
        raise ValueError(f"inference_config standard deviations must be positive, got {stats}.")
    return stats


def load_prompt_template(path: str | os.PathLike) -> str:
    """Read the prompt template a VideoAlign checkpoint was trained with (see docs/rewards.md).

    The file holds the template text exactly (leading and trailing newlines included) with one
    ``{text_prompt}`` placeholder and each reward token once, in the order VQ, MQ, TA.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Prompt template {path} not found. Save the template your VideoAlign checkpoint was trained with "
            f"(VideoAlign's prompt_template.py, see docs/rewards.md) as {TEMPLATE_FILENAME} in the checkpoint "
            "folder, or pass template_path=."
        )
    with path.open(encoding="utf-8", newline="") as file:
        template = file.read()
    if template.count(TEMPLATE_PLACEHOLDER) != 1:
        raise ValueError(f"Prompt template {path} must contain {TEMPLATE_PLACEHOLDER} exactly once.")
    positions = [template.find(token) for token in REWARD_TOKENS.values()]
    counts = [template.count(token) for token in REWARD_TOKENS.values()]
    if counts != [1, 1, 1] or positions != sorted(positions):
        raise ValueError(
            f"Prompt template {path} must contain each of {list(REWARD_TOKENS.values())} exactly once, in that "
            "order; is it the special-token template of the checkpoint?"
        )
    return template


# -- weights: peft + transformers 4.45 -> merged weights in the installed layout -------------------


def merge_lora_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``W + scale * B @ A`` in float32: the weight a peft LoRA linear layer computes with (unmerged forward)."""
    return base.float() + scale * (lora_b.float() @ lora_a.float())


def remap_qwen2_vl_key(key: str) -> str:
    """Map a transformers-4.45 ``Qwen2VLForConditionalGeneration`` key to the installed (5.x) layout.

    transformers 5 moved the decoder under ``model.language_model`` and the vision tower under
    ``model.visual`` (its own conversion rules for this class do the same); module names inside are unchanged.
    Keys already in the new layout pass through.
    """
    if key.startswith(("model.language_model.", "model.visual.", "lm_head.", "rm_head.")):
        return key
    if key.startswith("model."):
        return "model.language_model." + key.removeprefix("model.")
    if key.startswith("visual."):
        return "model.visual." + key.removeprefix("visual.")
    raise ValueError(
        f"Unexpected key {key!r} in the VideoAlign checkpoint: expected Qwen2-VL keys under model., visual., "
        "lm_head. or rm_head."
    )


def _strip_peft_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefixed = [key.startswith(_PEFT_PREFIX) for key in state_dict]
    if any(prefixed) and not all(prefixed):
        outliers = [key for key, has in zip(state_dict, prefixed) if not has][:5]
        raise ValueError(
            f"Mixed key layout in the VideoAlign checkpoint: {outliers} lack the {_PEFT_PREFIX!r} prefix."
        )
    return {key.removeprefix(_PEFT_PREFIX): value for key, value in state_dict.items()}


def _collect_lora_factors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{module: {"A": lora_A, "B": lora_B}}`` for every LoRA pair; one adapter only."""
    factors: dict[str, dict[str, torch.Tensor]] = {}
    adapters = set()
    for key, value in state_dict.items():
        match = _LORA_KEY.match(key)
        if match:
            adapters.add(match.group("adapter"))
            factors.setdefault(match.group("module"), {})[match.group("factor")] = value
    if len(adapters) > 1:
        raise ValueError(
            f"The VideoAlign checkpoint holds several LoRA adapters {sorted(map(str, adapters))}; expected one."
        )
    incomplete = [module for module, pair in factors.items() if set(pair) != {"A", "B"}]
    if incomplete:
        raise ValueError(f"LoRA modules {incomplete[:5]} have lora_A or lora_B but not both.")
    return factors


def _lora_scale(
    module: str,
    pair: dict[str, torch.Tensor],
    base: torch.Tensor,
    lora_alpha: float | None,
    lora_rank: int | None,
    use_rslora: bool,
) -> float:
    """Check one LoRA pair's shapes against its base weight and the configured rank; return alpha / r."""
    lora_a, lora_b = pair["A"], pair["B"]
    rank = lora_a.shape[0]
    if (
        lora_a.ndim != 2
        or lora_b.ndim != 2
        or lora_b.shape[1] != rank
        or base.shape != (lora_b.shape[0], lora_a.shape[1])
    ):
        raise ValueError(
            f"LoRA shape mismatch at {module}: base {tuple(base.shape)}, lora_A {tuple(lora_a.shape)}, lora_B "
            f"{tuple(lora_b.shape)}; expected lora_A (r, {base.shape[-1]}) and lora_B ({base.shape[0]}, r)."
        )
    if lora_rank is not None and rank != lora_rank:
        raise ValueError(
            f"LoRA rank mismatch at {module}: the weights have r={rank} but model_config.json says lora_r={lora_rank}."
        )
    if lora_alpha is None:
        raise ValueError(
            "The checkpoint has LoRA weights but model_config.json gives no peft_lora_config.lora_alpha."
        )
    # peft's LoraLayer scaling: alpha / r, or alpha / sqrt(r) for rank-stabilised LoRA.
    return lora_alpha / (math.sqrt(rank) if use_rslora else rank)


def convert_videoalign_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    lora_alpha: float | None,
    lora_rank: int | None = None,
    use_rslora: bool = False,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Turn a released ``model.pth`` into `VideoAlignModel` weights in the installed layout.

    Strips peft's ``base_model.model.`` prefix, folds every unmerged LoRA pair into its base weight
    (``W + (alpha / r) * B @ A`` computed in float32, ``alpha / sqrt(r)`` with rsLoRA; r from the weights,
    alpha from model_config.json), renames the transformers-4.45 keys (`remap_qwen2_vl_key`) and drops
    ``lm_head`` (the reward never computes language-model logits). Every tensor is cast to ``dtype`` as soon
    as it is ready (None: merged weights float32, the others as stored), which bounds peak memory.
    """
    flat = _strip_peft_prefix(state_dict)
    factors = _collect_lora_factors(flat)
    merged: dict[str, torch.Tensor] = {}
    for module, pair in factors.items():
        base_key = f"{module}{_BASE_LAYER}weight"
        if base_key not in flat:
            raise ValueError(f"LoRA module {module} has no base weight {base_key} in the checkpoint.")
        scale = _lora_scale(module, pair, flat[base_key], lora_alpha, lora_rank, use_rslora)
        merged[f"{module}.weight"] = merge_lora_weight(flat[base_key], pair["A"], pair["B"], scale).to(dtype)
        if f"{module}{_BASE_LAYER}bias" in flat:
            merged[f"{module}.bias"] = flat[f"{module}{_BASE_LAYER}bias"].to(dtype)
    for key, value in flat.items():
        if _LORA_KEY.match(key) or key.split(_BASE_LAYER)[0] in factors:
            continue
        if _BASE_LAYER in key:
            raise ValueError(f"{key} is a LoRA base layer without lora_A/lora_B weights.")
        merged[key] = value.to(dtype)
    return {remap_qwen2_vl_key(key): value for key, value in merged.items() if not key.startswith("lm_head.")}


# -- the model ---------------------------------------------------------------------------------------


class VideoAlignModel(nn.Module):
    """Qwen2-VL (``transformers.Qwen2VLModel``) with VideoAlign's bias-free reward head.

    Args:
        config: the Qwen2-VL configuration (vocabulary size as in the checkpoint).
        output_dim: outputs of ``rm_head``: 3 (one per metric, read diagonally) or 1 (shared).
    """

    def __init__(self, config: Qwen2VLConfig, output_dim: int) -> None:
        super().__init__()
        if output_dim not in (1, 3):
            raise ValueError(f"VideoAlign's reward head has 1 or 3 outputs, got {output_dim}.")
        self.config = config
        self.model = Qwen2VLModel(config)
        self.rm_head = nn.Linear(config.text_config.hidden_size, output_dim, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values_videos: torch.Tensor,
        video_grid_thw: torch.Tensor,
        reward_token_ids: Sequence[int],
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Raw ``(B, 3)`` float32 scores (VQ, MQ, TA) of right-padded token sequences with their videos.

        ``position_ids`` defaults to ``0..L-1`` for every sequence: VideoAlign was trained with transformers
        4.45, whose Qwen2-VL decoder numbered tokens sequentially when called without position ids;
        transformers 5 would build 3-D M-RoPE ids instead, which change the scores.
        """
        if position_ids is None:
            length = input_ids.shape[1]
            position_ids = torch.arange(length, device=input_ids.device).expand(input_ids.shape[0], length)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=video_grid_thw,
            use_cache=False,
        )
        return self.read_rewards(outputs.last_hidden_state, input_ids, reward_token_ids)

    def read_rewards(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor, reward_token_ids: Sequence[int]
    ) -> torch.Tensor:
        """Apply ``rm_head`` at each reward token; metric i reads output i (or output 0 of a 1-output head)."""
        scores = []
        for metric, token_id in enumerate(reward_token_ids):
            at_token = input_ids == token_id
            counts = at_token.sum(dim=1)
            if not bool((counts == 1).all()):
                raise ValueError(
                    f"Each sequence needs reward token id {token_id} exactly once, got counts {counts.tolist()}."
                )
            logits = self.rm_head(hidden_states[at_token])
            scores.append(logits[:, metric if logits.shape[1] == 3 else 0])
        return torch.stack(scores, dim=1).float()


def _check_state_dict(model: VideoAlignModel, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Fail loudly, naming the keys, when the converted checkpoint does not fit the model exactly."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(
            f"The VideoAlign checkpoint does not match the Qwen2-VL architecture: missing keys {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''} ({len(missing)}), unexpected keys {unexpected[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''} ({len(unexpected)}). Is the base config the right one?"
        )
    wrong = [(k, tuple(v.shape), expected[k]) for k, v in state_dict.items() if tuple(v.shape) != expected[k]]
    if wrong:
        details = "; ".join(f"{key}: checkpoint {got}, model {want}" for key, got, want in wrong[:5])
        raise ValueError(
            f"Shape mismatch between the VideoAlign checkpoint and the Qwen2-VL config: {details}."
        )


def build_videoalign_model(
    config: Qwen2VLConfig,
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.bfloat16,
    attn_implementation: str = "sdpa",
) -> VideoAlignModel:
    """Instantiate `VideoAlignModel` from converted weights (`convert_videoalign_state_dict`) without random init.

    The vocabulary size and the head's shape come from the weights; the architecture from ``config``.
    """
    from accelerate import init_empty_weights

    head = state_dict.get("rm_head.weight")
    embeddings = state_dict.get("model.language_model.embed_tokens.weight")
    if head is None or embeddings is None:
        raise ValueError(
            "The VideoAlign checkpoint lacks rm_head.weight or the token embeddings (model.embed_tokens)."
        )
    if head.ndim != 2 or head.shape[1] != config.text_config.hidden_size:
        raise ValueError(
            f"Reward head shape {tuple(head.shape)} does not fit hidden size {config.text_config.hidden_size} of "
            "the Qwen2-VL config; expected (1 or 3, hidden_size)."
        )
    config = copy.deepcopy(config)
    config.text_config.vocab_size = embeddings.shape[0]
    config._attn_implementation = attn_implementation
    with init_empty_weights(include_buffers=False):
        model = VideoAlignModel(config, output_dim=head.shape[0])
    _check_state_dict(model, state_dict)
    model.load_state_dict(
        {key: value.to(dtype) for key, value in state_dict.items()}, strict=True, assign=True
    )
    return model.eval().requires_grad_(False)


# -- the reward function -------------------------------------------------------------------------------


def _resolve_base_config(
    base_config: Qwen2VLConfig | str | os.PathLike | None,
    checkpoint: VideoAlignCheckpoint,
    base_model: str | None,
) -> Qwen2VLConfig:
    """The Qwen2-VL architecture: ``base_config``, else ``config.json`` beside model_config.json, else the base model."""
    if isinstance(base_config, Qwen2VLConfig):
        return copy.deepcopy(base_config)
    source = base_config or (checkpoint.root if (checkpoint.root / "config.json").is_file() else base_model)
    if source is None:
        raise ValueError(
            "model_config.json names no model_name_or_path; pass base_config= (a Qwen2-VL config or folder)."
        )
    try:
        config = Qwen2VLConfig.from_pretrained(str(source))
    except OSError as error:
        raise OSError(
            f"Could not load the Qwen2-VL config from {str(source)!r}: {error}. Pass base_config= a local folder "
            "with the base model's config.json (e.g. Qwen/Qwen2-VL-2B-Instruct)."
        ) from error
    if config.model_type != "qwen2_vl":
        raise ValueError(
            f"{source} holds a {config.model_type!r} config; VideoAlign is built on Qwen2-VL ('qwen2_vl')."
        )
    return config


def _token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if (
        token_id is None
        or token_id == tokenizer.unk_token_id
        or tokenizer.convert_ids_to_tokens(token_id) != token
    ):
        raise ValueError(
            f"The VideoAlign tokenizer has no token {token}; is it the checkpoint's tokenizer/ folder?"
        )
    return token_id


def _read_chat_template(path: str | os.PathLike) -> str:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Chat template {path} not found.")
    text = path.read_text(encoding="utf-8")
    return json.loads(text)["chat_template"] if path.suffix == ".json" else text


class VideoAlignReward:
    """VideoAlign scores of generated videos as a reward function (``videos, prompts, *, fps -> scores``).

    Returns ``vq``, ``mq``, ``ta`` (normalised by the checkpoint's mean/std when model_config.json has them,
    else raw; these are what `CompositeReward`'s presets weight) and, reported only, ``vq_raw``, ``mq_raw``,
    ``ta_raw`` and ``overall`` (``vq + mq + ta``, as VideoAlign's inference reports it).

    Args:
        checkpoint_dir: the released folder (``model_config.json``, ``checkpoint-<step>/``).
        step: which ``checkpoint-<step>`` to load; None: the latest.
        template_path: the prompt template file; None: ``prompt_template.txt`` in ``checkpoint_dir``.
        base_config: the Qwen2-VL architecture (config or folder / Hub id); None: ``config.json`` in
            ``checkpoint_dir``, else model_config.json's ``model_name_or_path`` (only its config.json is read).
        chat_template: a ``.jinja`` or ``chat_template.json`` file, if the tokenizer folder has no chat template.
        device: where scoring runs; None: CUDA when available.
        dtype: weight dtype (VideoAlign ran in bfloat16; float32 works too).
        batch_size: videos per forward pass.
        normalize: report ``vq``/``mq``/``ta`` normalised by the checkpoint's mean/std (when present).
        sample_fps, num_frames, max_pixels: override model_config.json's frame sampling and pixel budget.
        min_pixels: lower bound of the per-frame pixel budget (qwen-vl-utils' default).
        attn_implementation: transformers attention (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``).
        lazy: read the weights only at the first call (or `load`).
        offload_between_calls: move the weights to the CPU after each call (see `offload`).
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike,
        *,
        step: int | None = None,
        template_path: str | os.PathLike | None = None,
        base_config: Qwen2VLConfig | str | os.PathLike | None = None,
        chat_template: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        batch_size: int = 4,
        normalize: bool = True,
        sample_fps: float | None = None,
        num_frames: int | None = None,
        max_pixels: int | None = None,
        min_pixels: int = VIDEO_MIN_PIXELS,
        attn_implementation: str = "sdpa",
        lazy: bool = False,
        offload_between_calls: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.__name__ = "videoalign"
        self.checkpoint = find_videoalign_checkpoint(checkpoint_dir, step)
        self.settings = VideoAlignSettings.from_model_config(self.checkpoint.model_config)
        self.template = load_prompt_template(template_path or self.checkpoint.root / TEMPLATE_FILENAME)
        self.config = _resolve_base_config(base_config, self.checkpoint, self.settings.base_model)
        self.tokenizer = self._load_tokenizer(chat_template)
        self.video_processor = VideoAlignVideoProcessor(
            sample_fps=sample_fps or self.settings.sample_fps,
            num_frames=num_frames or self.settings.num_frames,
            min_pixels=min_pixels,
            max_pixels=max_pixels or self.settings.max_pixels,
            patch_size=self.config.vision_config.patch_size,
            temporal_patch_size=self.config.vision_config.temporal_patch_size,
            merge_size=self.config.vision_config.spatial_merge_size,
        )
        self.device = torch.device(device) if device is not None else _default_device()
        self.dtype, self.batch_size, self.normalize = dtype, batch_size, normalize
        self.attn_implementation = attn_implementation
        self.offload_between_calls = offload_between_calls
        self.model: VideoAlignModel | None = None
        if not lazy:
            self.load()

    def _load_tokenizer(self, chat_template: str | os.PathLike | None) -> PreTrainedTokenizerBase:
        tokenizer = AutoTokenizer.from_pretrained(self.checkpoint.tokenizer_path)
        if chat_template is not None:
            tokenizer.chat_template = _read_chat_template(chat_template)
        if not tokenizer.chat_template:
            raise ValueError(
                f"The tokenizer in {self.checkpoint.tokenizer_path} has no chat template; pass chat_template= the "
                "chat_template.json of Qwen/Qwen2-VL-2B-Instruct (the template VideoAlign's processor applied)."
            )
        self.reward_token_ids = [_token_id(tokenizer, token) for token in REWARD_TOKENS.values()]
        self.video_token_id = _token_id(tokenizer, VIDEO_TOKEN)
        if self.video_token_id != self.config.video_token_id:
            raise ValueError(
                f"The tokenizer's {VIDEO_TOKEN} id {self.video_token_id} differs from the config's video_token_id "
                f"{self.config.video_token_id}; the tokenizer and base config do not belong together."
            )
        # Any id pads: padded positions come after every real token and are masked out.
        candidates = (tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.pad_token_id = next(token_id for token_id in candidates if token_id is not None)
        return tokenizer

    # -- weights and devices -------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        """Whether the weights have been read (see ``lazy``)."""
        return self.model is not None

    def load(self) -> VideoAlignModel:
        """Read, convert and merge the checkpoint's weights onto ``self.device`` (once)."""
        if self.model is None:
            # mmap keeps the stored tensors file-backed: each is copied once, already in the target dtype.
            raw = torch.load(self.checkpoint.weights_path, map_location="cpu", weights_only=True, mmap=True)
            settings = self.settings
            state_dict = convert_videoalign_state_dict(
                raw, settings.lora_alpha, settings.lora_rank, settings.use_rslora, dtype=self.dtype
            )
            del raw
            model = build_videoalign_model(self.config, state_dict, self.dtype, self.attn_implementation)
            self._check_loaded(model)
            self.model = model.to(_concrete_device(self.device))
        return self.model

    def _check_loaded(self, model: VideoAlignModel) -> None:
        head_outputs = model.rm_head.out_features
        if self.settings.output_dim is not None and self.settings.output_dim != head_outputs:
            raise ValueError(
                f"model_config.json says output_dim={self.settings.output_dim} but the reward head has "
                f"{head_outputs} outputs."
            )
        vocab_size = model.config.text_config.vocab_size
        if max([*self.reward_token_ids, self.video_token_id]) >= vocab_size:
            raise ValueError(
                f"The tokenizer's reward tokens lie outside the checkpoint's {vocab_size} embeddings."
            )

    def to(self, device: str | torch.device) -> VideoAlignReward:
        """Score on ``device`` from now on (moves the weights when loaded)."""
        self.device = torch.device(device)
        if self.model is not None:
            self.model.to(_concrete_device(self.device))
        return self

    def offload(self) -> VideoAlignReward:
        """Move the weights to the CPU and free cached GPU memory; the next call moves them back to ``device``."""
        if self.model is not None:
            self.model.to("cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self

    def _ready_model(self) -> VideoAlignModel:
        model, device = self.load(), _concrete_device(self.device)
        if model.rm_head.weight.device != device:
            model.to(device)
        return model

    # -- inputs ----------------------------------------------------------------------------------

    def build_text(self, prompt: str) -> str:
        """The chat text of one prompt (template filled in, one ``<|video_pad|>`` for the video)."""
        for token in (*REWARD_TOKENS.values(), VIDEO_TOKEN):
            if token in prompt:
                raise ValueError(f"Prompt {prompt!r} contains the special token {token}; remove it.")
        text = self.template.replace(TEMPLATE_PLACEHOLDER, prompt)
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _token_ids(self, prompt: str, num_video_tokens: int) -> list[int]:
        ids = self.tokenizer(self.build_text(prompt))["input_ids"]
        if ids.count(self.video_token_id) != 1:
            raise ValueError(
                f"The chat template must render the video as one {VIDEO_TOKEN}, got {ids.count(self.video_token_id)}."
            )
        # The Qwen2-VL processor expands the placeholder to one token per merged 2x2 patch window.
        index = ids.index(self.video_token_id)
        return ids[:index] + [self.video_token_id] * num_video_tokens + ids[index + 1 :]

    def prepare_inputs(
        self, videos: Sequence[torch.Tensor], prompts: Sequence[str], fps: Sequence[float]
    ) -> dict[str, torch.Tensor]:
        """Model inputs for ``(F, 3, H, W)`` videos in [0, 1]: right-padded ids, mask, video patches and grids."""
        processed = [self.video_processor(video.to(self.device), rate) for video, rate in zip(videos, fps)]
        merge = self.video_processor.merge_size**2
        sequences = [
            self._token_ids(p, int(grid.prod()) // merge) for p, (_, grid) in zip(prompts, processed)
        ]
        length = max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        return {
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention_mask.to(self.device),
            "pixel_values_videos": torch.cat([patches for patches, _ in processed]),
            "video_grid_thw": torch.stack([grid for _, grid in processed]).to(self.device),
        }

    # -- scoring ---------------------------------------------------------------------------------

    @torch.no_grad()
    def raw_scores(
        self, videos: Sequence[torch.Tensor], prompts: Sequence[str], fps: Sequence[float]
    ) -> torch.Tensor:
        """Unnormalised ``(B, 3)`` VQ / MQ / TA scores on the CPU, ``batch_size`` videos per forward pass."""
        model = self._ready_model()
        scores = []
        for start in range(0, len(videos), self.batch_size):
            window = slice(start, start + self.batch_size)
            inputs = self.prepare_inputs(videos[window], prompts[window], fps[window])
            scores.append(model(**inputs, reward_token_ids=self.reward_token_ids).cpu())
        return torch.cat(scores) if scores else torch.zeros(0, len(REWARD_TOKENS))

    def __call__(
        self,
        videos: torch.Tensor | Sequence[torch.Tensor | str | os.PathLike],
        prompts: Sequence[str],
        *,
        fps: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """Score videos for prompts: ``{vq, mq, ta, vq_raw, mq_raw, ta_raw, overall}``, each ``(B,)`` float32.

        ``videos`` is a ``(B, F, 3, H, W)`` tensor in [0, 1] (``fps`` its frame rate, required), or a list of
        ``(F, 3, H, W)`` tensors and/or video file paths (files use their own frame rate, else ``fps``). Videos
        with non-finite pixels get NaN scores.
        """
        clips, rates = _video_list(videos, fps)
        if len(prompts) != len(clips):
            raise ValueError(
                f"Got {len(clips)} videos but {len(prompts)} prompts; pass one prompt per video."
            )
        raw = torch.full((len(clips), len(REWARD_TOKENS)), math.nan)
        finite = [index for index, clip in enumerate(clips) if bool(torch.isfinite(clip).all())]
        try:
            if finite:
                pick = [clips[i] for i in finite], [prompts[i] for i in finite], [rates[i] for i in finite]
                raw[finite] = self.raw_scores(*pick)
        finally:
            if self.offload_between_calls:
                self.offload()
        return self._named_scores(raw)

    def _named_scores(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = {}
        for index, metric in enumerate(REWARD_TOKENS):
            value = raw[:, index]
            if self.normalize and self.settings.normalization is not None:
                mean, std = self.settings.normalization[metric]
                value = (value - mean) / std
            scores[metric] = value
        scores.update({f"{metric}_raw": raw[:, index] for index, metric in enumerate(REWARD_TOKENS)})
        scores["overall"] = scores["vq"] + scores["mq"] + scores["ta"]
        return scores

    def __repr__(self) -> str:
        return (
            f"VideoAlignReward({str(self.checkpoint.root)!r}, step={self.checkpoint.step}, device={self.device}, "
            f"dtype={self.dtype}, loaded={self.is_loaded})"
        )


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _concrete_device(device: torch.device) -> torch.device:
    """``cuda`` means the current CUDA device *now* (under accelerate each process sets its own)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _video_list(
    videos: torch.Tensor | Sequence[torch.Tensor | str | os.PathLike], fps: float | None
) -> tuple[list[torch.Tensor], list[float]]:
    """Normalise the accepted video inputs to ``(F, 3, H, W)`` tensors in [0, 1] and their frame rates."""
    if isinstance(videos, torch.Tensor):
        check_videos(videos)
        return list(videos), [_required_fps(fps)] * videos.shape[0]
    if isinstance(videos, (str, os.PathLike)):
        raise ValueError("Pass a list of video paths, not a single path.")
    clips, rates = [], []
    for item in videos:
        if isinstance(item, (str, os.PathLike)):
            clip, file_fps = read_video_file(item)
            rates.append(file_fps if file_fps is not None else _required_fps(fps))
        else:
            clip = item
            rates.append(_required_fps(fps))
        check_videos(clip.unsqueeze(0) if isinstance(clip, torch.Tensor) else clip)
        clips.append(clip)
    return clips, rates


def _required_fps(fps: float | None) -> float:
    if fps is None:
        raise ValueError(
            "Pass fps=, the frame rate of the videos: VideoAlign samples frames at ~2 per second."
        )
    return float(fps)
