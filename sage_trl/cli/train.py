"""``sage-train``: train (evaluating on held-out prompts on ``eval_strategy``'s schedule), evaluate before and after
training, and write the run folder.

The order protects the user's data: every argument is parsed and validated, the rewards and prompts are
resolved and the run folder's plan is made (`sage_trl.run_folder.plan_start`: another run there, a missing
checkpoint, a finished run) before anything is loaded or written; only then is the folder claimed and
``run_config.yaml`` written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from transformers.trainer_utils import IntervalStrategy

from sage_trl.cli.arguments import TrainScriptArguments
from sage_trl.cli.parsing import parse_train_arguments
from sage_trl.cli.resolve import resolve_eval_prompts, resolve_reward, resolve_train_prompts
from sage_trl.model_facts import check_model_facts
from sage_trl.run_folder import RunFolder, RunFolderError, RunStart, check_resume, layout, plan_start
from sage_trl.run_folder.writes import guarded_write

__all__ = [
    "PreparedRun",
    "execute_training",
    "prepare_training",
    "resume_argument",
    "run_config_text",
    "run_training",
    "train_main",
]

_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0", ""}


def resume_argument(value: str | bool | None) -> str | bool | None:
    """``--resume_from_checkpoint``'s value: ``true`` (the latest checkpoint), ``false``/None, or a path."""
    if value is None or isinstance(value, bool):
        return value or None
    lowered = str(value).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return None
    return str(value)


def resolved_config(script_args: TrainScriptArguments, config: Any) -> dict[str, Any]:
    """Every field of both dataclasses as resolved (presets, YAML, flags, defaults): a valid ``--config`` file."""
    from sage_trl.config import SageGRPOConfig, refused_fields

    # generation_batch_size is derived from steps_per_generation (TRL refuses both set): record the latter only.
    names = {f.name for f in fields(SageGRPOConfig) if f.init} - refused_fields() - {"generation_batch_size"}
    names.discard("algorithm_args")  # the algorithm's own fields are written out, as flags and keys name them
    training = {k: v for k, v in json.loads(json.dumps(config.to_dict(), default=str)).items() if k in names}
    algorithm = config.algorithm_config()
    own = {f.name: getattr(algorithm, f.name) for f in algorithm.own_fields()}
    return {**asdict(script_args), **training, **own}


def run_config_text(script_args: TrainScriptArguments, config: Any) -> str:
    """``run_config.yaml``'s text for a run of these arguments: `resolved_config` as YAML."""
    return yaml.safe_dump(resolved_config(script_args, config), sort_keys=False)


def _write_run_config(script_args: TrainScriptArguments, config: Any, output_dir: Path) -> None:
    path = output_dir / layout.RUN_CONFIG_FILE
    with guarded_write(path.name, path, survived="nothing else was changed"):
        RunFolder(output_dir).record(path.name)
        path.write_text(run_config_text(script_args, config))


def _report_finished(start: RunStart) -> dict[str, Any]:
    finished = start.finished or {}
    print(
        f"{start.folder.path} holds a finished run (step {finished.get('global_step')} of "
        f"{finished.get('max_steps')}): nothing to train. Raise --max_steps to train further."
    )
    return {"finished": finished}


@dataclass
class PreparedRun:
    """A ``sage-train`` run whose arguments were all checked and resolved; nothing loaded or written yet."""

    script_args: TrainScriptArguments
    config: Any
    start: RunStart
    rewards: list[Any]
    train_prompts: Any
    eval_prompts: list[str]
    eval_rewards: list[Any]


