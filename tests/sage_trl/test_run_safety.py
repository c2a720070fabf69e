"""A run folder is the user's data: never destroyed, never unpickled, never left looking finished when it is not.

Each test reproduces a failure found on earlier versions (a second run overwriting the first, a planted
pickle running during resume, a finished run trained past max_steps, duplicated metrics after resume, a run
with an always-failing reward ending successfully, a full disk reported as "unexpected pos").
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from sage_env.rewards import RewardFailureError
from sage_trl import checkpoints
from sage_trl.run_folder import RunFolderError, RunInUseError, layout
from sage_trl.run_folder.writes import RunWriteError
from tests.sage_trl.tiny_trainer import make_trainer, named_params

SCRIPT = Path(__file__).with_name("run_script.py")
CHECKPOINTED = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2}
_TIMING = ("time/", "step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` but the lock (which records its latest holder)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != layout.LOCK_FILE
    }


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def finished_run(tmp_path: Path, **settings: object) -> Path:
    make_trainer(tmp_path, **{**CHECKPOINTED, **settings}).train()
    return run_dir(tmp_path)


def script(*arguments: object, check: bool = True) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), *map(str, arguments)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def comparable_metrics(folder: Path) -> list[dict]:
    records = [json.loads(line) for line in (folder / layout.METRICS_FILE).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in records]


# -- an existing run is never changed unless asked --------------------------------------------------


def test_a_new_run_into_a_folder_holding_a_run_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    folder = finished_run(tmp_path)
    before = fingerprint(folder)
    with pytest.raises(RunFolderError) as caught:
        make_trainer(tmp_path, max_steps=1).train()
    message = str(caught.value)
    for expected in (str(folder), "checkpoint-4", "finished run", "resume_from_checkpoint", "output_dir",
                     "overwrite_output_dir"):  # fmt: skip
        assert expected in message
    assert fingerprint(folder) == before


def test_overwrite_deletes_the_earlier_run_but_not_the_users_files(tmp_path: Path) -> None:
    folder = finished_run(tmp_path)
    (folder / "notes.txt").write_text("mine")
    make_trainer(tmp_path, max_steps=1, overwrite_output_dir=True).train()
    assert not (folder / "checkpoint-4").exists() and not (folder / "checkpoint-2").exists()
    assert (folder / "notes.txt").read_text() == "mine"
    assert [r["step"] for r in comparable_metrics(folder)] == [1]
    assert json.loads((folder / layout.COMPLETE_FILE).read_text())["global_step"] == 1


@pytest.mark.parametrize(
    ("resume", "message"),
    [
        (True, "holds no checkpoint-N folder to resume from"),
        ("missing/checkpoint-9", "does not exist"),
    ],
)
def test_resume_errors_come_before_training(tmp_path: Path, resume: object, message: str) -> None:
    trainer = make_trainer(tmp_path, max_steps=2)
    with pytest.raises(RunFolderError, match=message):
        trainer.train(resume_from_checkpoint=resume)
    assert trainer.state.global_step == 0
    assert not run_dir(tmp_path).exists() or not any(run_dir(tmp_path).iterdir())


def test_a_second_process_sees_the_lock_and_a_killed_holder_blocks_nothing(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder), "--hold-lock", "120"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError, match=rf"in use by process {holder.pid} on"):
            make_trainer(tmp_path, max_steps=1).train()
    finally:
        holder.kill()  # SIGKILL: the holder cannot clean up; the kernel drops its lock
        holder.wait()
    make_trainer(tmp_path, max_steps=1).train()
    assert (folder / layout.COMPLETE_FILE).is_file()


# -- resume ----------------------------------------------------------------------------------------


def test_resuming_a_finished_run_trains_no_step_and_writes_nothing(tmp_path: Path) -> None:
    first = make_trainer(tmp_path, **CHECKPOINTED)
    first.train()
    folder = run_dir(tmp_path)
    before = fingerprint(folder)
    again = make_trainer(tmp_path, **CHECKPOINTED)
    output = again.train(resume_from_checkpoint=True)
    assert output.global_step == again.state.global_step == 4
    assert fingerprint(folder) == before
    final, loaded = named_params(first.backbone.transformer), named_params(again.backbone.transformer)
    assert all(torch.equal(loaded[name], final[name]) for name in final)  # the trainer holds the final model


class Interrupt(TrainerCallback):
    """Raise after step ``step`` is logged (and checkpointed): an in-process stand-in for a crash."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_a_run_killed_after_its_last_checkpoint_finishes_without_training_past_max_steps(
    tmp_path: Path,
) -> None:
    trainer = make_trainer(tmp_path, **CHECKPOINTED)
    trainer.add_callback(Interrupt(4))
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    folder = run_dir(tmp_path)
    assert not (folder / layout.COMPLETE_FILE).exists()
    resumed = make_trainer(tmp_path, **CHECKPOINTED)
    resumed.train(resume_from_checkpoint=True)
    completion = json.loads((folder / layout.COMPLETE_FILE).read_text())
    assert (completion["global_step"], completion["max_steps"]) == (4, 4)
    assert [r["step"] for r in comparable_metrics(folder)] == [1, 2, 3, 4]
    final, last_checkpoint = (
        load_file(folder / layout.LORA_WEIGHT_NAME),
        load_file(folder / "checkpoint-4" / layout.LORA_WEIGHT_NAME),
    )
    assert all(torch.equal(final[name], last_checkpoint[name]) for name in final)


