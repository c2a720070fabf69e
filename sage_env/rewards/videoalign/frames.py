"""VideoAlign's video preprocessing in torch: frame sampling, resizing, CLIP normalisation, Qwen2-VL patches.

The semantics are those of qwen-vl-utils (``smart_nframes``, ``smart_resize``), which VideoAlign's
``vision_process.py`` uses unchanged, and of the Qwen2-VL processor's patch layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "VideoAlignVideoProcessor",
    "default_max_pixels",
    "num_sampled_frames",
    "patchify_video",
    "resize_frames",
    "sample_frame_indices",
    "smart_resize",
]

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
