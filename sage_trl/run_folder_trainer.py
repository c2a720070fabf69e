"""What `SageGRPOTrainer` does with its run folder and the Hub, on top of `transformers.Trainer`.

`RunFolderTrainerMixin.train` runs `transformers.Trainer.train` in a claimed run folder (the rules:
`sage_trl.run_folder`), saving goes through `sage_trl.checkpoints` (diffusers-format weights, checkpoints written
atomically and loaded without unpickling) and pushing through `sage_trl.hub`. The mixin comes before
`trl.GRPOTrainer` in `SageGRPOTrainer`'s bases; it needs the trainer's ``checkpoint_state`` family of methods
(`sage_trl.checkpoints` calls them).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from sage_trl import checkpoints, hub
from sage_trl.hub.upload import check_license
from sage_trl.run_folder import RunFolder, RunFolderError, RunStart, layout, plan_start
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
        self.accelerator.wait_for_everyone()  # every process has validated before the main one writes
        start.begin(main_process=self.is_world_process_zero())
        try:
            self.accelerator.wait_for_everyone()
            if start.finished is not None:
                return self._finished_run(start.finished)
            output = self._train_from(start, trial, ignore_keys_for_eval, **kwargs)
            self._finish_run(output)
            return output
        finally:
            start.end()

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
            checkpoints.load_trainer_state(self, checkpoint)
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
            self.save_model(self.args.output_dir)
            if self.is_world_process_zero():
                summary = {k: v for k, v in output.metrics.items() if isinstance(v, (int, float))}
                RunFolder(self.args.output_dir).mark_complete(
                    self.state.global_step, self.state.max_steps, **summary
                )

    def _survivor(self) -> str:
        latest = RunFolder(self.args.output_dir).latest_checkpoint()
        return f"the last good checkpoint is {latest}" if latest else "no checkpoint was written"

    def _finished_run(self, completion: dict[str, Any]) -> TrainOutput:
        """A finished run asked to resume: load its final weights, train nothing, say so."""
        checkpoints.load_model_weights(self, self.args.output_dir)
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

    def _save(self, output_dir: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Save the adapter (diffusers LoRA format) or the full transformer (diffusers folder) and the config."""
        checkpoints.save_model_files(self, output_dir or self.args.output_dir, state_dict)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Write ``checkpoint-N`` atomically (`sage_trl.checkpoints.save_checkpoint`)."""
        checkpoints.save_checkpoint(self, trial)

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        """Restore weights (adapter or transformer) and the trainer's state from ``resume_from_checkpoint``."""
        checkpoints.load_checkpoint(self, resume_from_checkpoint)
