"""The arena's report (sage_trl.arena.report) from cells' results made up here, so each number can be worked by
hand; tests/sage_trl/arena/test_arena_runs.py writes reports from real cells through ``sage-arena``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sage_trl.arena.report import REPORT_FILE, write_report


def cell_result(label: str, seed: int, score: float, gold: float) -> dict[str, Any]:
    algorithm, _, variant = label.partition("+")
    return {"cell": {"algorithm": algorithm, "task": "toy", "seed": seed, "variant": variant or None},
            "score": score, "gold": gold, "flops": {"train": 1e12}, "wall_seconds": 10.0,
            "cpu": "test processor",
            "curve": [{"step": 0, "flops": 0.0, "score": 0.0}, {"step": 1, "flops": 1e12, "score": score}]}  # fmt: skip


def report_of(tmp_path: Path, by_label: dict[str, list[tuple[int, float, float]]]) -> str:
    results = {"toy": {label: [cell_result(label, *cell) for cell in cells] for label, cells in by_label.items()}}
    write_report(tmp_path, results, "sage_grpo", "sage-arena (test)", "{}", missing=[])
    return (tmp_path / REPORT_FILE).read_text()


def test_the_report_reads_each_row_against_the_baseline_by_seed(tmp_path: Path) -> None:
    report = report_of(tmp_path, {
        "sage_grpo": [(0, 0.10, 0.0), (1, 0.20, 0.0), (2, 0.30, 0.0)],
        # score higher by 0.01, 0.02, 0.03 seed by seed (mean 0.02, standard deviation 0.01); gold lower in seed 2
        "sage_grpo+kl_moving_strong": [(0, 0.11, 0.002), (1, 0.22, 0.001), (2, 0.33, -0.001)],
        "flow_grpo": [(0, 0.5, 0.0), (7, 0.5, 0.0)],  # one seed shared with the baseline: no paired interval
    })  # fmt: skip
    # 0.02 -+ t(0.975, 2) * 0.01 / sqrt(3) = 0.02 -+ 0.0248; gold 0.00067 -+ 4.303 * 0.00153 / sqrt(3)
    row = ("| `sage_grpo+kl_moving_strong` | 3 | +0.0200 [-0.0048, +0.0448] | 3 of 3 | +0.00067 [-0.00313, +0.00446] "
           "| 2 of 3 |")  # fmt: skip
    assert row in report, report
    paired = report[report.index("By seed against `sage_grpo`") :]
    assert "`flow_grpo` |" not in paired.split("![")[0]  # one shared seed: left out of the paired table
    assert "| `flow_grpo` | 2 |" in report  # but in the main table


def test_a_grid_of_one_seed_has_no_paired_table(tmp_path: Path) -> None:
    report = report_of(tmp_path, {"sage_grpo": [(0, 0.1, 0.0)], "flow_grpo": [(0, 0.2, 0.0)]})
    assert "By seed against" not in report and "| `flow_grpo` | 1 |" in report
