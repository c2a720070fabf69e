"""The alarms (`sage_trl.alarms`) replayed over arenas' finished runs: how often each fires per task and row, how
close every run came to the two held-out rules, and how the runs they fired on ended.

    python -m benchmarks.arena_alarms ARENA_FOLDER [ARENA_FOLDER ...]

Each folder is a ``sage-arena`` output folder (its ``arena.json`` names the cells); every finished cell's
``metrics.jsonl`` is replayed with the library's rules and thresholds (`sage_trl.alarms.replay`), so a rule added
or changed after the arena ran is measured on it. A cell copied between folders (``sage-arena --merge``) is one
run: runs whose ``metrics.jsonl`` are byte-identical are counted once. Nothing is trained; the folders are only
read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import reporting
from benchmarks.toy_alarms import firing_threshold
from sage_trl.alarms import ALARM_RULES, HELD_OUT_TOTAL, replay
from sage_trl.arena.cell import RUN_FOLDER, read_result
from sage_trl.arena.cli import GRID_FILE
from sage_trl.arena.grid import ArenaGrid
from sage_trl.evaluation import is_evaluation_record
from sage_trl.run_folder import RunFolder
from sage_trl.run_folder.layout import METRICS_FILE

__all__ = ["HELD_OUT_RULES", "arena_runs", "report"]

HELD_OUT_RULES = ("held_out_divergence", "held_out_decline")
"""The rules on the held-out videos' training reward whose closest approach each run reports."""


def arena_runs(folders: Sequence[Path]) -> tuple[list[dict[str, Any]], int]:
    """Every finished cell's run in ``folders`` (task, row, seed, records, the cell's result), each once, and how
    many further copies of runs already read were skipped. A row is its label plus the flags every cell of its
    arena added (``sage-arena ... -- FLAGS``), so that rows run with other flags stay apart."""
    runs, seen, copies = [], set(), 0
    for folder in folders:
        grid_path = folder / GRID_FILE
        if not grid_path.is_file():
            raise ValueError(f"{folder} holds no {GRID_FILE}: pass sage-arena output folders.")
        grid = ArenaGrid.from_json(grid_path.read_text())
        for cell in grid.cells():
            run_dir = folder / cell.folder / RUN_FOLDER
            result = read_result(folder / cell.folder)
            if result is None or not (run_dir / METRICS_FILE).is_file():
                continue  # not finished
            digest = hashlib.sha256((run_dir / METRICS_FILE).read_bytes()).hexdigest()
            if digest in seen:
                copies += 1
                continue
            seen.add(digest)
            row = " ".join([cell.label, *grid.flags])
            records = RunFolder(run_dir).read_metrics()
            runs.append({"task": cell.task, "row": row, "seed": cell.seed, "records": records, "result": result})
    return runs, copies


def _read_run(run: dict[str, Any]) -> dict[str, Any]:
    """The run's alarms (and the names of those that fired), its closest approach to each held-out rule, and its
    held-out training reward's course."""
    records = run["records"]
    held_out = [record[HELD_OUT_TOTAL] for record in records if is_evaluation_record(record)]
    alarms = replay(records)
    return {
        **run,
        "alarms": alarms,
        "fired": {alarm.name for alarm in alarms},
        "closest": {name: firing_threshold(records, name) for name in HELD_OUT_RULES},
        "held_out": (held_out[0], min(held_out), held_out[-1]) if held_out else None,
    }


def _rows_table(runs: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["task"], run["row"]), []).append(run)
    rows = []
    for (task, row), members in groups.items():
        counts = {name: sum(name in run["fired"] for run in members) for name in ALARM_RULES}
        fired = ", ".join(f"`{name}` {count}" for name, count in counts.items() if count) or "none"
        closest = [f"{max(run['closest'][name] for run in members):.4f}" for name in HELD_OUT_RULES]
        rows.append([task, row, len(members), fired, *closest])
    header = ["task", "row", "runs", "alarms fired (runs)",
              *(f"largest closest {name} (fires above its threshold)" for name in HELD_OUT_RULES)]  # fmt: skip
    return reporting.markdown_table(header, rows)


def _fired_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for run in runs:
        for alarm in (a for a in run["alarms"] if a.name in HELD_OUT_RULES):
            start, lowest, end = run["held_out"]
            after = run["result"]["after"]
            rows.append([
                run["task"], run["row"], run["seed"], f"`{alarm.name}` at step {alarm.step}",
                f"{start:.4f}, {lowest:.4f}, {end:.4f}", f"{run['result']['score']:+.4f}",
                f"{run['result']['gold']:+.5f}", _area(after),
            ])  # fmt: skip
    header = ["task", "row", "seed", "alarm", "held-out training reward: start, lowest, end",
              "the arena's score at the end (change)", "gold at the end (+ is nearer the world's videos)",
              "objects' area over the world's at the end"]  # fmt: skip
    return reporting.markdown_table(header, rows) if rows else "No held-out rule fired on any run."


def _area(after: dict[str, Any]) -> str:
    """The objects' area over the world's after training, "-" where the task's world does not measure it."""
    area = after.get("object_area_ratio")
    return f"{area:.2f}" if isinstance(area, (int, float)) else "-"


def _reading(runs: list[dict[str, Any]]) -> str:
    """How often each held-out rule fired, and the closest any other run came to it."""
    sentences = []
    for name in HELD_OUT_RULES:
        quiet = [run["closest"][name] for run in runs if name not in run["fired"]]
        others = f"the largest closest value among the others is {max(quiet):.4f}" if quiet else "no run stayed quiet"
        sentences.append(f"`{name}` fired in {len(runs) - len(quiet)} of {len(runs)} runs; {others}.")
    return " ".join(sentences)


def report(folders: Sequence[Path]) -> str:
    """The markdown of the alarms replayed over the finished runs of ``folders``."""
    runs, copies = arena_runs(folders)
    if not runs:
        raise ValueError(
            f"No finished arena cell in {', '.join(map(str, folders))}: run sage-arena there first, or pass folders "
            "whose cells finished."
        )
    runs = [_read_run(run) for run in runs]
    names = ", ".join(f"`{folder.name}`" for folder in folders)
    method = (
        f"{len(runs)} finished runs of the arena folders {names} ({copies} further byte-identical copies of these "
        "runs, cells merged from one folder into another, skipped), each `metrics.jsonl` replayed with the library's "
        "rules and thresholds. A closest value is the largest threshold at which the rule fires on the run (0: it "
        "fires at none)."
    )
    tables = [_rows_table(runs), "The runs a held-out rule fired on:", _fired_table(runs)]
    return "\n\n".join([method, *tables, _reading(runs)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("folders", type=Path, nargs="+", help="sage-arena output folders")
    context = reporting.start_benchmark("arena_alarms", parser, argv)
    body = "\n\n".join(["## Alarms over the arena's runs", context.provenance(), report(context.arguments.folders)])
    reporting.write_section(context.output, "arena_alarms", body)
    print(body)


if __name__ == "__main__":
    main()
