"""The commands a user types to publish: ``sage-push`` and ``sage-train --push_to_hub true``, against a local fake
Hub."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import ModelCard

from sage_trl.hub import build_upload_folder, push_main
from sage_trl.run_folder.layout import LORA_WEIGHT_NAME
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import REPO, UPLOADED, copy_run, folder_bytes


def test_sage_push_dry_run_then_push(run_dir: Path, tmp_path: Path, hub: FakeHub, capsys) -> None:
    common = [str(run_dir), "--repo-id", "tester/cli", "--license", "mit", "--endpoint", hub.url]
    assert push_main([*common, "--dry-run", str(tmp_path / "dry")]) == 0
    assert "Dry run: nothing uploaded" in capsys.readouterr().out and hub.requests == []
    assert push_main([*common, "--token", "hf_write", "--private"]) == 0
    assert "Pushed" in capsys.readouterr().out
    assert hub.files("tester/cli") == folder_bytes(tmp_path / "dry") and hub.repos["tester/cli"].private


def test_sage_push_default_dry_run_folder_is_never_uploaded(run_dir: Path, tmp_path: Path) -> None:
    output = copy_run(run_dir, tmp_path / "run")
    args = [str(output), "--repo-id", REPO, "--license", "mit", "--dry-run"]
    assert push_main(args) == 0 and push_main(args) == 0  # the default folder is rewritten
    assert set(folder_bytes(output / "hub-dry-run")) == UPLOADED
    assert (
        set(folder_bytes(build_upload_folder(output, tmp_path / "again", repo_id=REPO, license="mit")))
        == UPLOADED
    )


def test_sage_push_errors_exit_non_zero_with_one_line(tmp_path: Path, run_dir: Path, capsys) -> None:
    assert push_main([str(tmp_path), "--repo-id", REPO, "--license", "mit", "--dry-run"]) == 1
    assert capsys.readouterr().err.startswith("sage-push: error:")
    assert push_main([str(run_dir), "--repo-id", REPO, "--license", "mit"]) == 1  # no token anywhere
    assert "No Hugging Face token" in capsys.readouterr().err


def test_sage_train_push_to_hub_publishes_the_finished_run(tmp_path: Path, hub: FakeHub) -> None:
    """The flag the README documents, through the command the user types (it trained, then exited 1 on 2dec1df)."""
    import os
    import subprocess

    from tests.sage_trl.test_run_folder_rules import TOY_SMALL

    output = tmp_path / "run"
    environment = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_write", "OMP_NUM_THREADS": "1"}
    command = ["sage-train", "--output_dir", str(output), *TOY_SMALL, "--push_to_hub", "true",
               "--hub_model_id", "tester/toy-lora", "--hub_license", "mit"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    repo = hub.repos["tester/toy-lora"]
    assert {LORA_WEIGHT_NAME, "README.md", "sage_config.json", "summary.md"} <= set(repo.files)
    assert repo.commits[-1][0] == "End of training"
    card = ModelCard(repo.files["README.md"].decode())
    assert card.data.license == "mit"
    assert json.loads(repo.files["sage_config.json"])["run"]["base_model"]["pipeline_class"] == "toy"
