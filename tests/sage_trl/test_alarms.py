"""The alarms (`sage_trl.alarms`): each fires for its cause and stays quiet without it, on logged records and
through `SageGRPOTrainer` (dropout left on, a bf16 rollout with an fp32 training forward, a reward that rewards one
component only, held-out videos getting worse while the rollouts improve, and with them, groups of identical
rewards), and ``stop_on_alarm`` ends a run as not finished."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sage_trl import SageGRPOTrainer
from sage_trl.alarms import (
    ALARM_RULES,
    Alarm,
    default_rules,
    read_alarms,
    records_in_a_row,
    replay,
)
from sage_trl.evaluation import sampling_held_out
from sage_trl.hub.card import render_model_card
from sage_trl.report import run_report
from sage_trl.run_folder import layout, plan_start, read_run
from tests.doubles import LinearBackbone, mean_brightness
from tests.sage_trl.logged_runs import CPS_SEED_8_HELD_OUT, FALLING_ROLLOUTS, logged_run
from tests.sage_trl.tiny_trainer import PROMPTS, Interrupt, lora, make_args

# -- the rules on records ------------------------------------------------------------------------------------------


def steps(**series: list[float]) -> list[dict]:
    """Training records: ``reward/total`` plus each named series, one record per step."""
    length = len(next(iter(series.values())))
    return [{"step": i + 1, "reward/total": 1.0, **{k: v[i] for k, v in series.items()}} for i in range(length)]


def names(alarms: list[Alarm]) -> list[str]:
    return [alarm.name for alarm in alarms]


def test_proxy_gold_divergence_fires_when_the_gold_falls_while_the_proxy_rises() -> None:
    proxy = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    falling_gold = [1.0, 1.0, 1.0, 1.0, 0.85, 0.7]
    records = [
        {"step": 5 * i, "eval_reward/total": p, "eval_eval_reward/total": g} for i, (p, g) in enumerate(zip(proxy, falling_gold))
    ]
    alarms = replay(records)
    # Met at step 20 (1.0 -> 0.85 over 3 evaluations) and again at 25: two evaluations in a row fire it.
    assert names(alarms) == ["proxy_gold_divergence"] and alarms[0].step == 25
    assert "eval_reward/total fell (1 -> 0.7)" in alarms[0].message and "Reward hacking" in alarms[0].advice
    rising_gold = [{**r, "eval_eval_reward/total": r["eval_reward/total"]} for r in records]
    assert replay(rising_gold) == []
    falling_both = [{**r, "eval_reward/total": 2 - r["eval_reward/total"]} for r in records]
    assert replay(falling_both) == []  # the proxy fell too: a worse model, not a hacked reward


def evaluations(**series: list[float]) -> list[dict]:
    """Evaluation records, one per series value, 5 steps apart."""
    length = len(next(iter(series.values())))
    return [{"step": 5 * i, "eval_reward/total": 1.0, **{k: v[i] for k, v in series.items()}} for i in range(length)]


def test_component_divergence_needs_a_clear_rise_and_a_clear_fall() -> None:
    rise, fall = [0.5, 0.52, 0.55, 0.6, 0.65], [0.9, 0.89, 0.87, 0.85, 0.8]
    fired = replay(evaluations(**{"eval_reward/vq": rise, "eval_reward/ta": fall}))
    assert names(fired) == ["component_divergence"] and fired[0].step == 20  # met at 15 and 20
    assert "vq rose (0.52 -> 0.65)" in fired[0].message and "ta fell (0.89 -> 0.8)" in fired[0].message
    slight = [0.99, 0.99, 0.988, 0.986, 0.985]  # the default toy run's ta: -0.005 is no divergence
    assert replay(evaluations(**{"eval_reward/vq": rise, "eval_reward/ta": slight})) == []
    assert replay(evaluations(**{"eval_reward/vq": rise, "eval_reward/ta": rise})) == []


def test_held_out_divergence_fires_when_the_held_out_reward_falls_while_the_rollouts_rise() -> None:
    """The few-step toy task: sage_grpo raised its rollouts' reward while the held-out videos' fell (docs/runs.md)."""
    rising = [1.5 + 0.002 * step for step in range(1, 26)]
    falling = [1.6, 1.6, 1.6, 1.55, 1.5, 1.45]
    alarms = replay(logged_run(rising, falling))
    # At step 15 the window starts at step 0, with no rollout before it; met at 20 (1.6 -> 1.5) and 25.
    assert names(alarms) == ["held_out_divergence"] and alarms[0].step == 25
    assert "held-out videos' reward fell (1.6 -> 1.45)" in alarms[0].message
    assert "mean 1.511 before step 10, 1.536 since" in alarms[0].message and "eval_samples/" in alarms[0].advice
    # The rollouts fell too: no divergence, a policy getting worse (the next alarm).
    assert names(replay(logged_run(rising[::-1], falling))) == ["held_out_decline"]
    assert replay(logged_run(rising, falling[::-1])) == []  # the held-out reward rose
    slight = [1.6, 1.6, 1.6, 1.59, 1.585, 1.58]  # -1.25%: within the default toy run's wander
    assert replay(logged_run(rising, slight)) == []


def test_held_out_decline_fires_when_the_held_out_reward_falls_and_the_rollouts_do_not_rise() -> None:
    """The temporal task's cps run of seed 8 (docs/runs.md): the held-out reward fell and the rollouts' fell too."""
    alarms = replay(logged_run(FALLING_ROLLOUTS, CPS_SEED_8_HELD_OUT))
    # The fall met at 15 (1.74 -> 1.66, from step 0: no rollouts before to compare) and at 20 (1.77 -> 1.63), where
    # the rollouts did not rise: fires at 20.
    assert names(alarms) == ["held_out_decline"] and alarms[0].step == 20
    assert "reward fell (1.77 -> 1.63) and the training rollouts' reward did not rise" in alarms[0].message
    assert "mean 1.788 before step 5, 1.748 since" in alarms[0].message and "getting worse" in alarms[0].advice
    flat_rollouts = [1.8] * 25  # not rising is enough: the held-out videos still got worse
    assert names(replay(logged_run(flat_rollouts, CPS_SEED_8_HELD_OUT))) == ["held_out_decline"]
    slight = [1.74, 1.745, 1.74, 1.73, 1.72, 1.725]  # -1.4% at most: within the arena's healthy runs' wander
    assert replay(logged_run(FALLING_ROLLOUTS, slight)) == []
    once = [1.74, 1.77, 1.73, 1.70, 1.75, 1.76]  # fell at 15 (1.74 -> 1.70) only: one noisy evaluation
    assert replay(logged_run(FALLING_ROLLOUTS, once)) == []
    held_out_only = [r for r in logged_run(FALLING_ROLLOUTS, CPS_SEED_8_HELD_OUT) if "eval_reward/total" in r]
    assert replay(held_out_only) == []  # no rollouts logged: neither held-out rule can tell which it is


def test_held_out_decline_counts_its_own_evaluations_in_a_row() -> None:
    """The rule's ``in_a_row`` is the count its check uses and the one `records_in_a_row` reports."""
    counts = {rule.name: records_in_a_row(rule) for rule in default_rules()}
    assert counts["held_out_decline"] == 2
    assert counts["proxy_gold_divergence"] == 2 and counts["kl_spike"] == 1  # the other rules: their patience
    three = [replace(rule, in_a_row=3) if rule.name == "held_out_decline" else rule for rule in default_rules()]
    alarms = replay(logged_run(FALLING_ROLLOUTS, CPS_SEED_8_HELD_OUT), three)  # the falls at 15 and 20 no longer do
    assert names(alarms) == ["held_out_decline"] and alarms[0].step == 25


