"""Every built-in algorithm through ``sage-train`` on the toy world (the default run, 40 steps), over seeds: held-out
change of the total reward and of the distance to the world's videos, wall time at one thread, transformer FLOPs.

    python -m benchmarks.toy_algorithms --seeds 0,1,2 --workers 2

Each cell is ``sage-train --algorithm A --seed N`` (the toy preset, with the preset's per-algorithm tuning set back to
the algorithm's published settings as in the arena: `sage_trl.arena.grid.published_settings`), run as its own process
with one torch thread (``--workers`` at a time), into a run folder under ``--runs``. The held-out numbers are the
run's own before/after evaluation (``eval_results.json``: 8 held-out prompts x 2 seeds, deterministic sampling).
FLOPs are counted, not timed (`sage_trl.arena.compute`, as the arena counts them): every forward of the transformer
is counted with its rows, and torch's FLOP counter prices one row's forward, and one row's forward plus backward, of
the run's own transformer at the end; rollouts, training and the held-out evaluations are all included.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks import reporting
from sage_trl.arena.compute import count_transformer_rows
from sage_trl.arena.grid import published_settings

__all__ = ["run_cell", "t_interval"]

DEFAULT_ALGORITHMS = "sage_grpo,grpo_guard,mix_grpo,mix_grpo_flash,branch_grpo,diffusion_nft,awm"
"""The paper's algorithm and the ones the field trains video models with now (issue 23's), compared by default."""

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Two-sided 95% Student t quantiles for 1 .. 10 degrees of freedom (no scipy here)."""


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95% t interval of the mean of ``values`` (2 to 11 of them)."""
    count = len(values)
    if not 2 <= count <= len(_T95) + 1:
        raise ValueError(f"t_interval takes 2 to {len(_T95) + 1} values, got {count}.")
    mean = sum(values) / count
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = _T95[count - 2] * std / math.sqrt(count)
    return mean - half, mean + half


QUICK_FLAGS = ("--max_steps", "1", "--num_eval_prompts", "1", "--eval_seeds", "0")
"""What ``--quick`` adds to every cell's command (the test suite's smoke run)."""


def run_cell(algorithm: str, seed: int, run_dir: Path, *extra: str) -> None:
    """One ``sage-train`` run in this process, with the FLOP counter; writes ``benchmark.json`` beside its outputs."""
    from sage_trl.cli import train_main

    torch.set_num_threads(1)
    with count_transformer_rows() as counter:
        start = time.perf_counter()
        code = train_main([
            "--algorithm", algorithm, *published_settings(algorithm), "--seed", str(seed),
            "--output_dir", str(run_dir), *extra,
        ])  # fmt: skip
        seconds = time.perf_counter() - start
        flops = counter.flops()
    if code:
        raise SystemExit(code)
    result = {"algorithm": algorithm, "seed": seed, "wall_seconds": seconds, "flops": flops}
    (run_dir / "benchmark.json").write_text(json.dumps(result, indent=1))


def _launch(algorithm: str, seed: int, runs: Path, extra: Sequence[str]) -> Path:
    run_dir = runs / f"{algorithm}-seed{seed}"
    if (run_dir / "benchmark.json").is_file():
        return run_dir  # finished earlier: kept
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "benchmarks.toy_algorithms", "--cell", algorithm, str(seed), str(run_dir), *extra]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{algorithm} seed {seed} failed:\n{done.stderr[-3000:]}")
    return run_dir


def _changes(cells: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {
        name: [c["eval"]["after"][name] - c["eval"]["before"][name] for c in cells]
        for name in ("total", "world_distance")
    }


def _reading(algorithm: str, cells: list[dict[str, Any]]) -> str:
    """One line per algorithm: which changes three (or more) seeds separate from zero, and the objects' size."""
    words = []
    for name, better, label in (("total", 1, "the total reward"), ("world_distance", -1, "the distance to the world")):
        values = _changes(cells)[name]
        low, high = t_interval(values) if len(values) > 1 else (math.nan, math.nan)
        if low > 0 or high < 0:
            direction = "improved" if (low > 0) == (better > 0) else "worsened"
            words.append(f"{label} {direction} (interval clear of 0)")
        else:
            words.append(f"{label}: not separated from 0 by {len(values)} seeds")
    area = sum(c["eval"]["after"]["object_area_ratio"] for c in cells) / len(cells)
    return f"- `{algorithm}`: {'; '.join(words)}; objects {area:.2f}x the world's area."


