"""``sage-push``: publish a finished ``sage-train`` run (adapter, config, curves, samples, model card) to the Hub."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sage_trl.hub.connection import HubPushError
from sage_trl.hub.upload import DEFAULT_COMMIT_MESSAGE, push_output_dir
from sage_trl.run_folder import RunFolder, layout

__all__ = ["push_main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sage-push",
        description="Publish a finished sage-train run (adapter, config, curves, samples, model card) to the Hub.",
    )
    parser.add_argument("output_dir", help="The output_dir of a finished training run.")
    parser.add_argument("--repo-id", required=True, help="Target model repository, USER/NAME or ORG/NAME.")
    parser.add_argument(
        "--license", help="Hub license id of the published weights (e.g. apache-2.0). Required."
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="Write the exact upload folder to DIR (default: OUTPUT_DIR/hub-dry-run) and upload nothing.",
    )
    parser.add_argument(
        "--token", help="Hub token; default: HF_TOKEN, then the login cache (`hf auth login`)."
    )
    parser.add_argument(
        "--endpoint", help="Hub endpoint URL; default: HF_ENDPOINT or https://huggingface.co."
    )
    parser.add_argument("--base-model", help="Hub id of the base model, when model_name_or_path is not one.")
    parser.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE, help="Commit message.")
    return parser


def _dry_run_dir(output_dir: str, requested: str) -> Path:
    if requested:
        return Path(requested)
    default = Path(output_dir) / layout.HUB_DRY_RUN_FOLDER
    folder = RunFolder(output_dir)
    if layout.HUB_DRY_RUN_FOLDER in folder.entries() and folder.owned:
        # An earlier dry run's, recorded in the run's manifest; never uploaded (not allow-listed).
        shutil.rmtree(default, ignore_errors=True)
    folder.record(layout.HUB_DRY_RUN_FOLDER)
    return default


def push_main(argv: Sequence[str] | None = None) -> int:
    """``sage-push OUTPUT_DIR --repo-id USER/NAME [--license L] [--private] [--dry-run [DIR]] [--token T]
    [--endpoint URL] [--base-model ID]``: publish a finished run. Returns the exit status (0 on success)."""
    args = _parser().parse_args(argv)
    dry_run = _dry_run_dir(args.output_dir, args.dry_run) if args.dry_run is not None else None
    try:
        result = push_output_dir(
            args.output_dir,
            args.repo_id,
            private=True if args.private else None,
            token=args.token,
            license=args.license,
            commit_message=args.commit_message,
            endpoint=args.endpoint,
            dry_run_dir=dry_run,
            base_model=args.base_model,
        )
    except (ValueError, HubPushError) as error:
        print(f"sage-push: error: {error}", file=sys.stderr)
        return 1
    if isinstance(result, Path):
        names = sorted(p.relative_to(result).as_posix() for p in result.rglob("*") if p.is_file())
        print(f"Dry run: nothing uploaded. The upload folder is {result}:\n  " + "\n  ".join(names))
    else:
        print(f"Pushed {args.output_dir} to {result.repo_url} ({result.commit_url})")
    return 0
