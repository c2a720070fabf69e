"""``python -m benchmarks.toy_alarms``: the reading of a hackable run (when the divergence alarm fired, how much of
the gold score was lost by then) on records made by hand, and a smoke run of ``--quick`` through ``sage-train``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import toy_alarms
from tests.benchmarks.markdown_sections import quick_arguments, section_of


def _evaluation(step: int, proxy: float, gold: float, distance: float, vq: float = 0.6) -> dict:
    return {"step": step, "eval_reward/total": proxy, "eval_reward/vq": vq, "eval_eval_reward/total": gold,
            "eval_world/world_distance": distance}  # fmt: skip


def test_a_hackable_run_is_read_at_its_alarm() -> None:
    proxy, gold = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], [1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.6]
    distance = [0.10, 0.10, 0.11, 0.12, 0.14, 0.16, 0.20]
    records = [_evaluation(2 * i, p, g, d) for i, (p, g, d) in enumerate(zip(proxy, gold, distance))]
    row = toy_alarms.hackable_row(0, records)
    assert row["step"] == 8 and row["alarms"] == ["proxy_gold_divergence"]  # two evaluations in a row met the rule
    assert row["lost_fraction"] == pytest.approx((0.14 - 0.10) / (0.20 - 0.10)) and row["proxy_rose_after"]


def test_a_hackable_run_without_the_alarm_reads_as_such() -> None:
    """The preset's KL kept this run off the hack: no alarm, gold better, and the table says so without NaNs."""
    proxy, gold, distance = [1.0, 1.1, 1.2, 1.3], [1.0, 1.01, 1.02, 1.03], [0.10, 0.099, 0.098, 0.097]
    records = [_evaluation(2 * i, p, g, d) for i, (p, g, d) in enumerate(zip(proxy, gold, distance))]
    row = toy_alarms.hackable_row(3, records)
    assert row["step"] is None and row["alarms"] == []
    section = toy_alarms._hackable_section([row])
    assert "| 3 | did not fire | 1.0000, -, 1.3000 |" in section and "nan" not in section
    assert "fired in 0 of 1 seeds. The distance to the world's videos ended farther than it started in 0 of 1" in section


def test_the_firing_threshold_of_the_component_divergence_is_the_smaller_of_the_rise_and_the_fall() -> None:
    records = [{"step": i, "eval_reward/total": 1.0, "eval_reward/vq": 0.5 + 0.01 * i, "eval_reward/ta": 0.9 - 0.005 * i}
               for i in range(6)]  # fmt: skip
    assert toy_alarms.firing_threshold(records, "component_divergence") == pytest.approx(0.015)
    records[4]["eval_reward/ta"] = 0.9  # one window without a fall: it takes two windows in a row to fire
    assert toy_alarms.firing_threshold(records, "component_divergence") == 0.0


def test_the_firing_threshold_of_the_held_out_divergence_is_its_fall() -> None:
    records = [{"step": 0, "eval_reward/total": 1.0}]
    for step in range(1, 26):
        records.append({"step": step, "reward/total": 1.0 + 0.01 * step})
        if step % 5 == 0:
            records.append({"step": step, "eval_reward/total": 1.0 - 0.02 * step})  # -0.3 over every window
    assert toy_alarms.firing_threshold(records, "held_out_divergence") == pytest.approx(0.3)
    assert toy_alarms.firing_threshold(records, "held_out_decline") == 0.0  # the rollouts rose: not a decline
    falling_rollouts = [{**r, "reward/total": 2.0 - r["reward/total"]} if "reward/total" in r else r for r in records]
    assert toy_alarms.firing_threshold(falling_rollouts, "held_out_decline") == pytest.approx(0.3)


def test_the_rules_summary_gives_each_rules_count_in_a_row() -> None:
    summary = toy_alarms.rules_summary()
    assert "`held_out_decline` 0.02 over 3 at 2 in a row," in summary  # counted by the rule itself, not patience
    assert "`proxy_gold_divergence` 0.02 over 3 at 2 in a row," in summary and summary.endswith("`kl_spike` 20 over 10")


@pytest.mark.slow
def test_quick_runs_report_every_kind(tmp_path: Path) -> None:
    toy_alarms.main([*quick_arguments(tmp_path), "--seeds", "0", "--runs", str(tmp_path / "runs")])
    section = section_of(tmp_path / "benchmarks.md", "toy_alarms")
    assert "SAGE-GRPO at the paper's KL (reward hacking)" in section and "at the toy preset's KL" in section
    assert "An alarm fired in 0 of 1 default runs" in section and "With 1 seeds" in section
    for kind in toy_alarms.KINDS:
        config = (tmp_path / "runs" / kind / "seed-0" / "run_config.yaml").read_text()
        assert ("beta: 1.0e-05" in config) == (kind == "hackable")  # the paper's KL there, the preset's elsewhere
