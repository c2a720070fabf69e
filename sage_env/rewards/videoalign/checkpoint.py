"""A released VideoAlign checkpoint: locating its files (local folder or Hub repo), model_config.json, the template.

The layout, as KwaiVGI released it (``KwaiVGI/VideoReward`` on the Hugging Face Hub)::

    model_config.json                 data / model / LoRA settings and the per-metric mean and std
    checkpoint-<step>/model.pth       a peft state dict: transformers-4.45 key names, LoRA not merged
    checkpoint-<step>/tokenizer/      Qwen2 tokenizer with the three reward tokens
    prompt_template.txt               the prompt template the checkpoint was trained with (user-supplied)
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase, Qwen2VLConfig

__all__ = [
    "REWARD_TOKENS",
    "TEMPLATE_FILENAME",
    "VideoAlignCheckpoint",
    "VideoAlignSettings",
    "find_videoalign_checkpoint",
    "load_prompt_template",
    "resolve_videoalign_folder",
]

REWARD_TOKENS: dict[str, str] = {"vq": "<|VQ_reward|>", "mq": "<|MQ_reward|>", "ta": "<|TA_reward|>"}
"""Metric name -> the special token whose final hidden state the reward head reads (in prompt order)."""

VIDEO_TOKEN = "<|video_pad|>"
TEMPLATE_PLACEHOLDER = "{text_prompt}"
TEMPLATE_FILENAME = "prompt_template.txt"
"""Where the loader looks for the prompt template inside the checkpoint folder when no path is given."""


@dataclass(frozen=True)
class VideoAlignCheckpoint:
    """The files of one released VideoAlign checkpoint.

    Args:
        root: the folder holding ``model_config.json``.
        step: the training step of the chosen ``checkpoint-<step>`` subfolder.
        weights_path: ``checkpoint-<step>/model.pth``.
        tokenizer_path: ``checkpoint-<step>/tokenizer``.
        model_config: the parsed ``model_config.json``.
    """

    root: Path
    step: int
    weights_path: Path
    tokenizer_path: Path
    model_config: dict[str, Any]


def find_videoalign_checkpoint(path: str | os.PathLike, step: int | None = None) -> VideoAlignCheckpoint:
    """Locate ``model_config.json`` and ``checkpoint-<step>/{model.pth, tokenizer/}`` (default: the latest step)."""
    root = Path(path)
    config_path = root / "model_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found: point to a VideoAlign checkpoint folder as released "
            "(model_config.json + checkpoint-<step>/model.pth + checkpoint-<step>/tokenizer/)."
        )
    steps = sorted(
        int(match.group(1))
        for child in root.iterdir()
        if child.is_dir() and (match := re.fullmatch(r"checkpoint-(\d+)", child.name))
    )
    if not steps:
        raise FileNotFoundError(f"No checkpoint-<step> folder in {root}.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"No checkpoint-{step} in {root}; available steps: {steps}.")
    folder = root / f"checkpoint-{step}"
    weights_path, tokenizer_path = folder / "model.pth", folder / "tokenizer"
    if not weights_path.is_file():
        raise FileNotFoundError(
            f"{weights_path} not found; only the full-state-dict layout (model.pth) of VideoAlign is supported."
        )
    if not tokenizer_path.is_dir():
        raise FileNotFoundError(f"Tokenizer folder {tokenizer_path} not found.")
    try:
        with config_path.open(encoding="utf-8") as file:
            model_config = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{config_path} is not valid JSON ({error}); restore model_config.json from the release."
        ) from error
    if not isinstance(model_config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(model_config).__name__}.")
    return VideoAlignCheckpoint(root, step, weights_path, tokenizer_path, model_config)


def resolve_videoalign_folder(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
) -> Path:
    """The checkpoint folder of ``name_or_path``: a local folder as it is, else a Hub repo id (``KwaiVGI/VideoReward``).

    A repo is fetched with ``huggingface_hub.snapshot_download``, so the Hugging Face cache (``HF_HUB_CACHE``
    or ``cache_dir``) is reused and offline mode (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) reads
    the cached snapshot without touching the network.
    """
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        folder = snapshot_download(
            str(name_or_path),
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
        )
    except (OSError, ValueError, HfHubHTTPError) as error:
        raise OSError(
            f"{str(name_or_path)!r} is not a local folder and could not be fetched as a Hugging Face Hub repo "
            f"({type(error).__name__}: {error}). Pass the released checkpoint folder, or a repo id such as "
            "'KwaiVGI/VideoReward' that is cached or reachable (offline mode reads only the cache)."
        ) from error
    return Path(folder)


@dataclass(frozen=True)
class VideoAlignSettings:
    """What ``model_config.json`` says about inference.

    Args:
        base_model: ``model_config.model_name_or_path``, where the Qwen2-VL architecture config comes from.
        output_dim: outputs of ``rm_head`` (1 or 3), or None when not given (read from the weights).
        lora_rank: ``peft_lora_config.lora_r`` (checked against the weights), None when not given.
        lora_alpha: ``peft_lora_config.lora_alpha``, None when not given.
        use_rslora: scale LoRA by ``alpha / sqrt(r)`` instead of ``alpha / r``.
        sample_fps: ``data_config.fps``.
        num_frames: ``data_config.num_frames`` (a fixed frame count), usually None.
        max_pixels: ``data_config.max_frame_pixels``.
        normalization: ``{metric: (mean, std)}`` from ``inference_config``, None when absent.
    """

    base_model: str | None
    output_dim: int | None
    lora_rank: int | None
    lora_alpha: float | None
    use_rslora: bool
    sample_fps: float
    num_frames: int | None
    max_pixels: int | None
    normalization: dict[str, tuple[float, float]] | None

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any]) -> VideoAlignSettings:
        """Parse and check a ``model_config.json`` dictionary."""
        data = model_config.get("data_config") or {}
        model = model_config.get("model_config") or {}
        lora = model_config.get("peft_lora_config") or {}
        if model.get("use_special_tokens") is False or model.get("reward_token", "special") != "special":
            raise ValueError(
                "This VideoAlign checkpoint does not read its scores at the reward tokens (use_special_tokens is "
                "false); only the released special-token models are supported."
            )
        if data.get("sample_type", "uniform") != "uniform":
            raise ValueError(
                f"Unsupported frame sampling {data['sample_type']!r}; only 'uniform' is supported."
            )
        return cls(
            base_model=model.get("model_name_or_path"),
            output_dim=model.get("output_dim"),
            lora_rank=lora.get("lora_r") if lora.get("lora_enable", True) else None,
            lora_alpha=lora.get("lora_alpha") if lora.get("lora_enable", True) else None,
            use_rslora=bool(lora.get("use_rslora", False)),
            sample_fps=float(data.get("fps") or 2.0),
            num_frames=int(data["num_frames"]) if data.get("num_frames") else None,
            max_pixels=data.get("max_frame_pixels"),
            normalization=_parse_normalization(model_config.get("inference_config")),
        )


def _parse_normalization(inference_config: Mapping[str, Any] | None) -> dict[str, tuple[float, float]] | None:
    if not inference_config:
        return None
    keys = [f"{metric.upper()}_{stat}" for metric in REWARD_TOKENS for stat in ("mean", "std")]
    missing = [key for key in keys if key not in inference_config]
    if missing:
        raise ValueError(f"model_config.json's inference_config lacks {missing}; give all of {keys} or none.")
    stats = {
        m: (float(inference_config[f"{m.upper()}_mean"]), float(inference_config[f"{m.upper()}_std"]))
        for m in REWARD_TOKENS
    }
    if not all(std > 0 for _, std in stats.values()):
        raise ValueError(f"inference_config standard deviations must be positive, got {stats}.")
    return stats


def load_prompt_template(path: str | os.PathLike) -> str:
    """Read the prompt template a VideoAlign checkpoint was trained with (see docs/rewards.md).

    The file holds the template text exactly (leading and trailing newlines included) with one
    ``{text_prompt}`` placeholder and each reward token once, in the order VQ, MQ, TA.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Prompt template {path} not found. Save the template your VideoAlign checkpoint was trained with "
            f"(VideoAlign's prompt_template.py, see docs/rewards.md) as {TEMPLATE_FILENAME} in the checkpoint "
            "folder, or pass template_path=."
        )
    with path.open(encoding="utf-8", newline="") as file:
        template = file.read()
    if template.count(TEMPLATE_PLACEHOLDER) != 1:
        raise ValueError(f"Prompt template {path} must contain {TEMPLATE_PLACEHOLDER} exactly once.")
    positions = [template.find(token) for token in REWARD_TOKENS.values()]
    counts = [template.count(token) for token in REWARD_TOKENS.values()]
    if counts != [1, 1, 1] or positions != sorted(positions):
        raise ValueError(
            f"Prompt template {path} must contain each of {list(REWARD_TOKENS.values())} exactly once, in that "
            "order; is it the special-token template of the checkpoint?"
        )
    return template


