"""The cases' ``{name}`` placeholders filled in with the paths of the files the fixture ``files`` makes."""

from __future__ import annotations

from pathlib import Path


def with_paths(arguments: list[str], files: dict[str, Path]) -> list[str]:
    """``arguments`` with each ``{name}`` replaced by the path of ``files[name]``."""
    return [argument.format(**{k: str(v) for k, v in files.items()}) for argument in arguments]
