"""`RunFolder`: what a run folder holds, what this library wrote there, and the writes that keep it consistent.

The rules for starting, resuming, overwriting and restarting a run in a folder are `sage_trl.run_folder.start`;
docs/runs.md explains them to users.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from sage_trl.run_folder import layout
from sage_trl.run_folder.manifest import forget_entries, read_manifest, record_entries, recorded_entries

__all__ = ["RunFolder", "RunFolderError"]

_HOUSEKEEPING = (layout.LOCK_FILE, layout.MANIFEST_FILE)
"""Entries of the folder's bookkeeping, neither the run's data nor the user's."""


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

    def present(self) -> list[str]:
        """Names of everything in the folder but its bookkeeping (lock, manifest), sorted."""
        if not self.path.is_dir():
            return []
        return sorted(entry.name for entry in self.path.iterdir() if entry.name not in _HOUSEKEEPING)

    @property
    def owned(self) -> bool:
        """True when a run of this library claimed the folder (it has a manifest)."""
        return read_manifest(self.path) is not None

    def entries(self) -> list[str]:
        """The entries of the run present: recorded in the manifest, or, for a folder without one, every name a
        run writes (a run of an older version, or files that only carry such names)."""
        present = self.present()
        if self.owned:
            recorded = recorded_entries(self.path)
            return [name for name in present if name in recorded]
        return [name for name in present if layout.is_run_entry(name)]

    def foreign(self) -> list[str]:
        """What the folder holds that this library did not record writing (everything, without a manifest)."""
        recorded = recorded_entries(self.path)
        return [name for name in self.present() if name not in recorded]

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
        return self._read_records(layout.METRICS_FILE)

    def _read_records(self, name: str) -> list[dict[str, Any]]:
        path = self.path / name
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
        weights = [n for n in (layout.LORA_WEIGHT_NAME, layout.TRANSFORMER_FOLDER) if n in self.entries()]
        parts += [f"trained weights ({name})" for name in weights]
        steps = [step for step in self.metric_steps() if isinstance(step, int)]
        if steps:
            parts.append(f"{layout.METRICS_FILE} up to step {max(steps)}")
        try:
            completion = self.completion()
        except RunFolderError:
            completion = {}
        if completion:
            parts.append(
                f"a finished run (step {completion.get('global_step')} of {completion.get('max_steps')})"
            )
        described = {*checkpoints, *weights, layout.METRICS_FILE, layout.COMPLETE_FILE}
        others = [name for name in self.entries() if name not in described]
        if not parts or others:
            parts.append("files " + ", ".join(others))
        return "; ".join(parts)

    # -- writing ---------------------------------------------------------------------------------

    def record(self, *names: str) -> None:
        """Record in the manifest that the library is about to write these top-level entries."""
        record_entries(self.path, *names)

    def truncate_metrics(self, step: int) -> int:
        """Keep the records of steps ``<= step`` in ``metrics.jsonl`` and ``alarms.jsonl`` (and drop a partial
        line); returns how many metric records were dropped."""
        self._truncate_records(layout.ALARMS_FILE, step)
        return self._truncate_records(layout.METRICS_FILE, step)

    def _truncate_records(self, name: str, step: int) -> int:
        path = self.path / name
        if not path.is_file():
            return 0
        records = self._read_records(name)
        kept = [r for r in records if not isinstance(r.get("step"), int) or r["step"] <= step]
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(json.dumps(record) + "\n" for record in kept))
        os.replace(staging, path)
        return len(records) - len(kept)

    def truncate_eval_samples(self, step: int) -> int:
        """Delete the evaluation videos of steps ``> step`` (this library's, in `layout.EVAL_SAMPLES_FOLDER`): a
        resumed run evaluates those steps again. Returns how many were deleted."""
        folder = self.path / layout.EVAL_SAMPLES_FOLDER
        if layout.EVAL_SAMPLES_FOLDER not in self.entries() or not folder.is_dir():
            return 0
        later = [p for p in folder.iterdir() if (layout.eval_samples_step(p.name) or -1) > step and p.is_file()]
        for path in later:
            path.unlink()
        return len(later)

    def mark_complete(
        self, global_step: int, max_steps: int | None, status: str = "finished", **summary: Any
    ) -> Path:
        """Write ``training_complete.json``: the run finished (the last file a run writes). ``status``:
        ``finished``, or ``stopped_on_alarm`` (``stop_on_alarm``: not finished, so it resumes from its last
        checkpoint)."""
        record = {
            "status": status,
            "global_step": int(global_step),
            "max_steps": max_steps,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **summary,
        }
        self.record(layout.COMPLETE_FILE)
        path = self.path / layout.COMPLETE_FILE
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(staging, path)
        return path

    def remove_run(self) -> list[str]:
        """Delete every entry the manifest records (``overwrite_output_dir``, or restarting an unfinished run with
        nothing to resume); the user's own files stay. A folder without a manifest loses nothing."""
        removed = [name for name in self.present() if name in recorded_entries(self.path)]
        for name in removed:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        forget_entries(self.path)  # a name the user later gives one of their own files is theirs
        return removed
