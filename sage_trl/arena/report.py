"""The arena's report: ``report.md`` and PNG figures in the arena's output folder, built from its finished cells
(docs/arena.md, "Reading the report").

Everything between the results markers is computed from the cells' numbers alone (seeded bootstraps), so the same
cells give the same results, byte for byte, whichever machine, shard or restart produced them; the wall time,
which does not repeat, and the context (command, date, machine, versions) stand outside them.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from cycler import cycler
from matplotlib import colormaps

from sage_trl.arena import stats
from sage_trl.arena.tasks import task_named

__all__ = ["REPORT_FILE", "RESULTS_BEGIN", "RESULTS_END", "results_of", "write_report"]

REPORT_FILE = "report.md"
RESULTS_BEGIN, RESULTS_END = "<!-- results: begin -->", "<!-- results: end -->"
REACH_FRACTION = 0.9
"""The compute comparison: training FLOPs to reach this fraction of the baseline's final mean gain."""
_PACKAGES = ("sage-grpo", "torch", "diffusers", "transformers", "trl", "peft", "numpy")

_LINE_STYLES = cycler(linestyle=["-", "--"]) * cycler(color=list(colormaps["tab20"].colors))
"""40 distinct lines (20 colours, solid then dashed): the full grid has 25 rows."""

Results = dict[str, dict[str, list[dict[str, Any]]]]  # task -> label -> the cells' results, by seed


def results_of(text: str) -> str:
    """The results part of a report (what must repeat exactly for the same cells)."""
    return text[text.index(RESULTS_BEGIN) : text.index(RESULTS_END) + len(RESULTS_END)]


def _interval(low: float, high: float, digits: int = 4) -> str:
    return f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def _flops(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:.3g}"


def _reach(results: list[dict[str, Any]], target: float) -> str:
    """Compute to reach ``target`` on the mean curve of the cells, with its interval over seeds."""
    curves = [r["curve"] for r in results]
    if target <= 0 or not curves or not curves[0] or any(len(c) != len(curves[0]) for c in curves):
        return "n/a"
    flops = np.array([point["flops"] for point in curves[0]])
    scores = np.array([[point["score"] for point in curve] for curve in curves])
    point, low, high = stats.reach_interval(flops, scores, target)
    return f"{_flops(point)} [{_flops(low)}, {_flops(high)}]"


def _task_table(task: str, by_label: dict[str, list[dict[str, Any]]], baseline: str) -> list[str]:
    base = by_label[baseline]
    target = REACH_FRACTION * float(np.mean([r["score"] for r in base]))
    header = (
        "| algorithm | seeds | IQM score [95% CI] | mean score | IQM gold change [95% CI] | "
        f"P(better than {baseline}) [95% CI] | training FLOPs per run | FLOPs to {REACH_FRACTION:.0%} of "
        f"{baseline}'s final score [95% CI] |"
    )
    lines = [header, "|---" * 8 + "|"]
    for label, results in by_label.items():
        scores, golds = [r["score"] for r in results], [r["gold"] for r in results]
        low, high = stats.bootstrap_interval([scores], stats.iqm)
        gold_low, gold_high = stats.bootstrap_interval([golds], stats.iqm)
        better = stats.probability_of_improvement([scores], [[r["score"] for r in base]])
        versus = "baseline" if label == baseline else f"{better[0]:.2f} [{better[1]:.2f}, {better[2]:.2f}]"
        flops = float(np.mean([r["flops"]["train"] for r in results]))
        lines.append(
            f"| `{label}` | {len(results)} | {stats.iqm(scores):+.4f} {_interval(low, high)} | {np.mean(scores):+.4f} "
            f"| {stats.iqm(golds):+.5f} {_interval(gold_low, gold_high, 5)} | {versus} | {flops:.3g} | "
            f"{_reach(results, target)} |"
        )
    return lines


def _task_section(task: str, by_label: dict[str, list[dict[str, Any]]], baseline: str, figures: list[str]) -> list[str]:
    spec = task_named(task)
    direction = "" if spec.higher_is_better else " (its fall: lower is better)"
    detectable = stats.detectable_difference([[r["score"] for r in results] for results in by_label.values()])
    power = (
        f"Detectable difference (two-sided 5% test, 80% power, pooled per-seed spread): **{detectable:.4f}**."
        if math.isfinite(detectable)
        else "Detectable difference: not estimable with one seed per algorithm."
    )
    lines = [f"## Task `{task}`", "", spec.tests, "",
             f"Score: the held-out change of `{spec.score}`{direction}, after training minus before. Gold: the fall of "
             f"`{spec.gold}`, the distance to the world's own videos (the score no reward can fool).", "", power, ""]  # fmt: skip
    lines += _task_table(task, by_label, baseline)
    lines += [""] + [f"![{name}]({name})" for name in figures]
    return lines


