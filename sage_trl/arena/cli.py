"""``sage-arena``: run a grid of algorithms x tasks x seeds on the toy world and report the comparison with
confidence intervals (docs/arena.md).

    sage-arena --profile quick                       # every algorithm, two tasks, one seed: minutes
    sage-arena --profile full --workers 2            # the published grid (hours on 2 cores; resumable)
    sage-arena --algorithms sage_grpo,mine --seeds 8 # your plug-in against ours
    sage-arena --profile full --shard 3/10           # one of ten shards (a Slurm array task)
    sage-arena --profile full --merge shard-*/       # merge the shards' folders and report
    sage-arena --profile quick -- --max_steps 4      # sage-train flags for every cell after --
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from sage_trl.arena.cell import read_result
from sage_trl.arena.grid import PROFILES, VARIANTS, ArenaGrid, parse_shard
from sage_trl.arena.report import write_report
from sage_trl.arena.runner import merge_cells, run_cells
from sage_trl.arena.tasks import TASKS

__all__ = ["GRID_FILE", "arena_main", "build_parser"]

GRID_FILE = "arena.json"
"""The arena's grid, in its output folder: a rerun or a merge must ask for the same grid."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sage-arena", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    profiles = "; ".join(f"{name}: {profile.about}" for name, profile in PROFILES.items())
    parser.add_argument("--profile", choices=list(PROFILES), default="quick", help=f"the grid's defaults ({profiles})")
    parser.add_argument("--algorithms", help="comma-separated algorithm names, any registered one (plug-ins "
                        "included); default: every registered algorithm")  # fmt: skip
    parser.add_argument("--tasks", help=f"comma-separated tasks of {', '.join(TASKS)}; default: the profile's")
    parser.add_argument("--seeds", help="a count N (seeds 0..N-1) or comma-separated seeds; default: the profile's")
    parser.add_argument("--variants", help=f"comma-separated ablations of sage_grpo, or 'all' or 'none' "
                        f"({', '.join(VARIANTS)}); default: the profile's")  # fmt: skip
    parser.add_argument("--baseline", default="sage_grpo",
                        help="the row the others are compared with: an algorithm or a variant's row "
                             "(sage_grpo+eta_0.55)")
    parser.add_argument("--workers", type=int, default=2, help="cells run at once, one torch thread each")
    parser.add_argument("--output_dir", type=Path, default=Path("arena-output"), help="the arena's folder")
    parser.add_argument("--shard", help="K/N: run only shard K of N (every N-th cell); merge the shards' folders "
                        "with --merge")  # fmt: skip
    parser.add_argument("--merge", type=Path, nargs="+", help="shards' folders whose finished cells to copy into "
                        "--output_dir (nothing is run), then report")  # fmt: skip
    parser.add_argument("--report_only", action="store_true", help="report the finished cells; run nothing")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="after --: sage-train flags for every cell")
    return parser


def _grid(options: argparse.Namespace) -> ArenaGrid:
    from agents import ALGORITHMS

    profile = PROFILES[options.profile]
    known = ALGORITHMS.names()
    algorithms = options.algorithms.split(",") if options.algorithms else list(profile.algorithms or known)
    unknown = [a for a in algorithms if a not in known]
    if unknown:
        raise ValueError(f"--algorithms: {unknown} are not registered; the algorithms are {', '.join(known)}.")
    seeds = options.seeds or str(profile.seeds)
    try:
        seed_list = list(range(int(seeds))) if "," not in seeds else [int(s) for s in seeds.split(",")]
    except ValueError:
        raise ValueError(f"--seeds takes a count N or comma-separated seeds (0,3,7), got {seeds!r}.") from None
    if options.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {options.workers}.")
    variants = {None: list(profile.variants), "all": list(VARIANTS), "none": []}.get(options.variants)
    train_flags = [f for f in options.train_flags if f != "--"]
    return ArenaGrid(
        algorithms=algorithms,
        tasks=options.tasks.split(",") if options.tasks else list(profile.tasks),
        seeds=seed_list,
        variants=variants if variants is not None else options.variants.split(","),
        flags=[*profile.flags, *train_flags],
    )


def _check_grid_file(output_dir: Path, grid: ArenaGrid) -> None:
    """A folder holds one grid: a rerun (resume), a shard or a merge into it must ask for the same one."""
    path = output_dir / GRID_FILE
    if path.is_file():
        if ArenaGrid.from_json(path.read_text()) != grid:
            raise ValueError(
                f"{output_dir} holds an arena of another grid ({GRID_FILE}). Rerun with that grid's options to "
                "resume it, or choose a new --output_dir."
            )
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(grid.to_json())


def arena_main(argv: Sequence[str] | None = None) -> int:
    """The ``sage-arena`` entry point; returns the exit status (1 when a cell failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = build_parser().parse_args(argv)
    try:
        grid = _grid(options)
        shard = parse_shard(options.shard) if options.shard else None
        if options.baseline not in grid.labels():
            raise ValueError(f"--baseline {options.baseline} is not a row of the grid ({', '.join(grid.labels())}).")
        _check_grid_file(options.output_dir, grid)
    except ValueError as error:
        print(f"sage-arena: error: {error}", file=sys.stderr)
        return 2
    cells = grid.cells() if shard is None else grid.shard(*shard)
    failed = []
    if options.merge:
        try:
            print(f"Merged {merge_cells(options.output_dir, options.merge, grid.cells(), grid.flags)} finished cells.")
        except ValueError as error:
            print(f"sage-arena: error: {error}", file=sys.stderr)
            return 2
    elif not options.report_only:
        failed = run_cells(options.output_dir, cells, grid.flags, options.workers)
    results, missing = {}, []
    for cell in grid.cells():
        result = read_result(options.output_dir / cell.folder)
        if result is None:
            missing.append(str(cell.folder))
        else:
            results.setdefault(cell.task, {}).setdefault(cell.label, []).append(result)
    if results:
        command = shlex.join(["sage-arena", *argv])
        path = write_report(options.output_dir, results, options.baseline, command, grid.to_json(), missing)
        print(f"Report: {path}")
    return 1 if failed else 0
