"""The run folder (a training run's ``output_dir``) and everything that reads or writes it, in one place.

* `sage_trl.run_folder.layout`: the name of every file a run writes;
* `RunFolder`: what a folder holds and what this library wrote there (its manifest, `sage_trl.run_folder.manifest`);
* `plan_start`, `RunStart`: starting, resuming, overwriting and restarting a run in it (the rules:
  `sage_trl.run_folder.start`); `check_resume`: whether a checkpoint fits the command resuming it;
* `acquire_lock`: one training process per folder;
* `save_state` / `load_state`: checkpoint state as JSON plus safetensors (never pickle);
* `RunRecord` / `read_run`: what a finished run says about itself (for the model card and ``sage-push``).

The trainer, ``sage-train``, ``sage-push`` and the model card use these instead of repeating file names.
"""

from sage_trl.run_folder import layout
from sage_trl.run_folder.folder import RunFolder, RunFolderError
from sage_trl.run_folder.lock import RunInUseError, RunLock, acquire_lock
from sage_trl.run_folder.record import RunRecord, read_run
from sage_trl.run_folder.resume import check_resume
from sage_trl.run_folder.start import RunStart, plan_start
from sage_trl.run_folder.state import StateFormatError, load_state, save_state

__all__ = [
    "RunFolder",
    "RunFolderError",
    "RunInUseError",
    "RunLock",
    "RunRecord",
    "RunStart",
    "StateFormatError",
    "acquire_lock",
    "check_resume",
    "layout",
    "load_state",
    "plan_start",
    "read_run",
    "save_state",
]
