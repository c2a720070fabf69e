"""What a run may delete, and what a failed or interrupted start leaves: the folder rules through the user's entry points.

Each test reproduces a failure found on 2dec1df: ``--overwrite_output_dir`` deleted a user's lone ``summary.md``
and the ``transformer/`` folder of a diffusers model given as ``--output_dir``; a failing resume of a finished run
deleted its ``training_complete.json`` and rewrote ``run_config.yaml``; after a kill during the first save, a plain
rerun said "resume" and the resume said "start a new run".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sage_trl.cli import train_main
from sage_trl.run_folder import RunFolder, RunFolderError, layout, plan_start
from tests.sage_trl.test_run_safety import fingerprint, script

TOY_SMALL = [
    "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1", "--per_device_train_batch_size", "4",
    "--num_generations", "2", "--gradient_accumulation_steps", "1", "--micro_batch_size", "8",
    "--num_eval_prompts", "1", "--eval_seeds", "0",
]  # fmt: skip
"""The toy preset, shrunk: a finished, checkpointed ``sage-train`` run in seconds."""


@pytest.fixture(scope="module")
def finished_toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run written by ``sage-train`` itself (copy it before changing anything)."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    assert train_main(["--output_dir", str(folder), *TOY_SMALL]) == 0
    return folder


def _refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as caught:
        train_main(argv)
    assert caught.value.code not in (0, None)
    return f"{caught.value.code} {capsys.readouterr().err}"


def _diffusers_model_folder(path: Path) -> Path:
    (path / "transformer").mkdir(parents=True)
    (path / "transformer" / "config.json").write_text('{"_class_name": "WanTransformer3DModel"}')
    (path / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"weights")
    (path / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    return path


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_diffusers_model_folder_is_never_written_into_or_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture, overwrite: bool
) -> None:
    model = _diffusers_model_folder(tmp_path / "wan")
    before = fingerprint(model)
    message = _refused(["--output_dir", str(model), "--overwrite_output_dir", str(overwrite).lower()], capsys)
    assert "diffusers model folder" in message and "transformer" in message
    assert "trained weights" not in message  # its transformer/ is not a run's weights
    assert fingerprint(model) == before


def test_overwrite_refuses_a_folder_with_a_users_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "summary.md").write_text("my notes")
    message = _refused(["--output_dir", str(folder), "--overwrite_output_dir", "true"], capsys)
    assert "not created by sage-train" in message and "summary.md" in message
    assert (folder / "summary.md").read_text() == "my notes"


def test_overwrite_deletes_only_what_the_run_recorded(finished_toy_run: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(finished_toy_run, tmp_path / "run")
    (folder / "notes.txt").write_text("mine")
    assert train_main(["--output_dir", str(folder), "--overwrite_output_dir", "true", *TOY_SMALL,
                       "--max_steps", "1", "--num_eval_prompts", "0"]) == 0  # fmt: skip
    assert (folder / "notes.txt").read_text() == "mine"
    assert not (folder / "checkpoint-2").exists() and not (folder / layout.EVAL_RESULTS_FILE).exists()
    assert "for 1 of 1 optimizer steps" in (folder / layout.SUMMARY_FILE).read_text()  # the new run's report
    assert json.loads((folder / layout.COMPLETE_FILE).read_text())["global_step"] == 1


def test_a_failing_resume_of_a_finished_run_changes_no_file(
    finished_toy_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = shutil.copytree(finished_toy_run, tmp_path / "run")
    before = fingerprint(folder)
    argv = ["--output_dir", str(folder), *TOY_SMALL, "--resume_from_checkpoint", "true", "--max_steps", "6"]
    message = _refused([*argv, "--lora_target_modules", "nosuch"], capsys)
    assert "lora_target_modules" in message
    assert fingerprint(folder) == before


def test_a_resume_that_fails_while_loading_the_model_changes_no_file(
    finished_toy_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = shutil.copytree(finished_toy_run, tmp_path / "run")
    before = fingerprint(folder)

    def broken(*args, **kwargs):
        raise OSError("the model's weights are unreadable")

    monkeypatch.setattr("sage_trl.training_setup.load_backbone", broken)
    with pytest.raises(OSError, match="unreadable"):
        train_main(
            ["--output_dir", str(folder), *TOY_SMALL, "--resume_from_checkpoint", "true", "--max_steps", "6"]
        )
    assert fingerprint(folder) == before


@pytest.mark.slow
def test_a_kill_during_the_first_save_is_recovered_by_the_same_command(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    killed = script(folder, "--kill-during-save-at-step", 2, check=False)
    assert killed.returncode == -9
    assert not RunFolder(folder).checkpoints() and any(folder.glob(f"{layout.STAGING_PREFIX}-*"))
    with pytest.raises(RunFolderError, match="same command without --resume_from_checkpoint"):
        plan_start(folder, resume_from_checkpoint=True)
    script(folder)  # the same command again: the unfinished run had nothing to resume and starts over
    completion = json.loads((folder / layout.COMPLETE_FILE).read_text())
    assert completion["global_step"] == 4
    assert not any(folder.glob(f"{layout.STAGING_PREFIX}-*"))


def test_an_unfinished_run_with_checkpoints_is_not_restarted_silently(
    finished_toy_run: Path, tmp_path: Path
) -> None:
    folder = shutil.copytree(finished_toy_run, tmp_path / "run")
    (folder / layout.COMPLETE_FILE).unlink()
    with pytest.raises(RunFolderError, match="resume_from_checkpoint true"):
        plan_start(folder)


def test_sage_train_resumes_a_finished_run_for_more_steps(finished_toy_run: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(finished_toy_run, tmp_path / "run")
    argv = ["--output_dir", str(folder), *TOY_SMALL, "--resume_from_checkpoint", "true", "--max_steps", "3"]
    assert train_main([*argv, "--num_eval_prompts", "0"]) == 0
    assert json.loads((folder / layout.COMPLETE_FILE).read_text())["global_step"] == 3
    assert [record["step"] for record in RunFolder(folder).read_metrics() if "loss" in record] == [1, 2, 3]
    assert (folder / "checkpoint-3").is_dir()
