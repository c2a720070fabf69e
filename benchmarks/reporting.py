"""What every benchmark script shares: its command line, its section of ``docs/benchmarks.md``, tables, plots.

Every script runs as ``python -m benchmarks.<name> [--quick] [--output docs/benchmarks.md] [--threads N]``,
prints a table and replaces only its own section of the shared markdown file, delimited by
``<!-- begin: <name> -->`` and ``<!-- end: <name> -->``, so the scripts can be rerun independently and in any
order. Plots go to the ``img/`` folder beside the markdown file and are linked relatively.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sage_trl.machine import cpu_description

__all__ = [
    "DEFAULT_OUTPUT",
    "SECTION_ORDER",
    "BenchmarkContext",
    "benchmark_parser",
    "format_mean_std",
    "markdown_table",
    "new_figure",
    "save_figure",
    "start_benchmark",
    "write_section",
]

DEFAULT_OUTPUT = Path("docs") / "benchmarks.md"
"""The shared markdown file every benchmark writes its section into."""

SECTION_ORDER: tuple[str, ...] = (
    "rollout_overhead",
    "training_throughput",
    "memory",
    "scaling",
    "sde_noise_std",
    "gradient_norms",
    "equalizer_ablation",
    "kl_ablation",
    "off_manifold_drift",
    "toy_algorithms",
    "toy_alarms",
    "arena_alarms",
    "sde_step_overhead",
    "example_configs",
)
"""Order of the sections in the markdown file (a new section is inserted at its place in this order)."""

_HEADER = """# Benchmarks

Every table below is written by one script under `benchmarks/` (`python -m benchmarks.<name>`; see
`benchmarks/README.md`). Each script replaces only its own section, between `<!-- begin: name -->` and
`<!-- end: name -->`, so text outside the sections is kept when a script is rerun. Timings on the shared CPU
machine are noisy: the performance tables report ratios of interleaved, repeated measurements taken in the
same process (medians), never absolute times alone. Each section's first line names the machine it ran on, with its
processor since 2026-11-27 (two of this project's 2-core machines differ about twice in speed); a line without one
was written before.
"""


@dataclass
class BenchmarkContext:
    """The parsed command line of one benchmark run and where its outputs go.

    Args:
        name: the script's section name (one of `SECTION_ORDER`).
        arguments: the parsed command line.
        output: the markdown file holding every benchmark's section.
        image_dir: folder of the plots (``img/`` beside ``output``).
        command: the command line as typed, for the report.
    """

    name: str
    arguments: argparse.Namespace
    output: Path
    image_dir: Path
    command: str

    @property
    def quick(self) -> bool:
        """True for the smoke run of the test suite (seconds, numbers meaningless)."""
        return bool(self.arguments.quick)

    def image_path(self, stem: str) -> Path:
        """Where the plot ``stem`` is written (``<image_dir>/<name>_<stem>.png``)."""
        self.image_dir.mkdir(parents=True, exist_ok=True)
        return self.image_dir / f"{self.name}_{stem}.png"

    def image_link(self, path: Path, caption: str) -> str:
        """Markdown image link to ``path`` relative to the markdown file."""
        relative = os.path.relpath(path, self.output.parent)
        return f"![{caption}]({Path(relative).as_posix()})"

    def provenance(self) -> str:
        """One line: the command, the date, the machine (its processor too: timings differ about twice between two
        of this project's 2-core machines) and the thread count."""
        date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        mode = " (quick smoke run: numbers are not meaningful)" if self.quick else ""
        return (
            f"Command: `{self.command}`{mode}. Run {date} on {platform.machine()} "
            f"({cpu_description()}, {os.cpu_count()} CPUs shared with other jobs), torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch thread(s)."
        )


def benchmark_parser(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark takes (``--quick``, ``--output``, ``--threads``)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run of a few seconds (used by the tests)")
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="markdown file whose section this script replaces (plots go to img/ beside it)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: the script's own choice)"
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed")
    return parser


def start_benchmark(
    name: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None, default_threads: int | None = None
) -> BenchmarkContext:
    """Parse the command line, set the torch thread count, and return the run's `BenchmarkContext`."""
    if name not in SECTION_ORDER:
        raise ValueError(f"Unknown benchmark section {name!r}; add it to SECTION_ORDER.")
    arguments = parser.parse_args(argv)
    _quiet_libraries()
    threads = arguments.threads if arguments.threads is not None else default_threads
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}.")
        torch.set_num_threads(threads)
    tokens = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m", f"benchmarks.{name}", *tokens])
    output = Path(arguments.output)
    return BenchmarkContext(name, arguments, output, output.parent / "img", command)


def _quiet_libraries() -> None:
    """No weight-loading progress bars or per-call warnings in the benchmark output."""
    import diffusers
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.set_verbosity_error()


def _section_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- begin: {re.escape(name)} -->.*?<!-- end: {re.escape(name)} -->\n?", re.DOTALL)


def _insertion_index(text: str, name: str) -> int:
    """Where a new section ``name`` goes: before the first existing section that follows it in the order."""
    later = SECTION_ORDER[SECTION_ORDER.index(name) + 1 :] if name in SECTION_ORDER else ()
    positions = [text.find(f"<!-- begin: {other} -->") for other in later]
    positions = [position for position in positions if position >= 0]
    return min(positions) if positions else len(text)


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the section ``name`` of the markdown file ``path`` with ``body`` (create the file if needed).

    Everything outside the section's ``begin``/``end`` comments is left as it is.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.is_file() else _HEADER
    section = f"<!-- begin: {name} -->\n{body.strip()}\n<!-- end: {name} -->\n"
    pattern = _section_pattern(name)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        index = _insertion_index(text, name)
        before, after = text[:index].rstrip("\n"), text[index:]
        text = f"{before}\n\n{section}" + (f"\n{after}" if after else "")
    path.write_text(text)


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if value != 0 and (abs(value) >= 10 ** (digits + 1) or abs(value) < 10 ** (-digits)):
            return f"{value:.{max(digits - 1, 1)}e}"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3) -> str:
    """A markdown table; floats get ``digits`` decimals (scientific notation when very large or small)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"A row has {len(row)} cells but the header has {len(header)}.")
        lines.append("| " + " | ".join(_cell(value, digits) for value in row) + " |")
    return "\n".join(lines)


def format_mean_std(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± std`` (population std) of ``values``; just the value for a single one."""
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return f"{mean:.{digits}f}"
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def new_figure(columns: int = 1, rows: int = 1, size: tuple[float, float] = (5.0, 3.6)) -> tuple[Any, Any]:
    """A matplotlib figure (Agg backend) with ``rows x columns`` axes (always a flat list)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(rows, columns, figsize=(size[0] * columns, size[1] * rows), squeeze=False)
    return figure, [axis for row in axes for axis in row]


def save_figure(figure: Any, path: Path) -> Path:
    """Lay out, write (PNG, 110 dpi) and close ``figure``; returns ``path``."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
