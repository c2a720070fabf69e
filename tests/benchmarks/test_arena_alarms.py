"""``python -m benchmarks.arena_alarms``: arena folders laid out as ``sage-arena`` writes them (the grid file, each
finished cell's result and run folder), with runs made by hand; their alarms are replayed and a copied cell counts
once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import arena_alarms
from sage_trl.arena.cell import RESULT_FILE, RUN_FOLDER
from sage_trl.arena.cli import GRID_FILE
from sage_trl.arena.grid import ArenaGrid, Cell
from sage_trl.run_folder.layout import METRICS_FILE
from tests.benchmarks.markdown_sections import quick_arguments, section_of
from tests.sage_trl.logged_runs import CPS_SEED_8_HELD_OUT, FALLING_ROLLOUTS, logged_run

HEALTHY = [1.74, 1.75, 1.77, 1.78, 1.80, 1.82]


def write_cell(folder: Path, seed: int, held_out: list[float], finished: bool = True) -> None:
    """A cell of sage_grpo on the temporal task: its run's metrics and, once ``finished``, its result."""
    cell_dir = folder / Cell("sage_grpo", "temporal", seed).folder
    (cell_dir / RUN_FOLDER).mkdir(parents=True)
    records = logged_run(FALLING_ROLLOUTS, held_out)
    (cell_dir / RUN_FOLDER / METRICS_FILE).write_text("".join(json.dumps(record) + "\n" for record in records))
    result = {"score": held_out[-1] - held_out[0], "gold": 0.001, "after": {"object_area_ratio": 0.75}}
    if finished:
        (cell_dir / RESULT_FILE).write_text(json.dumps(result))


def arena_folder(path: Path, seeds: list[int], flags: list[str] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / GRID_FILE).write_text(ArenaGrid(["sage_grpo"], ["temporal"], seeds, flags=flags or []).to_json())
    return path


def test_the_alarms_are_replayed_over_finished_cells_and_a_copied_cell_counts_once(tmp_path: Path) -> None:
    first = arena_folder(tmp_path / "first", [0, 1, 2])
    write_cell(first, 0, CPS_SEED_8_HELD_OUT)
    write_cell(first, 1, HEALTHY)
    write_cell(first, 2, CPS_SEED_8_HELD_OUT, finished=False)  # killed before its result: not read
    merged = arena_folder(tmp_path / "merged", [0, 1])
    shutil.copytree(first / "cells", merged / "cells")  # what sage-arena --merge does
    section = arena_alarms.report([first, merged])
    assert section.startswith("2 finished runs of the arena folders `first`, `merged` (2 further byte-identical")
    row = next(line for line in section.splitlines() if line.startswith("| temporal | sage_grpo | 2 |"))
    decline_closest = float(row.rstrip(" |").rsplit("|", 1)[1])
    assert "| `held_out_decline` 1 | 0.0000 |" in row and decline_closest > 0.02  # fires above the threshold
    assert "| temporal | sage_grpo | 0 | `held_out_decline` at step 20 | 1.7400, 1.6300, 1.6500 | -0.0900 |" in section
    assert "`held_out_decline` fired in 1 of 2 runs; the largest closest value among the others is 0.0000." in section


def test_rows_run_with_other_flags_stay_apart(tmp_path: Path) -> None:
    plain, longer = arena_folder(tmp_path / "plain", [0]), arena_folder(tmp_path / "longer", [1], ["--max_steps", "25"])
    write_cell(plain, 0, HEALTHY)
    write_cell(longer, 1, CPS_SEED_8_HELD_OUT)
    section = arena_alarms.report([plain, longer])
    assert "| temporal | sage_grpo | 1 | none |" in section
    assert "| temporal | sage_grpo --max_steps 25 | 1 | `held_out_decline` 1 |" in section


def test_a_folder_that_is_not_an_arena_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"holds no arena\.json: pass sage-arena output folders"):
        arena_alarms.report([tmp_path])
    with pytest.raises(ValueError, match=r"No finished arena cell .*: run sage-arena there first"):
        arena_alarms.report([arena_folder(tmp_path / "empty", [0])])


def test_the_script_writes_its_section(tmp_path: Path) -> None:
    folder = arena_folder(tmp_path / "arena", [0])
    write_cell(folder, 0, HEALTHY)
    arena_alarms.main([*quick_arguments(tmp_path), str(folder)])
    section = section_of(tmp_path / "benchmarks.md", "arena_alarms")
    assert "1 finished runs" in section and "No held-out rule fired on any run." in section
