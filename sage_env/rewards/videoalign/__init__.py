"""VideoAlign (KwaiVGI's VideoReward) as a reward function for generated video tensors and video files.

VideoAlign ("Improving Video Generation with Human Feedback", arXiv 2501.13918) is Qwen2-VL-2B with a bias-free
linear head ``rm_head`` read at the final hidden states of three special tokens ``<|VQ_reward|>``,
``<|MQ_reward|>`` and ``<|TA_reward|>`` placed in the prompt: visual quality, motion quality and text alignment.
It is the paper's terminal reward (SAGE-GRPO Sec. 4.1, Table 2).

`VideoAlignReward` (or `VideoAlignReward.from_pretrained` with a folder or a Hub repo id) loads a checkpoint
exactly as released (see `checkpoint`) and reproduces the original inference: frames sampled at ~2 fps, resized
to multiples of 28 within a pixel budget (antialiased bicubic, as qwen-vl-utils), CLIP normalisation, Qwen2-VL
patching (`frames`), the chat template, sequential position ids, the reward head at the reward tokens, optional
mean/std normalisation, and in bfloat16 the released rotary-embedding numerics (`weights`). Everything is plain
torch plus transformers' ``Qwen2VLModel``; no remote code, weights read with ``weights_only=True``.

Modules: `frames` (sampling, pixels, patches), `checkpoint` (files, model_config.json, prompt template, Hub),
`weights` (state-dict conversion, the model), `reward` (`VideoAlignReward`).
"""

from __future__ import annotations

from sage_env.rewards.videoalign.checkpoint import (
    REWARD_TOKENS,
    TEMPLATE_FILENAME,
    VideoAlignCheckpoint,
    VideoAlignSettings,
    find_videoalign_checkpoint,
    load_prompt_template,
    resolve_videoalign_folder,
)
from sage_env.rewards.videoalign.frames import (
    VideoAlignVideoProcessor,
    num_sampled_frames,
    patchify_video,
    resize_frames,
    sample_frame_indices,
    smart_resize,
)
from sage_env.rewards.videoalign.reward import DEFAULT_DTYPE, VideoAlignReward
from sage_env.rewards.videoalign.weights import (
    ReleasedVisionRotaryEmbedding,
    VideoAlignModel,
    build_videoalign_model,
    convert_videoalign_state_dict,
    merge_lora_weight,
    remap_qwen2_vl_key,
)
from sage_env.video_io import read_video as read_video_file

__all__ = [
    "DEFAULT_DTYPE",
    "REWARD_TOKENS",
    "TEMPLATE_FILENAME",
    "ReleasedVisionRotaryEmbedding",
    "VideoAlignCheckpoint",
    "VideoAlignModel",
    "VideoAlignReward",
    "VideoAlignSettings",
    "VideoAlignVideoProcessor",
    "build_videoalign_model",
    "convert_videoalign_state_dict",
    "find_videoalign_checkpoint",
    "load_prompt_template",
    "merge_lora_weight",
    "num_sampled_frames",
    "patchify_video",
    "read_video_file",
    "remap_qwen2_vl_key",
    "resize_frames",
    "resolve_videoalign_folder",
    "sample_frame_indices",
    "smart_resize",
]
