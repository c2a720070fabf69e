"""``summary.md``: a run's report, written by ``sage-train`` from what the run folder recorded (`RunRecord`).

What ran and for how long, what the reward optimised and what each of its heads measures, the held-out table with
the overall score, the evaluations during training and the alarms that fired; the model card (`sage_trl.hub.card`)
reads the same record.
"""

from __future__ import annotations

import math
from typing import Any

from agents import ALGORITHM_CONFIGS
from sage_trl.alarms import ALARM_RULES, HELD_OUT_TOTAL
from sage_trl.evaluation import (
    EVAL_REWARD_PREFIX,
    HELD_OUT_EVAL_REWARD,
    HELD_OUT_WORLD,
    WORLD_MEASURES,
    is_evaluation_record,
)
from sage_trl.run_folder import RunRecord, layout

__all__ = ["held_out_table", "run_report"]

_MAX_EVALUATION_ROWS = 12


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "an unrecorded time"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _what_ran(run: RunRecord) -> list[str]:
    algorithm = str(run.config.get("algorithm", "sage_grpo"))
    config_class = ALGORITHM_CONFIGS.get(algorithm)
    name = config_class.display_name if config_class else algorithm
    model = run.base_model.get("name_or_path") or run.config.get("model_name_or_path")
    trained = f"a LoRA adapter (rank {run.lora_config.get('r')})" if run.lora_config else "the full transformer"
    completion = run.completion or {}
    steps = f"{run.global_step} of {run.max_steps} optimizer steps" if run.max_steps else f"{run.global_step} steps"
    line = (
        f"{name} (`{algorithm}`) trained {trained} of `{model}` for {steps} in "
        f"{_duration(completion.get('train_runtime'))}, seed {run.config.get('seed')}, group size "
        f"{run.config.get('num_generations')}, the `{run.config.get('sde')}` SDE."
    )
    lines = [f"# Run summary: {name} on `{model}`", "", line]
    if completion.get("status") == "stopped_on_alarm":
        lines += ["", f"**Stopped by an alarm** (`stop_on_alarm`): {completion.get('stopped_by_alarm')}"]
    elif not run.complete:
        lines += ["", "**Not finished**: training_complete.json is missing."]
    return lines


def _reward_section(run: RunRecord) -> list[str]:
    weights = run.run.get("reward_weights") or {}
    descriptions = {n: t for reward in run.run.get("rewards") or [] for n, t in (reward.get("components") or {}).items()}
    terms = " + ".join(f"{float(w):g} {n}" for n, w in weights.items() if w)
    lines = ["", "## Reward", "", f"The run optimised total = {terms or 'its reward'} (the overall score below).", ""]
    lines += ["| component | weight | what it measures |", "|---|---|---|"]
    lines += [f"| {n} | {float(w):g} | {descriptions.get(n, 'not described by its reward')} |" for n, w in weights.items()]
    return lines


def held_out_table(results: dict[str, Any]) -> str:
    """The before/after table of ``eval_results.json`` (means +- std, change): the training reward's components,
    ``total`` (the overall score), the evaluation rewards, the toy world's measures."""
    before, after = results["before"], results["after"]
    before_std, after_std = results.get("before_std", {}), results.get("after_std", {})
    extra = {"total"} | set(WORLD_MEASURES)
    names = sorted(n for n in before if n not in extra and not n.startswith(EVAL_REWARD_PREFIX))
    names += ["total", *sorted((n for n in before if n.startswith(EVAL_REWARD_PREFIX)), key=lambda n: (n.endswith("/total"), n))]
    names += [n for n in WORLD_MEASURES if n in before]
    lines = ["| component | before | after | change |", "|---|---|---|---|"]
    for name in names:
        change = after[name] - before[name]
        label = "**total (overall)**" if name == "total" else name
        lines.append(
            f"| {label} | {before[name]:.4f} ± {before_std.get(name, 0.0):.4f} | "
            f"{after[name]:.4f} ± {after_std.get(name, 0.0):.4f} | {'+' if change >= 0 else ''}{change:.4f} |"
        )
    legend = [f"- `{name}`: {WORLD_MEASURES[name]}" for name in WORLD_MEASURES if name in before]
    if any(n.startswith(EVAL_REWARD_PREFIX) for n in before):
        legend.append(f"- `{EVAL_REWARD_PREFIX}...`: the evaluation rewards, scored and never optimised")
    return "\n".join(lines + (["", *legend] if legend else []))


def _held_out_section(run: RunRecord) -> list[str]:
    results = run.eval_results
    if not results:
        return ["", "## Held-out evaluation", "", "None (no held-out prompts)."]
    prompts, seeds = results.get("prompts") or [], sorted(set(results.get("seeds") or []))
    head = (
        f"{len(set(prompts))} held-out prompts x {len(seeds)} seeds, deterministic sampling, before and after "
        f"training; `{layout.SAMPLES_FILE}` shows each video (a row per prompt and seed, before | after)."
    )
    return ["", "## Held-out evaluation", "", head, "", held_out_table(results)]


def _during_training_section(run: RunRecord) -> list[str]:
    points = [r for r in run.metrics if is_evaluation_record(r)]
    if not points:
        return []
    columns = [HELD_OUT_TOTAL, HELD_OUT_EVAL_REWARD + "total", HELD_OUT_WORLD + "world_distance"]
    columns = [c for c in columns if any(c in r for r in points)]
    shown = points if len(points) <= _MAX_EVALUATION_ROWS else points[:: math.ceil(len(points) / _MAX_EVALUATION_ROWS)]
    if shown[-1] is not points[-1]:
        shown.append(points[-1])
    header = "| step | " + " | ".join(c.removeprefix("eval_") for c in columns) + " |"
    lines = ["", "## Evaluations during training", "", header, "|---" * (len(columns) + 1) + "|"]
    lines += ["| " + " | ".join([str(r["step"]), *(f"{r.get(c, math.nan):.4f}" for c in columns)]) + " |" for r in shown]
    lines += ["", f"The videos of each point are in `{layout.EVAL_SAMPLES_FOLDER}/`; the reward curves mark them."]
    return lines


def _alarm_section(run: RunRecord) -> list[str]:
    lines = ["", "## Alarms", ""]
    if not run.alarms:
        checked = ", ".join(ALARM_RULES)
        return [*lines, f"None fired (checked where their metrics were logged: {checked})."]
    return lines + [f"- {alarm.line()}" for alarm in run.alarms]


def run_report(run: RunRecord) -> str:
    """The markdown of ``summary.md`` for the run ``run`` records."""
    sections = [
        _what_ran(run),
        _reward_section(run),
        _held_out_section(run),
        _during_training_section(run),
        _alarm_section(run),
    ]
    return "\n".join(line for section in sections for line in section) + "\n"
