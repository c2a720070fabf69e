"""Alarms: failure seen coming during training, from the metrics a run logs (docs/runs.md, "Alarms").

Each alarm is a rule over the history of logged records (the training steps' and the held-out evaluations',
`sage_trl.evaluation_trainer`), so the same rules run live (`AlarmMonitor`, fed by `sage_trl.alarm_callback`) and
replayed over a finished run's ``metrics.jsonl`` (`replay`), which is how their thresholds were chosen (the
measurements are in docs/runs.md). A rule fires at most once per run; it applies only where its metrics are
logged, so a likelihood-free algorithm (no importance ratio) gets the other alarms.

| alarm | fires when | likely cause |
|---|---|---|
| ``proxy_gold_divergence`` | over the last evaluations the training reward of the held-out videos rose while an evaluation reward fell | reward hacking |
| ``component_divergence`` | over the last evaluations one component of the training reward rose while another fell | the reward's weights favour one head, or a KL too weak to hold the policy |
| ``held_out_divergence`` | over the last evaluations the held-out videos' reward fell while the training rollouts' rose | rollouts off the sampler's path, or overfitting the training prompts |
| ``held_out_decline`` | over the last evaluations the held-out videos' reward fell and the training rollouts' did not rise | updates that break the policy: too large a step or too much exploration noise |
| ``off_policy_ratio`` | the importance ratio where it must be 1 is not | dropout, train-mode modules, dtype or batching differing between rollout and training, a non-deterministic kernel |
| ``groups_without_signal`` | most groups had identical rewards over the last steps | a saturated or constant reward |
| ``kl_spike`` | the KL to the anchor jumped far above its recent level | a too-large step |
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from sage_trl.evaluation import HELD_OUT_EVAL_REWARD, HELD_OUT_REWARD, is_evaluation_record

__all__ = [
    "ALARM_RULES",
    "HELD_OUT_TOTAL",
    "Alarm",
    "AlarmMonitor",
    "AlarmRule",
    "component_changes",
    "read_alarms",
    "records_in_a_row",
    "relative_changes",
    "replay",
]

HELD_OUT_TOTAL = HELD_OUT_REWARD + "total"
"""``eval_reward/total``: the held-out videos' training reward, the proxy the alarms compare against."""

Record = dict[str, Any]


@dataclass(frozen=True)
class Alarm:
    """One alarm that fired: its rule's ``name``, the ``step`` it fired at, what was seen (``message``) and the
    likely cause with what to try (``advice``)."""

    name: str
    step: int
    message: str
    advice: str

    def line(self) -> str:
        """The one-line warning: ``ALARM <name> at step <step>: <message> <advice>``."""
        return f"ALARM {self.name} at step {self.step}: {self.message} {self.advice}"


@dataclass
class AlarmRule:
    """A rule over the logged records.

    Args:
        name: the alarm's name.
        threshold: the value the rule compares with (its meaning is the rule's); the default is measured.
        window: how many records (steps or evaluations) the rule looks back over.
        check: ``check(rule, history) -> (message, advice) | None``.
        applies: ``applies(record) -> bool``: the records the rule is checked at (training steps or
            evaluations); they are in the history it reads.
        reads: ``reads(record) -> bool``: other records the history also holds, never checked at (None: none).
        patience: how many records it is checked at in a row must meet the rule before it fires (a noisy
            evaluation meets it once by chance more often than twice).
        in_a_row: for a rule whose check counts its own records in a row (`held_out_decline`, whose count must
            not restart when its reading changes between records): how many; the check reads it, and patience
            stays 1 (`records_in_a_row`).
        explain: for ``off_policy_ratio``: names the causes the library can see (`sage_trl.alarm_callback`).
    """

    name: str
    threshold: float
    window: int
    check: Callable[[AlarmRule, list[Record]], tuple[str, str] | None]
    applies: Callable[[Record], bool]
    patience: int = 1
    explain: Callable[[], str] | None = field(default=None, repr=False)
    reads: Callable[[Record], bool] | None = None
    in_a_row: int = 1

    def __post_init__(self) -> None:
        if self.patience < 1 or self.in_a_row < 1:
            raise ValueError(f"AlarmRule {self.name!r}: patience and in_a_row must be at least 1.")
        if self.patience > 1 and self.in_a_row > 1:
            raise ValueError(
                f"AlarmRule {self.name!r}: set patience (the monitor counts the records in a row) or in_a_row (the "
                "check counts them), not both."
            )