@pytest.mark.slow
def test_metrics_after_kill_and_resume_equal_the_uninterrupted_run(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight" / "run", tmp_path / "killed" / "run"
    script(straight)
    result = script(killed, "--kill-at-step", 3, check=False)
    assert result.returncode == -9  # a real SIGKILL, right after step 3 was logged
    assert [r["step"] for r in comparable_metrics(killed)] == [1, 2, 3]
    script(killed, "--resume")
    assert comparable_metrics(killed) == comparable_metrics(straight)
    assert [r["step"] for r in comparable_metrics(killed)] == [1, 2, 3, 4]
    resumed, uninterrupted = (
        load_file(killed / layout.LORA_WEIGHT_NAME),
        load_file(straight / layout.LORA_WEIGHT_NAME),
    )
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in resumed)


# -- nothing the library loads can run code ---------------------------------------------------------


class Payload:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("planted", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "sage_state.pt"])
def test_a_planted_pickle_in_a_checkpoint_runs_nothing(tmp_path: Path, planted: str) -> None:
    finished_run(tmp_path, max_steps=2, save_steps=2, overwrite_output_dir=False)
    checkpoint = run_dir(tmp_path) / "checkpoint-2"
    marker = tmp_path / "payload-ran"
    torch.save({"state": Payload(marker)}, checkpoint / planted)
    (run_dir(tmp_path) / layout.COMPLETE_FILE).unlink()  # not finished: resume really loads the checkpoint
    trainer = make_trainer(tmp_path, max_steps=3, save_strategy="steps", save_steps=2)
    if planted == "sage_state.pt":  # the old pickle name: never read (the state is JSON + safetensors)
        trainer.train(resume_from_checkpoint=str(checkpoint))
    else:
        with pytest.raises(RunFolderError, match="pickled objects other than tensors"):
            trainer.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()


@pytest.mark.parametrize("planted", [layout.LORA_WEIGHT_NAME, layout.STATE_TENSORS_FILE])
def test_a_planted_pickle_in_place_of_safetensors_is_refused(tmp_path: Path, planted: str) -> None:
    finished_run(tmp_path, max_steps=2, save_steps=2)
    checkpoint = run_dir(tmp_path) / "checkpoint-2"
    marker = tmp_path / "payload-ran"
    torch.save(Payload(marker), checkpoint / planted)
    trainer = make_trainer(
        tmp_path, max_steps=3, save_strategy="steps", save_steps=2, overwrite_output_dir=True
    )
    with pytest.raises((RunFolderError, ValueError, OSError)):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()


# -- a run that learned nothing does not end looking successful -------------------------------------


