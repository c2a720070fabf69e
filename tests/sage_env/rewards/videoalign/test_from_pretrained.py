"""`VideoAlignReward.from_pretrained`: a local folder, or a Hub repo id resolved by huggingface_hub from its cache.

No test touches the network: the Hub repo is put into a Hugging Face cache folder in the layout huggingface_hub
writes (checked with its own ``scan_cache_dir``), and offline mode is on (huggingface_hub's ``HF_HUB_OFFLINE``,
set as the environment variable in a fresh process for the end-to-end test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants, scan_cache_dir
from transformers import Qwen2VLConfig

from sage_env.rewards.videoalign import VideoAlignReward
from tests.fixtures.videoalign import TinyVideoAlign, cache_as_hub_repo
from tests.sage_env.rewards.conftest import TEST_MIN_PIXELS
from tests.sage_env.rewards.videoalign.helpers import FPS, PROMPTS, edit_model_config, make_videos, raw_scores

REPO_ID = "tester/tiny-videoalign"
RELEASED_BASE_MODEL = "Qwen/Qwen2-VL-2B-Instruct"  # what the released model_config.json names
TEST_OPTIONS = {"device": "cpu", "dtype": torch.float32, "min_pixels": TEST_MIN_PIXELS}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's offline mode (what ``HF_HUB_OFFLINE=1`` sets when the library is imported)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def hub_cache(tiny_videoalign: TinyVideoAlign, tmp_path: Path) -> Path:
    """A Hugging Face cache folder holding the tiny checkpoint as the repo `REPO_ID`."""
    cache = tmp_path / "hub-cache"
    cache_as_hub_repo(tiny_videoalign.path, cache, REPO_ID)
    return cache


def assert_same_scores(reward: VideoAlignReward, expected: VideoAlignReward, count: int, seed: int) -> None:
    """Both rewards give identical raw scores for ``count`` seeded videos."""
    videos, prompts = make_videos(count, seed=seed), PROMPTS[:count]
    torch.testing.assert_close(
        raw_scores(reward(videos, prompts, fps=FPS)),
        raw_scores(expected(videos, prompts, fps=FPS)),
        atol=0,
        rtol=0,
    )


def test_a_local_folder_loads_as_the_constructor_does(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    reward = VideoAlignReward.from_pretrained(tiny_videoalign.path, **TEST_OPTIONS)
    assert_same_scores(reward, videoalign_reward, count=2, seed=0)
    default = VideoAlignReward.from_pretrained(tiny_videoalign.path, device="cpu", lazy=True)
    assert default.dtype == torch.bfloat16 and default.checkpoint.step == 10
    older = VideoAlignReward.from_pretrained(str(tiny_videoalign.path), step=9, lazy=True)
    assert older.checkpoint.step == 9  # constructor options pass through


def test_the_cache_is_what_huggingface_hub_writes(hub_cache: Path, tiny_videoalign: TinyVideoAlign) -> None:
    (repo,) = scan_cache_dir(hub_cache).repos
    (revision,) = repo.revisions
    assert repo.repo_id == REPO_ID and repo.repo_type == "model" and revision.refs == frozenset({"main"})
    files = {str(file.file_path.relative_to(revision.snapshot_path)) for file in revision.files}
    assert "model_config.json" in files and "checkpoint-10/model.pth" in files


def test_a_hub_repo_id_loads_from_the_cache_offline(
    offline: None, hub_cache: Path, videoalign_reward: VideoAlignReward
) -> None:
    reward = VideoAlignReward.from_pretrained(REPO_ID, cache_dir=hub_cache, **TEST_OPTIONS)
    assert reward.checkpoint.root.parent.parent.name == "models--tester--tiny-videoalign"
    assert_same_scores(reward, videoalign_reward, count=2, seed=1)


def test_local_files_only_reads_the_cache_without_offline_mode(hub_cache: Path) -> None:
    reward = VideoAlignReward.from_pretrained(
        REPO_ID, cache_dir=hub_cache, local_files_only=True, lazy=True, **TEST_OPTIONS
    )
    assert (reward.checkpoint.root / "model_config.json").is_file()


def test_an_uncached_repo_offline_names_the_fix(offline: None, tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"'tester/absent' is not a local folder and could not be fetched"):
        VideoAlignReward.from_pretrained("tester/absent", cache_dir=tmp_path, **TEST_OPTIONS)
    with pytest.raises(OSError, match="is not a local folder"):
        VideoAlignReward.from_pretrained(tmp_path / "missing" / "folder", **TEST_OPTIONS)


def test_base_model_overrides_the_released_base_model_offline(
    offline: None, tiny_videoalign: TinyVideoAlign, videoalign_copy: Path, videoalign_reward: VideoAlignReward
) -> None:
    edit_model_config(
        videoalign_copy, lambda c: c["model_config"].update(model_name_or_path=RELEASED_BASE_MODEL)
    )
    with pytest.raises(OSError, match=f"Could not load the Qwen2-VL config from '{RELEASED_BASE_MODEL}'"):
        VideoAlignReward.from_pretrained(videoalign_copy, lazy=True, **TEST_OPTIONS)
    reward = VideoAlignReward.from_pretrained(
        videoalign_copy, base_model=tiny_videoalign.base_path, **TEST_OPTIONS
    )
    assert_same_scores(reward, videoalign_reward, count=1, seed=2)
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    as_config = VideoAlignReward.from_pretrained(
        videoalign_copy, base_model=config, lazy=True, **TEST_OPTIONS
    )
    assert as_config.config.vision_config.depth == config.vision_config.depth


def test_base_config_is_named_base_model_here(tiny_videoalign: TinyVideoAlign) -> None:
    with pytest.raises(TypeError, match="base_model="):
        VideoAlignReward.from_pretrained(tiny_videoalign.path, base_config=tiny_videoalign.base_path)


_SCORE_FROM_THE_HUB = """
import json, sys, torch
from sage_env.rewards.videoalign import VideoAlignReward
reward = VideoAlignReward.from_pretrained(sys.argv[1], base_model=sys.argv[2], device="cpu",
                                          dtype=torch.float32, min_pixels=int(sys.argv[3]))