def _resolve_base_config(
    base_config: Qwen2VLConfig | str | os.PathLike | None,
    checkpoint: VideoAlignCheckpoint,
    base_model: str | None,
) -> Qwen2VLConfig:
    """The Qwen2-VL architecture: ``base_config``, else ``config.json`` beside model_config.json, else the base model."""
    if isinstance(base_config, Qwen2VLConfig):
        return copy.deepcopy(base_config)
    source = base_config or (checkpoint.root if (checkpoint.root / "config.json").is_file() else base_model)
    if source is None:
        raise ValueError(
            "model_config.json names no model_name_or_path; pass base_config= (a Qwen2-VL config or folder)."
        )
    try:
        config = Qwen2VLConfig.from_pretrained(str(source))
    except OSError as error:
        raise OSError(
            f"Could not load the Qwen2-VL config from {str(source)!r}: {error}. Pass base_config= a local folder "
            "with the base model's config.json (e.g. Qwen/Qwen2-VL-2B-Instruct)."
        ) from error
    if config.model_type != "qwen2_vl":
        raise ValueError(
            f"{source} holds a {config.model_type!r} config; VideoAlign is built on Qwen2-VL ('qwen2_vl')."
        )
    return config


def _token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if (
        token_id is None
        or token_id == tokenizer.unk_token_id
        or tokenizer.convert_ids_to_tokens(token_id) != token
    ):
        raise ValueError(
            f"The VideoAlign tokenizer has no token {token}; is it the checkpoint's tokenizer/ folder?"
        )
    return token_id


def _read_chat_template(path: str | os.PathLike) -> str:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Chat template {path} not found.")
    text = path.read_text(encoding="utf-8")
    return json.loads(text)["chat_template"] if path.suffix == ".json" else text
