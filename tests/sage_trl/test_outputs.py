"""The one-line status per step: its fields and its wall-clock seconds per step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sage_trl import outputs
from sage_trl.outputs import StatusCallback, format_status


def test_format_status_lists_reward_components_and_leaves_out_bookkeeping_keys():
    logs = {
        "reward/total": 1.25,
        "reward/vq": 0.5,
        "reward/ta": 0.75,
        "reward/total_std": 0.1,
        "reward/invalid_count": 2.0,
        "kl/coef": 5e-6,
        "loss": 0.02,
    }
    line = format_status(3, 40, logs, seconds_per_step=2.04)
    assert line == "step 3/40 | reward 1.25 (vq 0.500 ta 0.750) | kl coef 5.0e-06 | loss 0.02 | invalid 2 | 2.0 s/step"
    assert "s/step" not in format_status(3, 40, logs)


def test_status_callback_reports_wall_clock_per_step_not_phase_timers(monkeypatch: pytest.MonkeyPatch):
    clock = iter([100.0, 106.0, 107.5])
    monkeypatch.setattr(outputs.time, "perf_counter", lambda: next(clock))
    callback = StatusCallback()
    state = SimpleNamespace(is_world_process_zero=True, max_steps=10, global_step=0)
    callback.on_train_begin(None, state, None)
    lines: list[str] = []
    callback.bar.write = lines.append
    # Phase timers summing to 50 s must not be what the line reports: 6 s over 3 steps is 2 s/step.
    state.global_step = 3
    callback.on_log(None, state, None, logs={"loss": 0.0, "time/rollout": 40.0, "step_time": 10.0})
    state.global_step = 4
    callback.on_log(None, state, None, logs={"loss": 0.0})
    callback.on_train_end(None, state, None)
    assert lines[0].endswith("| 2.0 s/step")
    assert lines[1].endswith("| 1.5 s/step")


def test_reward_curves_mark_the_held_out_evaluations_and_leave_out_counters(tmp_path) -> None:
    import json

    from PIL import Image, ImageChops

    records = [
        {"step": 1, "reward/total": 1.0, "reward/failed_calls": 0.0, "reward/invalid_count": 0.0},
        {"step": 2, "reward/total": 1.2, "reward/failed_calls": 1.0, "reward/invalid_count": 0.0},
        {"step": 2, "eval_reward/total": 1.1},
    ]
    with_evaluations, without = tmp_path / "with", tmp_path / "without"
    for folder, lines in ((with_evaluations, records), (without, records[:2])):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        written = outputs.plot_reward_curves(folder / "metrics.jsonl", folder)
        assert [p.name for p in written] == ["reward_total.png"]  # no curve of a failure counter
    pictures = [Image.open(folder / "reward_total.png").convert("RGB") for folder in (with_evaluations, without)]
    assert ImageChops.difference(*pictures).getbbox() is not None  # the evaluation point and legend are drawn
    assert "failed_calls" not in format_status(2, 2, records[1])