@pytest.mark.parametrize(("patience", "in_a_row", "message"), [(0, 1, "at least 1"), (2, 2, "not both")])
def test_an_alarm_rule_counts_records_in_a_row_once(patience: int, in_a_row: int, message: str) -> None:
    """The monitor's patience and the check's own count are exclusive: both would multiply the records asked for."""
    rule = default_rules()[0]
    with pytest.raises(ValueError, match=message):
        replace(rule, patience=patience, in_a_row=in_a_row)


def test_a_held_out_fall_is_caught_when_the_rollouts_comparison_flips_between_evaluations() -> None:
    """Each rule waits for 2 evaluations in a row; a fall read as divergence at one and decline at the next still
    fires one of them (held_out_decline counts the fall, not the comparison, over its two)."""
    rollouts = [1.0] * 5 + [2.0] * 5 + [1.2] * 10 + [1.0] * 5
    held_out = [1.8, 1.75, 1.7, 1.6, 1.5, 1.4]
    # At 20 the rollouts since step 5 (1.47) average above those before (1.0); at 25 those since step 10 (1.13) below
    # those before (1.5).
    alarms = replay(logged_run(rollouts, held_out))
    assert names(alarms) == ["held_out_decline"] and alarms[0].step == 25


def test_nan_rewards_are_no_fall_and_no_comparison() -> None:
    nan = float("nan")
    assert replay(logged_run(FALLING_ROLLOUTS, [nan, 1.6, 1.6, 1.6, 1.6, 1.6])) == []  # a NaN first evaluation
    assert replay(logged_run(FALLING_ROLLOUTS, [1.74, 1.77, nan, nan, nan, nan])) == []
    assert replay(logged_run([nan] * 25, CPS_SEED_8_HELD_OUT)) == []  # rollouts' reward all NaN: not compared


