"""What is uploaded, and the uploads: the allow-listed folder of a run, ``sage-push``'s push, checkpoint pushes.

The upload folder is assembled from an allow-list, never by uploading the output folder as is:

* the weights: ``pytorch_lora_weights.safetensors`` (diffusers LoRA format, what ``pipe.load_lora_weights(repo_id)``
  loads) or, after full fine-tuning, the diffusers ``transformer/`` folder;
* ``sage_adapter.json``: the adapter's ``LoraConfig`` and how to load it;
* ``sage_config.json`` (the resolved config and the run record, tokens redacted), ``metrics.jsonl``,
  ``eval_results.json``, ``summary.md``, the reward curves and ``samples_before_after.gif`` when the run wrote them;
* ``README.md``: the model card (`sage_trl.hub.card`).

Checkpoints (``checkpoint-*/``), optimizer and RNG state are never part of it, except for the resumable
``last-checkpoint/`` that ``hub_strategy="checkpoint"`` asks for (transformers' convention).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import CommitInfo, HfApi

from sage_trl.hub.card import ADAPTER_INFO_FILE, render_model_card, resolve_base_model
from sage_trl.hub.connection import HubPushError, check_repo_id, connect, create_repo, hub_errors
from sage_trl.run_folder import RunFolderError, RunRecord, layout, read_run
from sage_trl.run_folder.record import LORA_PREFIX, check_inside

__all__ = [
    "DEFAULT_COMMIT_MESSAGE",
    "build_upload_folder",
    "check_license",
    "push_checkpoint",
    "push_output_dir",
]

logger = logging.getLogger(__name__)

DEFAULT_COMMIT_MESSAGE = "Upload SAGE-GRPO video model"
README_FILE = "README.md"
_LICENSE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


def check_license(license: str | None) -> str:
    """``license`` if it is a Hub license id; a ``ValueError`` saying how to choose one otherwise."""
    if not license:
        raise ValueError(
            "A license is required to publish: pass --license (sage-push) or license= / hub_license (trainer) with "
            "a Hub license id, e.g. apache-2.0, mit, openrail, cc-by-nc-4.0, or 'other'. Check the base model's "
            "license: an adapter usually inherits its terms."
        )
    if not _LICENSE_PATTERN.match(license):
        raise ValueError(f"license must be a lowercase Hub license id like 'apache-2.0', got {license!r}.")
    return license


def finished_run(output_dir: str | os.PathLike) -> RunRecord:
    """The run in ``output_dir`` if it finished (trained weights, config, ``training_complete.json``)."""
    run = read_run(output_dir)
    if not run.complete:
        raise RunFolderError(
            f"{run.directory} has weights but no {layout.COMPLETE_FILE}: the run did not finish, so nothing is "
            "pushed. Resume it (--resume_from_checkpoint true) until it finishes."
        )
    return run


def _place(source: Path, target: Path, link: bool) -> None:
    """Copy ``source`` to ``target``; with ``link``, hard-link where possible (large weights stage for free)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if link:
        with contextlib.suppress(OSError):
            os.link(source, target)
            return
    shutil.copyfile(source, target)


def _adapter_info(run: RunRecord, base_model: str | None) -> dict[str, Any]:
    lora = dict(run.lora_config or {})
    return {
        "format": "diffusers-lora",
        "weight_name": layout.LORA_WEIGHT_NAME,
        "expert_2_weight_name": layout.EXPERT_2_LORA_WEIGHT_NAME if run.second_expert else None,
        "prefix": LORA_PREFIX,
        "r": lora.get("r"),
        "lora_alpha": lora.get("lora_alpha"),
        "target_modules": sorted(lora.get("target_modules") or []),
        "base_model": base_model,
        "pipeline_class": run.base_model.get("pipeline_class"),
        "lora_config": lora,
    }


def _redacted_config(path: Path) -> bytes:
    """``sage_config.json``'s bytes, with any token value replaced (`TrainingArguments.to_dict` already masks
    ``*_token`` fields; a config written another way must not leak a secret to a public repo)."""
    content = path.read_bytes()
    config = json.loads(content)
    leaked = [
        k for k, v in config.items() if k.endswith("_token") and isinstance(v, str) and not v.startswith("<")
    ]
    if not leaked:
        return content
    for key in leaked:
        config[key] = f"<{key.upper()}>"
    return (json.dumps(config, indent=2) + "\n").encode()


