"""A run folder's lock: one training process at a time, released by the operating system when it dies.

The lock is an advisory ``flock`` on ``<output_dir>/.sage-run.lock``. A second process (a second ``sage-train``
into the same folder, or a second `SageGRPOTrainer.train`) sees it at once and stops with an error naming the
holder; a crashed or killed process holds nothing (the kernel drops ``flock`` locks with the process), so a
stale lock file never blocks a later run. Within one process the lock is shared: the CLI claims the folder
before it loads the model and the trainer claims it again in ``train()`` without blocking itself.

``flock`` is local to a machine: on a network file system shared by several hosts it may not exclude a process
on another host (the lock file still names the holder's host for the error message).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock; the lock then only records the holder
    fcntl = None

from sage_trl.run_folder.layout import LOCK_FILE

__all__ = ["RunInUseError", "RunLock", "acquire_lock"]


class RunInUseError(ValueError):
    """Another process is training into the run folder."""


class RunLock:
    """A held lock on a run folder; `release` it (or let the process end)."""

    def __init__(self, folder: Path, handle: Any) -> None:
        self.folder, self._handle, self._holders = folder, handle, 1

    @property
    def held(self) -> bool:
        """True until released."""
        return self._handle is not None

    def release(self) -> None:
        """Drop one hold; the lock itself goes with the last one."""
        self._holders -= 1
        if self._holders > 0 or self._handle is None:
            return
        if fcntl is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
        _HELD.pop(self.folder, None)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


_HELD: dict[Path, RunLock] = {}


def _holder_description(path: Path) -> str:
    try:
        holder = json.loads(path.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
        return f"process {holder['pid']} on {holder['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def acquire_lock(folder: str | os.PathLike) -> RunLock:
    """Lock ``folder`` (created if missing) for this process; raise `RunInUseError` if another process holds it."""
    folder = Path(folder).resolve()
    if folder in _HELD:
        _HELD[folder]._holders += 1
        return _HELD[folder]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    handle = path.open("a+")
    if fcntl is not None:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunInUseError(
                f"{folder} is in use by {_holder_description(path)}, which is training into it. Wait for that run "
                "to finish, or choose another --output_dir."
            ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
    handle.flush()
    lock = RunLock(folder, handle)
    _HELD[folder] = lock
    return lock
