"""``sage-arena`` through its entry point, as a user runs it: the quick profile's one-seed smoke, and a grid whose
cells repeat exactly, whether run whole, in shards merged afterwards, or killed with SIGKILL and rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import ALGORITHMS
from sage_trl.arena.cell import RESULT_FILE
from sage_trl.arena.report import REPORT_FILE, results_of
from sage_trl.machine import cpu_description

ARENA = str(Path(sys.executable).with_name("sage-arena"))
TINY = ["--", "--max_steps", "1", "--num_eval_prompts", "1", "--gradient_norm_steps", "0", "--num_generations", "2",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"]  # fmt: skip
"""sage-train flags that make each cell a one-step run on small batches (seconds)."""
GRID = ["--algorithms", "sage_grpo,flow_grpo,dance_grpo", "--tasks", "toy", "--seeds", "1"]


def arena(output: Path, *options: str, wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    command = [ARENA, "--output_dir", str(output), *options]
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_quick_profile_runs_every_algorithm_on_both_tasks(tmp_path: Path) -> None:
    arena(tmp_path / "quick", "--profile", "quick", *TINY)
    report = (tmp_path / "quick" / REPORT_FILE).read_text()
    for task in ("toy", "hackable"):
        section = report[report.index(f"## Task `{task}`") :]
        assert all(f"| `{name}` | 1 |" in section for name in ALGORITHMS.names()), section[:3000]
        assert (tmp_path / "quick" / f"compute_{task}.png").stat().st_size > 0
    assert "Detectable difference: not estimable with one seed" in report
    cell = json.loads((tmp_path / "quick" / "cells" / "toy" / "awm" / "seed-0" / RESULT_FILE).read_text())
    assert cell["flops"]["train"] > 0 and cell["curve"][0]["step"] == 0
    assert f"| toy | `awm` | {cell['wall_seconds']:.0f} | {cpu_description()} |" in report  # where it ran


def _wait_for(path: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.mark.slow  # 2-3 minutes; CI runs the shards and the merge through docs/arena.md's commands
def test_cells_repeat_whole_in_shards_and_after_a_kill(tmp_path: Path) -> None:
    arena(tmp_path / "whole", *GRID, *TINY)
    # Shard 1 of 2 holds sage_grpo and dance_grpo: kill it once sage_grpo is finished and dance_grpo has begun.
    shard = arena(tmp_path / "shard1", *GRID, "--shard", "1/2", "--workers", "1", *TINY, wait=False)
    cells = tmp_path / "shard1" / "cells" / "toy"
    _wait_for(cells / "sage_grpo" / "seed-0" / RESULT_FILE)
    _wait_for(cells / "dance_grpo" / "seed-0" / "run" / "run_config.yaml")
    os.kill(shard.pid, signal.SIGKILL)
    shard.wait()
    assert not (cells / "dance_grpo" / "seed-0" / RESULT_FILE).exists()
    rerun = arena(tmp_path / "shard1", *GRID, "--shard", "1/2", *TINY)
    assert "1 of 2 cells finished earlier; running 1" in rerun.stdout
    arena(tmp_path / "shard2", *GRID, "--shard", "2/2", *TINY)
    merged = arena(tmp_path / "merged", *GRID, "--merge", str(tmp_path / "shard1"), str(tmp_path / "shard2"), *TINY)
    assert "Merged 3 finished cells" in merged.stdout
    whole, combined = (tmp_path / "whole" / REPORT_FILE).read_text(), (tmp_path / "merged" / REPORT_FILE).read_text()
    assert results_of(combined) == results_of(whole)  # every number, interval and table of the results
    assert (tmp_path / "merged" / "iqm_toy.png").read_bytes() == (tmp_path / "whole" / "iqm_toy.png").read_bytes()
    for algorithm in ("sage_grpo", "flow_grpo", "dance_grpo"):
        one, other = (json.loads((tmp_path / folder / "cells" / "toy" / algorithm / "seed-0" / RESULT_FILE).read_text())
                      for folder in ("whole", "merged"))  # fmt: skip
        assert (one["score"], one["gold"], one["curve"], one["flops"]) == (
            other["score"], other["gold"], other["curve"], other["flops"]
        )  # fmt: skip


def test_a_failing_cell_is_reported_and_the_arena_exits_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [ARENA, "--output_dir", str(tmp_path / "arena"), "--algorithms", "sage_grpo", "--seeds", "1", "--tasks", "toy",
         "--", "--eta", "-1"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cells/toy/sage_grpo/seed-0: FAILED" in done.stdout and "eta must be" in done.stdout  # the log tail
    assert not (tmp_path / "arena" / "cells" / "toy" / "sage_grpo" / "seed-0" / RESULT_FILE).exists()
