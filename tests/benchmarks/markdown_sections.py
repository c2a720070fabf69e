"""What the benchmark smoke tests check in a script's output: its markdown section and the plots it links."""

from __future__ import annotations

import re
from pathlib import Path


def quick_arguments(tmp_path: Path) -> list[str]:
    """``--quick --output <tmp>/benchmarks.md``: the smoke run, writing into a temporary docs folder."""
    return ["--quick", "--output", str(tmp_path / "benchmarks.md")]


def section_of(path: Path, name: str) -> str:
    """The text of section ``name`` of the markdown file ``path`` (fails if it is missing)."""
    text = path.read_text()
    begin, end = f"<!-- begin: {name} -->", f"<!-- end: {name} -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"section {name} missing or duplicated"
    return text[text.index(begin) + len(begin) : text.index(end)]


def linked_images(section: str, docs: Path) -> list[Path]:
    """The images a section links to, resolved against the markdown file's folder."""
    return [docs / match for match in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)]
