"""Shared pytest fixtures: tiny Wan and HunyuanVideo 1.5 pipelines saved once per session, and backbones on them.

* ``tiny_wan_path`` / ``tiny_hunyuan_path`` (session): folders written with ``save_pretrained`` (read-only by
  convention: copy one before changing it).
* ``tiny_wan_backbone`` / ``tiny_hunyuan_backbone`` (per test): fresh backbones loaded from those folders with
  ``sage_env.backbones.load_backbone(path)``, the path users take; a test may add LoRA adapters or offload
  text encoders without affecting other tests.

Sizes and timings are documented in `tests.fixtures.tiny_pipelines`; use ``TINY_VIDEO_SIZE`` from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sage_env.backbones import VideoBackbone, load_backbone
from tests.fixtures.tiny_pipelines import (
    build_tiny_hunyuan_pipeline,
    build_tiny_wan_pipeline,
    save_tiny_pipeline,
)


@pytest.fixture(scope="session")
def tiny_wan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random ``WanPipeline`` (``build_tiny_wan_pipeline()``) saved with ``save_pretrained``."""
    return save_tiny_pipeline(build_tiny_wan_pipeline(), tmp_path_factory.mktemp("tiny_wan"))


@pytest.fixture(scope="session")
def tiny_hunyuan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random ``HunyuanVideo15Pipeline`` (``build_tiny_hunyuan_pipeline()``), saved."""
    return save_tiny_pipeline(build_tiny_hunyuan_pipeline(), tmp_path_factory.mktemp("tiny_hunyuan"))


@pytest.fixture
def tiny_wan_backbone(tiny_wan_path: Path) -> VideoBackbone:
    """A fresh `WanBackbone` loaded from ``tiny_wan_path`` through ``load_backbone`` (CPU, float32)."""
    return load_backbone(str(tiny_wan_path))


@pytest.fixture
def tiny_hunyuan_backbone(tiny_hunyuan_path: Path) -> VideoBackbone:
    """A fresh `HunyuanVideo15Backbone` loaded from ``tiny_hunyuan_path`` through ``load_backbone`` (CPU, float32)."""
    return load_backbone(str(tiny_hunyuan_path))
