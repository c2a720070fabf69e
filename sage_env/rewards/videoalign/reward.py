"""`VideoAlignReward`: VideoAlign's VQ / MQ / TA scores of generated videos as a reward function."""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2VLConfig

from sage_env.rewards.base import check_videos
from sage_env.rewards.videoalign.checkpoint import (
    REWARD_TOKENS,
    TEMPLATE_FILENAME,
    TEMPLATE_PLACEHOLDER,
    VIDEO_TOKEN,
    VideoAlignSettings,
    _read_chat_template,
    _resolve_base_config,
    _token_id,
    find_videoalign_checkpoint,
    load_prompt_template,
    resolve_videoalign_folder,
)
from sage_env.rewards.videoalign.frames import VIDEO_MIN_PIXELS, VideoAlignVideoProcessor
from sage_env.rewards.videoalign.weights import (
    VideoAlignModel,
    build_videoalign_model,
    convert_videoalign_state_dict,
)
from sage_env.video_io import read_video

__all__ = ["DEFAULT_DTYPE", "VideoAlignReward"]

DEFAULT_DTYPE = torch.bfloat16
"""The weight dtype VideoAlign's inference runs in (``VideoVLMRewardInference``'s default)."""


class VideoAlignReward:
    """VideoAlign scores of generated videos as a reward function (``videos, prompts, *, fps -> scores``).

    Returns ``vq``, ``mq``, ``ta`` (normalised by the checkpoint's mean/std when model_config.json has them,
    else raw; these are what `CompositeReward`'s presets weight) and, reported only, ``vq_raw``, ``mq_raw``,
    ``ta_raw`` and ``overall`` (``vq + mq + ta``, as VideoAlign's inference reports it).

    Args:
        checkpoint_dir: the released folder (``model_config.json``, ``checkpoint-<step>/``).
        step: which ``checkpoint-<step>`` to load; None: the latest.
        template_path: the prompt template file; None: ``prompt_template.txt`` in ``checkpoint_dir``.
        base_config: the Qwen2-VL architecture (config or folder / Hub id); None: ``config.json`` in
            ``checkpoint_dir``, else model_config.json's ``model_name_or_path`` (only its config.json is read).
        chat_template: a ``.jinja`` or ``chat_template.json`` file, if the tokenizer folder has no chat template.
        device: where scoring runs; None: CUDA when available.
        dtype: weight dtype (VideoAlign ran in bfloat16 and is reproduced so, rotary buffers included; float32
            works too).
        batch_size: videos per forward pass.
        normalize: report ``vq``/``mq``/``ta`` normalised by the checkpoint's mean/std (when present).
        sample_fps, num_frames, max_pixels: override model_config.json's frame sampling and pixel budget.
        min_pixels: lower bound of the per-frame pixel budget (qwen-vl-utils' default).
        attn_implementation: transformers attention (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``).
        lazy: read the weights only at the first call (or `load`).
        offload_between_calls: move the weights to the CPU after each call (see `offload`).
    """

    component_descriptions: ClassVar[dict[str, str]] = {
        "vq": "visual quality",
        "mq": "motion quality",
        "ta": "text alignment",
        "overall": "vq + mq + ta, reported only",
    }
    """What each returned score measures (the optional attribute of the reward protocol, for model cards)."""

    @property
    def reward_model_description(self) -> str:
        """What the model card names as the reward: VideoAlign and the checkpoint it loaded."""
        return (
            "[VideoAlign](https://huggingface.co/KwaiVGI/VideoReward) (KwaiVGI's Qwen2-VL video reward model), "
            f"checkpoint {self.checkpoint.root.name}/checkpoint-{self.checkpoint.step}"
        )

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike,
        *,
        step: int | None = None,
        template_path: str | os.PathLike | None = None,
        base_config: Qwen2VLConfig | str | os.PathLike | None = None,
        chat_template: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = DEFAULT_DTYPE,
        batch_size: int = 4,
        normalize: bool = True,
        sample_fps: float | None = None,
        num_frames: int | None = None,
        max_pixels: int | None = None,
        min_pixels: int = VIDEO_MIN_PIXELS,
        attn_implementation: str = "sdpa",
        lazy: bool = False,
        offload_between_calls: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.__name__ = "videoalign"
        self.checkpoint = find_videoalign_checkpoint(checkpoint_dir, step)
        self.settings = VideoAlignSettings.from_model_config(self.checkpoint.model_config)
        self.template = load_prompt_template(template_path or self.checkpoint.root / TEMPLATE_FILENAME)
        self.config = _resolve_base_config(base_config, self.checkpoint, self.settings.base_model)
        self.tokenizer = self._load_tokenizer(chat_template)
        self.video_processor = VideoAlignVideoProcessor(
            sample_fps=sample_fps or self.settings.sample_fps,
            num_frames=num_frames or self.settings.num_frames,
            min_pixels=min_pixels,
            max_pixels=max_pixels or self.settings.max_pixels,
            patch_size=self.config.vision_config.patch_size,
            temporal_patch_size=self.config.vision_config.temporal_patch_size,
            merge_size=self.config.vision_config.spatial_merge_size,
        )
        self.device = torch.device(device) if device is not None else _default_device()
        self.dtype, self.batch_size, self.normalize = dtype, batch_size, normalize
        self.attn_implementation = attn_implementation
        self.offload_between_calls = offload_between_calls
        self.model: VideoAlignModel | None = None
        if not lazy:
            self.load()

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        base_model: Qwen2VLConfig | str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool = False,
        **options: Any,
    ) -> VideoAlignReward:
        """Load VideoAlign from its released folder or a Hugging Face Hub repo id (``"KwaiVGI/VideoReward"``).

        Args:
            pretrained_model_name_or_path: a local checkpoint folder, else a Hub repo holding one, fetched with
                ``huggingface_hub.snapshot_download``: the Hugging Face cache is reused, and with
                ``HF_HUB_OFFLINE=1`` (or ``local_files_only=True``) only the cache is read.
            base_model: the Qwen2-VL base model whose ``config.json`` gives the architecture (Hub id, local
                folder or ``Qwen2VLConfig``), overriding model_config.json's ``model_name_or_path``
                (``Qwen/Qwen2-VL-2B-Instruct``); a local folder works offline. Only its config is read.
            device: where scoring runs; None: CUDA when available.
            dtype: weight dtype; None: `DEFAULT_DTYPE` (bfloat16, as VideoAlign's inference).
            revision, cache_dir, token, local_files_only: ``snapshot_download``'s, for a Hub repo.
            **options: the constructor's other options (``step``, ``template_path``, ``batch_size``, ...).
        """
        if "base_config" in options:
            raise TypeError("from_pretrained names the base model base_model=; drop base_config=.")
        folder = resolve_videoalign_folder(
            pretrained_model_name_or_path,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
        )
        dtype = DEFAULT_DTYPE if dtype is None else dtype
        return cls(folder, base_config=base_model, device=device, dtype=dtype, **options)

    def _load_tokenizer(self, chat_template: str | os.PathLike | None) -> PreTrainedTokenizerBase:
        tokenizer = AutoTokenizer.from_pretrained(self.checkpoint.tokenizer_path)
        if chat_template is not None:
            tokenizer.chat_template = _read_chat_template(chat_template)
        if not tokenizer.chat_template:
            raise ValueError(
                f"The tokenizer in {self.checkpoint.tokenizer_path} has no chat template; pass chat_template= the "
                "chat_template.json of Qwen/Qwen2-VL-2B-Instruct (the template VideoAlign's processor applied)."
            )
        self.reward_token_ids = [_token_id(tokenizer, token) for token in REWARD_TOKENS.values()]
        self.video_token_id = _token_id(tokenizer, VIDEO_TOKEN)
        if self.video_token_id != self.config.video_token_id:
            raise ValueError(
                f"The tokenizer's {VIDEO_TOKEN} id {self.video_token_id} differs from the config's video_token_id "
                f"{self.config.video_token_id}; the tokenizer and base config do not belong together."
            )
        # Any id pads: padded positions come after every real token and are masked out.
        candidates = (tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        self.pad_token_id = next(token_id for token_id in candidates if token_id is not None)
        return tokenizer

    # -- weights and devices -------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        """Whether the weights have been read (see ``lazy``)."""
        return self.model is not None

    def load(self) -> VideoAlignModel:
        """Read, convert and merge the checkpoint's weights onto ``self.device`` (once)."""
        if self.model is None:
            raw = _read_weights(self.checkpoint.weights_path)
            settings = self.settings
            state_dict = convert_videoalign_state_dict(
                raw, settings.lora_alpha, settings.lora_rank, settings.use_rslora, dtype=self.dtype
            )
            del raw
            model = build_videoalign_model(self.config, state_dict, self.dtype, self.attn_implementation)
            self._check_loaded(model)
            self.model = model.to(_concrete_device(self.device))
        return self.model

    def _check_loaded(self, model: VideoAlignModel) -> None:
        head_outputs = model.rm_head.out_features
        if self.settings.output_dim is not None and self.settings.output_dim != head_outputs:
            raise ValueError(
                f"model_config.json says output_dim={self.settings.output_dim} but the reward head has "
                f"{head_outputs} outputs."
            )
        vocab_size = model.config.text_config.vocab_size
        if max([*self.reward_token_ids, self.video_token_id]) >= vocab_size:
            raise ValueError(
                f"The tokenizer's reward tokens lie outside the checkpoint's {vocab_size} embeddings."
            )

    def to(self, device: str | torch.device) -> VideoAlignReward:
        """Score on ``device`` from now on (moves the weights when loaded)."""
        self.device = torch.device(device)
        if self.model is not None:
            self.model.to(_concrete_device(self.device))
        return self

    def offload(self) -> VideoAlignReward:
        """Move the weights to the CPU and free cached GPU memory; the next call moves them back to ``device``."""
        if self.model is not None:
            self.model.to("cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self

    def _ready_model(self) -> VideoAlignModel:
        model, device = self.load(), _concrete_device(self.device)
        if model.rm_head.weight.device != device:
            model.to(device)
        return model

    # -- inputs ----------------------------------------------------------------------------------

    def build_text(self, prompt: str) -> str:
        """The chat text of one prompt (template filled in, one ``<|video_pad|>`` for the video)."""
        for token in (*REWARD_TOKENS.values(), VIDEO_TOKEN):
            if token in prompt:
                raise ValueError(f"Prompt {prompt!r} contains the special token {token}; remove it.")
        text = self.template.replace(TEMPLATE_PLACEHOLDER, prompt)
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _token_ids(self, prompt: str, num_video_tokens: int) -> list[int]:
        ids = self.tokenizer(self.build_text(prompt))["input_ids"]
        if ids.count(self.video_token_id) != 1:
            raise ValueError(
                f"The chat template must render the video as one {VIDEO_TOKEN}, got {ids.count(self.video_token_id)}."
            )
        # The Qwen2-VL processor expands the placeholder to one token per merged 2x2 patch window.
        index = ids.index(self.video_token_id)
        return ids[:index] + [self.video_token_id] * num_video_tokens + ids[index + 1 :]

    def prepare_inputs(
        self, videos: Sequence[torch.Tensor], prompts: Sequence[str], fps: Sequence[float]
    ) -> dict[str, torch.Tensor]:
        """Model inputs for ``(F, 3, H, W)`` videos in [0, 1]: right-padded ids, mask, video patches and grids."""
        processed = [self.video_processor(video.to(self.device), rate) for video, rate in zip(videos, fps)]
        merge = self.video_processor.merge_size**2
        sequences = [
            self._token_ids(p, int(grid.prod()) // merge) for p, (_, grid) in zip(prompts, processed)
        ]
        length = max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        return {
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention_mask.to(self.device),
            "pixel_values_videos": torch.cat([patches for patches, _ in processed]),
            "video_grid_thw": torch.stack([grid for _, grid in processed]).to(self.device),
        }

    # -- scoring ---------------------------------------------------------------------------------

    @torch.no_grad()
    def raw_scores(
        self, videos: Sequence[torch.Tensor], prompts: Sequence[str], fps: Sequence[float]
    ) -> torch.Tensor:
        """Unnormalised ``(B, 3)`` VQ / MQ / TA scores on the CPU, ``batch_size`` videos per forward pass."""
        model = self._ready_model()
        scores = []
        for start in range(0, len(videos), self.batch_size):
            window = slice(start, start + self.batch_size)
            inputs = self.prepare_inputs(videos[window], prompts[window], fps[window])
            scores.append(model(**inputs, reward_token_ids=self.reward_token_ids).cpu())
        return torch.cat(scores) if scores else torch.zeros(0, len(REWARD_TOKENS))

    def __call__(
        self,
        videos: torch.Tensor | Sequence[torch.Tensor | str | os.PathLike],
        prompts: Sequence[str],
        *,
        fps: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """Score videos for prompts: ``{vq, mq, ta, vq_raw, mq_raw, ta_raw, overall}``, each ``(B,)`` float32.

        ``videos`` is a ``(B, F, 3, H, W)`` tensor in [0, 1] (``fps`` its frame rate, required), or a list of
        ``(F, 3, H, W)`` tensors and/or video file paths (files use their own frame rate, else ``fps``). Videos
        with non-finite pixels get NaN scores.
        """
        clips, rates = _video_list(videos, fps)
        if len(prompts) != len(clips):
            raise ValueError(
                f"Got {len(clips)} videos but {len(prompts)} prompts; pass one prompt per video."
            )
        raw = torch.full((len(clips), len(REWARD_TOKENS)), math.nan)
        finite = [index for index, clip in enumerate(clips) if bool(torch.isfinite(clip).all())]
        try:
            if finite:
                pick = [clips[i] for i in finite], [prompts[i] for i in finite], [rates[i] for i in finite]
                raw[finite] = self.raw_scores(*pick)
        finally:
            if self.offload_between_calls:
                self.offload()
        return self._named_scores(raw)

    def _named_scores(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = {}
        for index, metric in enumerate(REWARD_TOKENS):
            value = raw[:, index]
            if self.normalize and self.settings.normalization is not None:
                mean, std = self.settings.normalization[metric]
                value = (value - mean) / std
            scores[metric] = value
        scores.update({f"{metric}_raw": raw[:, index] for index, metric in enumerate(REWARD_TOKENS)})
        scores["overall"] = scores["vq"] + scores["mq"] + scores["ta"]
        return scores

    def __repr__(self) -> str:
        return (
            f"VideoAlignReward({str(self.checkpoint.root)!r}, step={self.checkpoint.step}, device={self.device}, "
            f"dtype={self.dtype}, loaded={self.is_loaded})"
        )


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _concrete_device(device: torch.device) -> torch.device:
    """``cuda`` means the current CUDA device *now* (under accelerate each process sets its own)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _video_list(
    videos: torch.Tensor | Sequence[torch.Tensor | str | os.PathLike], fps: float | None
) -> tuple[list[torch.Tensor], list[float]]:
    """Normalise the accepted video inputs to ``(F, 3, H, W)`` tensors in [0, 1] and their frame rates."""
    if isinstance(videos, torch.Tensor):
        check_videos(videos)
        return list(videos), [_required_fps(fps)] * videos.shape[0]
    if isinstance(videos, (str, os.PathLike)):
        raise ValueError("Pass a list of video paths, not a single path.")
    clips, rates = [], []
    for item in videos:
        if isinstance(item, (str, os.PathLike)):
            clip, file_fps = read_video(item)
            rates.append(file_fps if file_fps is not None else _required_fps(fps))
        else:
            clip = item
            rates.append(_required_fps(fps))
        check_videos(clip.unsqueeze(0) if isinstance(clip, torch.Tensor) else clip)
        clips.append(clip)
    return clips, rates


def _required_fps(fps: float | None) -> float:
    if fps is None:
        raise ValueError(
            "Pass fps=, the frame rate of the videos: VideoAlign samples frames at ~2 per second."
        )
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a finite frame rate > 0, got {fps!r}.")
    return float(fps)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """``model.pth`` read without unpickling code (``weights_only``), memory-mapped; a damaged file says so."""
    try:
        # mmap keeps the stored tensors file-backed: each is copied once, already in the target dtype.
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path} holds pickled objects other than tensors, which are refused (unpickling them could run "
            "code); a released VideoAlign checkpoint holds tensors only: download it again from its source."
        ) from error
    except (RuntimeError, EOFError) as error:
        raise ValueError(
            f"{path} cannot be read as VideoAlign weights ({type(error).__name__}: {str(error)[:200]}); it is "
            "damaged or not a released checkpoint."
        ) from error
