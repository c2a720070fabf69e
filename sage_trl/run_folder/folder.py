"""`RunFolder`: what a run folder holds, and the rules for starting, resuming and finishing a run in it.

The rules (docs/runs.md explains them to users):

* A new run starts only in a folder that holds no run. A folder holding one is an error naming what it holds
  and the ways on: resume it (``resume_from_checkpoint``), write elsewhere (another ``output_dir``), or replace
  it (``overwrite_output_dir``, which deletes the earlier run's files and nothing else).
* Resuming needs a checkpoint: ``True`` takes the latest ``checkpoint-N`` (an error when there is none), a path
  must be a checkpoint folder written by `SageGRPOTrainer`. Both are checked before any model is loaded.
* A finished run (``training_complete.json``, ``global_step >= max_steps``) resumed is reported as finished and
  trains no step. A run killed after its last checkpoint, with no steps left, is finalised without training.
* Before training resumes, ``metrics.jsonl`` is cut back to the checkpoint's step, so every step is in it once.
* Only the main process changes the folder, and only after every argument was validated (`plan_start`
  changes nothing; `RunStart.begin` claims the lock and then writes).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sage_trl.run_folder import layout
from sage_trl.run_folder.lock import RunLock, acquire_lock

__all__ = ["RunFolder", "RunFolderError", "RunStart", "plan_start"]


class RunFolderError(ValueError):
    """The run folder cannot be used as asked (it holds another run, has no checkpoint to resume, ...)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RunFolderError(f"{path} is not readable JSON ({error}); was it written completely?") from error


class RunFolder:
    """A training run's ``output_dir`` (see `sage_trl.run_folder.layout` for its files)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    # -- inspection ------------------------------------------------------------------------------

    def entries(self) -> list[str]:
        """Names of the run's files and folders present (checkpoints included), sorted."""
        if not self.path.is_dir():
            return []
        return sorted(entry.name for entry in self.path.iterdir() if layout.is_run_entry(entry.name))

    def holds_run(self) -> bool:
        """True when the folder holds anything a run writes."""
        return bool(self.entries())

    def checkpoints(self) -> list[Path]:
        """The ``checkpoint-N`` folders, by step."""
        if not self.path.is_dir():
            return []
        found = [p for p in self.path.iterdir() if p.is_dir() and layout.checkpoint_step(p.name) is not None]
        return sorted(found, key=lambda p: layout.checkpoint_step(p.name))

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint with the highest step, or None."""
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None

    def completion(self) -> dict[str, Any] | None:
        """The completion record (``training_complete.json``), or None when the run did not finish."""
        path = self.path / layout.COMPLETE_FILE
        return _read_json(path) if path.is_file() else None

    def metric_steps(self) -> list[int]:
        """The step of every record in ``metrics.jsonl``."""
        return [record.get("step") for record in self.read_metrics()]

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` (empty when there is none); a truncated last line is skipped."""
        path = self.path / layout.METRICS_FILE
        if not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a kill mid-write leaves a partial last line
        return records

    def describe(self) -> str:
        """One line on what the folder holds, for error messages."""
        parts = []
        checkpoints = [p.name for p in self.checkpoints()]
        if checkpoints:
            parts.append(f"{len(checkpoints)} checkpoint(s) up to {checkpoints[-1]}")
        weights = [name for name in (layout.LORA_WEIGHT_NAME, layout.TRANSFORMER_FOLDER) if (self.path / name).exists()]
        parts += [f"trained weights ({name})" for name in weights]
        steps = [step for step in self.metric_steps() if isinstance(step, int)]
        if steps:
            parts.append(f"{layout.METRICS_FILE} up to step {max(steps)}")
        try:
            completion = self.completion()
        except RunFolderError:
            completion = {}
        if completion:
            parts.append(f"a finished run (step {completion.get('global_step')} of {completion.get('max_steps')})")
        described = {*checkpoints, *weights, layout.METRICS_FILE, layout.COMPLETE_FILE}
        others = [name for name in self.entries() if name not in described]
        if not parts or others:
            parts.append("files " + ", ".join(others))
        return "; ".join(parts)

    # -- writing ---------------------------------------------------------------------------------

    def truncate_metrics(self, step: int) -> int:
        """Keep the records of steps ``<= step`` (and drop a partial line); returns how many were dropped."""
        path = self.path / layout.METRICS_FILE
        if not path.is_file():
            return 0
        records = self.read_metrics()
        kept = [r for r in records if not isinstance(r.get("step"), int) or r["step"] <= step]
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(json.dumps(record) + "\n" for record in kept))
        os.replace(staging, path)
        return len(records) - len(kept)

    def mark_complete(self, global_step: int, max_steps: int | None, **summary: Any) -> Path:
        """Write ``training_complete.json``: the run finished (the last file a run writes)."""
        record = {
            "status": "finished",
            "global_step": int(global_step),
            "max_steps": max_steps,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **summary,
        }
        path = self.path / layout.COMPLETE_FILE
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(staging, path)
        return path

    def remove_run(self) -> list[str]:
        """Delete every file and folder the library wrote (``overwrite_output_dir``); the user's own stay."""
        removed = self.entries()
        for name in removed:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        return removed