def _aggregate(results: Results, baseline: str) -> list[str]:
    """P(improvement) over the tasks every label ran, stratified by task."""
    tasks = [t for t in results if baseline in results[t]]
    labels = [label for label in next(iter(results.values())) if label != baseline and all(label in results[t] for t in tasks)]
    lines = ["## Over all tasks", "",
             f"P(a run beats a run of `{baseline}` on the same task), averaged over the tasks "
             f"({', '.join(tasks)}), with a 95% stratified bootstrap interval (resampling seeds within each task):",
             "", "| algorithm | P(better) [95% CI] |", "|---|---|"]  # fmt: skip
    for label in labels:
        scores = [[r["score"] for r in results[t][label]] for t in tasks]
        base = [[r["score"] for r in results[t][baseline]] for t in tasks]
        point, low, high = stats.probability_of_improvement(scores, base)
        lines.append(f"| `{label}` | {point:.2f} [{low:.2f}, {high:.2f}] |")
    return lines


def _figures(output_dir: Path, task: str, by_label: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The task's interval plot, performance profile and score-against-compute curves; their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(by_label)
    scores = {label: [r["score"] for r in by_label[label]] for label in labels}
    names = [f"iqm_{task}.png", f"profile_{task}.png", f"compute_{task}.png"]
    figure, axis = plt.subplots(figsize=(6, 0.4 * len(labels) + 1.2))
    for row, label in enumerate(labels):
        low, high = stats.bootstrap_interval([scores[label]], stats.iqm)
        axis.plot([low, high], [row, row], linewidth=6, alpha=0.4)
        axis.plot([stats.iqm(scores[label])], [row], "k|", markersize=12)
    axis.set_yticks(range(len(labels)), labels)
    axis.invert_yaxis()  # the table's order, top to bottom
    axis.axvline(0, color="grey", linewidth=0.8)
    axis.set_xlabel(f"IQM of the held-out score, 95% bootstrap CI ({task})")
    _save(figure, output_dir / names[0])
    every = np.concatenate([np.asarray(v) for v in scores.values()])
    thresholds = np.linspace(every.min() - 1e-9, every.max(), 100)
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.set_prop_cycle(_LINE_STYLES)
    for label in labels:
        axis.plot(thresholds, stats.performance_profile(scores[label], thresholds), drawstyle="steps-post", label=label)
    axis.set_xlabel(f"held-out score threshold ({task})")
    axis.set_ylabel("fraction of runs above")
    axis.legend(fontsize="x-small")
    _save(figure, output_dir / names[1])
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.set_prop_cycle(_LINE_STYLES)
    for label in labels:
        curves = [r["curve"] for r in by_label[label] if r["curve"]]
        if curves and all(len(c) == len(curves[0]) for c in curves):
            axis.plot([p["flops"] for p in curves[0]], np.mean([[p["score"] for p in c] for c in curves], axis=0),
                      marker=".", label=label)  # fmt: skip
    axis.set_xlabel("training FLOPs (rollouts and training)")
    axis.set_ylabel("held-out score, mean over seeds")
    axis.legend(fontsize="x-small")
    _save(figure, output_dir / names[2])
    return names


def _save(figure: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: the same cells, the same bytes
    plt.close(figure)


def _context(command: str, grid_text: str) -> list[str]:
    versions = []
    for package in _PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ["# Arena report", "", f"Command: `{command}`", "",
            f"Made {date} on {platform.machine()} ({platform.processor() or 'cpu'}, {os.cpu_count()} CPUs), "
            f"Python {platform.python_version()}, {', '.join(versions)}.", "", "Grid:", "", "```json", grid_text,
            "```", ""]  # fmt: skip


def _wall_time(results: Results) -> list[str]:
    lines = ["", "## Wall time on this machine (one torch thread per cell; does not repeat across runs)", "",
             "| task | algorithm | mean seconds per run |", "|---|---|---|"]  # fmt: skip
    for task, by_label in results.items():
        for label, cells in by_label.items():
            lines.append(f"| {task} | `{label}` | {np.mean([c['wall_seconds'] for c in cells]):.0f} |")
    return lines


def _baseline_first(by_label: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, list[dict[str, Any]]]:
    """The rows in the grid's order with the baseline moved first (what the others are read against)."""
    return {label: by_label[label] for label in sorted(by_label, key=lambda label: label != baseline)}


def write_report(output_dir: Path, results: Results, baseline: str, command: str, grid_text: str,
                 missing: Sequence[str]) -> Path:  # fmt: skip
    """Write ``report.md`` and its figures into ``output_dir``; ``missing``: the cells not finished (listed)."""
    body = [RESULTS_BEGIN, ""]
    if missing:
        body += [f"**{len(missing)} cells not finished**; the numbers below leave them out:", ""]
        body += [f"- `{name}`" for name in missing] + [""]
    results = {task: _baseline_first(by_label, baseline) for task, by_label in results.items()}
    for task, by_label in results.items():
        if baseline not in by_label:
            body += [f"## Task `{task}`", "", f"The baseline `{baseline}` has no finished cell here.", ""]
            continue
        body += [*_task_section(task, by_label, baseline, _figures(output_dir, task, by_label)), ""]
    if any(baseline in by_label for by_label in results.values()):
        body += [*_aggregate(results, baseline), ""]
    body.append(RESULTS_END)
    text = "\n".join([*_context(command, grid_text), *body, *_wall_time(results)]) + "\n"
    path = output_dir / REPORT_FILE
    path.write_text(text)
    return path
