"""The bad-input sweep through ``sage-push``: each case names the problem before any upload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sage_trl.hub import push_main
from sage_trl.run_folder import RunFolder


def _finished_run(root: Path) -> Path:
    from safetensors.torch import save_file

    run = root / "run"
    run.mkdir()
    metadata = {"lora_adapter_metadata": json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["mix"]})}
    save_file(
        {"transformer.mix.lora_A.weight": torch.zeros(2, 3)},
        run / "pytorch_lora_weights.safetensors",
        metadata,
    )
    (run / "sage_config.json").write_text(json.dumps({"model_name_or_path": "toy", "run": {}}))
    RunFolder(run).mark_complete(2, 2)
    return run


PUSH_CASES: list[tuple[list[str], str]] = [
    (["{missing}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "{missing}"),
    (["{file}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "{file}"),
    (["{not_a_pipeline}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "no trained model"),
    (["{run}", "--repo-id", "me/x", "--dry-run"], "license is required"),
    (["{run}", "--repo-id", "me/x", "--license", "Apache 2.0", "--dry-run"], "license"),
    (["{run}", "--repo-id", "no/such/repo", "--license", "mit", "--dry-run"], "repo id"),
    (["{run}", "--repo-id", "bare-name", "--license", "mit", "--dry-run"], "user/name"),
    (
        ["{run}", "--repo-id", "me/x", "--license", "mit", "--base-model", "/data/wan", "--dry-run"],
        "base_model",
    ),
    (["{run}", "--repo-id", "me/x", "--license", "mit", "--dry-run", "{file}"], "{file}"),
    (["{run}", "--repo-id", "me/x", "--license", "mit", "--endpoint", "http://127.0.0.1:9"], "token"),
]


@pytest.mark.parametrize(
    ("arguments", "words"), PUSH_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(PUSH_CASES)]
)
def test_sage_push_names_the_problem(
    arguments: list[str], words: str, files: dict[str, Path], capsys, monkeypatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    paths = {**files, "run": _finished_run(tmp_path)}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in arguments]
    assert push_main(argv) != 0
    assert words.format(**{k: str(v) for k, v in paths.items()}) in capsys.readouterr().err


def test_sage_push_refuses_an_unfinished_run(tmp_path: Path, capsys) -> None:
    run = _finished_run(tmp_path)
    (run / "training_complete.json").unlink()
    assert push_main([str(run), "--repo-id", "me/x", "--license", "mit", "--dry-run"]) != 0
    assert "did not finish" in capsys.readouterr().err
