"""`sage_env.video_io` against the video libraries themselves: they read what we write and we read what they write.

Oracles: PyAV's own demuxing/decoding (``av.open``), imageio's pyav and pillow plugins, and Pillow's GIF reader.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence

from sage_env.video_io import MP4_CRF, read_video, write_video


def smooth_video(frames: int = 12, height: int = 48, width: int = 64) -> torch.Tensor:
    """``(F, 3, H, W)`` slowly changing colour gradients in [0, 1]: content H.264 (4:2:0) keeps within a few levels."""
    t = torch.arange(frames, dtype=torch.float32)[:, None, None]
    y = torch.linspace(0, 1, height)[None, :, None]
    x = torch.linspace(0, 1, width)[None, None, :]
    channels = [0.2 + 0.6 * x * (1 - 0.02 * t), 0.2 + 0.6 * y, 0.5 + 0.3 * torch.sin(2 * x + 2 * y + 0.2 * t)]
    return torch.stack([channel.expand(frames, height, width) for channel in channels], dim=1).clamp(0, 1)


def palette_video(frames: int = 6, height: int = 20, width: int = 30, seed: int = 0) -> torch.Tensor:
    """``(F, 3, H, W)`` uint8 frames of four grey levels: a GIF palette stores them exactly."""
    levels = torch.randint(0, 4, (frames, 1, height, width), generator=torch.Generator().manual_seed(seed))
    return (levels * 85).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()


def as_hwc_uint8(frames: torch.Tensor) -> np.ndarray:
    """Our ``(F, 3, H, W)`` float frames as the libraries hold them: ``(F, H, W, 3)`` uint8."""
    return (frames * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


# -- mp4 ------------------------------------------------------------------------------------------


def test_mp4_we_write_is_what_pyav_decodes(tmp_path: Path) -> None:
    video = smooth_video()
    path = write_video(video, tmp_path / "nested" / "clip.mp4", fps=16)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        assert stream.average_rate == 16 and (stream.height, stream.width) == (48, 64)
        decoded = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])
    assert decoded.shape == (12, 48, 64, 3)
    error = np.abs(decoded.astype(np.float64) - as_hwc_uint8(video))
    # Lossy: limited-range YUV 4:2:0 at CRF 18 on smooth content stays within a few of the 256 levels.
    assert error.mean() < 3 and np.percentile(error, 99) < 10
    assert MP4_CRF == 18


def test_mp4_round_trip_and_imageio_agree(tmp_path: Path) -> None:
    video = smooth_video(frames=10)
    path = write_video(video, tmp_path / "clip.mp4", fps=29.97)
    frames, fps = read_video(path)
    assert frames.shape == video.shape and frames.dtype == torch.float32
    assert fps == pytest.approx(29.97, abs=1e-9)
    assert iio.immeta(path, plugin="pyav")["fps"] == pytest.approx(29.97, abs=1e-9)
    expected = torch.from_numpy(iio.imread(path, plugin="pyav")).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(frames, expected)
    assert (frames - video).abs().mean() < 3 / 255


@pytest.mark.parametrize(("codec", "rate"), [("libx264", Fraction(30000, 1001)), ("mpeg4", Fraction(12))])
def test_we_read_mp4_that_pyav_writes(tmp_path: Path, codec: str, rate: Fraction) -> None:
    pixels = as_hwc_uint8(smooth_video(frames=9))
    path = tmp_path / f"{codec}.mp4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    frames, fps = read_video(path)
    assert fps == pytest.approx(float(rate))
    expected = torch.from_numpy(iio.imread(path, plugin="pyav")).permute(0, 3, 1, 2).float() / 255
    assert frames.shape == (9, 3, 48, 64) and torch.equal(frames, expected)


def test_we_read_mp4_that_imageio_writes(tmp_path: Path) -> None:
    pixels = as_hwc_uint8(smooth_video(frames=8))
    path = tmp_path / "imageio.mp4"
    iio.imwrite(path, pixels, plugin="pyav", codec="libx264", fps=8)
    frames, fps = read_video(path)
    assert fps == 8.0 and frames.shape == (8, 3, 48, 64)
    assert np.abs(as_hwc_uint8(frames).astype(float) - pixels).mean() < 3


# -- GIF ------------------------------------------------------------------------------------------


def test_gif_we_write_is_what_pillow_reads(tmp_path: Path) -> None:
    video = palette_video()
    path = write_video(video, tmp_path / "clip.gif", fps=4)
    with Image.open(path) as image:
        assert image.format == "GIF" and image.n_frames == 6 and image.info["loop"] == 0
        frames = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
        durations = [frame.info["duration"] for frame in ImageSequence.Iterator(image)]
    assert durations == [250] * 6
    np.testing.assert_array_equal(np.stack(frames), video.permute(0, 2, 3, 1).numpy())
    read, fps = read_video(path)
    assert fps == 4.0 and torch.equal((read * 255).round().to(torch.uint8), video)


def test_gif_frame_rates_are_whole_centiseconds(tmp_path: Path) -> None:
    path = write_video(palette_video(), tmp_path / "clip.gif", fps=16)  # 62.5 ms -> 6 cs
    assert iio.immeta(path, plugin="pillow")["duration"] == 60
    assert read_video(path)[1] == pytest.approx(1000 / 60)


def test_we_read_gifs_that_imageio_writes(tmp_path: Path) -> None:
    video = palette_video(seed=1)
    path = tmp_path / "imageio.gif"
    iio.imwrite(path, video.permute(0, 2, 3, 1).numpy(), plugin="pillow", duration=100, loop=0)
    frames, fps = read_video(path)
    assert fps == 10.0 and torch.equal((frames * 255).round().to(torch.uint8), video)


def test_gif_timeline_undoes_pillows_merge_of_repeated_frames(tmp_path: Path) -> None:
    first, second, third = palette_video(frames=3, seed=2)
    video = torch.stack([first, second, second, second, third])
    path = write_video(video, tmp_path / "repeats.gif", fps=10)
    with Image.open(path) as image:  # Pillow stores the three equal frames as one shown for 300 ms
        stored = [frame.info["duration"] for frame in ImageSequence.Iterator(image)]
    assert stored == [100, 300, 100]
    frames, fps = read_video(path)
    assert fps == 10.0 and torch.equal((frames * 255).round().to(torch.uint8), video)


def test_a_still_gif_is_one_frame(tmp_path: Path) -> None:
    still = palette_video(frames=1).expand(4, -1, -1, -1)
    frames, fps = read_video(write_video(still, tmp_path / "still.gif", fps=10))
    assert frames.shape[0] == 1 and fps == 2.5  # Pillow keeps one frame shown for 400 ms


def test_a_gif_without_delays_has_no_frame_rate(tmp_path: Path) -> None:
    images = [Image.fromarray(frame) for frame in palette_video(frames=3).permute(0, 2, 3, 1).numpy()]
    path = tmp_path / "no_delay.gif"
    images[0].save(path, save_all=True, append_images=images[1:])
    frames, fps = read_video(path)
    assert frames.shape[0] == 3 and fps is None


# -- inputs and errors ------------------------------------------------------------------------------


def test_uint8_and_float_frames_write_the_same_file(tmp_path: Path) -> None:
    video = palette_video()
    from_uint8 = write_video(video, tmp_path / "a.gif", fps=5)
    from_float = write_video(video.float() / 255, tmp_path / "b.gif", fps=5)
    assert from_uint8.read_bytes() == from_float.read_bytes()


@pytest.mark.parametrize(
    ("frames", "name", "fps", "message"),
    [
        (torch.rand(2, 3, 8, 8), "clip.avi", 8, r"writes \.mp4 or \.gif files, got 'clip\.avi'"),
        (torch.rand(2, 3, 9, 8), "clip.mp4", 8, "needs an even height and width, got 9x8; crop or pad"),
        (torch.rand(2, 8, 8, 3), "clip.gif", 8, r"\(F, 3, H, W\) tensor"),
        (torch.rand(0, 3, 8, 8), "clip.gif", 8, "at least one frame"),
        (torch.rand(2, 3, 8, 8) * 2, "clip.gif", 8, r"lie in \[0, 1\]"),
        (torch.full((2, 3, 8, 8), float("nan")), "clip.gif", 8, "must be finite"),
        (torch.zeros(2, 3, 8, 8, dtype=torch.int64), "clip.gif", 8, "float in \\[0, 1\\] or uint8"),
        (torch.rand(2, 3, 8, 8), "clip.gif", 0, "fps must be a positive number"),
        (torch.rand(2, 3, 8, 8), "clip.mp4", float("inf"), "fps must be a positive number"),
    ],
)
def test_bad_writes_fail_before_encoding(
    tmp_path: Path, frames: torch.Tensor, name: str, fps: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_video(frames, tmp_path / name, fps)
    assert not (tmp_path / name).exists()


def test_bad_reads(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_video(tmp_path / "missing.mp4")
    for name in ("garbage.mp4", "garbage.gif"):
        (tmp_path / name).write_bytes(b"not a video")
        with pytest.raises(ValueError, match=f"Could not read video .*{name}"):
            read_video(tmp_path / name)
    audio_only = tmp_path / "audio.wav"
    with av.open(str(audio_only), mode="w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        samples = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        samples.sample_rate = 8000
        container.mux(stream.encode(samples))
        container.mux(stream.encode())
    with pytest.raises(ValueError, match="no video stream"):
        read_video(audio_only)
