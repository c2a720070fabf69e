"""What a training run writes and prints: metrics JSONL, a one-line status per step, reward curves, videos."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from sage_env.video_io import write_video
from sage_trl.evaluation import metric_name
from sage_trl.run_folder.manifest import record_entries
from sage_trl.run_folder.writes import guarded_write

__all__ = [
    "MetricsFileCallback",
    "StatusCallback",
    "log_video_to_trackers",
    "plot_reward_curves",
    "save_comparison_gif",
    "save_video_gif",
]

_STATUS_KEYS = (
    ("reward/total", "reward"),
    ("kl/coef", "kl coef"),
    ("kl/total", "kl"),
    ("loss", "loss"),
    ("clip_fraction", "clip"),
)


_NOT_REWARDS = ("reward/invalid_count", "reward/total_std", "reward/failed_calls")
"""Logged under ``reward/`` but counts or spreads, not rewards: neither a component in the status line nor a reward curve."""


class MetricsFileCallback(TrainerCallback):
    """Append every per-step log record (with its step) as one JSON line to ``path`` (main process only).

    The end-of-training summary (``train_runtime``, ``train_loss``, ...) is left out: it describes the run, not a
    step, and goes into ``training_complete.json``. A resumed run starts from the file cut back to its
    checkpoint (`sage_trl.run_folder.RunStart.begin`), so every step is in it exactly once.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        record = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        survived = "the checkpoints written so far are intact"
        with guarded_write(self.path.name, self.path, survived=survived):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record_entries(self.path.parent, self.path.name)
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")


class StatusCallback(TrainerCallback):
    """A progress bar and one status line per logged step, replacing the Trainer's dict printing."""

    def __init__(self) -> None:
        self.bar = None
        # Wall clock and step of the previous status line: s/step is measured end to end (rollout,
        # reward, training, logging, checkpoints), not summed from the per-phase timers.
        self._last_log_time = 0.0
        self._last_log_step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, desc="training", dynamic_ncols=True, leave=True)
            self._last_log_time, self._last_log_step = time.perf_counter(), state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self.bar is None or not logs or "loss" not in logs:
            return
        now, steps = time.perf_counter(), state.global_step - self._last_log_step
        seconds_per_step = (now - self._last_log_time) / steps if steps > 0 else None
        self._last_log_time, self._last_log_step = now, state.global_step
        self.bar.write(format_status(state.global_step, state.max_steps, logs, seconds_per_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_status(
    step: int, max_steps: int, logs: dict[str, Any], seconds_per_step: float | None = None
) -> str:
    """``step 3/40 | reward 0.812 (vq 0.9 mq 0.7 ta 0.8) | kl coef 1.0e-06 | ... | 2.1 s/step``.

    ``seconds_per_step`` is the wall-clock time per optimizer step since the previous line; the
    part is left out when it is None.
    """
    parts = [f"step {step}/{max_steps}"]
    components = [
        (k.split("/", 1)[1], v)
        for k, v in logs.items()
        if k.startswith("reward/") and k != "reward/total" and k not in _NOT_REWARDS
    ]
    for key, label in _STATUS_KEYS:
        value = logs.get(key)
        if value is None:
            continue
        text = f"{label} {value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{label} {value:.1e}"
        if key == "reward/total" and components:
            text += " (" + " ".join(f"{name} {v:.3f}" for name, v in components) + ")"
        parts.append(text)
    if logs.get("reward/invalid_count"):
        parts.append(f"invalid {int(logs['reward/invalid_count'])}")
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.1f} s/step")
    return " | ".join(parts)


def _points(records: list[dict[str, Any]], name: str) -> list[tuple[int, float]]:
    return [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float)) and math.isfinite(r[name])]


