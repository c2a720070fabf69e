"""Every code block of README.md, docs/ and the other READMEs runs, or says why it cannot and is checked anyway.

A fence names its language. ``python`` blocks of one file run in order as one script (a later block may use an
earlier block's names), in a temporary folder, offline. ``bash`` blocks: ``pip install`` and ``python -m pytest``
lines are what CI runs (they must be in ``.ci/run``); the other commands run in a temporary folder that links the
repository's top-level entries (relative paths work, outputs stay out of the checkout), the entry points with the
small flags below appended so that they finish in seconds, except the README's first screen, which runs as written
(and must train a better adapter than the prior). ``python no-run`` and ``bash no-run`` blocks need
what this machine lacks (a GPU, the Hub, half an hour): the line above says what (it contains "need"); their
Python must compile and its imports resolve, and every ``--flag`` of their commands must be one the command's
``--help`` lists. ``text``, ``bibtex``, ``yaml``, ``json`` and ``toml`` blocks are not code (YAML, JSON and TOML must parse).
Inline ``sage-train --flag`` style mentions in prose are checked against ``--help`` the same way.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import yaml

from sage_trl.arena.cli import _grid, build_parser
from sage_trl.cli.parsing import _flag_value
from sage_trl.run_folder import layout
from tests.fixtures.markdown import Block, blocks_of, first_block
from tests.fixtures.toml import toml_loads

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"python", "bash", "text", "bibtex", "yaml", "json", "toml"}
ENTRY_POINTS = {"sage-train", "sage-generate", "sage-push", "sage-arena"}
# Appended to a runnable entry-point command so that it finishes in seconds (the later flag wins).
SMALL_RUN_FLAGS = {
    "sage-train": ["--max_steps", "1", "--num_eval_prompts", "1", "--eval_seeds", "0"],
    # every cell a one-step run on small batches (sage-train flags after --)
    "sage-arena": ["--", "--max_steps", "1", "--num_eval_prompts", "1", "--gradient_norm_steps", "0",
                   "--num_generations", "2", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"],
}
_INLINE_COMMAND = re.compile(r"`((?:sage-train|sage-generate|sage-push|sage-arena|python -m [\w.]+)(?: [^`]*)?)`")


def markdown_files() -> list[Path]:
    """README.md, docs/*.md and every README.md of the packages, examples and benchmarks."""
    nested = [p for p in ROOT.glob("*/**/README.md") if not any(part.startswith(".") for part in p.parts)]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(nested)]


ALL_BLOCKS = [block for path in markdown_files() for block in blocks_of(path)]
FIRST_SCREEN = first_block(ROOT / "README.md", "bash")  # the block tests/test_readme.py holds to CI's commands
# Where `sage-train` without arguments writes (relative to where it runs).
TOY_OUTPUT_DIR = yaml.safe_load((ROOT / "sage_trl" / "presets" / "toy.yaml").read_text())["output_dir"]


def offline_environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def commands_of(code: str) -> list[str]:
    """Shell commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n", " ", code)
    return [
        shlex.join(shlex.split(line, comments=True))
        for line in joined.splitlines()
        if shlex.split(line, comments=True)
    ]


def main_of(program: str) -> Callable[[list[str]], object]:
    """The function ``program`` runs: an entry point's installed target, or the module's ``main``."""
    if program in ENTRY_POINTS:
        (entry_point,) = importlib.metadata.entry_points(group="console_scripts", name=program)
        return entry_point.load()
    return importlib.import_module(program.split()[-1]).main


def command_line(program: str) -> list[str]:
    """``program`` as the user types it, in this interpreter's environment: the installed script, or ``python -m``."""
    if program in ENTRY_POINTS:
        return [str(Path(sys.executable).with_name(program))]
    return [sys.executable, "-m", program.split()[-1]]


