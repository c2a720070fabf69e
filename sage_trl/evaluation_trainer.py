"""`EvaluationTrainerMixin`: the held-out evaluation as `transformers.Trainer.evaluate`, on its schedule.

transformers decides when to evaluate (``eval_strategy="steps"`` with ``eval_steps``, ``eval_on_start``) and calls
``evaluate``; here an evaluation samples the held-out prompts (``eval_dataset``) once per ``eval_seeds`` seed
deterministically, scores the videos with the training reward, the evaluation rewards (``eval_reward_funcs``,
logged and never optimised) and, on the toy world, its own measures, logs the means through ``Trainer.log`` (so
every ``report_to`` tracker and ``metrics.jsonl`` receive them, keyed by step), writes the videos into the run
folder (`layout.EVAL_SAMPLES_FOLDER`) and shows them in TensorBoard, Weights & Biases and Trackio. ``sage-train``'s
before/after evaluation is `held_out_evaluation`, the same sampling and scores.

A resumed run continues the schedule: transformers evaluates a step before it checkpoints it, so a checkpoint's
``trainer_state.json`` holds the evaluations up to its step, ``metrics.jsonl`` and the sample files are cut back
to it (`sage_trl.run_folder.RunStart.begin`), and an evaluation already logged at the current step
(``eval_on_start`` on resume) is not repeated.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import speed_metrics

from sage_trl import training_setup as setup
from sage_trl.evaluation import (
    TRAINING_REWARD_PREFIX,
    EvaluationResult,
    evaluate_policy,
    evaluation_metrics,
    metric_name,
    world_measures,
)
from sage_trl.outputs import log_video_to_trackers, save_video_gif
from sage_trl.run_folder import layout
from sage_trl.run_folder.manifest import record_entries
from sage_trl.run_folder.writes import guarded_write

__all__ = ["EvaluationTrainerMixin", "held_out_pairs"]


def held_out_pairs(prompts: list[str], seeds: list[int]) -> tuple[list[str], list[int]]:
    """Every prompt with every seed, prompt by prompt: the held-out videos' ``(prompts, seeds)``."""
    return [p for p in prompts for _ in seeds], [s for _ in prompts for s in seeds]


@contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode (no dropout), its own mode back afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _toy_prompts(prompts: list[str]) -> bool:
    """True when every prompt reads in the toy world's grammar (its measures apply)."""
    from sage_env.toy.world import parse_prompt

    try:
        for prompt in prompts:
            parse_prompt(prompt)
    except ValueError:
        return False
    return True


class EvaluationTrainerMixin:
    """``evaluate`` and `held_out_evaluation` for `SageGRPOTrainer` (uses its ``backbone``, ``reward``,
    ``eval_reward``, ``eval_dataset`` and ``pipeline_class``)."""

    def held_out_evaluation(self, eval_dataset: Any = None) -> EvaluationResult:
        """Sample every held-out prompt once per ``args.eval_seeds`` seed (deterministic, the same starting noise at
        every call) and score the videos; nothing is logged or written. ``eval_dataset``: prompts (a list or a
        Dataset with ``prompt``) in place of the trainer's."""
        dataset = self.eval_dataset if eval_dataset is None else setup.prompt_dataset(eval_dataset, "eval_dataset")
        if dataset is None:
            raise ValueError(
                "No held-out prompts to evaluate: pass eval_dataset (a list of prompts) to SageGRPOTrainer or to "
                "evaluate (sage-train: --eval_prompts)."
            )
        args = self.args
        prompts, seeds = held_out_pairs(list(dataset["prompt"]), list(args.eval_seeds))
        toy = self.pipeline_class == "toy" and _toy_prompts(prompts)
        device = self.backbone.device
        forked = [device] if device.type == "cuda" else []
        # The training's own random streams (its rollout shuffles) must not see the evaluation: evaluating
        # during training leaves the training unchanged (tested).
        with _eval_mode(self.backbone.transformer), torch.random.fork_rng(devices=forked):
            return evaluate_policy(
                self.backbone,
                self.reward,
                prompts,
                seeds,
                args.sampling(),
                negative_prompt=args.negative_prompt,
                batch_size=args.rollout_batch_size or setup.videos_per_round(args),
                measure=world_measures if toy else None,
                eval_reward=self.eval_reward,
            )

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """The held-out evaluation (`held_out_evaluation`) logged at the current step: metrics named by
        `sage_trl.evaluation.evaluation_metrics` (``eval_reward/total``, ...) to every tracker and
        ``metrics.jsonl``, the videos to ``eval_samples/`` and the video-capable trackers. An evaluation of the
        trainer's own prompts already logged at this step (a resumed run's ``eval_on_start``) is returned, not
        repeated."""
        logged = self._logged_evaluation(metric_key_prefix) if eval_dataset is None else None
        if logged is not None:
            return logged
        start = time.time()
        result = self.held_out_evaluation(eval_dataset)
        metrics = evaluation_metrics(result, metric_key_prefix)
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(result.prompts)))
        with _eval_mode(self.model):  # TRL's log adds the metrics of the model's mode: the training ones stay
            self.log(metrics)
        if self.is_world_process_zero():
            self._write_evaluation_videos(result, metric_key_prefix)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _logged_evaluation(self, prefix: str) -> dict[str, float] | None:
        """The metrics of an evaluation logged at the current step (``trainer_state.json``'s log history)."""
        marker = metric_name(TRAINING_REWARD_PREFIX + "total", prefix)
        for record in reversed(self.state.log_history):
            if record.get("step") == self.state.global_step and marker in record:
                return {key: value for key, value in record.items() if key.startswith(f"{prefix}_")}
        return None

    def _write_evaluation_videos(self, result: EvaluationResult, prefix: str) -> None:
        """One GIF per evaluation (a row per prompt, a column per seed) in the run folder, and in the trackers
        (TensorBoard, Weights & Biases, Trackio)."""
        folder = Path(self.args.output_dir) / layout.EVAL_SAMPLES_FOLDER
        path = folder / layout.eval_samples_name(prefix, self.state.global_step)
        with guarded_write(layout.EVAL_SAMPLES_FOLDER, path, survived="the checkpoints written so far are intact"):
            record_entries(self.args.output_dir, layout.EVAL_SAMPLES_FOLDER)
            folder.mkdir(parents=True, exist_ok=True)
            fps = self.args.fps or self.backbone.default_fps
            save_video_gif(result.videos, path, fps=fps, columns=len(self.args.eval_seeds))
        log_video_to_trackers(self.callback_handler.callbacks, f"{prefix}/samples", path, self.state.global_step)
