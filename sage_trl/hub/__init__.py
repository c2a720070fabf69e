"""Publish trained video models to the Hugging Face Hub.

* `push_output_dir`: a finished run's folder (or, with ``dry_run_dir``, the exact folder that would be uploaded);
* `build_upload_folder`: the allow-listed upload folder of a run, with its model card;
* `render_model_card`: the model card, from what the run recorded;
* `push_checkpoint`: intermediate pushes following TRL's ``hub_strategy``;
* `prepare_hub_repo`: check offline mode, token and endpoint, then create the repository (before training);
* `push_main`: the ``sage-push`` command; `HubPushError`: every environment problem, in one error.

Modules: `connection` (talking to the Hub), `upload` (what is uploaded), `card` (the model card), `cli`.
"""

from sage_trl.hub.card import render_model_card
from sage_trl.hub.cli import push_main
from sage_trl.hub.connection import HubPushError, prepare_hub_repo
from sage_trl.hub.upload import build_upload_folder, push_checkpoint, push_output_dir

__all__ = [
    "HubPushError",
    "build_upload_folder",
    "prepare_hub_repo",
    "push_checkpoint",
    "push_main",
    "push_output_dir",
    "render_model_card",
]
