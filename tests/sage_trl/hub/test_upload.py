"""Pushing a run to a local fake Hub (tests/fixtures/hub_server.py) with ``push_output_dir``, the connection's
errors, and the runs that are refused before anything is created."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from sage_trl import SageGRPOTrainer
from sage_trl.hub import HubPushError, push_main, push_output_dir
from sage_trl.hub.upload import finished_run
from sage_trl.run_folder import RunFolder, read_run
from sage_trl.run_folder.layout import COMPLETE_FILE, LORA_WEIGHT_NAME
from tests.doubles import LinearBackbone
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import PROMPTS, REPO, copy_run, folder_bytes


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
