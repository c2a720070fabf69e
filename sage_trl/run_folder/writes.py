"""Failed writes into a run folder in plain words: a full disk says so, and the last good checkpoint stays.

torch reports a full disk during ``torch.save`` as ``RuntimeError: [enforce fail at inline_container.cc:...]
unexpected pos`` and safetensors as its own error type; neither says "disk full". `RunWriteError` does, names
what was being written, where, and what survived.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["RunWriteError", "guarded_write"]

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}
# What torch's zip writer and safetensors say when a write comes up short (the OS error is swallowed).
_SHORT_WRITE_MARKERS = ("unexpected pos", "PytorchStreamWriter failed", "file write failed", "No space left")
_LOW_SPACE_BYTES = 64 * 2**20


class RunWriteError(OSError):
    """Writing into the run folder failed (disk full, no permission, ...); the message says what survived."""


def _errno_of(error: BaseException) -> int | None:
    while error is not None:
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno
        error = error.__cause__ or error.__context__
    return None


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def _cause(error: BaseException, path: Path) -> str | None:
    """The plain-words cause of a failed write, or None when it is not a storage problem."""
    code = _errno_of(error)
    if code in _DISK_FULL:
        return "the disk is full (no space left on the device)"
    if code in _NO_PERMISSION:
        return "there is no permission to write there (or the file system is read-only)"
    if any(marker in str(error) for marker in _SHORT_WRITE_MARKERS):
        free = _free_bytes(path)
        if free is not None and free < _LOW_SPACE_BYTES:
            return f"the disk is full ({free / 2**20:.0f} MiB free)"
        return "the write came up short (disk full, quota, or the file system failed)"
    return None


@contextmanager
def guarded_write(what: str, path: str | os.PathLike, *, survived: str, cleanup: Path | None = None) -> Iterator[None]:
    """Run a write; on a storage failure remove ``cleanup`` (a partial folder) and raise `RunWriteError`.

    Args:
        what: what is written ("checkpoint-40", "the final adapter").
        path: where.
        survived: what the user still has, e.g. "the last good checkpoint is .../checkpoint-20".
        cleanup: a staging folder to delete after a failure (it frees the space the failed write took).
    """
    path = Path(path)
    try:
        yield
    except Exception as error:
        cause = _cause(error, path)
        if cause is None:
            raise
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        raise RunWriteError(
            f"Could not write {what} to {path}: {cause}. {survived[0].upper()}{survived[1:]}. Free space (or fix the "
            "permissions) and resume with --resume_from_checkpoint true."
        ) from error
