"""The alarms (`sage_trl.alarms`) on the toy world over seeds: does the divergence alarm see reward hacking coming,
and does the default run stay quiet?

    python -m benchmarks.toy_alarms --seeds 0,1,2,3,4,5,6,7,8,9 --workers 2

Three kinds of ``sage-train`` runs per seed, each its own process with one torch thread (``--workers`` at a time),
into ``--runs``/<kind>/seed-<N>:

* ``hackable``: SAGE-GRPO at the paper's KL coefficients (as the arena runs it) trained on the hackable toy reward
  (``--reward toy_hackable``, a proxy RL games by drawing larger objects), evaluated every 2 steps with the toy
  world's reward as the evaluation reward (``--eval_reward toy``); the gold score is the toy world's own measure,
  the held-out videos' distance to the world's videos, which no reward sees.
* ``hackable_preset``: the same at the toy preset's SAGE-GRPO KL (does the preset's KL stop the hack?);
* ``default``: the default ``sage-train --seed N`` (the toy preset with its SAGE-GRPO KL, evaluated every 5 steps).

The alarms are replayed from each run's ``metrics.jsonl`` with the library's rules and thresholds
(`sage_trl.alarms.replay`): the same decisions the run made live, and the ones a changed threshold would make.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import reporting
from sage_trl.alarms import HELD_OUT_TOTAL, default_rules, records_in_a_row, replay
from sage_trl.arena.grid import published_settings
from sage_trl.evaluation import HELD_OUT_EVAL_REWARD, HELD_OUT_WORLD, is_evaluation_record

__all__ = ["KINDS", "firing_threshold", "hackable_row", "report"]

HACKABLE_FLAGS = ("--reward", "toy_hackable", "--eval_reward", "toy", "--eval_steps", "2")
"""The hackable runs' flags: the proxy reward RL games, and the toy reward as the evaluation reward, every 2 steps."""
KINDS: dict[str, tuple[str, ...]] = {
    "hackable": (*published_settings("sage_grpo"), *HACKABLE_FLAGS),
    "hackable_preset": HACKABLE_FLAGS,
    "default": (),
}
"""Each kind of run: the flags it adds to ``sage-train --seed N``. ``hackable`` is the arena's ``hackable`` task as
the arena runs it, SAGE-GRPO at the paper's KL (`published_settings`), where the hack happens; ``hackable_preset``
the same reward at the toy preset's stronger KL, which the default runs use too."""
QUICK_FLAGS = ("--max_steps", "2", "--num_eval_prompts", "1", "--eval_seeds", "0", "--eval_steps", "1")
"""What ``--quick`` adds to every run's command (the test suite's smoke run)."""


def _launch(kind: str, seed: int, runs: Path, extra: Sequence[str]) -> Path:
    run_dir = runs / kind / f"seed-{seed}"
    if (run_dir / "training_complete.json").is_file():
        return run_dir  # finished earlier: kept
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    code = "import sys, torch; torch.set_num_threads(1); from sage_trl.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "--seed", str(seed), "--output_dir", str(run_dir), *KINDS[kind], *extra]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{kind} seed {seed} failed:\n{done.stderr[-3000:]}")
    return run_dir


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _evaluations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if is_evaluation_record(r)]


