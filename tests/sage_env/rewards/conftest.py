"""Fixtures of the reward tests: the tiny VideoAlign checkpoint (written once) and rewards loaded from it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.fixtures.videoalign import TinyVideoAlign, build_tiny_videoalign

TEST_MIN_PIXELS = 28 * 28
"""Per-frame pixel floor for tests (VideoAlign's 128 * 28 * 28 would upscale tiny frames to ~100k pixels)."""


@pytest.fixture(scope="session")
def tiny_videoalign(tmp_path_factory: pytest.TempPathFactory) -> TinyVideoAlign:
    """The tiny VideoAlign folder (read-only by convention: use ``videoalign_copy`` to change files)."""
    return build_tiny_videoalign(tmp_path_factory.mktemp("tiny_videoalign"))


@pytest.fixture
def videoalign_copy(tiny_videoalign: TinyVideoAlign, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint folder that a test may break."""
    return Path(shutil.copytree(tiny_videoalign.path, tmp_path / "videoalign"))


@pytest.fixture(scope="session")
def videoalign_reward(tiny_videoalign: TinyVideoAlign):
    """`VideoAlignReward` on the tiny checkpoint through the public loader: CPU, float32, eager loading."""
    from sage_env.rewards.videoalign import VideoAlignReward

    return VideoAlignReward(
        tiny_videoalign.path, device="cpu", dtype=torch.float32, min_pixels=TEST_MIN_PIXELS
    )
