"""Hub publishing against a local fake Hub (tests/fixtures/hub_server.py): upload folder, model card, pushes,
the trainer helpers and the ``sage-push`` CLI. Nothing here contacts the real Hugging Face Hub."""

from __future__ import annotations

import copy
import json
import logging
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, constants
from peft import LoraConfig
from PIL import Image

from sage_trl import SageGRPOConfig, SageGRPOTrainer
from sage_trl.hub import (
    HubPushError,
    build_upload_folder,
    push_checkpoint,
    push_main,
    push_output_dir,
    render_model_card,
)
from sage_trl.hub.card import ADAPTER_INFO_FILE, resolve_base_model
from sage_trl.hub.upload import finished_run
from sage_trl.run_folder import RunFolder, layout, read_run
from sage_trl.run_folder.layout import COMPLETE_FILE, LORA_WEIGHT_NAME
from tests.doubles import LinearBackbone, LinearVideoModel, mean_brightness
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.tiny_trainer import make_args

PROMPTS = ["a red ball", "a blue cube", "a green cone", "a white star"]
WAN_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
REPO = "tester/sage-lora"
EVAL_RESULTS = {
    "before": {"mean_brightness": 0.5, "total": 0.5},
    "after": {"mean_brightness": 0.625, "total": 0.625},
    "prompts": ["a red ball", "a blue cube"],
    "seeds": [0, 1],
}
UPLOADED = {
    LORA_WEIGHT_NAME,
    ADAPTER_INFO_FILE,
    "sage_config.json",
    "metrics.jsonl",
    "eval_results.json",
    "summary.md",
    "reward_total.png",
    "reward_mean_brightness.png",
    "samples_before_after.gif",
    "README.md",
}


def tiny_args(output_dir: Path, **kwargs) -> SageGRPOConfig:
    """The trainer tests' tiny config (`tests.sage_trl.tiny_trainer.make_args`), recorded as a Wan run."""
    values = {"output_dir": str(output_dir), "model_name_or_path": WAN_ID, "gradient_accumulation_steps": 1}
    return make_args(output_dir.parent, **{**values, **kwargs})


def record_pipeline(run_dir: Path, pipeline_class: str) -> None:
    """The tiny analytic backbone has no diffusers pipeline: record the one a Wan run would have."""
    config = json.loads((run_dir / layout.CONFIG_FILE).read_text())
    config["run"]["base_model"]["pipeline_class"] = pipeline_class
    (run_dir / layout.CONFIG_FILE).write_text(json.dumps(config))


