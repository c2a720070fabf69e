"""Evaluation during training (`sage_trl.evaluation_trainer`): transformers' ``eval_strategy`` schedule, the
metrics in TensorBoard (read back with its own event reader) and in the run folder, the evaluation videos, and a
resumed run that continues the schedule without repeating or skipping a point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sage_trl import SageGRPOTrainer
from sage_trl.run_folder import layout
from tests.doubles import LinearBackbone, mean_brightness
from tests.sage_trl.tiny_trainer import PROMPTS, Interrupt, lora, make_args

HELD_OUT = ["a black cat", "a yellow moon"]


def darkness(videos: torch.Tensor, prompts: list[str], **kwargs) -> torch.Tensor:
    """An evaluation reward that falls as the training reward (brightness) rises."""
    return 1.0 - videos.mean(dim=(1, 2, 3, 4))


def evaluating_trainer(tmp_path: Path, callbacks: list | None = None, **settings) -> SageGRPOTrainer:
    args = make_args(
        tmp_path, eval_strategy="steps", eval_seeds=[0, 1], report_to=["tensorboard"], **settings
    )
    return SageGRPOTrainer(
        LinearBackbone(), mean_brightness, args=args, train_dataset=PROMPTS, eval_dataset=HELD_OUT,
        eval_reward_funcs=darkness, peft_config=lora(), callbacks=callbacks,
    )  # fmt: skip


def scalar_steps(folder: Path, tag: str) -> dict[int, float]:
    """``{step: value}`` of one scalar over every TensorBoard event folder under ``folder``."""
    values: dict[int, float] = {}
    for events in sorted({path.parent for path in folder.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0}).Reload()
        if tag in accumulator.Tags()["scalars"]:
            values.update({event.step: event.value for event in accumulator.Scalars(tag)})
    return values


def eval_records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / layout.METRICS_FILE).read_text().splitlines()) if "eval_reward/total" in r]


def test_evaluations_on_the_schedule_reach_tensorboard_and_the_run_folder(tmp_path: Path) -> None:
    trainer = evaluating_trainer(tmp_path, max_steps=4, eval_steps=2)
    trainer.train()
    run = Path(trainer.args.output_dir)
    records = eval_records(run)
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        assert {"eval_reward/mean_brightness", "eval_eval_reward/darkness", "eval_eval_reward/total"} <= set(record)
        assert "loss" not in record and "reward/total" not in record  # the training metrics stay in their records
        assert record["eval_eval_reward/darkness"] == pytest.approx(1 - record["eval_reward/mean_brightness"])
    assert records[1]["eval_reward/total"] != pytest.approx(records[0]["eval_reward/total"])  # the policy changed
    # The last point is the trained model's held-out evaluation, deterministic.
    assert records[1]["eval_reward/total"] == pytest.approx(trainer.held_out_evaluation().means()["total"], abs=1e-6)
    # TensorBoard, read with its own reader: the scalars under eval/ and one video (an animated GIF) per point.
    assert scalar_steps(run, "eval/reward/total") == pytest.approx({2: records[0]["eval_reward/total"], 4: records[1]["eval_reward/total"]})
    assert set(scalar_steps(run, "eval/eval_reward/darkness")) == {2, 4}
    events = next(run.rglob("events.out.tfevents.*")).parent
    images = EventAccumulator(str(events), size_guidance={"images": 0}).Reload().Images("eval/samples")
    samples = sorted((run / layout.EVAL_SAMPLES_FOLDER).iterdir())
    assert [image.step for image in images] == [2, 4]
    assert [p.name for p in samples] == ["eval-step-000002.gif", "eval-step-000004.gif"]
    assert images[1].encoded_image_string == samples[1].read_bytes() and samples[1].read_bytes()[:6] == b"GIF89a"
    assert layout.EVAL_SAMPLES_FOLDER in json.loads((run / layout.MANIFEST_FILE).read_text())["entries"]


def test_a_resumed_run_continues_the_evaluation_schedule(tmp_path: Path) -> None:
    settings = {"max_steps": 4, "eval_steps": 1, "eval_on_start": True, "save_strategy": "steps", "save_steps": 2}
    uninterrupted = evaluating_trainer(tmp_path / "whole", **settings)
    uninterrupted.train()
    whole = {r["step"]: r["eval_reward/total"] for r in eval_records(Path(uninterrupted.args.output_dir))}
    trainer = evaluating_trainer(tmp_path / "resumed", callbacks=[Interrupt(3, after="evaluation")], **settings)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    run = Path(trainer.args.output_dir)
    assert [r["step"] for r in eval_records(run)] == [0, 1, 2, 3]  # step 3 evaluated, not checkpointed
    resumed = evaluating_trainer(tmp_path / "resumed", **settings)
    resumed.train(resume_from_checkpoint=True)  # from checkpoint-2; eval_on_start must not evaluate step 2 again
    records = eval_records(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # each point once, none skipped
    assert {r["step"]: r["eval_reward/total"] for r in records} == pytest.approx(whole, abs=1e-6)
    samples = sorted(p.name for p in (run / layout.EVAL_SAMPLES_FOLDER).iterdir())
    assert samples == [layout.eval_samples_name("eval", step) for step in range(5)]


def test_an_evaluation_schedule_without_held_out_prompts_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"eval_strategy='steps' \(eval_on_start=False\).*there are none: pass eval_dataset"):
        SageGRPOTrainer(
            "not/a-model-that-exists", mean_brightness, args=make_args(tmp_path, eval_strategy="steps", eval_steps=1),
            train_dataset=PROMPTS,
        )  # fmt: skip
    with pytest.raises(ValueError, match="eval_dataset is one string"):
        SageGRPOTrainer(LinearBackbone(), mean_brightness, args=make_args(tmp_path), train_dataset=PROMPTS, eval_dataset="a cat")


def test_evaluating_during_training_leaves_the_training_unchanged(tmp_path: Path) -> None:
    evaluated = evaluating_trainer(tmp_path / "evaluated", max_steps=3, eval_steps=1, eval_on_start=True)
    evaluated.train()
    plain = SageGRPOTrainer(
        LinearBackbone(), mean_brightness, args=make_args(tmp_path / "plain", max_steps=3, report_to=["tensorboard"]),
        train_dataset=PROMPTS, peft_config=lora(),
    )  # fmt: skip
    plain.train()
    for (name, trained), (_, reference) in zip(
        evaluated.backbone.transformer.named_parameters(), plain.backbone.transformer.named_parameters()
    ):
        assert torch.equal(trained, reference), name