def test_groups_without_signal_and_kl_spikes() -> None:
    assert names(replay(steps(frac_groups_without_signal=[0.75] * 5))) == ["groups_without_signal"]
    assert replay(steps(frac_groups_without_signal=[0.75, 0.75, 0.0, 0.75, 0.0, 0.25])) == []  # not most, on average
    growing = [1e-6 * 1.3**i for i in range(20)]  # a KL that grows from 0 as the policy moves: no spike
    assert replay(steps(**{"kl/total": [0.0, 0.0, *growing]})) == []
    spike = replay(steps(**{"kl/total": [*growing, growing[-1] * 40]}))
    assert names(spike) == ["kl_spike"] and spike[0].step == 21


def test_each_alarm_fires_once_and_only_where_its_metrics_are_logged() -> None:
    constant = steps(frac_groups_without_signal=[1.0] * 12)
    assert names(replay(constant)) == ["groups_without_signal"]
    # A likelihood-free algorithm logs no ratio and no KL: those alarms never apply.
    assert replay(steps(**{"policy_loss": [0.1] * 30})) == []
    assert set(ALARM_RULES) == {
        "proxy_gold_divergence", "component_divergence", "held_out_divergence", "held_out_decline",
        "off_policy_ratio", "groups_without_signal", "kl_spike",
    }  # fmt: skip


# -- through the trainer -----------------------------------------------------------------------------------------


def bright_and_dark(videos: torch.Tensor, prompts: list[str], **kwargs) -> dict[str, torch.Tensor]:
    """Two components that always move in opposite directions."""
    brightness = videos.mean(dim=(1, 2, 3, 4))
    return {"bright": brightness, "dark": 1 - brightness}


def bright_twice(videos: torch.Tensor, prompts: list[str], **kwargs) -> dict[str, torch.Tensor]:
    """Two components that move together."""
    brightness = videos.mean(dim=(1, 2, 3, 4))
    return {"bright": brightness, "bright_squared": brightness**2}


def constant(videos: torch.Tensor, prompts: list[str], **kwargs) -> torch.Tensor:
    return torch.ones(videos.shape[0])


