"""The bad-input sweep's fixture: the files a mistyping user points the entry points at."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Paths the cases refer to (``{name}`` in a case's arguments)."""
    paths = {
        "missing": tmp_path / "missing",
        "file": tmp_path / "a-file.txt",
        "empty_prompts": tmp_path / "empty.txt",
        "prompts": tmp_path / "prompts.txt",
        "not_a_pipeline": tmp_path / "not-a-pipeline",
        "bad_yaml": tmp_path / "bad.yaml",
        "list_yaml": tmp_path / "list.yaml",
        "typo_yaml": tmp_path / "typo.yaml",
        "out": tmp_path / "out",
    }
    paths["file"].write_text("not a folder")
    paths["empty_prompts"].write_text("\n\n")
    paths["prompts"].write_text("a cat\na dog\n")
    paths["not_a_pipeline"].mkdir()
    paths["bad_yaml"].write_text("max_steps: [2\n")
    paths["list_yaml"].write_text("- max_steps\n- 2\n")
    paths["typo_yaml"].write_text("lerning_rate: 0.001\n")
    return paths