def hackable_row(seed: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """When the divergence alarm fired, and the proxy and gold scores then and at the end.

    ``lost_fraction``: the share of the gold score's eventual loss (the distance to the world's videos at the end
    minus at step 0) already lost when the alarm fired; ``proxy_rose_after``: the held-out training reward rose
    further after the alarm (it fired while the reward still rose)."""
    evaluations = _evaluations(records)
    fired = {alarm.name: alarm.step for alarm in replay(records)}
    step = fired.get("proxy_gold_divergence")
    at = next((r for r in evaluations if r["step"] == step), None)
    first, last = evaluations[0], evaluations[-1]
    distance, proxy, gold = HELD_OUT_WORLD + "world_distance", HELD_OUT_TOTAL, HELD_OUT_EVAL_REWARD + "total"
    loss = last[distance] - first[distance]
    row = {"seed": seed, "step": step, "alarms": sorted(fired), "distance_start": first[distance],
           "distance_end": last[distance], "proxy_start": first[proxy], "proxy_end": last[proxy],
           "gold_start": first[gold], "gold_end": last[gold],
           "area_end": last.get(HELD_OUT_WORLD + "object_area_ratio", math.nan)}  # fmt: skip
    if at is not None:
        row.update(
            distance_at=at[distance],
            proxy_at=at[proxy],
            gold_at=at[gold],
            lost_fraction=(at[distance] - first[distance]) / loss if loss > 0 else math.nan,
            proxy_rose_after=max(r[proxy] for r in evaluations if r["step"] > step) > at[proxy]
            if step < last["step"]
            else False,
        )
    return row


def firing_threshold(records: list[dict[str, Any]], name: str) -> float:
    """How close a run came to the alarm ``name`` (the library's rule, its window and patience): the largest
    threshold at which the rule fires on ``records`` (it fires at any threshold below), 0 when it fires at none.
    Found by bisection on the replayed rule itself, so it reads the rule exactly as training does."""
    rule = next(rule for rule in default_rules() if rule.name == name)

    def fires(threshold: float) -> bool:
        return bool(replay(records, [replace(rule, threshold=threshold)]))

    low, high = 0.0, 1.0
    if not fires(low):
        return 0.0
    while fires(high):
        if high > 2**20:
            return math.inf  # fires at any threshold: a rule that reads a non-number as a change
        high *= 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if fires(middle) else (low, middle)
    return low


def _at_alarm(row: dict[str, Any], start: str, at: str, end: str) -> str:
    """``start, at the alarm, end`` of one row ("-" at the alarm when it did not fire)."""
    middle = f"{row[at]:.4f}" if at in row else "-"
    return f"{row[start]:.4f}, {middle}, {row[end]:.4f}"


def _number_or_dash(value: float, spec: str) -> str:
    """``value`` formatted with ``spec``, or "-" where it is not a number (no alarm, no loss to share)."""
    return format(value, spec) if math.isfinite(value) else "-"


def _hackable_section(rows: list[dict[str, Any]]) -> str:
    fired = [r for r in rows if r["step"] is not None]
    header = ["seed", "alarm at step", "held-out training reward: start, at the alarm, end",
              "evaluation reward (toy): start, at the alarm, end",
              "distance to the world's videos (gold, lower is better): start, at the alarm, end",
              "share of the gold's loss lost at the alarm", "objects' area over the world's at the end",
              "other alarms"]  # fmt: skip
    table = [
        [r["seed"], r["step"] if r["step"] is not None else "did not fire",
         _at_alarm(r, "proxy_start", "proxy_at", "proxy_end"), _at_alarm(r, "gold_start", "gold_at", "gold_end"),
         _at_alarm(r, "distance_start", "distance_at", "distance_end"),
         _number_or_dash(r.get("lost_fraction", math.nan), ".0%"), _number_or_dash(r["area_end"], ".2f"),
         ", ".join(a for a in r["alarms"] if a != "proxy_gold_divergence") or "none"]
        for r in rows
    ]  # fmt: skip
    steps = sorted(r["step"] for r in fired)
    lost = [r["lost_fraction"] for r in fired if math.isfinite(r["lost_fraction"])]
    worse = sum(r["distance_end"] > r["distance_start"] for r in rows)
    reading = (
        f"The divergence alarm fired in {len(fired)} of {len(rows)} seeds"
        + (
            f", at steps {steps[0]} to {steps[-1]} (median {steps[len(steps) // 2]}) of 40; the held-out training "
            f"reward rose further after it in {sum(bool(r['proxy_rose_after']) for r in fired)} of {len(fired)}; "
            f"when it fired the gold score had lost at most {max(lost):.0%} (median {sorted(lost)[len(lost) // 2]:.0%}) "
            f"of what it lost by the end"
            if fired and lost
            else ""
        )
        + f". The distance to the world's videos ended farther than it started in {worse} of {len(rows)} seeds."
    )
    return "\n\n".join([reporting.markdown_table(header, table), reading])


def _default_section(seeds: Sequence[int], runs: Path) -> str:
    """Each default run's alarms beside its held-out outcome: an alarm on a run whose gold score (the distance to
    the world's videos) got worse is a true alarm, one on a run that got better a false one."""
    rows, false_alarms, alarmed, worse = [], 0, 0, 0
    for seed in seeds:
        run_dir = runs / "default" / f"seed-{seed}"
        records, results = _records(run_dir), json.loads((run_dir / "eval_results.json").read_text())
        change = {name: results["after"][name] - results["before"][name] for name in ("total", "world_distance", "vq", "mq")}
        alarms = replay(records)
        worse += change["world_distance"] > 0
        alarmed += bool(alarms)
        false_alarms += bool(alarms) and change["world_distance"] <= 0
        training = [r for r in records if "reward/total" in r]
        rows.append([
            seed, ", ".join(f"{a.name} (step {a.step})" for a in alarms) or "none",
            f"{change['total']:+.4f}", f"{change['vq']:+.4f} / {change['mq']:+.4f}", f"{change['world_distance']:+.4f}",
            f"{firing_threshold(records, 'component_divergence'):.4f}",
            f"{firing_threshold(records, 'held_out_divergence'):.4f}",
            f"{firing_threshold(records, 'held_out_decline'):.4f}",
            f"{max(r.get('diagnostics/on_policy_ratio_deviation', 0.0) for r in training):.2g}",
            f"{max(r.get('frac_groups_without_signal', 0.0) for r in training):.2f}",
        ])  # fmt: skip
    header = ["seed", "alarms", "held-out change of the total", "of vq / mq",
              "of the distance to the world's videos (gold; + is worse)",
              "closest component divergence (fires above the threshold)",
              "closest held-out divergence (fires above the threshold)",
              "closest held-out decline (fires above the threshold)", "largest on-policy ratio deviation",
              "largest fraction of groups without signal"]  # fmt: skip
    reading = (
        f"An alarm fired in {alarmed} of {len(seeds)} default runs; {worse} of the {len(seeds)} ended farther from the "
        f"world's videos than they started (gold worse). False alarms (an alarm on a run whose gold improved): "
        f"{false_alarms}."
    )
    return "\n\n".join([reporting.markdown_table(header, rows), reading])


def rules_summary() -> str:
    """The library's rules as "`name` threshold over window[ at N in a row]", N the records in a row each needs."""
    return ", ".join(
        f"`{r.name}` {r.threshold:g} over {r.window}" + (f" at {n} in a row" if (n := records_in_a_row(r)) > 1 else "")
        for r in default_rules()
    )


def report(runs: Path, seeds: Sequence[int]) -> str:
    """The markdown of the three kinds of runs over ``seeds``."""
    rules = rules_summary()
    method = (
        f"Runs: `sage-train --seed N` with the hackable flags at the paper's KL ({' '.join(KINDS['hackable'])}), the "
        f"same at the toy preset's KL ({' '.join(KINDS['hackable_preset'])}), or none, 40 optimizer steps each; the "
        f"alarms replayed from each run's metrics.jsonl with the library's rules (threshold over window: {rules}; "
        f"the evaluation rules count evaluations). With {len(seeds)} seeds, an outcome "
        f"seen in none of them happens in fewer than {1 - 0.05 ** (1 / len(seeds)):.0%} of such runs (95% one-sided "
        "bound)."
    )
    sections = [method]
    titles = {"hackable": "Hackable toy reward, SAGE-GRPO at the paper's KL (reward hacking):",
              "hackable_preset": "Hackable toy reward at the toy preset's KL (does it stop the hack?):"}  # fmt: skip
    for kind, title in titles.items():
        rows = [hackable_row(seed, _records(runs / kind / f"seed-{seed}")) for seed in seeds]
        sections += [title, _hackable_section(rows)]
    return "\n\n".join([*sections, "The default run (false and true alarms):", _default_section(seeds, runs)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one torch thread each")
    parser.add_argument("--runs", type=Path, default=Path("toy_alarm_runs"), help="the runs' folders")
    context = reporting.start_benchmark("toy_alarms", parser, argv)
    arguments = context.arguments
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    extra = QUICK_FLAGS if context.quick else ()
    cells = [(kind, seed) for seed in seeds for kind in KINDS]
    with ThreadPoolExecutor(arguments.workers) as pool:
        list(pool.map(lambda cell: _launch(*cell, arguments.runs, extra), cells))
    body = "\n\n".join(["## Alarms on the toy world", context.provenance(), report(arguments.runs, seeds)])
    reporting.write_section(context.output, "toy_alarms", body)
    print(body)


if __name__ == "__main__":
    main()