def train(
    tmp_path: Path, reward=mean_brightness, lora_dropout: float = 0.0, eval_dataset=None, **settings
) -> SageGRPOTrainer:
    adapter = lora()
    adapter.lora_dropout = lora_dropout
    settings = {"max_steps": 6, "gradient_accumulation_steps": 1, "steps_per_generation": 1, **settings}
    trainer = SageGRPOTrainer(
        LinearBackbone(), reward, args=make_args(tmp_path, **settings), train_dataset=PROMPTS, peft_config=adapter,
        eval_dataset=eval_dataset,
    )  # fmt: skip
    trainer.train()
    return trainer


def test_a_clean_run_raises_no_alarm(tmp_path: Path) -> None:
    trainer = train(tmp_path, max_steps=24)
    assert trainer.alarms == [] and not (Path(trainer.args.output_dir) / layout.ALARMS_FILE).exists()


def test_dropout_left_on_sets_off_the_ratio_alarm_and_is_named(tmp_path: Path) -> None:
    trainer = train(tmp_path, lora_dropout=0.5)
    assert names(trainer.alarms) == ["off_policy_ratio"]
    assert "Dropout is active" in trainer.alarms[0].advice and "lora_dropout" in trainer.alarms[0].advice
    written = read_alarms(Path(trainer.args.output_dir) / layout.ALARMS_FILE)
    assert written == trainer.alarms


def test_a_bf16_rollout_with_an_fp32_training_forward_is_named(tmp_path: Path, monkeypatch) -> None:
    rollout = SageGRPOTrainer._rollout

    def bf16_rollout(self, prompts, seeds):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return rollout(self, prompts, seeds)

    monkeypatch.setattr(SageGRPOTrainer, "_rollout", bf16_rollout)
    trainer = train(tmp_path)
    assert names(trainer.alarms) == ["off_policy_ratio"]
    advice = trainer.alarms[0].advice
    assert "different precisions" in advice and "autocast torch.bfloat16" in advice and "Dropout" not in advice


def test_a_reward_that_rewards_one_component_only_sets_off_the_divergence_alarm(tmp_path: Path) -> None:
    # The linear test model does not generalise across prompts: its "held-out" prompts are training prompts.
    held_out = {"eval_dataset": PROMPTS[:2], "eval_strategy": "steps", "eval_steps": 2}
    settings = {"max_steps": 12, "reward_component_weights": {"bright": 1.0, "dark": 0.0}, **held_out}
    one_sided = train(tmp_path / "one", bright_and_dark, **settings)
    assert names(one_sided.alarms) == ["component_divergence"]
    assert "bright rose" in one_sided.alarms[0].message and "dark fell" in one_sided.alarms[0].message
    together = train(tmp_path / "together", bright_twice, **{**settings, "reward_component_weights": {"bright": 1.0}})
    assert together.alarms == []


def brighter_in_rollouts_darker_held_out(videos: torch.Tensor, prompts: list[str], **kwargs) -> torch.Tensor:
    """Stands in for rollouts and sampler parting: what the rollouts gain, the held-out videos lose."""
    brightness = videos.mean(dim=(1, 2, 3, 4))
    return 1 - brightness if sampling_held_out() else brightness


def test_held_out_videos_getting_worse_while_rollouts_improve_set_off_the_held_out_alarm(tmp_path: Path) -> None:
    held_out = {"eval_dataset": PROMPTS[:2], "eval_strategy": "steps", "eval_steps": 2, "max_steps": 12}
    parting = train(tmp_path / "parting", brighter_in_rollouts_darker_held_out, **held_out)
    assert names(parting.alarms) == ["held_out_divergence"]
    assert "held-out videos' reward fell" in parting.alarms[0].message
    assert train(tmp_path / "together", mean_brightness, **held_out).alarms == []


def darker_with_each_call() -> Callable[..., torch.Tensor]:
    """Stands in for a policy getting worse: each call's reward is the videos' brightness less 0.05 per earlier
    call, so the rollouts' reward and the held-out videos' fall together whatever the policy learns."""
    calls = itertools.count()

    def darker(videos: torch.Tensor, prompts: list[str], **kwargs) -> torch.Tensor:
        return videos.mean(dim=(1, 2, 3, 4)) - 0.05 * next(calls)

    return darker


