"""Runs' logged records made by hand, for the alarms' rules (`sage_trl.alarms`) and the benchmarks that replay them."""

from __future__ import annotations

FALLING_ROLLOUTS = [1.8 - 0.004 * step for step in range(1, 26)]
"""The training rollouts' ``reward/total`` of 25 steps, falling."""
CPS_SEED_8_HELD_OUT = [1.74, 1.77, 1.73, 1.66, 1.63, 1.65]
"""The held-out totals at steps 0 to 25 (rounded) of the temporal task's cps run of seed 8, the run that broke with
no alarm before ``held_out_decline`` (docs/runs.md, "Alarms")."""


def logged_run(rollout_reward: list[float], held_out: list[float], every: int = 5) -> list[dict]:
    """A run's records in the order it logs them: a training record per step (``reward/total``) and, every
    ``every`` steps from step 0, an evaluation after the step's record."""
    records = [{"step": 0, "eval_reward/total": held_out[0]}]
    for step, reward in enumerate(rollout_reward, start=1):
        records.append({"step": step, "reward/total": reward})
        if step % every == 0:
            records.append({"step": step, "eval_reward/total": held_out[step // every]})
    return records
