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
