"""The Hub tests' fixtures: one tiny trained run shared by the package (read-only), a local fake Hub
(tests/fixtures/hub_server.py), and no way to reach the real Hugging Face Hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants
from peft import LoraConfig

from sage_trl import SageGRPOTrainer
from tests.doubles import LinearBackbone, mean_brightness
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import PROMPTS, tiny_args, write_run_outputs


@pytest.fixture(scope="package")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[SageGRPOTrainer, Path]:
    """A tiny run trained for 2 steps, saved as sage-train leaves it (with checkpoint-2/ inside). Read-only."""
    run_dir = tmp_path_factory.mktemp("hub") / "run"
    trainer = SageGRPOTrainer(
        LinearBackbone(),
        mean_brightness,
        args=tiny_args(run_dir, save_strategy="steps", save_steps=2),
        train_dataset=PROMPTS,
        peft_config=LoraConfig(
            r=2, lora_alpha=4, target_modules=["mix", "prompt_proj"], init_lora_weights="gaussian"
        ),
    )
    trainer.train()  # saves the final adapter and writes training_complete.json
    write_run_outputs(run_dir, trainer)
    return trainer, run_dir


@pytest.fixture
def run_dir(trained: tuple[SageGRPOTrainer, Path]) -> Path:
    return trained[1]


@pytest.fixture(autouse=True)
def no_real_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No token from this machine, no offline flag from the environment, and a dead default endpoint."""
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_OIDC_RESOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-login-cache" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        yield server
