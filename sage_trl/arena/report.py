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
from sage_trl.machine import cpu_description

__all__ = ["REPORT_FILE", "RESULTS_BEGIN", "RESULTS_END", "results_of", "write_report"]

REPORT_FILE = "report.md"
RESULTS_BEGIN, RESULTS_END = "<!-- results: begin -->", "<!-- results: end -->"
REACH_FRACTION = 0.9
"""The compute comparison: training FLOPs to reach this fraction of the baseline's final mean gain."""
_PACKAGES = ("sage-grpo", "torch", "diffusers", "transformers", "trl", "peft", "numpy")

_LINE_STYLES = cycler(linestyle=["-", "--", ":"]) * cycler(color=list(colormaps["tab10"].colors))
"""30 distinct lines (10 hues, solid, then dashed, then dotted): the full grid has 25 rows. tab20's paired light
and dark shades of one hue told neighbouring rows apart poorly."""

Results = dict[str, dict[str, list[dict[str, Any]]]]  # task -> label -> the cells' results, by seed


def results_of(text: str) -> str:
    """The results part of a report (what must repeat exactly for the same cells)."""
    return text[text.index(RESULTS_BEGIN) : text.index(RESULTS_END) + len(RESULTS_END)]


def _interval(low: float, high: float, digits: int = 4) -> str:
    return f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def _flops(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:.3g}"


