"""The transformers reporting callbacks a user switches on with ``report_to``: each receives the trainer's
metrics, grouped once (the Trainer's integrations put training metrics under ``train/``; ours add ``reward/``,
``kl/``, ``time/``, ``rollout/`` and never a second ``train/``), read back through each tracker's own API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("tracker_run.py")
EXPECTED = {"train/reward/mean_brightness", "train/kl/position", "train/kl/coef", "train/policy_loss",
            "train/clip_fraction", "train/time/rollout", "train/rollout/exploration_std", "train/loss"}  # fmt: skip


def train_with(tracker: str, tmp_path: Path, **environment: str) -> Path:
    output = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **environment}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), tracker, str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def check_tags(tags: set[str]) -> None:
    assert tags >= EXPECTED, sorted(EXPECTED - tags)
    assert not [tag for tag in tags if tag.startswith("train/train/")]


def test_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    output = train_with("tensorboard", tmp_path, TENSORBOARD_LOGGING_DIR=str(tmp_path / "run" / "logs"))
    events = EventAccumulator(str(output / "logs"))
    events.Reload()
    check_tags(set(events.Tags()["scalars"]))
    assert [event.step for event in events.Scalars("train/policy_loss")] == [1, 2]
    assert "model_config" in " ".join(events.Tags()["tensors"])  # the diffusers config, as text
    (video,) = events.Images("eval/samples")  # the evaluation's GIF, at its step, as the run folder holds it
    assert video.step == 2
    assert video.encoded_image_string == (output / "eval_samples" / "eval-step-000002.gif").read_bytes()


def test_wandb_offline(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    train_with("wandb", tmp_path, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    # wandb 0.31 reads offline runs only in its Go core; the run file holds each history key as protobuf text.
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    assert all(tag.encode() in data for tag in EXPECTED), [tag for tag in EXPECTED if tag.encode() not in data]
    assert b"train/train/" not in data
    # The evaluation's video: wandb stores the GIF it was given among the run's media files.
    (video,) = tmp_path.glob("wandb/offline-run-*/files/media/videos/eval/samples_*.gif")
    assert video.read_bytes() == (tmp_path / "run" / "eval_samples" / "eval-step-000002.gif").read_bytes()


def test_trackio(tmp_path: Path) -> None:
    pytest.importorskip("trackio")
    train_with("trackio", tmp_path, TRACKIO_DIR=str(tmp_path / "trackio"))
    code = (
        "from trackio.sqlite_storage import SQLiteStorage; import json;"
        "runs = SQLiteStorage.get_runs('sage-grpo-tests');"
        "print(json.dumps(sorted({k for run in runs for log in SQLiteStorage.get_logs('sage-grpo-tests', run) "
        "for k in log})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    check_tags(set(json.loads(result.stdout.splitlines()[-1])))
    # The evaluation's video: trackio copies the GIF into its media folder.
    (video,) = (tmp_path / "trackio").rglob("*.gif")
    assert video.read_bytes() == (tmp_path / "run" / "eval_samples" / "eval-step-000002.gif").read_bytes()
