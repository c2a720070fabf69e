"""Starting, resuming, overwriting and restarting a run in a folder: `plan_start` decides, `RunStart.begin` acts.

The rules (docs/runs.md explains them to users):

* A new run starts in a new or empty folder, or in a folder this library created (it has a manifest,
  `sage_trl.run_folder.manifest`) that holds no run. A folder holding a run is an error naming what it holds
  and the ways on: resume it (``resume_from_checkpoint``), write elsewhere (another ``output_dir``), or replace it
  (``overwrite_output_dir``, which deletes the entries the manifest records and nothing else).
* A folder this library did not create (no manifest: a diffusers model folder, a folder of your own files) is
  never written into by a new run and never overwritten: the error says what it holds.
* An unfinished run with no checkpoint (killed before its first save) has nothing to resume: the same command
  run again replaces it, without ``overwrite_output_dir``.
* Resuming needs a checkpoint: ``True`` takes the latest ``checkpoint-N``, a path must be a complete
  ``checkpoint-N`` folder written by `SageGRPOTrainer` (a ``tmp-checkpoint-N`` staging folder, a checkpoint whose
  recorded step disagrees with its name, are refused). Whether the checkpoint fits the command (algorithm, model,
  adapter shape, ...) is `sage_trl.run_folder.resume`. Everything is checked before any file is touched.
* A finished run (``training_complete.json``, ``global_step >= max_steps``) resumed is reported as finished and
  trains no step. A run killed after its last checkpoint, with no steps left, is finalised without training.
* Before training resumes, ``metrics.jsonl`` is cut back to the checkpoint's step, so every step is in it once.
* Only the main process changes the folder, and only after every argument was validated (`plan_start` changes
  nothing; `RunStart.begin` claims the lock and then writes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers.utils import logging

from sage_trl.run_folder import layout
from sage_trl.run_folder.folder import RunFolder, RunFolderError, _read_json
from sage_trl.run_folder.lock import RunLock, acquire_lock
from sage_trl.run_folder.manifest import create_manifest

__all__ = ["RunStart", "checkpoint_global_step", "plan_start"]

logger = logging.get_logger(__name__)

_SHOWN = 8


@dataclass
class RunStart:
    """What starting a run in a folder means; `plan_start` decides it without changing anything.

    Args:
        folder: the run folder.
        checkpoint: the checkpoint to resume from, or None for a fresh run.
        overwrite: the folder's earlier run (its recorded entries) is deleted when the run begins.
        restart: the folder holds an unfinished run without a checkpoint, replaced when the run begins.
        finished: the folder's run finished already and the config asks for no more steps: nothing to train.
    """

    folder: RunFolder
    checkpoint: Path | None = None
    overwrite: bool = False
    restart: bool = False
    finished: dict[str, Any] | None = None
    _lock: RunLock | None = field(default=None, init=False, repr=False)
    _depth: int = field(default=0, init=False, repr=False)

    @property
    def checkpoint_step(self) -> int | None:
        """The resumed checkpoint's global step."""
        return None if self.checkpoint is None else checkpoint_global_step(self.checkpoint)

    def begin(self, main_process: bool = True) -> RunStart:
        """Claim the folder: the main process takes the lock, records the folder as a run folder (its manifest),
        deletes an overwritten or restarted run and cuts the metrics back to the resumed checkpoint. Every process
        records the run as begun, so a nested `plan_start` of the same folder (the CLI begins, then the trainer)
        continues it instead of refusing it. Pair with `end`."""
        self._depth += 1
        _BEGUN[self.folder.path.resolve()] = self
        if self._depth > 1 or not main_process:
            return self
        try:
            self._lock = acquire_lock(self.folder.path)
            # new, or a run of an earlier version being resumed: its entries are the run's
            if not self.folder.owned:
                create_manifest(
                    self.folder.path, self.folder.entries() if self.checkpoint is not None else []
                )
            if self.overwrite or self.restart:
                removed = self.folder.remove_run()
                logger.warning(
                    "%s: removed the earlier run's %s.", self.folder.path, ", ".join(removed) or "nothing"
                )
            if self.checkpoint is not None and self.finished is None:
                self.folder.truncate_metrics(self.checkpoint_step)
                self.folder.truncate_eval_samples(self.checkpoint_step)
                (self.folder.path / layout.COMPLETE_FILE).unlink(missing_ok=True)
        except BaseException:
            self.end()
            raise
        return self

    def end(self) -> None:
        """Undo one `begin`; the last one releases the lock."""
        self._depth -= 1
        if self._depth > 0:
            return
        _BEGUN.pop(self.folder.path.resolve(), None)
        if self._lock is not None:
            self._lock.release()
            self._lock = None


_BEGUN: dict[Path, RunStart] = {}


def checkpoint_global_step(checkpoint: Path) -> int:
    """The global step a checkpoint folder records (its ``trainer_state.json``)."""
    state = checkpoint / layout.TRAINER_STATE_FILE
    if not state.is_file():
        raise RunFolderError(
            f"{checkpoint} has no {layout.TRAINER_STATE_FILE}: it is not a trainer checkpoint."
        )
    step = _read_json(state).get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RunFolderError(f"{state} records no valid global_step ({step!r}); the checkpoint is damaged.")
    return step