def _row(algorithm: str, cells: list[dict[str, Any]], baseline: dict[str, float]) -> list[Any]:
    changes = _changes(cells)
    area = [c["eval"]["after"]["object_area_ratio"] for c in cells]
    seconds = [c["wall_seconds"] for c in cells]
    flops = [c["flops"]["total"] for c in cells]
    row: list[Any] = [f"`{algorithm}`", len(cells)]
    for name in ("total", "world_distance"):
        low, high = t_interval(changes[name]) if len(cells) > 1 else (math.nan, math.nan)
        per_seed = ", ".join(f"{v:+.4f}" for v in changes[name])
        row.append(f"{sum(changes[name]) / len(cells):+.4f} ({per_seed}) [{low:+.4f}, {high:+.4f}]")
    row.append(f"{sum(area) / len(cells):.3f} ({', '.join(f'{v:.3f}' for v in area)})")
    row.append(f"{sum(seconds) / len(cells):.0f} s ({sum(seconds) / len(cells) / baseline['seconds']:.2f}x)")
    row.append(f"{sum(flops) / len(cells):.3g} ({sum(flops) / len(cells) / baseline['flops']:.2f}x)")
    return row


def report(runs: Path, algorithms: Sequence[str], seeds: Sequence[int]) -> str:
    """The markdown table of every finished cell (the first algorithm is the baseline of the ratios)."""
    table: dict[str, list[dict[str, Any]]] = {}
    for algorithm in algorithms:
        for seed in seeds:
            cell = json.loads((runs / f"{algorithm}-seed{seed}" / "benchmark.json").read_text())
            cell["eval"] = json.loads((runs / f"{algorithm}-seed{seed}" / "eval_results.json").read_text())
            table.setdefault(algorithm, []).append(cell)
    first = table[algorithms[0]]
    baseline = {
        "seconds": sum(c["wall_seconds"] for c in first) / len(first),
        "flops": sum(c["flops"]["total"] for c in first) / len(first),
    }
    table_rows = [_row(a, table[a], baseline) for a in algorithms]
    readings = "\n".join(_reading(a, table[a]) for a in algorithms)
    header = ["algorithm", "seeds", "change of the total reward: mean (per seed) [95% t interval]",
              "change of the distance to the world's videos (lower is better)",
              "object area / the world's after (1 is the world; per seed)", "wall time, 1 thread",
              "transformer FLOPs"]  # fmt: skip
    method = (
        "Each cell is `sage-train --algorithm A --seed N` (the toy preset: LoRA r8, lr 3e-3, 40 optimizer steps of 32 "
        "videos) with the algorithm's published defaults for everything else, the preset's per-algorithm tuning set "
        "back as the arena does (`sage_trl.arena.grid.published_settings`: sage_grpo at the paper's KL). Changes "
        "are the held-out evaluation after minus before (8 prompts x 2 seeds, deterministic sampling); intervals are "
        f"95% t intervals over the seeds (with 3 seeds the half-width is {_T95[1] / math.sqrt(3):.1f} standard "
        "deviations of the per-seed change: smaller differences between algorithms are not resolved). Wall time: two "
        "cells at once on two cores, one torch thread each. FLOPs: every transformer forward of the run (rollouts, "
        "training forwards with their backward, reference and old-policy forwards, the before/after evaluation), "
        "counted per row and priced by torch's FLOP counter."
    )
    return "\n\n".join([method, reporting.markdown_table(header, table_rows), readings])


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--cell"]:
        run_cell(argv[1], int(argv[2]), Path(argv[3]), *argv[4:])
        return
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--algorithms", default=DEFAULT_ALGORITHMS, help="comma-separated algorithm names")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2, help="cells run at once, one torch thread each")
    parser.add_argument("--runs", type=Path, default=Path("toy_algorithm_runs"), help="the cells' run folders")
    context = reporting.start_benchmark("toy_algorithms", parser, argv)
    arguments = context.arguments
    algorithms = arguments.algorithms.split(",")
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    arguments.runs.mkdir(parents=True, exist_ok=True)
    cells = [(algorithm, seed) for algorithm in algorithms for seed in seeds]
    extra = QUICK_FLAGS if context.quick else ()
    with ThreadPoolExecutor(arguments.workers) as pool:
        list(pool.map(lambda cell: _launch(*cell, arguments.runs, extra), cells))
    body = "\n\n".join(
        [
            "## Algorithms on the toy world",
            context.provenance(),
            report(arguments.runs, algorithms, seeds),
        ]
    )
    reporting.write_section(context.output, "toy_algorithms", body)
    print(body)


if __name__ == "__main__":
    main()