# -- the rules ----------------------------------------------------------------------------------------------------


def _is_training_step(record: Record) -> bool:
    return isinstance(record.get("reward/total"), (int, float))


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _proxy_gold(rule: AlarmRule, evaluations: list[Record]) -> tuple[str, str] | None:
    """Over the last ``window`` evaluations the training reward of the held-out videos rose while an evaluation
    reward (its total or a component) fell by more than ``threshold`` (relative, as in `relative_changes`)."""
    if len(evaluations) <= rule.window:
        return None
    first, last = evaluations[-rule.window - 1], evaluations[-1]
    if not last[HELD_OUT_TOTAL] > first[HELD_OUT_TOTAL]:
        return None
    changes = relative_changes(evaluations, rule.window, HELD_OUT_EVAL_REWARD)
    falling = [key for key, change in changes.items() if change < -rule.threshold]
    if not falling:
        return None
    key = min(falling, key=changes.get)
    message = (
        f"over the last {rule.window} evaluations the training reward of the held-out videos rose "
        f"({first[HELD_OUT_TOTAL]:.4g} -> {last[HELD_OUT_TOTAL]:.4g}) while {key.removeprefix('eval_')} "
        f"fell ({first[key]:.4g} -> {last[key]:.4g})."
    )
    advice = (
        "Reward hacking is likely: the policy raises the reward in a way the evaluation reward does not "
        "credit. Look at eval_samples/; keep the checkpoint of the best evaluation; raise the KL (beta) or "
        "lower the learning rate; add what the evaluation reward measures to the training reward."
    )
    return message, advice


@dataclass(frozen=True)
class _HeldOutFall:
    """The held-out videos' training reward falling over an alarm's window, and the training rollouts' mean reward
    (``reward/total``) over the steps up to the window's first evaluation and over those since (None where no finite
    one was logged)."""

    fall_text: str  # "over the last N evaluations the held-out videos' reward fell (a -> b)"
    first_step: int  # the step of the window's first evaluation
    mean_before: float | None
    mean_since: float | None

    def rollouts_compared(self) -> bool:
        return self.mean_before is not None and self.mean_since is not None

    def rollouts_rose(self) -> bool:
        if self.mean_before is None or self.mean_since is None:
            return False
        return self.mean_since > self.mean_before

    def rollout_means_text(self) -> str:
        return f"(mean {self.mean_before:.4g} before step {self.first_step}, {self.mean_since:.4g} since)"


def _held_out_fell(rule: AlarmRule, evaluations: list[Record]) -> bool:
    """Whether the held-out videos' training reward (``eval_reward/total``) fell by more than ``threshold``
    (relative, as in `relative_changes`) over the ``window`` evaluations ending at the last one; a NaN is no fall."""
    if len(evaluations) <= rule.window:
        return False
    change = relative_changes(evaluations, rule.window, HELD_OUT_TOTAL).get(HELD_OUT_TOTAL)
    return change is not None and change < -rule.threshold


def _evaluations(history: list[Record]) -> list[Record]:
    return [record for record in history if is_evaluation_record(record)]


