"""One cell of the arena: a ``sage-train`` run in this process, its transformer rows counted, and its result file
(``arena_cell.json``) written last, so that a cell holding it is finished and one without it is restarted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from sage_trl.arena.compute import count_transformer_rows
from sage_trl.arena.grid import Cell
from sage_trl.arena.tasks import task_named
from sage_trl.evaluation import is_evaluation_record, logged_name
from sage_trl.machine import cpu_description
from sage_trl.run_folder import layout

__all__ = ["RESULT_FILE", "RUN_FOLDER", "read_result", "run_cell"]

RESULT_FILE = "arena_cell.json"
"""A finished cell's result, in its folder beside the run folder."""
RUN_FOLDER = "run"
"""The cell's ``sage-train`` output folder, in the cell's folder."""


def read_result(cell_dir: Path) -> dict[str, Any] | None:
    """The cell's result, or None while it is not finished (no result file, or one cut short by a kill)."""
    try:
        return json.loads((cell_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def run_cell(cell: Cell, cell_dir: Path, extra_flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train the cell at one torch thread into ``cell_dir/run`` (restarting a run a kill left half-written: the
    run folder's own files only, `--overwrite_output_dir`), then write and return its result."""
    from sage_trl.cli import train_main

    torch.set_num_threads(1)
    run_dir = cell_dir / RUN_FOLDER
    flags = [*cell.flags(extra_flags), "--output_dir", str(run_dir)]
    if run_dir.exists():
        flags += ["--overwrite_output_dir", "true"]
    with count_transformer_rows() as counter:
        start = time.perf_counter()
        code = train_main(flags)
        seconds = time.perf_counter() - start
        flops = counter.flops()
    if code:
        raise RuntimeError(f"sage-train {' '.join(flags)} exited with {code}.")
    result = cell_result(cell, run_dir, flops, seconds)
    result["flags"] = flags[: flags.index("--output_dir")]
    partial = cell_dir / f".{RESULT_FILE}.partial"
    partial.write_text(json.dumps(result, indent=1))
    os.replace(partial, cell_dir / RESULT_FILE)  # whole or absent: a kill leaves no half result
    return result


def cell_result(cell: Cell, run_dir: Path, flops: dict[str, float], seconds: float) -> dict[str, Any]:
    """The cell's numbers: its score and gold change (`ArenaTask`), the held-out evaluations during training as a
    curve against training FLOPs, the FLOPs by kind, and the wall time with the processor it ran on."""
    task = task_named(cell.task)
    completion = json.loads((run_dir / layout.COMPLETE_FILE).read_text())
    if completion.get("status") != "finished":
        raise RuntimeError(f"The run in {run_dir} ended {completion.get('status')!r}, not finished.")
    evaluation = json.loads((run_dir / layout.EVAL_RESULTS_FILE).read_text())
    before, after = evaluation["before"], evaluation["after"]
    return {
        "cell": {"algorithm": cell.algorithm, "task": cell.task, "seed": cell.seed, "variant": cell.variant},
        "score": task.score_of(before, after),
        "gold": task.gold_of(before, after),
        "before": before,
        "after": after,
        "curve": training_curve(run_dir, task, flops["train"], completion["global_step"]),
        "flops": flops,
        "wall_seconds": seconds,
        "threads": torch.get_num_threads(),
        "cpu": cpu_description(),
    }


def training_curve(run_dir: Path, task: Any, train_flops: float, steps: int) -> list[dict[str, float]]:
    """The score and gold change at each held-out evaluation during training (against the first), with the
    training FLOPs spent by then (the run's rollout and training FLOPs pro rata to its ``steps`` optimizer steps:
    every step of a cell rolls out and trains the same number of videos)."""
    lines = (run_dir / layout.METRICS_FILE).read_text().splitlines()
    points = [r for r in (json.loads(line) for line in lines if line.strip()) if is_evaluation_record(r)]
    if not points:
        return []
    score, gold = logged_name(task.score), logged_name(task.gold)
    first = points[0]
    return [
        {
            "step": r["step"],
            "flops": train_flops * r["step"] / max(steps, 1),
            "score": task.score_of({task.score: first[score]}, {task.score: r[score]}),
            "gold": first[gold] - r[gold],
        }
        for r in points
    ]
