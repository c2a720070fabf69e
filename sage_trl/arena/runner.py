"""Running the arena's cells: worker processes with one torch thread each, finished cells kept, a cell a kill
left half-written restarted, and shards' folders merged (docs/arena.md)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import yaml

from sage_trl.arena.cell import RESULT_FILE, RUN_FOLDER, read_result, run_cell
from sage_trl.arena.grid import Cell
from sage_trl.run_folder import layout

__all__ = ["WORKER_LOG", "merge_cells", "run_cells"]

WORKER_LOG = "arena_worker.log"
"""The worker's output (the ``sage-train`` log of the cell), in the cell's folder."""


def _start_worker() -> None:  # runs in each worker process
    """On Linux the worker dies with the arena (``kill -9`` of the arena leaves no orphan writing a cell); each
    cell sets its one torch thread itself (`run_cell`)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_in_worker(cell: Cell, cell_dir: Path, flags: Sequence[str]) -> str | None:
    """Run one cell in this worker process with its output in the cell's log; None on success, else the log's
    tail. A worker runs cells one after another (imports once); each cell seeds everything it draws."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    saved = [os.dup(1), os.dup(2)]
    with open(cell_dir / WORKER_LOG, "w") as log:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        succeeded = False
        try:
            run_cell(cell, cell_dir, tuple(flags))
            succeeded = True
        except BaseException:  # the cell failed; the arena goes on with the others
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    return None if succeeded else (cell_dir / WORKER_LOG).read_text()[-2000:]


def run_cells(
    output_dir: Path, cells: Sequence[Cell], flags: Sequence[str], workers: int, say: Callable[[str], None] = print
) -> list[Cell]:
    """Run every cell of ``cells`` not finished yet under ``output_dir`` in ``workers`` worker processes; returns
    the cells that failed (each one's log says why; the others ran)."""
    pending = [cell for cell in cells if read_result(output_dir / cell.folder) is None]
    say(f"{len(cells) - len(pending)} of {len(cells)} cells finished earlier; running {len(pending)}, {workers} at once.")
    if not pending:
        return []
    failed = []
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no state of this process in a cell
    with _one_thread_environment(), ProcessPoolExecutor(max(1, workers), context, _start_worker) as pool:
        futures = {cell: pool.submit(_run_in_worker, cell, output_dir / cell.folder, flags) for cell in pending}
        for done, (cell, future) in enumerate(futures.items(), start=1):
            try:
                error = future.result()
            except BrokenProcessPool as broken:
                error = f"the worker process died: {broken}"
            if error is None:
                say(f"[{done}/{len(pending)}] {cell.folder}: done")
            else:
                failed.append(cell)
                say(f"[{done}/{len(pending)}] {cell.folder}: FAILED (log: {output_dir / cell.folder / WORKER_LOG})\n{error}")
    return failed


@contextlib.contextmanager
def _one_thread_environment() -> Iterator[None]:
    """Workers start with one OpenMP / MKL thread (they read it at import; several torch processes with all
    cores each oversubscribe a machine)."""
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(dict.fromkeys(saved, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def merge_cells(output_dir: Path, sources: Sequence[Path], cells: Sequence[Cell], flags: Sequence[str]) -> int:
    """Copy each finished cell of the shards' folders ``sources`` that ``output_dir`` lacks; a cell must have run
    with the grid's settings (``flags``: what every cell adds), and a cell finished in both must have the same
    result (a cell is deterministic). Returns how many were copied."""
    copied = 0
    for cell in cells:
        expected = cell.flags(tuple(flags))
        for source in sources:
            found = read_result(source / cell.folder)
            if found is None:
                continue
            differences = [] if found.get("flags") == expected else _settings_differences(source / cell.folder, expected)
            if differences:
                raise ValueError(
                    f"{source / cell.folder} ran as `sage-train {' '.join(found.get('flags') or [])}`, not as this "
                    f"grid's `sage-train {' '.join(expected)}`, and its settings differ ({', '.join(differences)}): "
                    "merge shards run with the same options (profile, tasks and flags after --) only."
                )
            here = read_result(output_dir / cell.folder)
            if here is None:
                if (output_dir / cell.folder).exists():
                    raise ValueError(
                        f"{output_dir / cell.folder} holds an unfinished cell: rerun sage-arena there first, or merge "
                        "into a new --output_dir."
                    )
                shutil.copytree(source / cell.folder, output_dir / cell.folder)
                copied += 1
            elif _numbers(here) != _numbers(found):
                raise ValueError(
                    f"{cell.folder} differs between {output_dir} and {source} ({RESULT_FILE}): the shards ran "
                    "different code or settings; merge shards of one grid only."
                )
    return copied


def _settings_differences(cell_dir: Path, flags: Sequence[str]) -> list[str]:
    """The settings in which the finished cell in ``cell_dir`` differs from a run of ``sage-train flags``: the
    fields of its run's ``run_config.yaml`` (every field as sage-train resolved it) against what ``flags`` resolve to
    now. Other flags with the same effect differ in nothing: a cell recorded before a flag that restates a default
    was added to every cell (`published_settings`) still merges."""
    from sage_trl.cli.parsing import parse_train_arguments
    from sage_trl.cli.train import run_config_text

    run_dir = cell_dir / RUN_FOLDER
    try:
        recorded = yaml.safe_load((run_dir / layout.RUN_CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return [f"no readable {RUN_FOLDER}/{layout.RUN_CONFIG_FILE} to compare"]
    if not isinstance(recorded, dict):
        return [f"{RUN_FOLDER}/{layout.RUN_CONFIG_FILE} is not a mapping"]
    # Where the cell ran is not a setting: a shard's folder moves before it is merged, and a cell merged once keeps
    # the output_dir of the folder it ran in. So the flags resolve with the recorded one.
    ran_in = recorded.get("output_dir") or run_dir
    script_args, config = parse_train_arguments([*flags, "--output_dir", str(ran_in)])
    # Through YAML as sage-train wrote it, so that types compare as the file holds them.
    wanted = yaml.safe_load(run_config_text(script_args, config))
    absent = object()
    return sorted(name for name in wanted.keys() | recorded.keys() if wanted.get(name, absent) != recorded.get(name, absent))


def _numbers(result: dict) -> tuple:
    """What must agree between two runs of one cell (not the wall time)."""
    return result["score"], result["gold"], result["flops"]["total"]
