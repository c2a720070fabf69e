"""The trainer's Hub helpers as transformers' Trainer names them (``push_to_hub``, ``init_hf_repo``) and the
intermediate pushes of each ``hub_strategy``, against a local fake Hub."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
from huggingface_hub import constants

from sage_trl import SageGRPOTrainer
from sage_trl.hub import HubPushError, push_checkpoint
from sage_trl.hub.card import ADAPTER_INFO_FILE
from sage_trl.run_folder.layout import LORA_WEIGHT_NAME
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import REPO, UPLOADED


def hub_trainer(
    trainer: SageGRPOTrainer, monkeypatch: pytest.MonkeyPatch, hub: FakeHub, **attributes
) -> SageGRPOTrainer:
    """The shared trained run's trainer with hub attributes set for this test only, pointed at the fake Hub."""
    args = copy.copy(trainer.args)
    for name, value in {"hub_token": "hf_write", "hub_model_id": "tester/from-trainer", **attributes}.items():
        setattr(args, name, value)
    monkeypatch.setattr(trainer, "args", args)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    return trainer


def test_push_to_hub_follows_trainer_conventions(
    trained: tuple[SageGRPOTrainer, Path], hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = hub_trainer(trained[0], monkeypatch, hub, hub_private_repo=True, hub_license="apache-2.0")
    commit = trainer.push_to_hub()
    repo = hub.repos["tester/from-trainer"]
    assert repo.private and repo.commits[-1][0] == "End of training" and commit.oid == repo.head
    assert set(repo.files) == UPLOADED
    trainer.args.hub_model_id = (
        None  # transformers' default: the output folder's name in the token's namespace
    )
    trainer.push_to_hub()
    assert "tester/run" in hub.repos


def test_init_hf_repo_checks_everything_before_training(
    trained: tuple[SageGRPOTrainer, Path], hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = hub_trainer(trained[0], monkeypatch, hub)
    monkeypatch.delattr(trainer, "hub_model_id", raising=False)
    with pytest.raises(ValueError, match="license is required"):
        trainer.init_hf_repo()
    trainer.args.hub_license = "mit"
    trainer.init_hf_repo()
    assert trainer.hub_model_id == "tester/from-trainer" and hub.repos["tester/from-trainer"].files == {}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubPushError, match="offline"):
        trainer.init_hf_repo()


@pytest.mark.parametrize(
    ("strategy", "folder"),
    [("every_save", None), ("checkpoint", "last-checkpoint"), ("all_checkpoints", "checkpoint-2")],
)
def test_push_checkpoint_follows_hub_strategy(
    trained: tuple[SageGRPOTrainer, Path], hub: FakeHub, strategy: str, folder: str | None
) -> None:
    checkpoint = trained[1] / "checkpoint-2"
    commits = push_checkpoint(
        checkpoint, "tester/from-trainer", strategy=strategy, license="mit", token="hf_write", endpoint=hub.url,
        raise_on_error=True,
    )  # fmt: skip
    files = hub.files("tester/from-trainer")
    assert len(commits) == (1 if folder is None else 2)
    assert files[LORA_WEIGHT_NAME] == (checkpoint / LORA_WEIGHT_NAME).read_bytes()
    assert {LORA_WEIGHT_NAME, ADAPTER_INFO_FILE, "sage_config.json", "README.md"} <= set(files)
    readme = files["README.md"].decode()
    assert "Training in progress" in readme and "optimizer step 2 of 2" in readme
    nested = {path.split("/", 1)[0] for path in files if "/" in path}
    assert nested == (set() if folder is None else {folder})
    if folder is not None:  # the resumable checkpoint, optimizer state included
        assert files[f"{folder}/optimizer.pt"] == (checkpoint / "optimizer.pt").read_bytes()
    assert hub.repos["tester/from-trainer"].commits[0][0] == "Training in progress, step 2"


def test_push_checkpoint_skips_end_strategy_and_survives_failures(
    trained: tuple[SageGRPOTrainer, Path], hub: FakeHub, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    checkpoint = trained[1] / "checkpoint-2"
    options = {"license": "mit", "token": "hf_write", "endpoint": hub.url}
    assert push_checkpoint(checkpoint, REPO, strategy="end", **options) == [] and hub.requests == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.WARNING, logger="sage_trl.hub.upload"):
        assert push_checkpoint(checkpoint, REPO, strategy="every_save", **options) == []
    assert "Intermediate push" in caplog.text and "offline" in caplog.text
    with pytest.raises(HubPushError, match="offline"):
        push_checkpoint(checkpoint, REPO, strategy="every_save", raise_on_error=True, **options)
