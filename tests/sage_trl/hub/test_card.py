"""The upload folder ``sage-push`` builds from a run and its model card, read back with huggingface_hub's
``ModelCard``; nothing is uploaded here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from peft import LoraConfig

from sage_trl.hub import build_upload_folder, push_output_dir, render_model_card
from sage_trl.hub.card import ADAPTER_INFO_FILE, resolve_base_model
from sage_trl.run_folder import RunFolder, read_run
from sage_trl.run_folder.layout import LORA_WEIGHT_NAME
from tests.doubles import LinearVideoModel
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import REPO, UPLOADED, WAN_ID, copy_run, folder_bytes


def test_dry_run_writes_exactly_the_allow_listed_files(run_dir: Path, tmp_path: Path, hub: FakeHub) -> None:
    folder = push_output_dir(
        run_dir, REPO, license="apache-2.0", dry_run_dir=tmp_path / "dry", endpoint=hub.url
    )
    assert folder == tmp_path / "dry" and set(folder_bytes(folder)) == UPLOADED
    assert (run_dir / "checkpoint-2" / "optimizer.pt").is_file()  # present in the run, never uploaded
    for name in UPLOADED - {"README.md", ADAPTER_INFO_FILE}:
        assert (folder / name).read_bytes() == (run_dir / name).read_bytes(), name
    assert hub.requests == []  # a dry run contacts nothing


def test_dry_run_refuses_a_non_empty_folder(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "dry").mkdir()
    (tmp_path / "dry" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="empty or new folder"):
        push_output_dir(run_dir, REPO, license="mit", dry_run_dir=tmp_path / "dry")


def test_card_metadata_parses_with_model_card(run_dir: Path, tmp_path: Path) -> None:
    folder = build_upload_folder(run_dir, tmp_path / "up", repo_id=REPO, license="apache-2.0")
    card = ModelCard((folder / "README.md").read_text())
    data = card.data
    assert (data.base_model, data.base_model_relation) == (WAN_ID, "adapter")
    assert (data.library_name, data.pipeline_tag, data.license) == (
        "diffusers",
        "text-to-video",
        "apache-2.0",
    )
    assert {"lora", "sage-grpo", "text-to-video", "sage-sde"} <= set(data.tags)
    body = card.text
    assert f'pipe.load_lora_weights("{REPO}")' in body and f'WanPipeline.from_pretrained("{WAN_ID}"' in body
    assert "| LoRA rank r | 2 |" in body and "| LoRA alpha | 4 |" in body
    assert "| LoRA target modules | mix, prompt_proj |" in body and "| KL strategy | dual |" in body
    assert "| optimizer steps trained | 2 |" in body and "| group size G | 4 |" in body
    assert "| total | 0.5000 | 0.6250 | +0.1250 |" in body  # eval_results.json, total last
    assert "| mean_brightness | 1 |" in body  # the reward weight the trainer used
    assert "![total](reward_total.png)" in body and "(samples_before_after.gif)" in body
    assert "@article{zheng2026sagegrpo" in body and "arXiv:2603.21872" in body and "Yang, Harry" in body
    assert "\n\n\n" not in body


def test_adapter_info_rebuilds_the_lora_config(run_dir: Path, tmp_path: Path) -> None:
    folder = build_upload_folder(run_dir, tmp_path / "up", repo_id=REPO, license="mit")
    info = json.loads((folder / ADAPTER_INFO_FILE).read_text())
    assert (info["r"], info["lora_alpha"], info["target_modules"]) == (2, 4, ["mix", "prompt_proj"])
    assert (info["weight_name"], info["prefix"], info["base_model"]) == (
        LORA_WEIGHT_NAME,
        "transformer",
        WAN_ID,
    )
    config = LoraConfig(**info["lora_config"])
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (2, 4, {"mix", "prompt_proj"})


def test_card_falls_back_to_the_last_logged_rewards(run_dir: Path, tmp_path: Path) -> None:
    bare = copy_run(run_dir, tmp_path / "bare", skip=("eval_results.json", "summary.md", "checkpoint-*"))
    card = render_model_card(read_run(bare), repo_id=REPO, license="mit")
    last = [json.loads(line) for line in (bare / "metrics.jsonl").read_text().splitlines()][-1]
    assert f"| reward/total | {last['reward/total']:.4f} |" in card.text
    assert "last logged step (2)" in card.text


def test_card_usage_snippet_follows_the_pipeline(run_dir: Path) -> None:
    run = read_run(run_dir)
    run.run["base_model"] = {"name_or_path": "toy", "pipeline_class": "toy", "hub_id": None}
    toy = render_model_card(run, repo_id=REPO, license="mit")
    assert 'load_backbone("toy")' in toy.text and "backbone.load_lora_weights(snapshot_download(" in toy.text
    assert toy.data.base_model is None and toy.data.to_dict().get("base_model_relation") is None
    assert "toy-world" in toy.data.tags
    hunyuan_id = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"
    run.run["base_model"] = {
        "name_or_path": hunyuan_id,
        "pipeline_class": "HunyuanVideo15Pipeline",
        "hub_id": hunyuan_id,
    }
    hunyuan = render_model_card(run, repo_id=REPO, license="mit")
    assert "HunyuanVideo15Pipeline.from_pretrained(" in hunyuan.text
    assert (
        f'pipe.transformer.load_lora_adapter(\n    "{REPO}", prefix="transformer", weight_name="{LORA_WEIGHT_NAME}"'
        in (hunyuan.text)
    )
    assert hunyuan.data.base_model == hunyuan_id


@pytest.mark.parametrize("algorithm", ["grpo_guard", "mix_grpo", "mix_grpo_flash", "branch_grpo", "diffusion_nft", "awm"])
def test_the_card_names_the_algorithm_that_ran(run_dir: Path, algorithm: str) -> None:
    from agents import ALGORITHM_CONFIGS

    run = read_run(run_dir)
    run.config["algorithm"] = algorithm
    card = render_model_card(run, repo_id=REPO, license="mit")
    config_class = ALGORITHM_CONFIGS[algorithm]
    assert config_class.display_name in card.text and config_class.summary in card.text


def test_base_model_resolution(run_dir: Path, tmp_path: Path) -> None:
    run = read_run(run_dir)
    assert resolve_base_model(run) == WAN_ID  # what the run recorded
    assert resolve_base_model(run, base_model="org/other") == "org/other"  # an explicit id wins
    run.run["base_model"] = {"name_or_path": str(tmp_path), "pipeline_class": "WanPipeline", "hub_id": None}
    assert resolve_base_model(run) is None  # a plain local folder: the card asks for base_model
    with pytest.raises(ValueError, match="Hub model id"):
        resolve_base_model(run, base_model="/data/wan")


def test_full_fine_tuning_uploads_the_transformer_folder(tmp_path: Path) -> None:
    output = tmp_path / "full"
    model = LinearVideoModel()
    model.save_pretrained(output / "transformer")
    config = {"model_name_or_path": "toy", "algorithm": "flow_grpo", "sde": "flow_grpo", "num_generations": 4}
    config["run"] = {"base_model": {"name_or_path": "toy", "pipeline_class": "toy", "hub_id": None}}
    (output / "sage_config.json").write_text(json.dumps(config))
    RunFolder(output).mark_complete(3, 3)
    folder = push_output_dir(output, "tester/full", license="mit", dry_run_dir=tmp_path / "dry")
    assert set(folder_bytes(folder)) == {
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "sage_config.json",
        "README.md",
    }
    card = ModelCard((folder / "README.md").read_text())
    assert "lora" not in card.data.tags and {"flow-grpo", "flow-grpo-sde", "toy-world"} <= set(card.data.tags)
    assert (
        'from_pretrained(folder, subfolder="transformer")' in card.text
        and "| optimizer steps trained | 3 |" in card.text
    )
    reloaded = LinearVideoModel.from_pretrained(folder / "transformer")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor)


def test_a_token_in_the_config_never_reaches_the_upload(run_dir: Path, tmp_path: Path) -> None:
    leaky = copy_run(run_dir, tmp_path / "leaky", skip=("checkpoint-*",))
    config = json.loads((leaky / "sage_config.json").read_text())
    config["hub_token"] = "hf_secret_value"
    (leaky / "sage_config.json").write_text(json.dumps(config))
    folder = build_upload_folder(leaky, tmp_path / "up", repo_id=REPO, license="mit")
    assert json.loads((folder / "sage_config.json").read_text())["hub_token"] == "<HUB_TOKEN>"
    assert all(b"hf_secret_value" not in content for content in folder_bytes(folder).values())


def test_the_template_ships_with_the_package() -> None:
    from importlib.resources import files

    assert "{{ card_data }}" in files("sage_trl").joinpath("templates", "model_card.md").read_text()
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert 'sage-push = "sage_trl.hub:push_main"' in scripts.splitlines()
