"""The run folder's manifest (``.sage-run.json``): what this library wrote into the folder.

A run folder is the user's data, and a folder name can be anything, so a file name alone does not say who wrote a
file: a user's own ``summary.md`` and a diffusers model's ``transformer/`` carry names a run also writes. The
manifest is written when a run first claims a folder (`RunStart.begin`) and every writer records the top-level
entry it is about to create (`record_entries`) before creating it. Overwriting or restarting a run deletes the
recorded entries and nothing else; a folder without a manifest was not created by this library and is never
overwritten.
"""

from __future__ import annotations

import json
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from sage_trl.run_folder.layout import MANIFEST_FILE

__all__ = ["create_manifest", "forget_entries", "read_manifest", "record_entries", "recorded_entries"]


def _library_version() -> str:
    try:
        return metadata.version("sage-grpo")
    except metadata.PackageNotFoundError:
        return "unknown"


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of ``folder``; None when it has none (or an unreadable one, which counts as none)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file() or path.is_symlink():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entries = manifest.get("entries") if isinstance(manifest, dict) else None
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        return None
    return manifest


def _write(folder: Path, manifest: dict[str, Any]) -> None:
    path = folder / MANIFEST_FILE
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(staging, path)


def create_manifest(folder: str | os.PathLike, entries: list[str] | None = None) -> None:
    """Start the manifest of a folder the library claims (``entries``: what it already wrote there, if anything)."""
    _write(
        Path(folder),
        {
            "written_by": f"sage-grpo {_library_version()}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "entries": sorted(set(entries or [])),
        },
    )


def recorded_entries(folder: str | os.PathLike) -> set[str]:
    """The top-level names the library recorded writing into ``folder`` (empty without a manifest)."""
    manifest = read_manifest(folder)
    return set(manifest["entries"]) if manifest else set()


def forget_entries(folder: str | os.PathLike) -> None:
    """Empty the manifest's record (after the recorded entries were deleted)."""
    manifest = read_manifest(folder)
    if manifest is not None and manifest["entries"]:
        manifest["entries"] = []
        _write(Path(folder), manifest)


def record_entries(folder: str | os.PathLike, *names: str) -> None:
    """Record that the library is about to write these top-level entries of ``folder`` (call before writing).

    A folder without a manifest (not claimed by a run: a checkpoint's own folder, a folder a user saves into with
    ``save_model``) records nothing.
    """
    manifest = read_manifest(folder)
    if manifest is None or set(names) <= set(manifest["entries"]):
        return
    manifest["entries"] = sorted(set(manifest["entries"]) | set(names))
    _write(Path(folder), manifest)
