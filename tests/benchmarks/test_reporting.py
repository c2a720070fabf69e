"""The shared markdown file: each script replaces only its own section, new sections go to their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import reporting
from sage_trl.machine import cpu_description
from tests.benchmarks.markdown_sections import section_of


def test_write_section_creates_the_file_with_a_header(tmp_path: Path) -> None:
    path = tmp_path / "docs" / "benchmarks.md"
    reporting.write_section(path, "scaling", "## Scaling\n\nbody")
    text = path.read_text()
    assert text.startswith("# Benchmarks")
    assert section_of(path, "scaling").strip() == "## Scaling\n\nbody"


def test_rewriting_a_section_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    reporting.write_section(path, "memory", "old memory")
    reporting.write_section(path, "scaling", "scaling body")
    path.write_text(path.read_text() + "\nA note written by hand.\n")
    reporting.write_section(path, "memory", "new memory")
    text = path.read_text()
    assert "old memory" not in text
    assert section_of(path, "memory").strip() == "new memory"
    assert section_of(path, "scaling").strip() == "scaling body"
    assert "A note written by hand." in text


def test_new_sections_follow_the_benchmark_order(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    for name in ("off_manifold_drift", "rollout_overhead", "memory"):
        reporting.write_section(path, name, f"body of {name}")
    text = path.read_text()
    positions = [
        text.index(f"<!-- begin: {name} -->") for name in ("rollout_overhead", "memory", "off_manifold_drift")
    ]
    assert positions == sorted(positions)


def test_unknown_section_names_are_refused() -> None:
    parser = reporting.benchmark_parser("test")
    with pytest.raises(ValueError, match="Unknown benchmark section"):
        reporting.start_benchmark("not_a_benchmark", parser, [])


def test_markdown_table_checks_row_width_and_formats_floats() -> None:
    table = reporting.markdown_table(["a", "b"], [[1.23456, "x"], [1e-7, float("nan")]], digits=2)
    lines = table.splitlines()
    assert lines[0] == "| a | b |"
    assert lines[2] == "| 1.23 | x |"
    assert lines[3] == "| 1.0e-07 | n/a |"
    with pytest.raises(ValueError, match="cells"):
        reporting.markdown_table(["a", "b"], [[1]])


def test_format_mean_std_uses_the_population_std() -> None:
    assert reporting.format_mean_std([1.0, 3.0], digits=1) == "2.0 ± 1.0"
    assert reporting.format_mean_std([0.5]) == "0.500"
    assert reporting.format_mean_std([float("nan")]) == "n/a"


def test_the_provenance_line_names_the_processor(tmp_path: Path) -> None:
    """Timings differ about twice between two of this project's 2-core machines: a section says which one it ran on."""
    parser = reporting.benchmark_parser("a benchmark")
    context = reporting.start_benchmark("scaling", parser, ["--quick", "--output", str(tmp_path / "benchmarks.md")])
    assert f"({cpu_description()}, " in context.provenance()
