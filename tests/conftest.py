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
from typing import Any

import pytest

import sage_env.backbones
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
def tiny_wan22_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random two-expert (Wan 2.2 A14B layout) ``WanPipeline``, boundary 0.5, saved."""
    pipeline = build_tiny_wan_pipeline(two_experts=True, boundary_ratio=0.5)
    return save_tiny_pipeline(pipeline, tmp_path_factory.mktemp("tiny_wan22"))


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


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a video model is loaded: every case here must be refused before that."""

    def refuse(model: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(model, VideoBackbone):  # already built: load_backbone returns it as is
            return model
        raise AssertionError("a model was loaded before the bad input was refused")

    def refusing_class(name: str) -> type[VideoBackbone]:
        # its facts (sampling defaults) stay readable; only loading is refused
        cls = real_backbone_class(name)
        return type(cls.__name__, (cls,), {"from_pretrained": classmethod(refuse)})

    real_backbone_class = sage_env.backbones.backbone_class
    monkeypatch.setattr("sage_trl.training_setup.load_backbone", refuse)
    # load_backbone checks the path first, then asks for the class: the refusal comes after those checks
    monkeypatch.setattr("sage_env.backbones.backbone_class", refusing_class)