def plot_reward_curves(metrics_path: str | os.PathLike, output_dir: str | os.PathLike) -> list[Path]:
    """One PNG per reward component (``reward_<name>.png``) from a metrics JSONL file: the training rollouts'
    reward per step and, where the run evaluated during training, the held-out evaluations' (``eval_reward/...``)
    as marked points. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    names = sorted({k for r in records for k in r if k.startswith("reward/") and k not in _NOT_REWARDS})
    written = []
    for name in names:
        points, evaluations = _points(records, name), _points(records, metric_name(name))
        if not points:
            continue
        figure, axis = plt.subplots(figsize=(5, 3.2))
        axis.plot(*zip(*points), marker=".", label="training rollouts")
        if evaluations:
            axis.plot(*zip(*evaluations), marker="o", linestyle="--", label="held-out evaluation")
            axis.legend(fontsize="small")
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(name)
        axis.set_title(name if evaluations else f"{name} of the training rollouts")  # the legend names both
        axis.grid(alpha=0.3)
        figure.tight_layout()
        path = Path(output_dir) / f"{name.replace('/', '_')}.png"
        record_entries(output_dir, path.name)  # a run folder's manifest records what the library writes
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


def _frames_uint8(videos: torch.Tensor, scale: int) -> np.ndarray:
    """``(N, F, 3, H, W)`` in [0, 1] -> ``(N, F, H*scale, W*scale, 3)`` uint8 (nearest upscaling)."""
    frames = (videos.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2)
    if scale > 1:
        frames = frames.repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3)
    return frames.cpu().numpy()


_LINE_HEIGHT = 12
"""Height in pixels of a line of text (PIL's default bitmap font is 11 pixels tall)."""


def _label_strip(text: str, width: int, lines: int = 1) -> np.ndarray:
    """A white ``(lines * _LINE_HEIGHT + 2, width, 3)`` strip with ``text`` in black, wrapped at words onto at
    most ``lines`` lines, the last cut with an ellipsis if it does not fit."""
    from PIL import Image, ImageDraw, ImageFont

    strip = Image.new("RGB", (width, lines * _LINE_HEIGHT + 2), "white")
    draw, font = ImageDraw.Draw(strip), ImageFont.load_default()
    words, rows = text.split(), []
    while words and len(rows) < lines:
        row = words.pop(0)
        while words and draw.textlength(f"{row} {words[0]}", font=font) <= width - 4:
            row = f"{row} {words.pop(0)}"
        rows.append(row)
    if words:  # what did not fit
        rows[-1] = f"{rows[-1]} {' '.join(words)}"
        while len(rows[-1]) > 1 and draw.textlength(rows[-1] + "…", font=font) > width - 4:
            rows[-1] = rows[-1][:-1]
        rows[-1] += "…"
    for index, row in enumerate(rows):
        draw.text((2, 1 + index * _LINE_HEIGHT), row, fill="black", font=font)
    return np.asarray(strip)


def save_video_gif(
    videos: torch.Tensor,
    path: str | os.PathLike,
    fps: float = 8.0,
    scale: int = 4,
    columns: int | None = None,
    row_labels: list[str] | None = None,
    column_labels: list[str] | None = None,
) -> Path:
    """Tile ``(N, F, 3, H, W)`` videos into one animated GIF (``columns`` per row, all N by default), with an
    optional text strip above each row (``row_labels``, one per row) and a header over the columns
    (``column_labels``)."""
    frames = _frames_uint8(videos, scale)
    count, num_frames, height, width, _ = frames.shape
    columns = columns or count
    rows = math.ceil(count / columns)
    if row_labels is not None and len(row_labels) != rows:
        raise ValueError(f"row_labels needs one label per row ({rows}), got {len(row_labels)}.")
    gap = max(scale // 2, 1)
    canvas_width = columns * (width + gap) - gap
    label = 2 * _LINE_HEIGHT + 2 if row_labels is not None else 0
    header = _LINE_HEIGHT + 2 if column_labels is not None else 0
    canvas = np.full((num_frames, header + rows * (label + height + gap) - gap, canvas_width, 3), 255, np.uint8)
    for column, text in enumerate(column_labels or []):
        canvas[:, :header, column * (width + gap) : column * (width + gap) + width] = _label_strip(text, width)
    for row, text in enumerate(row_labels or []):
        top = header + row * (label + height + gap)
        canvas[:, top : top + label] = _label_strip(text, canvas_width, lines=2)
    for index in range(count):
        row, column = divmod(index, columns)
        top, left = header + row * (label + height + gap) + label, column * (width + gap)
        canvas[:, top : top + height, left : left + width] = frames[index]
    return write_video(torch.from_numpy(canvas).permute(0, 3, 1, 2), path, fps)


def save_comparison_gif(
    before: torch.Tensor,
    after: torch.Tensor,
    path: str | os.PathLike,
    fps: float = 8.0,
    scale: int = 4,
    labels: list[str] | None = None,
) -> Path:
    """An animated grid with one row per video: before training on the left, after on the right, under a
    "before | after" header; ``labels`` (one per video, e.g. its prompt and seed) above each row."""
    if before.shape != after.shape:
        raise ValueError(
            f"before {tuple(before.shape)} and after {tuple(after.shape)} must have the same shape."
        )
    interleaved = torch.stack([before, after], dim=1).flatten(0, 1)
    return save_video_gif(
        interleaved, path, fps=fps, scale=scale, columns=2, row_labels=labels, column_labels=["before", "after"]
    )


def log_video_to_trackers(callbacks: list[Any], tag: str, gif_path: str | os.PathLike, step: int) -> list[str]:
    """Show an animated GIF under ``tag`` at ``step`` in every video-capable tracker that ``report_to`` opened
    (their transformers callbacks are among ``callbacks``): TensorBoard, Weights & Biases and Trackio. Returns
    the names of the trackers it reached (none open: an empty list, nothing to do)."""
    from transformers.integrations import TensorBoardCallback, TrackioCallback, WandbCallback

    reached = []
    tensorboard = [c.tb_writer for c in callbacks if isinstance(c, TensorBoardCallback) and c.tb_writer is not None]
    if tensorboard:
        _log_gif_to_tensorboard(tensorboard, tag, Path(gif_path), step)
        reached.append("tensorboard")
    if any(isinstance(c, WandbCallback) for c in callbacks) and _log_gif_to_wandb(tag, Path(gif_path), step):
        reached.append("wandb")
    if any(isinstance(c, TrackioCallback) for c in callbacks) and _log_gif_to_trackio(tag, Path(gif_path), step):
        reached.append("trackio")
    return reached


def _log_gif_to_tensorboard(writers: list[Any], tag: str, gif_path: Path, step: int) -> None:
    """TensorBoard plays a GIF image summary as a video in its Images tab: it is what ``SummaryWriter.add_video``
    writes, without needing moviepy to encode the frames again. ``SummaryWriter`` has no public call that takes
    an encoded image, hence its file writer's ``add_summary``."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    with Image.open(gif_path) as image:
        width, height = image.size
    picture = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif_path.read_bytes())
    for writer in writers:
        writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=picture)]), step)
        writer.flush()


def _log_gif_to_wandb(tag: str, gif_path: Path, step: int) -> bool:
    """Through the run `WandbCallback` opened (``wandb.run``), on its ``train/global_step`` axis."""
    import wandb

    if wandb.run is None:
        return False
    wandb.log({tag: wandb.Video(str(gif_path), format="gif"), "train/global_step": step})
    return True


def _log_gif_to_trackio(tag: str, gif_path: Path, step: int) -> bool:
    """Through the run `TrackioCallback` opened (trackio's current run), at the optimizer step."""
    import trackio

    if trackio.context_vars.current_run.get() is None:
        return False
    trackio.log({tag: trackio.Video(gif_path)}, step=step)
    return True