def _held_out_fall(rule: AlarmRule, history: list[Record], evaluations: list[Record]) -> _HeldOutFall | None:
    """The fall of the held-out videos' training reward over the last ``window`` of ``evaluations`` (the history's,
    `_held_out_fell`), with the training rollouts around it; None where it did not fall."""
    if not _held_out_fell(rule, evaluations):
        return None
    first, last = evaluations[-rule.window - 1], evaluations[-1]
    rewards = [(record["step"], record["reward/total"]) for record in history if _is_training_step(record)]
    before = _finite(reward for step, reward in rewards if step <= first["step"])
    since = _finite(reward for step, reward in rewards if first["step"] < step <= last["step"])
    fall_text = (
        f"over the last {rule.window} evaluations the held-out videos' reward fell ({first[HELD_OUT_TOTAL]:.4g} -> "
        f"{last[HELD_OUT_TOTAL]:.4g})"
    )
    return _HeldOutFall(fall_text, first["step"], fmean(before) if before else None, fmean(since) if since else None)


def _held_out_divergence(rule: AlarmRule, history: list[Record]) -> tuple[str, str] | None:
    """The held-out videos' training reward fell (`_held_out_fall`) while the training rollouts' reward of the
    steps since the window's first evaluation averaged above its average over the steps before."""
    found = _held_out_fall(rule, history, _evaluations(history))
    if found is None or not found.rollouts_rose():
        return None
    message = f"{found.fall_text} while the training rollouts' reward rose {found.rollout_means_text()}."
    advice = (
        "The policy raises the reward of its own rollouts and lowers it where it is sampled for use: the "
        "stochastic rollouts have parted from the deterministic sampling (few inference steps or a large eta put "
        "the SDE's samples off the sampler's path: more steps, a smaller eta), or it overfits the training "
        "prompts. Look at eval_samples/; keep the checkpoint of the best evaluation; lower the learning rate or "
        "raise the KL (beta)."
    )
    return message, advice


def _held_out_decline(rule: AlarmRule, history: list[Record]) -> tuple[str, str] | None:
    """The held-out videos' training reward fell (`_held_out_fell`) at the last ``in_a_row`` evaluations in a row,
    whatever the rollouts did at the earlier ones, and at the last the training rollouts' reward, compared as in
    `_held_out_divergence`, did not rise: the policy getting worse, the fall that rule leaves out. The rule counts its
    evaluations in a row itself, so that a fall read as a divergence at one evaluation and as a decline at the next
    fires this rule (with the monitor's patience, each rule's count would restart there)."""
    evaluations = _evaluations(history)
    found = _held_out_fall(rule, history, evaluations)
    if found is None or not found.rollouts_compared() or found.rollouts_rose():
        return None
    if not all(_held_out_fell(rule, evaluations[:-back]) for back in range(1, rule.in_a_row)):
        return None
    message = f"{found.fall_text} and the training rollouts' reward did not rise {found.rollout_means_text()}."
    advice = (
        "The policy is getting worse, not gaming the reward: its updates break what it draws (too large a step, or "
        "too much exploration noise: a large eta, or an SDE with more noise at the same eta). Look at "
        "eval_samples/; keep the checkpoint of the best evaluation; lower the learning rate or eta, or raise the KL "
        "(beta)."
    )
    return message, advice


def relative_changes(evaluations: list[Record], window: int, prefix: str) -> dict[str, float]:
    """Each ``prefix`` metric's change over the last ``window`` evaluations, over its first value's magnitude (at
    least 1, so that small scores compare in absolute terms); a change that is not a finite number (a NaN score) is
    left out, so it never reads as a rise or a fall."""
    first, last = evaluations[-window - 1], evaluations[-1]
    changes = {}
    for key, value in last.items():
        if key.startswith(prefix) and isinstance(first.get(key), (int, float)) and isinstance(value, (int, float)):
            scale = max(abs(evaluations[0].get(key, first[key])), 1.0)
            change = (value - first[key]) / scale
            if math.isfinite(change):
                changes[key] = change
    return changes


def component_changes(evaluations: list[Record], window: int) -> dict[str, float]:
    """Each training-reward component's `relative_changes` on the held-out videos (the total left out) over the
    ``window`` evaluations ending at the last one."""
    changes = relative_changes(evaluations, window, HELD_OUT_REWARD)
    changes.pop(HELD_OUT_TOTAL, None)
    return changes