def _check_checkpoint(checkpoint: Path) -> Path:
    """A complete ``checkpoint-N`` written by SageGRPOTrainer, whose recorded step is N."""
    if checkpoint.name.startswith(layout.STAGING_PREFIX):
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} is a checkpoint being written when its run stopped (a staging "
            "folder, possibly incomplete); resume from a checkpoint-N folder, or pass true for the latest complete one."
        )
    step = layout.checkpoint_step(checkpoint.name)
    if step is None:
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} is not a checkpoint-N folder; pass one, or true for the latest."
        )
    if not (checkpoint / layout.STATE_FILE).is_file():
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} has no {layout.STATE_FILE}: it is not a checkpoint written by "
            "SageGRPOTrainer (checkpoints of older versions, with sage_state.pt, cannot be resumed safely)."
        )
    recorded = checkpoint_global_step(checkpoint)
    if recorded != step:
        raise RunFolderError(
            f"{checkpoint} records global_step {recorded} in {layout.TRAINER_STATE_FILE} but its name says step {step}: "
            "the checkpoint was modified or mixed with another; resume from an unmodified checkpoint."
        )
    return checkpoint


def _resolve_checkpoint(folder: RunFolder, resume_from_checkpoint: bool | str) -> Path:
    if resume_from_checkpoint is True:
        latest = folder.latest_checkpoint()
        if latest is None:
            if folder.completion() is not None:
                hint = "It holds a finished run saved without checkpoints (save_strategy no): it cannot train further."
            elif folder.owned and folder.holds_run():
                hint = (
                    "It holds an unfinished run that was stopped before its first checkpoint: run the same command "
                    "without --resume_from_checkpoint to start it over (nothing else is deleted)."
                )
            else:
                hint = "Start a new run instead, or pass a checkpoint path."
            raise RunFolderError(
                f"resume_from_checkpoint=True but {folder.path} holds no checkpoint-N folder to resume from "
                f"(checkpoints need save_strategy='steps'). {hint}"
            )
        return _check_checkpoint(latest)
    checkpoint = Path(resume_from_checkpoint)
    if not checkpoint.is_dir():
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} does not exist (or is not a folder); pass a checkpoint-N folder "
            "or True for the latest checkpoint of output_dir."
        )
    return _check_checkpoint(checkpoint)


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _refuse_foreign(folder: RunFolder) -> None:
    """A non-empty folder without a manifest: this library did not create it and writes nothing there."""
    held = folder.present()
    if (folder.path / "model_index.json").is_file():
        what = "a diffusers model folder (model_index.json)"
    elif folder.entries():
        what = "files named like a run's (a run of an earlier version, or files of yours)"
    else:
        what = "files this library did not write"
    raise RunFolderError(
        f"output_dir {folder.path} was not created by sage-train and holds {what}: {_listing(held)}. Nothing there is "
        "written or deleted (overwrite_output_dir only deletes what a run recorded writing). Choose a new or empty "
        "--output_dir."
    )


def _plan_new_run(folder: RunFolder, overwrite: bool) -> RunStart:
    if not folder.present():
        return RunStart(folder)
    if not folder.owned:
        _refuse_foreign(folder)
    if not folder.holds_run():
        return RunStart(folder)  # only the user's own files are left: they stay
    if overwrite:
        return RunStart(folder, overwrite=True)
    if not folder.checkpoints() and folder.completion() is None:
        return RunStart(folder, restart=True)  # killed before its first checkpoint: nothing to resume
    raise RunFolderError(
        f"output_dir {folder.path} already holds a run ({folder.describe()}). To continue it pass "
        "--resume_from_checkpoint true (or a checkpoint path); to keep it, choose another --output_dir; "
        "to delete it and start over, pass --overwrite_output_dir true."
    )


def plan_start(
    output_dir: str | os.PathLike,
    *,
    resume_from_checkpoint: bool | str | None = None,
    overwrite: bool = False,
    max_steps: int | None = None,
) -> RunStart:
    """Decide how a run starts in ``output_dir``; raise `RunFolderError` when it cannot. Changes nothing.

    Args:
        output_dir: the run folder (may not exist yet).
        resume_from_checkpoint: None/False (new run), True (latest checkpoint) or a checkpoint path.
        overwrite: replace a run the folder holds (transformers' ``overwrite_output_dir`` convention).
        max_steps: the configured number of optimizer steps (``<= 0``: unknown); decides whether a finished run
            has steps left.
    """
    folder = RunFolder(output_dir)
    begun = _BEGUN.get(folder.path.resolve())
    if begun is not None:  # this process began this run already (e.g. sage-train, then the trainer)
        return begun
    if folder.path.exists() and not folder.path.is_dir():
        raise RunFolderError(f"output_dir {folder.path} is a file; pass a folder (it is created if missing).")
    if resume_from_checkpoint in (None, False, ""):
        return _plan_new_run(folder, overwrite)
    finished = _finished(folder, max_steps)
    if finished is not None and resume_from_checkpoint is True:
        return RunStart(folder, finished=finished)  # nothing to train, whether or not it kept checkpoints
    checkpoint = _resolve_checkpoint(folder, resume_from_checkpoint)
    inside = checkpoint.resolve().parent == folder.path.resolve()
    if not inside and folder.present():
        if not folder.owned:
            _refuse_foreign(folder)
        if folder.holds_run() and not overwrite:
            raise RunFolderError(
                f"Resuming from {checkpoint} into output_dir {folder.path}, which holds another run "
                f"({folder.describe()}); choose an empty output_dir or pass --overwrite_output_dir true."
            )
    return RunStart(
        folder, checkpoint, overwrite=not inside and overwrite, finished=_finished(folder, max_steps)
    )


def _finished(folder: RunFolder, max_steps: int | None) -> dict[str, Any] | None:
    """The completion record when the run finished and ``max_steps`` asks for no more steps."""
    completion = folder.completion()
    if not completion or completion.get("status") != "finished":
        return None
    target = max_steps if max_steps and max_steps > 0 else completion.get("max_steps")
    return completion if target is None or completion["global_step"] >= target else None
