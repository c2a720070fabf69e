"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures.markdown import first_block

ROOT = Path(__file__).resolve().parent.parent


def ci_block(name: str) -> list[str]:
    text = (ROOT / ".ci" / "run").read_text()
    match = re.search(rf"# --- README: {name} .*?\n(.*?)# --- end README: {name} ---", text, re.S)
    assert match, f"block {name!r} missing from .ci/run"
    return [line for line in match.group(1).splitlines() if line and not line.startswith("#")]


def readme_first_block() -> str:
    return first_block(ROOT / "README.md", "bash").code


def test_ci_installs_exactly_like_the_readme() -> None:
    block = readme_first_block()
    for command in ci_block("install"):
        assert command in block, f"CI runs {command!r}, which the README does not show"


def test_ci_runs_the_readme_test_command() -> None:
    block = readme_first_block()
    (command,) = ci_block("test")
    readme_command = command.split(" --junitxml")[0]
    assert readme_command in block
    assert "pip install torch==2.13.0" in block
