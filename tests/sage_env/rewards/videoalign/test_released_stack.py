"""Fidelity to VideoAlign's original stack: its inference path run on transformers 4.45 + peft (opt-in, slow).

Opt-in: set ``SAGE_TRANSFORMERS_445`` to a folder holding transformers 4.45, e.g.
``pip install --target DIR --no-deps transformers==4.45.2 tokenizers==0.20.3 huggingface_hub==0.25.2``.
`transformers445_reference.py` runs VideoAlign's own path in a process that imports that install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sage_env.rewards.videoalign import VideoAlignReward, resize_frames
from tests.fixtures.videoalign import STAND_IN_TEMPLATE, TinyVideoAlign, build_tiny_videoalign
from tests.sage_env.rewards.videoalign.helpers import (
    FPS,
    PROMPTS,
    RESIZED,
    SAMPLED,
    load_reward,
    make_videos,
    raw_scores,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def transformers_445() -> str:
    """The folder of the transformers-4.45 install (skips the test when not given)."""
    folder = os.environ.get("SAGE_TRANSFORMERS_445")
    if not folder:
        pytest.skip(
            "set SAGE_TRANSFORMERS_445 to a transformers-4.45 install to compare with VideoAlign's stack"
        )
    return folder


def _released_scores(
    transformers_445: str, folder: Path, videos: torch.Tensor, dtype: str, attention: str, work: Path
) -> dict:
    """Run `transformers445_reference.py` on frames as qwen-vl-utils hands them over; its JSON output."""
    frames = [resize_frames(video[SAMPLED], RESIZED) * 255 for video in videos]
    saved = {
        "path": str(folder),
        "prompts": PROMPTS,
        "template": STAND_IN_TEMPLATE,
        "frames": frames,
        "dtype": dtype,
        "attn_implementation": attention,
    }
    torch.save(saved, work / "inputs.pt")
    script = Path(__file__).with_name("transformers445_reference.py")
    environment = {**os.environ, "PYTHONPATH": transformers_445}
    subprocess.run(
        [sys.executable, str(script), str(work / "inputs.pt"), str(work / "out.json")],
        check=True,
        env=environment,
        cwd=work,
    )
    return json.loads((work / "out.json").read_text())


def test_float32_inputs_and_scores_match_transformers_445(
    transformers_445: str,
    tiny_videoalign: TinyVideoAlign,
    videoalign_reward: VideoAlignReward,
    tmp_path: Path,
) -> None:
    """VideoAlign's own path (peft LoRA unmerged, sdpa) gives the same inputs and scores as this loader."""
    videos = make_videos()
    reference = _released_scores(transformers_445, tiny_videoalign.path, videos, "float32", "sdpa", tmp_path)
    inputs = videoalign_reward.prepare_inputs(list(videos), PROMPTS, [FPS] * 3)
    for key in ("input_ids", "attention_mask", "video_grid_thw"):
        assert inputs[key].tolist() == reference[key], key
    torch.testing.assert_close(inputs["pixel_values_videos"], torch.tensor(reference["pixel_values_videos"]))
    scores = raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS))
    torch.testing.assert_close(scores, torch.tensor(reference["rewards"]), atol=1e-5, rtol=1e-5)


def test_bfloat16_scores_equal_transformers_445_bit_for_bit(transformers_445: str, tmp_path: Path) -> None:
    """The released bfloat16 computation (whole model cast, rotary buffers and vision angles in bfloat16).

    A checkpoint without LoRA (so both sides hold the same bfloat16 weights) and eager attention (the same
    arithmetic in both transformers versions) leave nothing but the dtype handling to compare: the scores
    are identical. Without the cast of ``inv_freq`` or the bfloat16 vision angles they are not.
    """
    tiny = build_tiny_videoalign(tmp_path / "checkpoint", steps=(1,), lora=False)
    videos = make_videos(seed=7)
    reference = _released_scores(transformers_445, tiny.path, videos, "bfloat16", "eager", tmp_path)
    reward = load_reward(tiny.path, dtype=torch.bfloat16, attn_implementation="eager")
    scores = raw_scores(reward(videos, PROMPTS, fps=FPS))
    torch.testing.assert_close(scores, torch.tensor(reference["rewards"]), atol=0, rtol=0)