def nan_reward(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
    return torch.full((len(prompts),), float("nan"))


def test_a_reward_failing_on_every_sample_stops_the_run(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, reward=nan_reward, max_steps=5, max_consecutive_reward_failures=2)
    with pytest.raises(RewardFailureError, match=r"2 consecutive rollouts.*component 'nan_reward' is nan"):
        trainer.train()
    assert not (run_dir(tmp_path) / layout.COMPLETE_FILE).exists()


def test_a_rollout_without_a_valid_reward_changes_no_weight_and_says_why(tmp_path: Path, caplog) -> None:
    """A float64 reward of 1e300 became inf, every sample was invalid, and the step still moved the weights (Adam's
    momentum and weight decay act on zero gradients) on 2dec1df."""

    def overflowing(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        return torch.full((len(prompts),), 1e300, dtype=torch.float64)

    trainer = make_trainer(tmp_path, reward=overflowing, max_steps=1, weight_decay=0.1)
    before = named_params(trainer.backbone.transformer)
    with caplog.at_level("WARNING"):
        trainer.train()
    assert named_params(trainer.backbone.transformer).keys() == before.keys()
    assert all(torch.equal(named_params(trainer.backbone.transformer)[n], before[n]) for n in before)
    record = comparable_metrics(run_dir(tmp_path))[0]
    assert record["reward/update_dropped"] == 1.0 and record["reward/invalid_count"] == 8.0
    assert "beyond float32's range" in caplog.text and "trains nothing" in caplog.text


def test_one_failed_reward_batch_is_tolerated_and_counted(tmp_path: Path) -> None:
    calls = {"count": 0}
    rollout_size = 8  # per_device_train_batch_size 4 x steps_per_generation 2

    def flaky(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        calls["count"] += 1
        if (
            calls["count"] <= 1 + rollout_size
        ):  # the batch call and every per-sample retry of the first rollout
            raise ConnectionError("reward server restarting")
        return videos.mean(dim=(1, 2, 3, 4))

    make_trainer(tmp_path, reward=flaky, max_steps=2).train()
    records = comparable_metrics(run_dir(tmp_path))
    assert [r["reward/failed_calls"] for r in records] == [1.0, 0.0]
    assert records[0]["reward/invalid_count"] == 8.0
    assert (run_dir(tmp_path) / layout.COMPLETE_FILE).is_file()


# -- a full disk says so ----------------------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_is_named_and_the_last_checkpoint_kept(
    tmp_path: Path, monkeypatch
) -> None:
    original = checkpoints.save_state
    calls = {"count": 0}

    def full_disk(*args: object, **kwargs: object) -> None:
        calls["count"] += 1
        if calls["count"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "save_state", full_disk)
    with pytest.raises(RunWriteError, match=r"checkpoint-4 .*the disk is full.*checkpoint-2"):
        make_trainer(tmp_path, **CHECKPOINTED).train()
    folder = run_dir(tmp_path)
    assert (folder / "checkpoint-2" / layout.STATE_FILE).is_file()
    assert not (folder / "tmp-checkpoint-4").exists()  # the partial write is gone, its space freed
    assert not (folder / layout.COMPLETE_FILE).exists()


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
    not _can_mount_tmpfs(), reason="needs user namespaces (unshare -rm) to mount a small tmpfs"
)
def test_a_real_full_disk_is_named_and_the_last_checkpoint_kept(tmp_path: Path) -> None:
    mount = tmp_path / "small-disk"
    mount.mkdir()
    folder = mount / "run"
    command = (
        f"mount -t tmpfs -o size=8m tmpfs {mount} && {sys.executable} {SCRIPT} {folder} --fill-disk-at-step 4; "
        f"status=$?; ls {folder} > {tmp_path}/listing; ls {folder}/checkpoint-2 >> {tmp_path}/listing; exit $status"
    )
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    assert "the disk is full" in result.stderr and "checkpoint-2" in result.stderr, result.stderr[-2000:]
    assert "unexpected pos" not in result.stderr.splitlines()[-1]
    listing = (tmp_path / "listing").read_text().split()
    assert "checkpoint-2" in listing and "checkpoint-4" not in listing and layout.STATE_FILE in listing