@cache
def help_text(program: str, *arguments: str) -> str:
    """``program [arguments] --help`` (an entry point, or ``python -m module``), from its parser in this process: a
    fresh interpreter per program imports torch and transformers again (about 19 s each on a slow 2-core machine, a
    sixth of the suite's time for 20 programs). `test_help_in_process_lists_what_the_command_line_does` holds
    this to what the installed command prints."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            main_of(program)([*arguments, "--help"])
    except SystemExit as done:
        assert done.code in (0, None), f"{program} {' '.join(arguments)} --help exited with {done.code}"
    else:
        raise AssertionError(f"{program} --help returned instead of exiting as argparse does")
    return printed.getvalue()


def help_flags(help_output: str) -> set[str]:
    return set(re.findall(r"--[\w-]+", help_output))


def program_of(command: list[str]) -> str | None:
    if command[0] in ENTRY_POINTS:
        return command[0]
    if command[:2] == ["python", "-m"] and len(command) > 2 and command[2] != "pytest":
        return f"python -m {command[2]}"
    return None


def arena_row_algorithms(arguments: list[str]) -> list[str | None]:
    """The algorithms of a ``sage-arena`` command's rows as its grid has them (``sage_grpo`` for its variants);
    ``[None]`` where the command names no installed algorithm (a placeholder), read with the plain help."""
    try:
        grid = _grid(build_parser().parse_args(arguments))
    except ValueError:
        return [None]
    return list(dict.fromkeys(algorithm for algorithm, _ in grid.rows()))


def help_checks(command: list[str]) -> list[tuple[str, tuple[str, ...], list[str]]]:
    """(program, the arguments its ``--help`` is read with, the part of the command it lists the flags of): the
    help a user reads. ``sage-train --algorithm NAME --help`` lists that algorithm's own fields, so a command that
    names an installed algorithm is read with it; ``sage-arena``'s flags after ``--`` are ``sage-train``'s for every
    cell, so each row's algorithm must list them."""
    from agents import ALGORITHMS

    program = program_of(command)
    if program is None:
        return []
    if program == "sage-arena" and "--" in command:
        split = command.index("--")
        cell_flags = command[split + 1 :]
        return help_checks(command[:split]) + [
            ("sage-train", ("--algorithm", name) if name else (), cell_flags) for name in arena_row_algorithms(command[1:])
        ]
    algorithm = _flag_value(command, "algorithm") if program == "sage-train" else None  # as sage-train reads it
    known = algorithm in ALGORITHMS.names()  # not a placeholder (NAME) or a plug-in the docs only imagine
    return [(program, ("--algorithm", algorithm) if known else (), command)]


def unknown_flags(command: list[str]) -> list[str]:
    unknown = []
    for program, help_arguments, part in help_checks(command):
        listed = help_flags(help_text(program, *help_arguments))
        unknown += [flag for flag in (t.split("=")[0] for t in part if t.startswith("--")) if flag not in listed]
    return list(dict.fromkeys(unknown))


def ci_script() -> str:
    return (ROOT / ".ci" / "run").read_text()


def test_every_fence_names_its_language() -> None:
    unlabelled = [f"{b} (```{b.language})" for b in ALL_BLOCKS if b.language not in LANGUAGES]
    assert not unlabelled, f"label these code blocks with one of {sorted(LANGUAGES)}: {unlabelled}"


def test_a_fence_inside_a_list_item_is_read_as_its_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "* **An item.** This block needs a GPU:\n\n  ```python no-run\n  import torch\n\n  x = 1\n  ```\n\n"
        "## Running\n\n```bash\nsage-train\n```\n"
    )
    item, top = blocks_of(page)
    assert (item.line, item.language, item.runs, item.code) == (3, "python", False, "import torch\n\nx = 1\n")
    assert (item.reason, item.heading) == ("* **An item.** This block needs a GPU:", "")
    assert (top.line, top.language, top.runs, top.code, top.heading) == (11, "bash", True, "sage-train\n", "Running")
    assert first_block(page, "bash", heading="Running") == top
    with pytest.raises(AssertionError, match=r"page.md: no runnable ```python block"):
        first_block(page, "python")  # the only Python block does not run


def test_every_block_that_does_not_run_says_what_it_needs() -> None:
    silent = [str(b) for b in ALL_BLOCKS if not b.runs and not re.search(r"\bneeds?\b", b.reason, re.I)]
    assert not silent, f"a no-run block needs a line above it saying what it needs: {silent}"


def test_data_blocks_parse() -> None:
    parsers = {"yaml": yaml.safe_load, "json": json.loads, "toml": toml_loads}
    for block in (b for b in ALL_BLOCKS if b.language in parsers):
        parsers[block.language](block.code)


def _python_files() -> list[Path]:
    return sorted({b.path for b in ALL_BLOCKS if b.language == "python" and b.runs})


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path: Path, tmp_path: Path) -> None:
    blocks = [b for b in ALL_BLOCKS if b.path == path and b.language == "python" and b.runs]
    script = "".join(f"# --- {b} ---\n{b.code}" for b in blocks)
    (tmp_path / "docs_blocks.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "docs_blocks.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**offline_environment(), "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert done.returncode == 0, f"the Python blocks of {path.name} failed:\n{script}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python" and not b.runs], ids=str)
def test_python_blocks_that_need_more_compile_and_import(block: Block) -> None:
    tree = ast.parse(block.code, filename=str(block))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block}: {node.module} has no {alias.name}"


def _bash_commands(runs: bool) -> list:
    return [
        pytest.param(b, c, id=f"{b}: {c}")
        for b in ALL_BLOCKS
        if b.language == "bash" and b.runs == runs
        for c in commands_of(b.code)
    ]


@pytest.mark.parametrize("block,command", _bash_commands(runs=False))
def test_commands_that_need_more_use_existing_flags(block: Block, command: str) -> None:
    assert not unknown_flags(shlex.split(command)), (
        f"{block}: {command!r} uses flags its --help does not list"
    )