def prepare_training(script_args: TrainScriptArguments, config: Any) -> PreparedRun:
    """Check everything that can be checked before loading a model: the run folder (another run, a missing
    checkpoint, a finished run), the reward functions, the prompts. Raises ``ValueError`` or ``OSError``."""
    config.resume_from_checkpoint = resume_argument(config.resume_from_checkpoint)
    start = plan_start(
        config.output_dir,
        resume_from_checkpoint=config.resume_from_checkpoint,
        overwrite=config.overwrite_output_dir,
        max_steps=config.max_steps,
    )
    if start.finished is not None:
        return PreparedRun(script_args, config, start, [], None, [], [])
    if start.checkpoint is not None:
        check_resume(start.checkpoint, config, script_args.peft_config())
    check_model_facts(config, script_args.peft_config())
    rewards = [resolve_reward(spec, offload=config.reward_offload) for spec in script_args.reward]
    eval_rewards = [resolve_reward(spec, offload=config.reward_offload) for spec in script_args.eval_reward]
    # toy rewards read the toy grammar
    toy_grammar = bool({"toy", "toy_hackable"} & {*script_args.reward, *script_args.eval_reward})
    train_prompts = resolve_train_prompts(script_args.dataset_name, script_args.dataset_split, toy_grammar)
    eval_prompts = resolve_eval_prompts(script_args.eval_prompts, script_args.num_eval_prompts, toy_grammar)
    if not eval_prompts and (config.eval_strategy != "no" or config.eval_on_start):
        # The toy preset evaluates every 5 steps; --num_eval_prompts 0 (or --eval_prompts none) means no evaluation.
        print(
            f"No held-out prompts (eval_prompts {script_args.eval_prompts!r}, num_eval_prompts "
            f"{script_args.num_eval_prompts}): no evaluation during training (eval_strategy no)."
        )
        config.eval_strategy, config.eval_on_start = IntervalStrategy.NO, False
    return PreparedRun(script_args, config, start, rewards, train_prompts, eval_prompts, eval_rewards)


def execute_training(run: PreparedRun) -> dict[str, Any]:
    """Build the trainer (the model loads), check a resumed checkpoint against it, and only then claim the folder,
    write ``run_config.yaml``, train, evaluate and write the outputs; returns the summary. A failure before the
    claim (a model that does not load, an adapter that does not fit) leaves the folder as it was."""
    if run.start.finished is not None:
        return _report_finished(run.start)
    trainer = _build_trainer(run)
    if run.start.checkpoint is not None:
        check_resume(run.start.checkpoint, trainer.args, trainer.peft_config)
    main_process = trainer.is_world_process_zero()
    _claim_on_every_process(run.start, trainer)
    try:
        if main_process:
            _write_run_config(run.script_args, run.config, Path(run.config.output_dir))
        return _train_and_evaluate(trainer, run)
    finally:
        run.start.end()


def run_training(script_args: TrainScriptArguments, config: Any) -> dict[str, Any]:
    """`prepare_training`, then `execute_training`: train, evaluate before/after, write the output folder."""
    return execute_training(prepare_training(script_args, config))


def _claim_on_every_process(start: RunStart, trainer: Any) -> None:
    """`RunStart.begin` once every process has validated; the main process's failure (another process holds the
    folder, a write failed) stops every process, where the others would otherwise wait for it forever."""
    from accelerate.utils import broadcast_object_list

    trainer.accelerator.wait_for_everyone()
    failure: list[Any] = [None]
    try:
        start.begin(main_process=trainer.is_world_process_zero())
    except Exception as error:  # reported on every process below; the main process re-raises its own
        failure = [f"{type(error).__name__}: {error}"]
        if trainer.accelerator.num_processes == 1:
            raise
        broadcast_object_list(failure)
        raise
    if trainer.accelerator.num_processes > 1:
        broadcast_object_list(failure)
        if failure[0] is not None:
            start.end()
            raise RunFolderError(f"The main process could not claim the run folder: {failure[0]}")
    trainer.accelerator.wait_for_everyone()


def _build_trainer(run: PreparedRun) -> Any:
    from sage_trl import SageGRPOTrainer
    from sage_trl.outputs import StatusCallback

    trainer = SageGRPOTrainer(
        None,
        run.rewards,
        args=run.config,
        train_dataset=run.train_prompts,
        eval_dataset=run.eval_prompts or None,
        eval_reward_funcs=run.eval_rewards or None,
        peft_config=run.script_args.peft_config(),
        callbacks=[StatusCallback()],
    )
    _quiet_trainer_printing(trainer)
    return trainer


