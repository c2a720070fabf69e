"""VideoAlign's frame sampling, pixel budget, resizing and Qwen2-VL patching (`sage_env.rewards.videoalign.frames`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sage_env.rewards.videoalign import (
    VideoAlignVideoProcessor,
    num_sampled_frames,
    patchify_video,
    resize_frames,
    sample_frame_indices,
    smart_resize,
)
from tests.sage_env.rewards.conftest import TEST_MIN_PIXELS
from tests.sage_env.rewards.videoalign.helpers import FPS, FRAMES, SAMPLED, make_videos, reference_pixels

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
    video = make_videos(1)[0]
    processor = VideoAlignVideoProcessor(min_pixels=TEST_MIN_PIXELS, max_pixels=56 * 84)
    patches, grid = processor(video, FPS)
    assert grid.tolist() == [2, 4, 6]
    torch.testing.assert_close(patches, reference_pixels(video), atol=1e-5, rtol=0)