def _component_divergence(rule: AlarmRule, evaluations: list[Record]) -> tuple[str, str] | None:
    """Over the last ``window`` evaluations one component of the training reward on the held-out videos rose by
    more than ``threshold`` (relative, as in `relative_changes`) while another fell by more than ``threshold``."""
    if len(evaluations) <= rule.window:
        return None
    changes = component_changes(evaluations, rule.window)
    rising = [key for key, change in changes.items() if change > rule.threshold]
    falling = [key for key, change in changes.items() if change < -rule.threshold]
    if not rising or not falling:
        return None
    up, down = max(rising, key=changes.get), min(falling, key=changes.get)
    first, last = evaluations[-rule.window - 1], evaluations[-1]
    message = (
        f"over the last {rule.window} evaluations the held-out {up.removeprefix(HELD_OUT_REWARD)} rose "
        f"({first[up]:.4g} -> {last[up]:.4g}) while {down.removeprefix(HELD_OUT_REWARD)} fell "
        f"({first[down]:.4g} -> {last[down]:.4g})."
    )
    advice = (
        "The policy trades one reward head for another: check the component weights (reward_preset, "
        "reward_component_weights), or hold the policy nearer its anchor with a stronger KL (raise beta: on the toy "
        "world this stopped it), and look at eval_samples/; a head rising alone is how reward hacking starts."
    )
    return message, advice


def _off_policy_ratio(rule: AlarmRule, steps: list[Record]) -> tuple[str, str] | None:
    """``diagnostics/on_policy_ratio_deviation`` above ``threshold`` in each of the last ``window`` records that
    log it."""
    values = _finite(record.get("diagnostics/on_policy_ratio_deviation") for record in steps)
    if len(values) < rule.window or min(values[-rule.window :]) <= rule.threshold:
        return None
    message = (
        f"the importance ratio where it must be 1 (the first minibatch after each rollout) is off by "
        f"{values[-1]:.2g} on average (diagnostics/on_policy_ratio_deviation, for {rule.window} steps)."
    )
    cause = rule.explain() if rule.explain is not None else ""
    return message, f"The training forward is not the rollout's. {cause}".strip()


def _groups_without_signal(rule: AlarmRule, steps: list[Record]) -> tuple[str, str] | None:
    """The mean of ``frac_groups_without_signal`` over the last ``window`` steps is above ``threshold``."""
    values = _finite(record.get("frac_groups_without_signal") for record in steps[-rule.window :])
    if len(values) < rule.window or (mean := fmean(values)) <= rule.threshold:
        return None
    message = (
        f"{mean:.0%} of the groups had identical rewards over the last {rule.window} steps "
        "(frac_groups_without_signal): they give no advantage and no learning signal."
    )
    advice = (
        "The reward is saturated or constant for these prompts: check the reward (reward/total_std), use harder "
        "prompts or a finer-grained reward, or raise num_generations."
    )
    return message, advice


