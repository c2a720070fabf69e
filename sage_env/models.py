"""How a video model samples by default (`SamplingDefaults`), and finding a model's pipeline class without loading it.

Every default of a video model (size, steps, schedule, guidance, frame rate) is declared once, on its backbone
class (`sage_env.backbones.VideoBackbone.sampling_defaults`), which the backbone plug-in group finds by the
``_class_name`` of the model's ``model_index.json`` (`sage_env.backbones.BACKBONES`;
`sage_env.backbones.sampling_defaults` reads it):

==========================  ======  =========  =====  =======================  ===================  ===
pipeline class              frames  height x   steps  shift                    guidance             fps
                                    width
==========================  ======  =========  =====  =======================  ===================  ===
``WanPipeline``             81      480 x 832  20     the checkpoint's own     the pipeline's (5)   16
``HunyuanVideo15Pipeline``  81      480 x 848  20     the checkpoint's own     the pipeline's       24
                                                                               guider (6 at 480p)
``toy``                     8       16 x 16    10     3                        1 (no CFG)           8
==========================  ======  =========  =====  =======================  ===================  ===

``shift=None`` means "the schedule the pipeline's own ``__call__`` sets on its scheduler as shipped"
(`sage_env.backbones.VideoBackbone.sigmas`): flow shift 3 for the Wan 2.1 / 2.2 T2V checkpoints, 5 for
HunyuanVideo 1.5 480p (the paper's setting, Sec. 4.1). ``guidance_scale=None`` means the pipeline's own
default. 20 steps is the paper's setting (Sec. 4.1); the pipelines' ``__call__`` default is 50. The toy model's
defaults are declared here (`TOY_SAMPLING_DEFAULTS`, which its backbone class names) because the toy world's
definition reads them and must not import diffusers. This module imports neither torch nor diffusers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GENERIC_SAMPLING_DEFAULTS",
    "MODEL_INDEX",
    "TOY_SAMPLING_DEFAULTS",
    "SamplingDefaults",
    "check_local_reference",
    "pipeline_class_of",
]

MODEL_INDEX = "model_index.json"
"""The file of a diffusers pipeline folder whose ``_class_name`` names the pipeline class."""


@dataclass(frozen=True)
class SamplingDefaults:
    """How a model samples by default.

    Args:
        num_frames, height, width: the video size (None: the model declares none; pass one).
        num_steps: denoising steps (None: the model's, when these are a run's choices over the model's).
        shift: the schedule's time shift; None: the pipeline's own scheduler as shipped.
        guidance_scale: classifier-free guidance scale; None: the pipeline's own default.
        fps: frame rate of the videos (for rewards and written files).
    """

    num_frames: int | None
    height: int | None
    width: int | None
    num_steps: int | None
    shift: float | None
    guidance_scale: float | None
    fps: float

    def filled_from(self, model: SamplingDefaults) -> SamplingDefaults:
        """These settings with each unset one (None) taken from ``model``'s declaration (a backbone's
        ``sampling_defaults``): a run's or a command line's choices over the model's defaults."""
        own = asdict(self)
        return SamplingDefaults(
            **{name: getattr(model, name) if value is None else value for name, value in own.items()}
        )

    def env_kwargs(self) -> dict[str, Any]:
        """The keywords of `sage_env.DenoisingVectorEnv` these defaults set (guidance belongs to the policy)."""
        values = asdict(self)
        del values["guidance_scale"]
        return {name: value for name, value in values.items() if value is not None}


TOY_SAMPLING_DEFAULTS = SamplingDefaults(
    num_frames=8, height=16, width=16, num_steps=10, shift=3.0, guidance_scale=1.0, fps=8.0
)
"""The toy model's: the prior was trained at 8 x 16 x 16 with noise levels drawn at shift 3 and is sampled with 10
Euler steps and no CFG (its model card); `sage_env.backbones.toy.ToyBackbone.sampling_defaults` is this."""

GENERIC_SAMPLING_DEFAULTS = SamplingDefaults(
    num_frames=None, height=None, width=None, num_steps=20, shift=5.0, guidance_scale=1.0, fps=16.0
)
"""What a backbone that declares no defaults gets: the paper's 20 steps at shift 5, no CFG, no video size."""


def check_local_reference(reference: str | os.PathLike, field: str) -> bool:
    """True when ``reference`` is an existing local path, False when it can only be a Hub repo id.

    Raises ``ValueError`` naming ``field`` when it can only be a local path (absolute, starting with ``.`` or
    ``~``, or not a valid Hub id such as ``a/b/c``) and nothing exists there, instead of the Hub's repo-id
    validation error.
    """
    text = os.fspath(reference)
    if not text:
        raise ValueError(f"{field} is empty; pass a local folder or a Hub repo id.")
    if Path(text).expanduser().exists():
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        hub_id = False
    else:
        hub_id = not text.startswith((".", "~"))
    if not hub_id:
        raise ValueError(
            f"{field}: {text} does not exist; check the path (or pass a Hub repo id like org/name)."
        )
    return False


def pipeline_class_of(model: str | os.PathLike, *, download: bool = False) -> str | None:
    """The ``_class_name`` of a model's ``model_index.json``, read without loading any weight.

    ``"toy"`` is the built-in toy model. A local folder is read directly; a Hub id is read from the local Hub
    cache, or fetched (``model_index.json`` only) when ``download`` is True. Returns None for a Hub id that is
    not cached when ``download`` is False. Raises ``ValueError`` for a local path that does not exist or a
    folder without ``model_index.json``.
    """
    text = os.fspath(model)
    if text == "toy":
        return "toy"
    if check_local_reference(text, "model"):
        index = Path(text).expanduser() / MODEL_INDEX
        if not index.is_file():
            raise ValueError(f"model: {text} has no {MODEL_INDEX}; point to a diffusers pipeline folder.")
        return _class_name(index)
    cached = _hub_index(text, download)
    return None if cached is None else _class_name(cached)


def _hub_index(repo_id: str, download: bool) -> Path | None:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, MODEL_INDEX)
    if isinstance(cached, str):
        return Path(cached)
    if not download:
        return None
    try:
        return Path(hf_hub_download(repo_id, MODEL_INDEX))
    except Exception as error:  # the Hub's errors vary (offline, gated, missing); all mean "cannot read it"
        raise ValueError(
            f"model: cannot read {MODEL_INDEX} of the Hub repo {repo_id!r} and no local folder has that name "
            f"({type(error).__name__}: {error})."
        ) from error


def _class_name(index: Path) -> str:
    name = json.loads(index.read_text()).get("_class_name")
    if not isinstance(name, str):
        raise ValueError(f"{index} has no _class_name; it is not a diffusers pipeline's {MODEL_INDEX}.")
    return name