videos = torch.load(sys.argv[4])
scores = reward(videos, json.loads(sys.argv[5]), fps=float(sys.argv[6]))
print(json.dumps({"root": str(reward.checkpoint.root), "ta": scores["ta_raw"].tolist()}))
"""


def test_hf_hub_offline_and_hf_hub_cache_set_by_a_user(
    tiny_videoalign: TinyVideoAlign,
    videoalign_copy: Path,
    tmp_path: Path,
    videoalign_reward: VideoAlignReward,
) -> None:
    """A fresh process with ``HF_HUB_OFFLINE=1 HF_HUB_CACHE=...`` and the released base model id in the config."""
    edit_model_config(
        videoalign_copy, lambda c: c["model_config"].update(model_name_or_path=RELEASED_BASE_MODEL)
    )
    cache = tmp_path / "user-cache"
    snapshot = cache_as_hub_repo(videoalign_copy, cache, REPO_ID)
    videos = make_videos(2, seed=3)
    torch.save(videos, tmp_path / "videos.pt")
    arguments = [REPO_ID, str(tiny_videoalign.base_path), str(TEST_MIN_PIXELS), str(tmp_path / "videos.pt")]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", _SCORE_FROM_THE_HUB, *arguments, json.dumps(PROMPTS[:2]), str(FPS)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=Path(__file__).resolve().parents[4],
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(output["root"]) == snapshot
    expected = videoalign_reward(videos, PROMPTS[:2], fps=FPS)["ta_raw"]
    torch.testing.assert_close(torch.tensor(output["ta"]), expected, atol=0, rtol=0)