def _kl_spike(rule: AlarmRule, steps: list[Record]) -> tuple[str, str] | None:
    """``kl/total`` above ``threshold`` times the median of the ``window`` steps before it (which must be above
    zero: a KL that starts from 0 grows without spiking)."""
    values = _finite(record.get("kl/total") for record in steps)
    if len(values) <= rule.window:
        return None
    earlier = sorted(values[-rule.window - 1 : -1])
    median = earlier[len(earlier) // 2]
    if not median > 0 or values[-1] <= rule.threshold * median:
        return None
    message = f"kl/total jumped to {values[-1]:.3g}, {values[-1] / median:.0f} times its median {median:.3g} over the {rule.window} steps before."
    advice = "The policy moved far from its anchor in one step: lower the learning rate, or raise beta or max_grad_norm's clipping."
    return message, advice


def default_rules(explain_off_policy: Callable[[], str] | None = None) -> list[AlarmRule]:
    """The alarms and their default thresholds (measured: docs/runs.md, "Alarms")."""
    return [
        AlarmRule("proxy_gold_divergence", 0.02, 3, _proxy_gold, is_evaluation_record, patience=2),
        # 0.03: the default toy runs whose gold score improved came to 0.022 at most (docs/benchmarks.md)
        AlarmRule("component_divergence", 0.03, 3, _component_divergence, is_evaluation_record, patience=2),
        # 0.02: the default toy runs came to 0.0087 at most, the worst few-step SAGE SDE runs to 0.022-0.039
        AlarmRule(
            "held_out_divergence", 0.02, 3, _held_out_divergence, is_evaluation_record, patience=2,
            reads=_is_training_step,
        ),
        # 0.02, as held_out_divergence: over the arena's 556 finished runs it fired on three, each a run that broke
        # or got worse (the temporal task's cps run of seed 8: 0.051; two few-step runs: 0.042 and 0.034); it misses
        # other runs that got worse (up to 0.0197) and came to 0.0182 on one that ended better (docs/runs.md). The
        # rule itself asks for the fall at in_a_row evaluations in a row (one noisy evaluation falls by chance more
        # often than two), the rollouts' comparison at the last only.
        AlarmRule(
            "held_out_decline", 0.02, 3, _held_out_decline, is_evaluation_record, reads=_is_training_step, in_a_row=2,
        ),
        AlarmRule("off_policy_ratio", 1e-4, 2, _off_policy_ratio, _is_training_step, explain=explain_off_policy),
        AlarmRule("groups_without_signal", 0.5, 5, _groups_without_signal, _is_training_step),
        AlarmRule("kl_spike", 20.0, 10, _kl_spike, _is_training_step),
    ]


def records_in_a_row(rule: AlarmRule) -> int:
    """How many records in a row must meet ``rule`` before it fires: its patience, or the count its check keeps
    itself (``in_a_row``)."""
    return max(rule.patience, rule.in_a_row)


ALARM_RULES: tuple[str, ...] = tuple(rule.name for rule in default_rules())
"""The alarms' names, in the order they are checked."""


class AlarmMonitor:
    """Feeds logged records to the rules; each rule fires at most once (`update` returns the new alarms)."""

    def __init__(self, rules: list[AlarmRule] | None = None) -> None:
        self.rules = rules if rules is not None else default_rules()
        self.fired: list[Alarm] = []
        self._met = {rule.name: 0 for rule in self.rules}  # records in a row that met each rule
        self._read: dict[str, list[Record]] = {rule.name: [] for rule in self.rules}  # the records each rule reads

    def update(self, record: Record) -> list[Alarm]:
        """Add one logged record (with its ``step``) and return the alarms it sets off."""
        new = []
        done = {alarm.name for alarm in self.fired}
        for rule in self.rules:
            checked = rule.applies(record)
            if checked or (rule.reads is not None and rule.reads(record)):
                self._read[rule.name].append(record)
            if not checked or rule.name in done:
                continue
            found = rule.check(rule, self._read[rule.name])
            self._met[rule.name] = self._met[rule.name] + 1 if found is not None else 0
            if found is not None and self._met[rule.name] >= rule.patience:
                new.append(Alarm(rule.name, int(record.get("step", 0)), *found))
        self.fired.extend(new)
        return new


def replay(records: Iterable[Record], rules: list[AlarmRule] | None = None) -> list[Alarm]:
    """The alarms a run's records (``metrics.jsonl``, in order) set off."""
    monitor = AlarmMonitor(rules)
    for record in records:
        monitor.update(record)
    return monitor.fired


def read_alarms(path: str | Path) -> list[Alarm]:
    """The alarms of a run folder's alarms file (none when there is none); a truncated last line is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    alarms = []
    for line in path.read_text().splitlines():
        try:
            alarms.append(Alarm(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return alarms


def alarm_json(alarm: Alarm) -> str:
    """One line of the alarms file."""
    return json.dumps(asdict(alarm))
