"""What `SageGRPOTrainer` does with its run folder and the Hub, on top of `transformers.Trainer`.

`RunFolderTrainerMixin.train` runs `transformers.Trainer.train` in a claimed run folder (the rules:
`sage_trl.run_folder`). It orders every save: the files are `sage_trl.checkpoints`'s (diffusers-format weights,
checkpoints written atomically and loaded without unpickling), pushing is `sage_trl.hub`'s. The mixin comes before
`trl.GRPOTrainer` in `SageGRPOTrainer`'s bases and uses the trainer's ``checkpoint_state`` family of methods and
its ``backbone``, ``reward`` and run attributes.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from sage_trl import _trl_compat, checkpoints, hub
from sage_trl.hub.upload import check_license
from sage_trl.run_folder import RunFolder, RunFolderError, RunStart, check_resume, layout, plan_start
from sage_trl.run_folder.writes import guarded_write

__all__ = ["RunFolderTrainerMixin"]

logger = logging.get_logger(__name__)


class RunFolderTrainerMixin:
    """`transformers.Trainer`'s ``train``, saving and Hub methods for a trainer whose ``output_dir`` is a run
    folder (`sage_trl.run_folder`)."""

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """`transformers.Trainer.train` in a claimed run folder (the rules: `sage_trl.run_folder.folder`).

        Before anything is loaded or written, a folder holding another run is refused (unless
        ``overwrite_output_dir``), a resume without a checkpoint is an error, and a finished run is reported as
        finished without training. At the end the final model is saved into ``output_dir`` and
        ``training_complete.json`` is written last: only a run that got there can be pushed.
        """
        start = self.plan_run(resume_from_checkpoint)
        if start.checkpoint is not None and start.finished is None:
            check_resume(start.checkpoint, self.args, self.peft_config)
        self.accelerator.wait_for_everyone()  # every process has validated before the main one writes
        start.begin(main_process=self.is_world_process_zero())
        if self.is_world_process_zero():
            self._record_logging_folder()
        try:
            self.accelerator.wait_for_everyone()
            if start.finished is not None:
                return self._finished_run(start.finished)
            output = self._train_from(start, trial, ignore_keys_for_eval, **kwargs)
            self._finish_run(output)
            return output
        finally:
            start.end()

    def _record_logging_folder(self) -> None:
        """transformers' TensorBoard callback writes its events into ``<output_dir>/runs/...`` unless
        ``TENSORBOARD_LOGGING_DIR`` says otherwise: the run wrote that folder, so the manifest records it."""
        from transformers.integrations.integration_utils import default_logdir

        reports = self.args.report_to or []
        if ("tensorboard" in reports or "all" in reports) and not os.getenv("TENSORBOARD_LOGGING_DIR"):
            RunFolder(self.args.output_dir).record(Path(default_logdir()).parts[0])

    def plan_run(self, resume_from_checkpoint: str | bool | None = None) -> RunStart:
        """How `train` would start in ``output_dir`` (see `sage_trl.run_folder.plan_start`); changes nothing."""
        return plan_start(
            self.args.output_dir,
            resume_from_checkpoint=resume_from_checkpoint,
            overwrite=self.args.overwrite_output_dir,
            max_steps=self.args.max_steps,
        )

    def _train_from(
        self, start: RunStart, trial: Any, ignore_keys_for_eval: Any, **kwargs: Any
    ) -> TrainOutput:
        checkpoint = str(start.checkpoint) if start.checkpoint is not None else None
        if checkpoint is not None and 0 < self.args.max_steps <= start.checkpoint_step:
            # Killed after its last checkpoint: no step is left. Restore the checkpoint and finish the run.
            self._load_from_checkpoint(checkpoint)
            self.state = TrainerState.load_from_json(os.path.join(checkpoint, layout.TRAINER_STATE_FILE))
            return TrainOutput(self.state.global_step, float("nan"), {})
        if checkpoint is not None and self.is_deepspeed_enabled:
            # DeepSpeed's engine restores the weights from its own checkpoint files, and transformers then skips
            # _load_from_checkpoint, which also restores the trainer's own state (anchor, counters, rollout seeds).
            self._load_trainer_state(checkpoint)
        try:
            return super().train(
                resume_from_checkpoint=checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
                **kwargs,
            )
        # transformers loads its checkpoint files with weights_only=True: a pickled object raises this.
        except pickle.UnpicklingError as error:
            raise RunFolderError(
                f"Refused to load checkpoint {checkpoint}: one of its files holds pickled objects other than "
                f"tensors and numbers, which could run code when loaded ({error}). Resume from a checkpoint you "
                "wrote yourself."
            ) from error

    def _finish_run(self, output: TrainOutput) -> None:
        """Save the final model into ``output_dir``, then write the completion record (main process)."""
        with guarded_write("the final model", self.args.output_dir, survived=self._survivor()):
            # Internal: transformers would push from save_model, before the completion record exists.
            self.save_model(self.args.output_dir, _internal_call=True)
            if self.is_world_process_zero():
                summary = {k: v for k, v in output.metrics.items() if isinstance(v, (int, float))}
                stopped = getattr(self, "stopped_by_alarm", None)
                if stopped is not None:
                    summary["stopped_by_alarm"] = stopped.line()
                RunFolder(self.args.output_dir).mark_complete(
                    self.state.global_step,
                    self.state.max_steps,
                    status="finished" if stopped is None else "stopped_on_alarm",
                    **summary,
                )

    def _survivor(self) -> str:
        return checkpoints.survivor(self.args.output_dir)

    def _finished_run(self, completion: dict[str, Any]) -> TrainOutput:
        """A finished run asked to resume: load its final weights, train nothing, say so."""
        checkpoints.load_model_weights(self.backbone, self.args.output_dir, lora=self.peft_config is not None)
        self.state.global_step = int(completion["global_step"])
        self.state.max_steps = completion.get("max_steps") or self.state.global_step
        logger.warning(
            "%s holds a finished run (step %s of %s): nothing to train. Raise max_steps to train further.",
            self.args.output_dir,
            completion["global_step"],
            completion.get("max_steps"),
        )
        return TrainOutput(self.state.global_step, float(completion.get("train_loss", float("nan"))), {})

    def _hub_repo_id(self) -> str:
        """TRL's convention: ``hub_model_id``, else the output folder's name (in the token's namespace)."""
        return (
            getattr(self, "hub_model_id", None)
            or self.args.hub_model_id
            or Path(self.args.output_dir).absolute().name
        )

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Before training with ``push_to_hub=True``: check license, token and network and create the repo, so a
        push that cannot happen fails now rather than after training."""
        self.push_in_progress = None
        if not self.is_world_process_zero():
            return
        check_license(self.args.hub_license)
        private = private if private is not None else self.args.hub_private_repo
        _, self.hub_model_id = hub.prepare_hub_repo(
            self._hub_repo_id(), token=token or self.args.hub_token, private=private
        )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Upload ``output_dir`` (diffusers-format weights, config and run record, curves, samples, model card).

        Refuses a run that did not finish. Only the main process uploads. ``kwargs``: ``license``, ``base_model``.
        """
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        return hub.push_output_dir(
            self.args.output_dir,
            self._hub_repo_id(),
            private=private if private is not None else self.args.hub_private_repo,
            token=token or self.args.hub_token,
            license=kwargs.pop("license", None) or self.args.hub_license,
            commit_message=commit_message or "End of training",
            revision=revision or self.args.hub_revision,
            **kwargs,
        )

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Intermediate push of a checkpoint following ``hub_strategy`` (the weights in the diffusers format)."""
        if not self.is_world_process_zero() or not self.args.push_to_hub:
            return
        hub.push_checkpoint(
            checkpoint_folder,
            self._hub_repo_id(),
            strategy=str(getattr(self.args.hub_strategy, "value", self.args.hub_strategy)),
            license=self.args.hub_license,
            token=self.args.hub_token,
            private=self.args.hub_private_repo,
            revision=self.args.hub_revision,
        )

    def run_record(self) -> dict[str, Any]:
        """The ``run`` block of ``sage_config.json`` (`sage_trl.checkpoints.run_record`)."""
        return checkpoints.run_record(
            model_name_or_path=self.model_name_or_path,
            pipeline_class=self.pipeline_class,
            reward_funcs=self.reward.reward_funcs,
            reward_weights=self.resolved_reward_weights,
            dataset=self.dataset_name,
        )

    def _save(self, output_dir: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Save the adapter (diffusers LoRA format) or the full transformer (diffusers folder) and the config.

        Main process only: under FSDP, transformers calls this on every process with the state dict it gathered,
        which is full on the main process and empty on the others.
        """
        if self.args.should_save:
            config = {**self.args.to_dict(), "run": self.run_record()}
            checkpoints.write_model_files(
                output_dir or self.args.output_dir, self.backbone, lora=self.peft_config is not None,
                config=config, state_dict=state_dict,
            )  # fmt: skip

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Write ``checkpoint-N`` into ``tmp-checkpoint-N`` and rename it at the end (see `sage_trl.checkpoints`);
        push it if ``hub_strategy`` asks."""
        run_dir = self._get_output_dir(trial=trial)
        name = layout.checkpoint_name(self.state.global_step)
        staging = os.path.join(run_dir, f"{layout.STAGING_PREFIX}-{self.state.global_step}")
        if self.args.should_save and os.path.exists(staging):
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        self.store_flos()
        state = self.checkpoint_state()  # on every process: a sharded (FSDP2) anchor is gathered
        with guarded_write(name, staging, survived=checkpoints.survivor(run_dir), cleanup=Path(staging)):
            if self.args.should_save:
                RunFolder(run_dir).record(os.path.basename(staging), name)
            self.save_model(staging, _internal_call=True)
            _trl_compat.save_trainer_checkpoint_parts(self, staging)
            if self.args.should_save:
                checkpoints.write_state(staging, state)
            if self.accelerator.num_processes > 1:
                checkpoints.write_state(staging, self.process_state(), self.accelerator.process_index)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            final = os.path.join(run_dir, name)
            checkpoints.replace_directory(staging, final)
            if self.args.push_to_hub:
                self._push_from_checkpoint(final)
            _trl_compat.rotate_checkpoints(self, run_dir)
        self.accelerator.wait_for_everyone()

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        """Restore weights (adapter or transformer) and the trainer's state from ``resume_from_checkpoint``."""
        checkpoints.load_model_weights(
            self.backbone, resume_from_checkpoint, lora=self.peft_config is not None
        )
        self._load_trainer_state(resume_from_checkpoint)

    def _load_trainer_state(self, checkpoint: str) -> None:
        """Restore the trainer's own state from ``checkpoint``: the shared one (``checkpoint_state``), then this
        process's own (``process_state``) where the checkpoint has it."""
        device = self.accelerator.device
        self.load_checkpoint_state(checkpoints.read_state(checkpoint, device))
        if self.accelerator.num_processes == 1:
            return
        own = checkpoints.read_state(checkpoint, device, self.accelerator.process_index)
        if own is not None:
            self.load_process_state(own)
        else:
            logger.warning(
                "%s has no state of process %d (it was written by fewer processes): this process resumes with the "
                "main process's buffered rollouts and timestep generator.",
                checkpoint,
                self.accelerator.process_index,
            )