def _empty_folder(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"{path} must be an empty or new folder: the upload folder is written there.")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_upload_folder(
    output_dir: str | os.PathLike,
    staging_dir: str | os.PathLike,
    *,
    repo_id: str,
    license: str | None,
    base_model: str | None = None,
    in_progress_step: int | None = None,
    link: bool = False,
) -> Path:
    """Write into ``staging_dir`` (new or empty) exactly the files to upload for the run in ``output_dir``.

    ``base_model`` names the Hub id of the base model when the run does not know it; ``in_progress_step`` marks an
    intermediate push; ``link`` hard-links large files instead of copying them (temporary staging). Returns
    ``staging_dir``.
    """
    license = check_license(license)
    check_repo_id(repo_id)
    run = read_run(output_dir)
    staging = _empty_folder(staging_dir)
    if run.is_lora:
        for name in (layout.LORA_WEIGHT_NAME, *([layout.EXPERT_2_LORA_WEIGHT_NAME] if run.second_expert else [])):
            _place(check_inside(run.directory, run.directory / name), staging / name, link)
        info = _adapter_info(run, resolve_base_model(run, base_model))
        (staging / ADAPTER_INFO_FILE).write_text(
            json.dumps(info, indent=2, sort_keys=True, default=str) + "\n"
        )
    else:
        folders = [layout.TRANSFORMER_FOLDER, *([layout.EXPERT_2_FOLDER] if run.second_expert else [])]
        for source in sorted(p for folder in folders for p in (run.directory / folder).rglob("*")):
            if check_inside(run.directory, source).is_file():
                _place(source, staging / source.relative_to(run.directory), link)
    (staging / layout.CONFIG_FILE).write_bytes(_redacted_config(run.directory / layout.CONFIG_FILE))
    optional = [layout.METRICS_FILE, layout.ALARMS_FILE, layout.EVAL_RESULTS_FILE, layout.SUMMARY_FILE, *run.curves]
    for name in [*optional, *([run.samples] if run.samples else [])]:
        if (run.directory / name).is_file():
            _place(run.directory / name, staging / name, link)
    card = render_model_card(
        run, repo_id=repo_id, license=license, base_model=base_model, in_progress_step=in_progress_step
    )
    (staging / README_FILE).write_text(str(card), encoding="utf-8")
    return staging


def push_output_dir(
    output_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    license: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    endpoint: str | None = None,
    dry_run_dir: str | os.PathLike | None = None,
    base_model: str | None = None,
    revision: str | None = None,
    timeout: float = 10.0,
) -> CommitInfo | Path:
    """Publish a finished run's ``output_dir`` to ``repo_id`` (created if needed); returns the commit.

    Refuses a run that did not finish (no ``training_complete.json``). With ``dry_run_dir``, writes there exactly
    the folder that would be uploaded, contacts nothing and returns that folder. Token: ``token``, else
    ``HF_TOKEN``, else the login cache. ``private=True`` creates a private repo; an existing repo keeps its
    visibility. Environment problems raise one `HubPushError`; bad arguments raise ``ValueError``.
    """
    check_license(license)
    finished_run(output_dir)
    if dry_run_dir is not None:
        return build_upload_folder(
            output_dir, dry_run_dir, repo_id=check_repo_id(repo_id), license=license, base_model=base_model
        )
    api, full_id = connect(repo_id, token=token, endpoint=endpoint, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="sage-push-") as staging:
        # Assembled before the repo is created: a folder that cannot be published leaves nothing on the Hub.
        folder = build_upload_folder(
            output_dir,
            Path(staging) / "upload",
            repo_id=full_id,
            license=license,
            base_model=base_model,
            link=True,
        )
        create_repo(api, full_id, private)
        with hub_errors("upload to", full_id):
            return api.upload_folder(
                repo_id=full_id, folder_path=folder, commit_message=commit_message, revision=revision
            )


def _checkpoint_step(checkpoint_dir: Path) -> int | None:
    return layout.checkpoint_step(checkpoint_dir.name)


def push_checkpoint(
    checkpoint_dir: str | os.PathLike,
    repo_id: str,
    *,
    strategy: str,
    license: str | None,
    token: str | None = None,
    private: bool | None = None,
    endpoint: str | None = None,
    revision: str | None = None,
    raise_on_error: bool = False,
) -> list[CommitInfo]:
    """Intermediate push of a saved ``checkpoint-N`` following TRL's ``hub_strategy``.

    ``every_save``, ``checkpoint`` and ``all_checkpoints`` upload the checkpoint's diffusers-format weights, config
    and a "training in progress" card to the repo root; ``checkpoint`` also uploads the whole checkpoint (to
    resume) to ``last-checkpoint/`` and ``all_checkpoints`` to ``checkpoint-N/``; ``end`` pushes nothing. A failed
    intermediate push logs a warning and returns ``[]`` (training goes on) unless ``raise_on_error``.
    """
    if strategy == "end":
        return []
    checkpoint_dir = Path(checkpoint_dir)
    try:
        api, full_id = connect(repo_id, token=token, endpoint=endpoint)
        with tempfile.TemporaryDirectory(prefix="sage-push-") as staging:
            folder = build_upload_folder(
                checkpoint_dir,
                Path(staging) / "upload",
                repo_id=full_id,
                license=license,
                in_progress_step=_checkpoint_step(checkpoint_dir),
                link=True,
            )
            create_repo(api, full_id, private)
            return _upload_checkpoint(api, full_id, folder, checkpoint_dir, strategy, revision)
    except (HubPushError, ValueError) as error:
        if raise_on_error:
            raise
        logger.warning("Intermediate push of %s skipped: %s", checkpoint_dir, error)
        return []


def _upload_checkpoint(
    api: HfApi, repo_id: str, folder: Path, checkpoint_dir: Path, strategy: str, revision: str | None
) -> list[CommitInfo]:
    message = f"Training in progress, step {_checkpoint_step(checkpoint_dir)}"
    with hub_errors("upload to", repo_id):
        commits = [
            api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=message, revision=revision)
        ]
        if strategy in ("checkpoint", "all_checkpoints"):
            path_in_repo = "last-checkpoint" if strategy == "checkpoint" else checkpoint_dir.name
            commits.append(
                api.upload_folder(
                    repo_id=repo_id,
                    folder_path=checkpoint_dir,
                    path_in_repo=path_in_repo,
                    commit_message=f"{message}, checkpoint",
                    revision=revision,
                )
            )
    return commits