def _curves(results: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """The evaluations' training FLOPs and the seeds' score curves (seeds x evaluations); None unless every seed
    has the same evaluations."""
    curves = [r["curve"] for r in results]
    if not curves or not curves[0] or any(len(c) != len(curves[0]) for c in curves):
        return None
    return np.array([point["flops"] for point in curves[0]]), np.array([[p["score"] for p in c] for c in curves])


def _reach(results: list[dict[str, Any]], target: float) -> str:
    """Compute to reach ``target`` on the mean curve of the cells, with its interval over seeds."""
    curves = _curves(results)
    if target <= 0 or curves is None:
        return "n/a"
    point, low, high = stats.reach_interval(*curves, target)
    return f"{_flops(point)} [{_flops(low)}, {_flops(high)}]"


def _iqm_interval(values: list[float]) -> tuple[float, float, float]:
    """The IQM of ``values`` and its 95% bootstrap interval."""
    return (stats.iqm(values), *stats.bootstrap_interval([values], stats.iqm))


def _task_table(
    by_label: dict[str, list[dict[str, Any]]], baseline: str, score_iqm: dict[str, tuple[float, float, float]]
) -> list[str]:
    base = by_label[baseline]
    target = REACH_FRACTION * float(np.mean([r["score"] for r in base]))
    header = (
        "| algorithm | seeds | IQM score [95% CI] | mean score | IQM gold change [95% CI] | "
        f"P(better than {baseline}) [95% CI] | training FLOPs per run | FLOPs to {REACH_FRACTION:.0%} of "
        f"{baseline}'s final score [95% CI] |"
    )
    lines = [header, "|---" * 8 + "|"]
    for label, results in by_label.items():
        scores = [r["score"] for r in results]
        iqm, low, high = score_iqm[label]
        gold, gold_low, gold_high = _iqm_interval([r["gold"] for r in results])
        better = stats.probability_of_improvement([scores], [[r["score"] for r in base]])
        versus = "baseline" if label == baseline else f"{better[0]:.2f} [{better[1]:.2f}, {better[2]:.2f}]"
        flops = float(np.mean([r["flops"]["train"] for r in results]))
        lines.append(
            f"| `{label}` | {len(results)} | {iqm:+.4f} {_interval(low, high)} | {np.mean(scores):+.4f} "
            f"| {gold:+.5f} {_interval(gold_low, gold_high, 5)} | {versus} | {flops:.3g} | "
            f"{_reach(results, target)} |"
        )
    return lines


def _paired_table(by_label: dict[str, list[dict[str, Any]]], baseline: str) -> list[str]:
    """Each row's mean per-seed difference from the baseline over their shared seeds, score and gold, with 95%
    Student t intervals and the count of seeds where the row is higher; empty with fewer than two shared seeds."""
    base = {r["cell"]["seed"]: r for r in by_label[baseline]}
    rows = []
    for label, results in by_label.items():
        shared = [(r, base[r["cell"]["seed"]]) for r in results if r["cell"]["seed"] in base]
        if label == baseline or len(shared) < 2:
            continue
        cells = [f"`{label}`", str(len(shared))]
        for key, digits in (("score", 4), ("gold", 5)):
            differences = [r[key] - b[key] for r, b in shared]
            mean, low, high = stats.paired_difference(differences)
            higher = sum(d > 0 for d in differences)
            cells += [f"{mean:+.{digits}f} {_interval(low, high, digits)}", f"{higher} of {len(shared)}"]
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", f"By seed against `{baseline}`: the rows share their seeds (a seed starts every row from the same "
            "random draws), so the mean of the per-seed differences, with a 95% Student t interval over the shared "
            "seeds, removes the spread they share; and in how many seeds the row is higher.", "",
            "| algorithm | shared seeds | score difference [95% CI] | seeds higher | gold difference [95% CI] | "
            "seeds higher |", "|---" * 6 + "|", *rows]  # fmt: skip


def _task_section(output_dir: Path, task: str, by_label: dict[str, list[dict[str, Any]]], baseline: str) -> list[str]:
    """The task's heading, what it tests, its detectable difference, its table and figures (written here)."""
    spec = task_named(task)
    score_iqm = {label: _iqm_interval([r["score"] for r in results]) for label, results in by_label.items()}
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
    lines += _task_table(by_label, baseline, score_iqm)
    lines += _paired_table(by_label, baseline)
    figures = [
        _iqm_figure(output_dir / f"iqm_{task}.png", task, score_iqm),
        _profile_figure(output_dir / f"profile_{task}.png", task, by_label),
        _compute_figure(output_dir / f"compute_{task}.png", by_label),
    ]
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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _iqm_figure(path: Path, task: str, score_iqm: dict[str, tuple[float, float, float]]) -> str:
    """Each row's IQM and interval, in the table's order; the file's name."""
    figure, axis = _pyplot().subplots(figsize=(6, 0.4 * len(score_iqm) + 1.2))
    for row, (iqm, low, high) in enumerate(score_iqm.values()):
        axis.plot([low, high], [row, row], linewidth=6, alpha=0.4)
        axis.plot([iqm], [row], "k|", markersize=12)
    axis.set_yticks(range(len(score_iqm)), list(score_iqm))
    axis.invert_yaxis()  # the table's order, top to bottom
    axis.axvline(0, color="grey", linewidth=0.8)
    axis.set_title(f"task {task}", fontsize="medium")  # the title, not the axis label: long row names leave it no room
    axis.set_xlabel("IQM of the held-out score, 95% bootstrap CI")
    return _save(figure, path)


def _profile_figure(path: Path, task: str, by_label: dict[str, list[dict[str, Any]]]) -> str:
    """The performance profiles of the rows; the file's name."""
    scores = {label: [r["score"] for r in results] for label, results in by_label.items()}
    every = np.concatenate([np.asarray(v) for v in scores.values()])
    thresholds = np.linspace(every.min() - 1e-9, every.max(), 100)
    figure, axis = _pyplot().subplots(figsize=(6, 3.5))
    axis.set_prop_cycle(_LINE_STYLES)
    for label, values in scores.items():
        axis.plot(thresholds, stats.performance_profile(values, thresholds), drawstyle="steps-post", label=label)
    axis.set_xlabel(f"held-out score threshold ({task})")
    axis.set_ylabel("fraction of runs above")
    axis.legend(fontsize="x-small")
    return _save(figure, path)


def _compute_figure(path: Path, by_label: dict[str, list[dict[str, Any]]]) -> str:
    """Each row's mean held-out score curve against training FLOPs; the file's name."""
    figure, axis = _pyplot().subplots(figsize=(6, 3.5))
    axis.set_prop_cycle(_LINE_STYLES)
    for label, results in by_label.items():
        curves = _curves(results)
        if curves is not None:
            axis.plot(curves[0], curves[1].mean(axis=0), marker=".", label=label)
    axis.set_xlabel("training FLOPs (rollouts and training)")
    axis.set_ylabel("held-out score, mean over seeds")
    axis.legend(fontsize="x-small")
    return _save(figure, path)


def _save(figure: Any, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: the same cells, the same bytes
    _pyplot().close(figure)
    return path.name


def _context(command: str, grid_text: str) -> list[str]:
    versions = []
    for package in _PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ["# Arena report", "", f"Command: `{command}`", "",
            f"Made {date} on {platform.machine()} ({cpu_description()}, {os.cpu_count()} CPUs), "
            f"Python {platform.python_version()}, {', '.join(versions)}.", "", "Grid:", "", "```json", grid_text,
            "```", ""]  # fmt: skip


def _wall_time(results: Results) -> list[str]:
    lines = ["", "## Wall time (one torch thread per cell; does not repeat across runs)", "",
             "| task | algorithm | mean seconds per run | processors the cells ran on |", "|---|---|---|---|"]  # fmt: skip
    for task, by_label in results.items():
        for label, cells in by_label.items():
            processors = "; ".join(sorted({c.get("cpu", "not recorded") for c in cells}))
            lines.append(f"| {task} | `{label}` | {np.mean([c['wall_seconds'] for c in cells]):.0f} | {processors} |")
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
        body += [*_task_section(output_dir, task, by_label, baseline), ""]
    if any(baseline in by_label for by_label in results.values()):
        body += [*_aggregate(results, baseline), ""]
    body.append(RESULTS_END)
    text = "\n".join([*_context(command, grid_text), *body, *_wall_time(results)]) + "\n"
    path = output_dir / REPORT_FILE
    path.write_text(text)
    return path