def test_held_out_videos_and_rollouts_getting_worse_together_set_off_the_decline_alarm(tmp_path: Path) -> None:
    held_out = {"eval_dataset": PROMPTS[:2], "eval_strategy": "steps", "eval_steps": 2, "max_steps": 12}
    trainer = train(tmp_path, darker_with_each_call(), **held_out)
    assert names(trainer.alarms) == ["held_out_decline"]
    assert "the training rollouts' reward did not rise" in trainer.alarms[0].message
    assert names(read_alarms(Path(trainer.args.output_dir) / layout.ALARMS_FILE)) == ["held_out_decline"]


def test_groups_of_identical_rewards_set_off_their_alarm_and_stop_on_alarm_ends_the_run(tmp_path: Path) -> None:
    trainer = train(tmp_path, constant, max_steps=12, stop_on_alarm=True, save_strategy="steps", save_steps=2)
    assert names(trainer.alarms) == ["groups_without_signal"] and trainer.state.global_step == 5
    completion = json.loads((Path(trainer.args.output_dir) / layout.COMPLETE_FILE).read_text())
    assert completion["status"] == "stopped_on_alarm" and "groups_without_signal" in completion["stopped_by_alarm"]
    assert math.isfinite(completion["global_step"])
    # The report and the model card say so, from the run folder's own record.
    record = read_run(trainer.args.output_dir)
    assert record.alarms == trainer.alarms and record.completion["status"] == "stopped_on_alarm"
    report = run_report(record)
    assert "**Stopped by an alarm**" in report and "- ALARM groups_without_signal at step 5:" in report
    card = str(render_model_card(record, repo_id="user/run", license="mit"))
    assert "**Training was stopped by an alarm**" in card and "- ALARM groups_without_signal at step 5:" in card
    # Not finished: resuming continues from the last checkpoint (here without stopping).
    assert plan_start(trainer.args.output_dir, resume_from_checkpoint=True, max_steps=12).finished is None


def test_the_report_and_card_of_a_run_without_alarms_say_none_fired(tmp_path: Path) -> None:
    record = read_run(train(tmp_path).args.output_dir)
    assert "None fired (checked where their metrics were logged: proxy_gold_divergence" in run_report(record)
    assert "No alarm fired during training" in str(render_model_card(record, repo_id="user/run", license="mit"))


def test_a_resumed_run_records_each_alarm_once(tmp_path: Path) -> None:
    """The alarm fired at step 5, after checkpoint-4, and the run was killed at step 7: the resume cuts
    alarms.jsonl back to the checkpoint, the alarm fires again at step 5, and the file holds it once."""
    settings = {"max_steps": 8, "save_strategy": "steps", "save_steps": 4}
    args = make_args(tmp_path, gradient_accumulation_steps=1, steps_per_generation=1, **settings)
    interrupted = SageGRPOTrainer(
        LinearBackbone(), constant, args=args, train_dataset=PROMPTS, peft_config=lora(), callbacks=[Interrupt(7)]
    )
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    path = Path(args.output_dir) / layout.ALARMS_FILE
    assert [(a.name, a.step) for a in read_alarms(path)] == [("groups_without_signal", 5)]
    resumed = SageGRPOTrainer(LinearBackbone(), constant, args=args, train_dataset=PROMPTS, peft_config=lora())
    resumed.train(resume_from_checkpoint=True)
    assert [(a.name, a.step) for a in read_alarms(path)] == [("groups_without_signal", 5)]
    assert resumed.alarms == read_alarms(path)


def test_a_likelihood_free_algorithm_gets_the_alarms_that_apply(tmp_path: Path) -> None:
    trainer = train(tmp_path, constant, algorithm="diffusion_nft", max_steps=6)
    logged = {name for record in trainer.state.log_history for name in record}
    assert "diagnostics/on_policy_ratio_deviation" not in logged  # no importance ratio: that alarm does not apply
    assert names(trainer.alarms) == ["groups_without_signal"]  # its rewards still have no spread