def _is_ci_command(command: list[str]) -> bool:
    return command[:2] == ["pip", "install"] or command[:3] == ["python", "-m", "pytest"]


@pytest.mark.slow
@pytest.mark.parametrize("block,command", _bash_commands(runs=True))
def test_bash_commands_run(block: Block, command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    if _is_ci_command(argv):
        assert command in ci_script().replace('".[dev]"', "'.[dev]'"), f"{block}: CI does not run {command!r}"
        return
    if block != FIRST_SCREEN:
        argv = [*argv, *SMALL_RUN_FLAGS.get(argv[0], [])]
    for entry in ROOT.iterdir():  # relative paths as from the repository root; outputs land in tmp_path
        if not entry.name.startswith(".") and entry.name != TOY_OUTPUT_DIR:  # a run of the user's own
            (tmp_path / entry.name).symlink_to(entry)
    environment = offline_environment()
    if block == FIRST_SCREEN:  # as a user runs it: torch's own thread count
        environment.pop("OMP_NUM_THREADS")
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=environment, timeout=600)
    assert done.returncode == 0, f"{block}: {shlex.join(argv)} failed:\n{done.stderr[-4000:]}"
    if block == FIRST_SCREEN and argv == ["sage-train"]:
        evaluation = json.loads((tmp_path / TOY_OUTPUT_DIR / layout.EVAL_RESULTS_FILE).read_text())
        assert evaluation["after"]["total"] > evaluation["before"]["total"], evaluation
        # and by the score the reward cannot fool (docs/rewards.md): closer to the toy world's own videos
        assert evaluation["after"]["world_distance"] < evaluation["before"]["world_distance"], evaluation


def test_help_in_process_lists_what_the_command_line_does() -> None:
    """One installed entry point and one ``python -m`` program, run as the user types them (at once: each is a
    fresh interpreter), list exactly the flags `help_text` reads in this process (each with one of its own)."""
    declared = {"sage-arena": "--seeds", "python -m benchmarks.sde_noise_std": "--eta"}  # one flag of each parser
    started = {
        program: subprocess.Popen([*command_line(program), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=offline_environment(), cwd=ROOT)
        for program in declared
    }
    for program, process in started.items():
        printed, errors = process.communicate(timeout=300)
        assert process.returncode == 0, f"{program} --help failed:\n{errors[-2000:]}"
        assert declared[program] in help_flags(printed), f"{program} --help printed:\n{printed}"
        assert help_flags(printed) == help_flags(help_text(program)), program


def test_an_algorithms_own_flags_are_checked_against_its_help() -> None:
    """`sage-train --algorithm NAME --help` lists NAME's own fields, and a `sage-arena` cell flag (after `--`) must be
    a field of every row's algorithm, `sage_grpo`'s for the ablation rows included."""
    flag = "--post_window_compress_ratio"
    assert unknown_flags(["sage-train", flag, "0.8"]) == [flag]
    assert unknown_flags(["sage-train", "--algorithm", "mix_grpo_flash", flag, "0.8"]) == []
    assert unknown_flags(["sage-train", "--algorithm", "NAME", "--help"]) == []  # a placeholder: the plain help
    arena = ["sage-arena", "--profile", "full", "--variants", "none", "--algorithms"]
    assert unknown_flags([*arena, "mix_grpo_flash", "--", flag, "0.8"]) == []
    assert unknown_flags([*arena, "mix_grpo_flash,sage_grpo", "--", flag, "0.8"]) == [flag]
    assert unknown_flags([*arena, "dance_grpo,mix_grpo_flash,cps", "--", flag, "0.8"]) == [flag]
    with_ablations = ["sage-arena", "--profile", "full", "--algorithms", "mix_grpo_flash", "--", flag, "0.8"]
    assert unknown_flags(with_ablations) == [flag]


def _inline_commands() -> list:
    found = {}
    for path in markdown_files():
        for command in _INLINE_COMMAND.findall(path.read_text()):
            if "<" not in command and "..." not in command:
                found[path, " ".join(command.split())] = None
    return [pytest.param(path, command, id=f"{path.relative_to(ROOT)}: {command}") for path, command in found]


@pytest.mark.parametrize("path,command", _inline_commands())
def test_commands_in_prose_use_existing_flags(path: Path, command: str) -> None:
    argv = shlex.split(command)
    assert not unknown_flags(argv), (
        f"{path.relative_to(ROOT)}: `{command}` uses flags its --help does not list"
    )


def test_the_readmes_algorithm_table_lists_every_built_in_algorithm() -> None:
    declared = toml_loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["sage_grpo.algorithms"]
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| `--algorithm` | family | choose it when |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", table, flags=re.MULTILINE)
    assert sorted(listed) == sorted(declared)