def write_run_outputs(run_dir: Path, trainer: SageGRPOTrainer) -> None:
    """What sage-train writes next to the weights: metrics, curves, samples, evaluation."""
    records = [{"step": h["step"], **h} for h in trainer.state.log_history if "loss" in h]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for name, colour in (("reward_total.png", "red"), ("reward_mean_brightness.png", "blue")):
        Image.new("RGB", (8, 6), colour).save(run_dir / name)
    frames = [Image.new("RGB", (8, 4), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(
        run_dir / "samples_before_after.gif", save_all=True, append_images=frames[1:], duration=100
    )
    (run_dir / "eval_results.json").write_text(json.dumps(EVAL_RESULTS))
    (run_dir / "summary.md").write_text("| component | before | after | change |\n|---|---|---|---|\n")
    record_pipeline(run_dir, "WanPipeline")


@pytest.fixture(scope="module")
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


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def copy_run(run_dir: Path, target: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns(*skip))
    return target


# ------------------------------------------------------------------------------------------
# The upload folder and its card
# ------------------------------------------------------------------------------------------


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
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert 'sage-push = "sage_trl.hub:push_main"' in scripts.splitlines()


# ------------------------------------------------------------------------------------------
# Pushing
# ------------------------------------------------------------------------------------------


def test_push_uploads_the_dry_run_folder_byte_identical(run_dir: Path, tmp_path: Path, hub: FakeHub) -> None:
    dry = push_output_dir(run_dir, REPO, license="apache-2.0", dry_run_dir=tmp_path / "dry")
    commit = push_output_dir(
        run_dir,
        REPO,
        token="hf_write",
        license="apache-2.0",
        endpoint=hub.url,
        private=True,
        commit_message="First adapter",
    )
    assert hub.files(REPO) == folder_bytes(dry)
    repo = hub.repos[REPO]
    assert repo.private and repo.commits[-1][0] == "First adapter" and commit.oid == repo.head
    # Pushing again is idempotent: the repo exists (exist_ok) and the unchanged files make no new commit.
    push_output_dir(run_dir, REPO, token="hf_write", license="apache-2.0", endpoint=hub.url)
    assert len(repo.commits) == 1 and hub.files(REPO) == folder_bytes(dry)


def test_uploaded_adapter_reproduces_the_trained_policy(
    trained: tuple[SageGRPOTrainer, Path], tmp_path: Path, hub: FakeHub
) -> None:
    trainer, run_dir = trained
    push_output_dir(run_dir, REPO, token="hf_write", license="mit", endpoint=hub.url)
    downloaded = hub.download(REPO, tmp_path / "download")
    fresh, untouched = LinearBackbone(), LinearBackbone()
    fresh.load_lora_weights(downloaded)
    latents, sigma = torch.randn(2, 3, 2, 4, 4), torch.tensor([0.9, 0.3])
    with torch.no_grad():
        expected = trainer.backbone.predict_velocity(
            latents, sigma, trainer.backbone.encode_prompts(PROMPTS[:2])
        )
        actual = fresh.predict_velocity(latents, sigma, fresh.encode_prompts(PROMPTS[:2]))
        base = untouched.predict_velocity(latents, sigma, untouched.encode_prompts(PROMPTS[:2]))
    torch.testing.assert_close(actual, expected)
    assert not torch.allclose(base, expected, atol=1e-4)  # the adapter does change the policy


def test_bare_repo_name_goes_to_the_token_owner(run_dir: Path, hub: FakeHub) -> None:
    commit = push_output_dir(run_dir, "bare-name", token="hf_write", license="mit", endpoint=hub.url)
    assert commit.repo_url.repo_id == "tester/bare-name"
    assert '"tester/bare-name"' in hub.files("tester/bare-name")["README.md"].decode()


def test_token_comes_from_hf_token(run_dir: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_write")
    push_output_dir(run_dir, REPO, license="mit", endpoint=hub.url)
    assert LORA_WEIGHT_NAME in hub.files(REPO)


def test_missing_token_is_one_clear_error(run_dir: Path, hub: FakeHub) -> None:
    with pytest.raises(HubPushError, match="No Hugging Face token: run `hf auth login`"):
        push_output_dir(run_dir, REPO, license="mit", endpoint=hub.url)
    assert hub.requests == []


@pytest.mark.parametrize(("token", "message"), [("hf_bogus", "rejected the token"), ("hf_read", "read-only")])
def test_unusable_tokens_fail_before_anything_is_created(
    run_dir: Path, hub: FakeHub, token: str, message: str
) -> None:
    with pytest.raises(HubPushError, match=message):
        push_output_dir(run_dir, REPO, token=token, license="mit", endpoint=hub.url)
    assert hub.repos == {}


@pytest.mark.parametrize("how", ["environment", "huggingface_hub"])
def test_offline_mode_fails_at_once(
    run_dir: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "environment":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(HubPushError, match="offline mode is on") as error:
        push_output_dir(run_dir, REPO, token="hf_write", license="mit", endpoint=hub.url)
    assert time.perf_counter() - start < 1.0 and hub.requests == []
    assert "--dry-run" in str(error.value)


def test_unreachable_endpoint_fails_fast(run_dir: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.perf_counter()
    with pytest.raises(HubPushError, match=f"Cannot reach the Hugging Face Hub at http://127.0.0.1:{port}"):
        push_output_dir(run_dir, REPO, token="hf_write", license="mit", endpoint=f"http://127.0.0.1:{port}")
    assert time.perf_counter() - start < 3.0


def test_silent_endpoint_times_out_instead_of_hanging(run_dir: Path) -> None:
    with socket.socket() as silent:  # accepts connections (kernel backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(HubPushError, match="Cannot reach"):
            push_output_dir(run_dir, REPO, token="hf_write", license="mit", endpoint=endpoint, timeout=0.5)
        assert time.perf_counter() - start < 3.0


# ------------------------------------------------------------------------------------------
# What is refused
# ------------------------------------------------------------------------------------------


def test_refuses_a_folder_without_trained_weights(tmp_path: Path, hub: FakeHub) -> None:
    (tmp_path / "sage_config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no trained model"):
        push_output_dir(tmp_path, REPO, token="hf_write", license="mit", endpoint=hub.url)
    assert hub.requests == []


def test_a_folder_that_cannot_be_published_creates_no_repo(run_dir: Path, hub: FakeHub) -> None:
    with pytest.raises(ValueError, match="Hub model id"):
        push_output_dir(
            run_dir, REPO, token="hf_write", license="mit", endpoint=hub.url, base_model="/data/wan"
        )
    assert hub.repos == {}


def test_refuses_an_unfinished_run(run_dir: Path, tmp_path: Path, hub: FakeHub) -> None:
    unfinished = copy_run(run_dir, tmp_path / "unfinished", skip=(COMPLETE_FILE, "eval_results.json"))
    with pytest.raises(ValueError, match="did not finish"):
        push_output_dir(unfinished, REPO, token="hf_write", license="mit", endpoint=hub.url)
    with pytest.raises(ValueError, match="did not finish"):
        push_output_dir(unfinished, REPO, license="mit", dry_run_dir=tmp_path / "dry")
    assert hub.requests == []
    RunFolder(unfinished).mark_complete(2, 2)
    assert finished_run(unfinished).global_step == 2


def test_refuses_weights_without_lora_metadata(run_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = copy_run(run_dir, tmp_path / "broken", skip=("checkpoint-*",))
    save_file(load_file(broken / LORA_WEIGHT_NAME), broken / LORA_WEIGHT_NAME)  # drops the metadata
    with pytest.raises(ValueError, match="no LoRA metadata"):
        read_run(broken)
    (broken / LORA_WEIGHT_NAME).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_run(broken)


@pytest.mark.parametrize(
    ("license", "repo_id", "message"),
    [
        (None, REPO, "A license is required"),
        ("Apache 2.0", REPO, "lowercase Hub license id"),
        ("mit", "no/such/repo", "Invalid repo id"),
        ("mit", "just-a-name", "must be 'user/name'"),  # a dry run cannot ask the Hub for the namespace
    ],
)
def test_bad_arguments_are_value_errors(
    run_dir: Path, tmp_path: Path, license, repo_id: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        push_output_dir(run_dir, repo_id, license=license, dry_run_dir=tmp_path / "dry")


# ------------------------------------------------------------------------------------------
# The sage-push CLI
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# Trainer helpers
# ------------------------------------------------------------------------------------------


def hub_trainer(
    trainer: SageGRPOTrainer, monkeypatch: pytest.MonkeyPatch, hub: FakeHub, **attributes
) -> SageGRPOTrainer:
    """The module's trainer with hub attributes set for this test only, pointed at the fake Hub."""
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


# ------------------------------------------------------------------------------------------
# A real diffusers pipeline
# ------------------------------------------------------------------------------------------


def test_uploaded_adapter_loads_into_a_tiny_wan_pipeline(
    tiny_wan_path: Path, tmp_path: Path, hub: FakeHub
) -> None:
    from diffusers import WanPipeline

    from sage_env.backbones import load_backbone
    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    output = tmp_path / "wan-run"
    args = tiny_args(
        output, model_name_or_path=str(tiny_wan_path), max_steps=1, num_inference_steps=2, **TINY_VIDEO_SIZE
    )
    trainer = SageGRPOTrainer(
        load_backbone(str(tiny_wan_path)),
        mean_brightness,
        args=args,
        train_dataset=PROMPTS,
        peft_config=LoraConfig(r=2, lora_alpha=4, init_lora_weights="gaussian"),
    )
    trainer.train()
    push_output_dir(
        output, "tester/wan-lora", token="hf_write", license="apache-2.0", endpoint=hub.url, base_model=WAN_ID
    )
    assert 'pipe.load_lora_weights("tester/wan-lora")' in hub.files("tester/wan-lora")["README.md"].decode()
    pipe = WanPipeline.from_pretrained(tiny_wan_path)
    inputs = {
        "hidden_states": torch.randn(1, 4, 2, 2, 2),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 32),
        "return_dict": False,
    }
    with torch.no_grad():
        base = pipe.transformer(**inputs)[0]
        pipe.load_lora_weights(str(hub.download("tester/wan-lora", tmp_path / "download")))
        loaded = pipe.transformer(**inputs)[0]
        trained_output = trainer.backbone.transformer(**inputs)[0]
    torch.testing.assert_close(loaded, trained_output)
    assert not torch.allclose(base, trained_output, atol=1e-6)


def test_both_wan22_experts_adapters_are_pushed_and_load_with_diffusers(
    tiny_wan22_path: Path, tmp_path: Path, hub: FakeHub
) -> None:
    from diffusers import WanPipeline

    from sage_env.backbones.wan import WanBackbone
    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    output = tmp_path / "wan22-run"
    args = tiny_args(
        output, model_name_or_path=str(tiny_wan22_path), max_steps=1, num_inference_steps=4, expert="both",
        learning_rate=5e-2, **TINY_VIDEO_SIZE,
    )  # fmt: skip
    trainer = SageGRPOTrainer(
        None, mean_brightness, args=args, train_dataset=PROMPTS, peft_config=LoraConfig(r=2, lora_alpha=4)
    )
    trainer.train()
    push_output_dir(output, "tester/wan22", token="hf_write", license="apache-2.0", endpoint=hub.url, base_model=WAN_ID)
    files = hub.files("tester/wan22")
    assert {layout.LORA_WEIGHT_NAME, layout.EXPERT_2_LORA_WEIGHT_NAME} <= set(files)
    card = files["README.md"].decode()
    assert (
        f'pipe.load_lora_weights("tester/wan22", weight_name="{layout.EXPERT_2_LORA_WEIGHT_NAME}", '
        "load_into_transformer_2=True)"
    ) in card
    download = str(hub.download("tester/wan22", tmp_path / "download"))
    pipe = WanPipeline.from_pretrained(tiny_wan22_path)  # loaded as the card says
    pipe.load_lora_weights(download)
    pipe.load_lora_weights(download, weight_name=layout.EXPERT_2_LORA_WEIGHT_NAME, load_into_transformer_2=True)
    inputs = {
        "hidden_states": torch.randn(1, 4, 2, 2, 2),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 32),
        "return_dict": False,
    }
    base = WanBackbone(WanPipeline.from_pretrained(tiny_wan22_path)).pipeline
    with torch.no_grad():
        for name in ("transformer", "transformer_2"):
            loaded = getattr(pipe, name)(**inputs)[0]
            trained_output = trainer.backbone.transformer.expert(name)(**inputs)[0]
            torch.testing.assert_close(loaded, trained_output)
            assert not torch.allclose(getattr(base, name)(**inputs)[0], trained_output, atol=1e-6), name


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


@pytest.mark.parametrize("linked", ["summary.md", LORA_WEIGHT_NAME])
def test_a_symlinked_file_pushes_nothing_from_outside_the_run(
    run_dir: Path, tmp_path: Path, hub: FakeHub, capsys, linked: str
) -> None:
    """A ``summary.md`` linking to a token file uploaded the token, in the file and in the card, on 2dec1df."""
    run = copy_run(run_dir, tmp_path / "run")
    secret = tmp_path / "secret-token"
    secret.write_text("hf_SECRET_TOKEN_VALUE")
    (run / linked).unlink()
    (run / linked).symlink_to(secret)
    arguments = [str(run), "--repo-id", "tester/linked", "--license", "mit", "--token", "hf_write"]
    assert push_main([*arguments, "--endpoint", hub.url]) != 0
    assert push_main([*arguments, "--dry-run", str(tmp_path / "dry")]) != 0
    assert "symbolic link" in capsys.readouterr().err
    assert "tester/linked" not in hub.repos
    dry = tmp_path / "dry"
    assert not dry.exists() or all(b"SECRET" not in p.read_bytes() for p in dry.rglob("*") if p.is_file())


@pytest.mark.parametrize("algorithm", ["grpo_guard", "mix_grpo", "mix_grpo_flash", "branch_grpo", "diffusion_nft", "awm"])
def test_the_card_names_the_algorithm_that_ran(run_dir: Path, algorithm: str) -> None:
    from agents import ALGORITHM_CONFIGS

    run = read_run(run_dir)
    run.config["algorithm"] = algorithm
    card = render_model_card(run, repo_id=REPO, license="mit")
    config_class = ALGORITHM_CONFIGS[algorithm]
    assert config_class.display_name in card.text and config_class.summary in card.text
