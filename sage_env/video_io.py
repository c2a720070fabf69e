"""Read and write video files: mp4 (and the other containers ffmpeg reads) through PyAV, GIF through Pillow.

Frames are ``(F, 3, H, W)`` tensors, float in [0, 1] when read. Both backends are dependencies of the
package, so mp4 and GIF work on a plain install.

- **mp4** is written as H.264 (libx264, ``yuv420p`` so that every player opens it, constant rate factor
  `MP4_CRF`) at the exact frame rate given; H.264 is lossy, and ``yuv420p`` needs an even height and width.
  Any container and codec PyAV (ffmpeg) decodes can be read (mp4, webm, mov, mkv, avi, ...).
- **GIF** stores a palette of 256 colours per frame and frame durations in hundredths of a second: a frame
  rate is written as the nearest whole number of centiseconds per frame (16 fps -> 6 cs, read back as
  16.67 fps). Pillow's writer merges identical consecutive frames into one longer frame; `read_video`
  puts GIF frames back on a uniform timeline (a frame shown for k periods is returned k times), so only a
  fully still video loses its frame count (it is stored as one frame).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image, ImageSequence

__all__ = ["GIF_SUFFIX", "MP4_CRF", "WRITABLE_SUFFIXES", "read_video", "write_video"]

GIF_SUFFIX = ".gif"
MP4_SUFFIX = ".mp4"
WRITABLE_SUFFIXES = (MP4_SUFFIX, GIF_SUFFIX)
"""The file types `write_video` writes (any other suffix is refused before encoding)."""

MP4_CRF = 18
"""libx264's constant rate factor for written mp4 files (0 lossless .. 51 worst; 18 is visually lossless)."""

_MP4_CODEC = "libx264"
_MP4_PIXEL_FORMAT = "yuv420p"
_GIF_TICK_MS = 10  # GIF frame delays are stored in hundredths of a second
_MAX_RATE_DENOMINATOR = 65535  # frame rates become fractions (29.97 -> 2997/100), as ffmpeg stores them


def read_video(path: str | os.PathLike) -> tuple[torch.Tensor, float | None]:
    """Read a video file as ``(F, 3, H, W)`` float frames in [0, 1] and its frame rate (None if unknown).

    GIFs are read with Pillow (frames on a uniform timeline, see the module docstring); every other file
    with PyAV, which decodes whatever ffmpeg can (mp4, webm, mov, mkv, avi, ...).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Video file {path} does not exist.")
    try:
        frames, fps = _read_gif(path) if path.suffix.lower() == GIF_SUFFIX else _read_with_pyav(path)
    except (OSError, ValueError, av.FFmpegError) as error:
        raise ValueError(
            f"Could not read video {path}: {error}. Pass a readable video file (mp4, gif, webm, ...) or the "
            "frames as a tensor."
        ) from error
    if not frames:
        raise ValueError(f"Video {path} holds no frames.")
    stacked = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)
    return stacked.float() / 255.0, fps


def _read_with_pyav(path: Path) -> tuple[list[np.ndarray], float | None]:
    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError("the file has no video stream")
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        rate = stream.average_rate or stream.guessed_rate
    return frames, float(rate) if rate else None


def _read_gif(path: Path) -> tuple[list[np.ndarray], float | None]:
    frames, durations = [], []
    with Image.open(path) as image:
        for frame in ImageSequence.Iterator(image):
            frames.append(np.asarray(frame.convert("RGB")))
            durations.append(int(frame.info.get("duration") or 0))
    shown = [duration for duration in durations if duration > 0]
    if not shown:  # no delays stored: the rate is unknown, the frames are taken as they are
        return frames, None
    period = math.gcd(*shown)
    # A frame shown for k periods stands for k frames (Pillow merges identical consecutive frames).
    timeline = [frame for frame, ms in zip(frames, durations) for _ in range(max(1, ms // period))]
    return timeline, 1000.0 / period


def write_video(frames: torch.Tensor, path: str | os.PathLike, fps: float) -> Path:
    """Write ``(F, 3, H, W)`` frames (float in [0, 1], or uint8) to ``path`` (.mp4 or .gif) at ``fps``.

    Creates missing parent folders and returns the path. mp4: H.264, ``yuv420p``, CRF `MP4_CRF`; GIF:
    Pillow, looping, durations rounded to hundredths of a second (see the module docstring).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WRITABLE_SUFFIXES:
        raise ValueError(f"write_video writes {' or '.join(WRITABLE_SUFFIXES)} files, got {path.name!r}.")
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number, got {fps!r}.")
    pixels = _as_uint8_frames(frames)
    if suffix == MP4_SUFFIX and (pixels.shape[1] % 2 or pixels.shape[2] % 2):
        raise ValueError(
            f"mp4 ({_MP4_PIXEL_FORMAT}) needs an even height and width, got {pixels.shape[1]}x{pixels.shape[2]}; "
            "crop or pad the frames by one pixel, or write a .gif."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == GIF_SUFFIX:
        _write_gif(pixels, path, fps)
    else:
        _write_mp4(pixels, path, fps)
    return path


def _as_uint8_frames(frames: torch.Tensor) -> np.ndarray:
    """``(F, 3, H, W)`` float in [0, 1] or uint8 -> ``(F, H, W, 3)`` uint8, checked before any encoding."""
    if (
        not isinstance(frames, torch.Tensor)
        or frames.ndim != 4
        or frames.shape[1] != 3
        or frames.shape[0] < 1
    ):
        shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
        raise ValueError(f"frames must be a (F, 3, H, W) tensor with at least one frame, got {shape}.")
    frames = frames.detach().cpu()
    if frames.dtype != torch.uint8:
        if not frames.is_floating_point():
            raise ValueError(f"frames must be float in [0, 1] or uint8, got {frames.dtype}.")
        if not bool(torch.isfinite(frames).all()) or frames.min() < 0 or frames.max() > 1:
            raise ValueError("float frames must be finite and lie in [0, 1]; clamp them or convert to uint8.")
        frames = (frames.float() * 255).round().to(torch.uint8)
    return frames.permute(0, 2, 3, 1).contiguous().numpy()


def _write_mp4(pixels: np.ndarray, path: Path, fps: float) -> None:
    if _MP4_CODEC not in av.codecs_available:
        raise RuntimeError(f"This PyAV build has no {_MP4_CODEC} encoder; install the PyPI wheel of av.")
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(_MP4_CODEC, rate=Fraction(fps).limit_denominator(_MAX_RATE_DENOMINATOR))
        stream.width, stream.height = pixels.shape[2], pixels.shape[1]
        stream.pix_fmt = _MP4_PIXEL_FORMAT
        stream.options = {"crf": str(MP4_CRF)}
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())  # flush the encoder's buffered frames


def _write_gif(pixels: np.ndarray, path: Path, fps: float) -> None:
    ticks = max(1, round(1000 / fps / _GIF_TICK_MS))
    images = [Image.fromarray(frame) for frame in pixels]
    images[0].save(path, save_all=True, append_images=images[1:], duration=ticks * _GIF_TICK_MS, loop=0)