def _train_and_evaluate(trainer: Any, run: PreparedRun) -> dict[str, Any]:
    config = trainer.args
    before = trainer.held_out_evaluation() if run.eval_prompts else None
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    summary = _finish_outputs(trainer, Path(config.output_dir), before)
    if config.push_to_hub:
        trainer.push_to_hub()
    return summary


def _quiet_trainer_printing(trainer: Any) -> None:
    """The status line replaces the Trainer's progress bar and its printed log dictionaries."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)


def _finish_outputs(trainer: Any, output_dir: Path, before: Any) -> dict:
    """The after evaluation, then (main process) the curves, ``eval_results.json``, the labelled before/after GIF
    and ``summary.md`` (`sage_trl.report`, from what the folder now records); returns the held-out summary."""
    from sage_trl.outputs import plot_reward_curves

    summary = _held_out_summary(before, trainer.held_out_evaluation()) if before is not None else {}
    if not trainer.is_world_process_zero():
        return summary
    if (output_dir / layout.METRICS_FILE).is_file():
        plot_reward_curves(output_dir / layout.METRICS_FILE, output_dir)
    survived = "the trained model and training_complete.json are already written"
    with guarded_write("the run's report", output_dir, survived=survived):
        if summary:
            _write_held_out(trainer, output_dir, summary)
        _write_report(output_dir)
    return {key: value for key, value in summary.items() if key != "videos"}


def _held_out_summary(before: Any, after: Any) -> dict[str, Any]:
    return {
        "before": before.means(),
        "after": after.means(),
        "before_std": before.stds(),
        "after_std": after.stds(),
        "prompts": before.prompts,
        "seeds": before.seeds,
        "videos": (before.videos, after.videos),
    }


def _write_held_out(trainer: Any, output_dir: Path, summary: dict[str, Any]) -> None:
    from sage_trl.outputs import save_comparison_gif
    from sage_trl.report import held_out_table

    RunFolder(output_dir).record(layout.EVAL_RESULTS_FILE, layout.SAMPLES_FILE)
    results = {key: value for key, value in summary.items() if key != "videos"}
    (output_dir / layout.EVAL_RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    labels = [f"{prompt} (seed {seed})" for prompt, seed in zip(summary["prompts"], summary["seeds"])]
    before, after = summary["videos"]
    save_comparison_gif(before, after, output_dir / layout.SAMPLES_FILE, fps=trainer.backbone.default_fps, labels=labels)
    print(f"\nHeld-out reward, {len(labels)} videos (before -> after training):\n{held_out_table(results)}\n")


def _write_report(output_dir: Path) -> None:
    from sage_trl.report import run_report
    from sage_trl.run_folder import read_run

    RunFolder(output_dir).record(layout.SUMMARY_FILE)
    record = read_run(output_dir)
    (output_dir / layout.SUMMARY_FILE).write_text(run_report(record))
    for alarm in record.alarms:
        print(alarm.line())
    print(f"Outputs written to {output_dir} (the report: {layout.SUMMARY_FILE})")


def train_main(argv: Sequence[str] | None = None) -> int:
    """``sage-train``: see `sage_trl.cli`. Returns the exit status.

    Every argument, path and the run folder are checked before any model is loaded; a problem there exits with
    one line naming the field or path and the fix (argparse's own errors exit with 2). Failures during training
    keep their traceback.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        script_args, config = parse_train_arguments(argv)
        # DeepSpeed (a dev extra) would print that it found no accelerator, on every CPU run
        if config.use_cpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        prepared = None if script_args.preflight else prepare_training(script_args, config)
    except (ValueError, OSError) as error:
        raise SystemExit(f"sage-train: error: {error}") from None
    if prepared is None:
        return _preflight(script_args, config)
    try:
        execute_training(prepared)
    except RunFolderError as error:  # raised before anything trains: one line, as for the arguments
        raise SystemExit(f"sage-train: error: {error}") from None
    return 0


def _preflight(script_args: TrainScriptArguments, config: Any) -> int:
    from sage_trl.preflight import preflight_main

    return preflight_main(
        script_args,
        config,
        gpu=script_args.gpu,
        gpu_memory_gib=script_args.gpu_memory_gib,
        world_size=script_args.preflight_world_size,
        fsdp=script_args.preflight_fsdp,
    )
