"""The model card as huggingface_hub reads it: its metadata parses, every fact comes from the run record.

A real (tiny) toy-world run is trained and its upload folder built; the card is then loaded with
``huggingface_hub.ModelCard.load`` and its metadata round-tripped through ``ModelCardData``. The Hub's own YAML
validation endpoint needs the network, so the check is huggingface_hub's local parsing and repo-id validation.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import validate_repo_id
from peft import LoraConfig

from sage_env.rewards.toy import ToyReward
from sage_trl import SageGRPOConfig, SageGRPOTrainer
from sage_trl.checkpoints import _hub_id
from sage_trl.hub import build_upload_folder
from sage_trl.run_folder import read_run


@pytest.fixture(scope="module")
def toy_card(tmp_path_factory: pytest.TempPathFactory) -> ModelCard:
    root = tmp_path_factory.mktemp("toy-card")
    args = SageGRPOConfig.from_preset(
        "toy", output_dir=str(root / "run"), max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = SageGRPOTrainer(
        None,
        ToyReward(),
        args=args,
        train_dataset=["a red square moving left"] * 2,
        peft_config=LoraConfig(r=2),
    )
    trainer.train()
    folder = build_upload_folder(root / "run", root / "upload", repo_id="me/toy-lora", license="apache-2.0")
    return ModelCard.load(folder / "README.md")


def test_the_card_metadata_parses_and_round_trips(toy_card: ModelCard) -> None:
    data = toy_card.data
    assert (data.library_name, data.pipeline_tag, data.license) == (
        "diffusers",
        "text-to-video",
        "apache-2.0",
    )
    assert {"grpo", "reinforcement-learning", "trl", "lora", "sage-grpo", "sage-sde", "toy-world"} <= set(
        data.tags
    )
    assert all(tag == tag.lower() and " " not in tag and "_" not in tag for tag in data.tags)
    known = set(inspect.signature(ModelCardData.__init__).parameters)  # huggingface_hub's model-card fields
    metadata = data.to_dict()
    assert set(metadata) <= known, set(metadata) - known
    assert ModelCardData(**metadata).to_dict() == metadata


def test_the_card_states_the_recorded_reward_not_a_guess(toy_card: ModelCard) -> None:
    text = toy_card.text
    assert "VideoAlign" not in text  # the toy reward's components are also named vq/mq/ta
    assert "the toy world's analytic reward" in text
    assert "| vq (visual quality: the world's background" in text and "| ta (text alignment" in text
    assert "| 0.5 |" in text and "| 1 |" in text  # Setting B, as the trainer resolved it
    assert toy_card.data.base_model is None  # the toy world has no Hub repository
    assert "prompts from `toy`" not in text  # a list of prompts has no dataset name


def test_the_base_model_comes_from_the_run(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    assert _hub_id(str(snapshot)) == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # a Hub cache folder knows its repo
    assert _hub_id("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    plain = tmp_path / "my-wan"
    plain.mkdir()
    assert _hub_id(str(plain)) is None and _hub_id("toy") is None
    validate_repo_id(_hub_id(str(snapshot)))


def test_a_run_recorded_from_the_hub_names_its_base_model(tmp_path: Path) -> None:
    from tests.sage_trl.tiny_trainer import make_trainer

    trainer = make_trainer(tmp_path, model_name_or_path="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", max_steps=1)
    trainer.train()
    run = read_run(tmp_path / "run")
    assert run.base_model["hub_id"] == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    folder = build_upload_folder(tmp_path / "run", tmp_path / "up", repo_id="me/wan-lora", license="mit")
    card = ModelCard.load(folder / "README.md")
    assert (
        card.data.base_model == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
        and card.data.base_model_relation == "adapter"
    )