@dataclass
class RunStart:
    """What starting a run in a folder means; `plan_start` decides it without changing anything.

    Args:
        folder: the run folder.
        checkpoint: the checkpoint to resume from, or None for a fresh run.
        overwrite: the folder's earlier run is deleted when the run begins.
        finished: the folder's run finished already and the config asks for no more steps: nothing to train.
    """

    folder: RunFolder
    checkpoint: Path | None = None
    overwrite: bool = False
    finished: dict[str, Any] | None = None
    _lock: RunLock | None = field(default=None, init=False, repr=False)
    _depth: int = field(default=0, init=False, repr=False)

    @property
    def checkpoint_step(self) -> int | None:
        """The resumed checkpoint's global step."""
        return None if self.checkpoint is None else _checkpoint_global_step(self.checkpoint)

    def begin(self, main_process: bool = True) -> RunStart:
        """Claim the folder: the main process takes the lock, deletes an overwritten run and cuts the metrics
        back to the resumed checkpoint. Every process records the run as begun, so a nested `plan_start` of the
        same folder (the CLI begins, then the trainer) continues it instead of refusing it. Pair with `end`."""
        self._depth += 1
        _BEGUN[self.folder.path.resolve()] = self
        if self._depth > 1 or not main_process:
            return self
        try:
            self._lock = acquire_lock(self.folder.path)
            if self.overwrite:
                self.folder.remove_run()
            if self.checkpoint is not None and self.finished is None:
                self.folder.truncate_metrics(self.checkpoint_step)
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


def _checkpoint_global_step(checkpoint: Path) -> int:
    state = checkpoint / layout.TRAINER_STATE_FILE
    if state.is_file():
        return int(_read_json(state).get("global_step", 0))
    step = layout.checkpoint_step(checkpoint.name)
    if step is None:
        raise RunFolderError(f"{checkpoint} has no {layout.TRAINER_STATE_FILE}: it is not a trainer checkpoint.")
    return step


def _resolve_checkpoint(folder: RunFolder, resume_from_checkpoint: bool | str) -> Path:
    if resume_from_checkpoint is True:
        latest = folder.latest_checkpoint()
        if latest is None:
            raise RunFolderError(
                f"resume_from_checkpoint=True but {folder.path} holds no checkpoint-N folder to resume from "
                "(checkpoints need save_strategy='steps'). Start a new run instead, or pass a checkpoint path."
            )
        return latest
    checkpoint = Path(resume_from_checkpoint)
    if not checkpoint.is_dir():
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} does not exist (or is not a folder); pass a checkpoint-N folder "
            "or True for the latest checkpoint of output_dir."
        )
    if not (checkpoint / layout.STATE_FILE).is_file():
        raise RunFolderError(
            f"resume_from_checkpoint {checkpoint} has no {layout.STATE_FILE}: it is not a checkpoint written by "
            "SageGRPOTrainer (checkpoints of older versions, with sage_state.pt, cannot be resumed safely)."
        )
    return checkpoint


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
        if folder.holds_run() and not overwrite:
            raise RunFolderError(
                f"output_dir {folder.path} already holds a run ({folder.describe()}). To continue it pass "
                "--resume_from_checkpoint true (or a checkpoint path); to keep it, choose another --output_dir; "
                "to delete it and start over, pass --overwrite_output_dir true."
            )
        return RunStart(folder, overwrite=overwrite and folder.holds_run())
    checkpoint = _resolve_checkpoint(folder, resume_from_checkpoint)
    inside = checkpoint.resolve().parent == folder.path.resolve()
    if not inside and folder.holds_run() and not overwrite:
        raise RunFolderError(
            f"Resuming from {checkpoint} into output_dir {folder.path}, which holds another run "
            f"({folder.describe()}); choose an empty output_dir or pass --overwrite_output_dir true."
        )
    return RunStart(folder, checkpoint, overwrite=not inside and overwrite, finished=_finished(folder, max_steps))


def _finished(folder: RunFolder, max_steps: int | None) -> dict[str, Any] | None:
    """The completion record when the run finished and ``max_steps`` asks for no more steps."""
    completion = folder.completion()
    if not completion or completion.get("status") != "finished":
        return None
    target = max_steps if max_steps and max_steps > 0 else completion.get("max_steps")
    return completion if target is None or completion["global_step"] >= target else None
