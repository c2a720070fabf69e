"""The bad-input sweep through the rewards and VideoAlign: a reward's bad output, a broken VideoAlign folder
or a bad frame rate is named."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sage_env.rewards import CompositeReward, RewardFailureMonitor, check_videos
from sage_env.rewards.toy import ToyReward
from tests.doubles import mean_brightness

# -- rewards ----------------------------------------------------------------------------------------------------------

VIDEOS = torch.rand(2, 2, 3, 4, 4)


def _scores(value: Any) -> Callable:
    def returns(videos: torch.Tensor, prompts: list[str], **kwargs: Any) -> Any:
        return value

    return returns


REWARD_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: CompositeReward("not callable"), "callable"),
    (lambda: CompositeReward([]), "non-empty"),
    (lambda: CompositeReward([mean_brightness, mean_brightness]), "distinct names"),
    (lambda: CompositeReward([mean_brightness], [1.0, 2.0]), "reward_weights"),
    (lambda: CompositeReward([mean_brightness], {"mean_brightness": math.nan}), "mean_brightness"),
    (lambda: CompositeReward([mean_brightness], "setting_c"), "setting_c"),
    (lambda: CompositeReward([mean_brightness], "setting_b")(VIDEOS, ["a", "b"]), "mq"),
    (lambda: CompositeReward(_scores(torch.ones(3)))(VIDEOS, ["a", "b"]), "one score per video"),
    (lambda: CompositeReward(_scores("high"))(VIDEOS, ["a", "b"]), "component"),
    (lambda: CompositeReward(_scores({}))(VIDEOS, ["a", "b"]), "no components"),
    (lambda: check_videos((VIDEOS * 255).to(torch.uint8)), "uint8"),
    (lambda: check_videos(VIDEOS.permute(0, 2, 1, 3, 4)), "layout"),
    (lambda: check_videos(VIDEOS * 2 - 1), "[0, 1]"),
    (lambda: check_videos(VIDEOS, num_prompts=3), "prompts"),
    (lambda: RewardFailureMonitor(1).observe(0, 2, ["reward 'x' raised OSError: gone"]), "reward 'x'"),
    (lambda: RewardFailureMonitor(0), "max_consecutive_reward_failures"),
    (lambda: CompositeReward(_scores(["high", "low"]))(VIDEOS, ["a", "b"]), "component"),
    (lambda: CompositeReward(_scores(torch.ones(2, 2)))(VIDEOS, ["a", "b"]), "one score per video"),
    (lambda: CompositeReward([mean_brightness], {"mean_brightness": "high"}), "mean_brightness"),
    (lambda: CompositeReward([mean_brightness], {"nosuch": 1.0})(VIDEOS, ["a", "b"]), "nosuch"),
    (lambda: check_videos(VIDEOS[0]), "layout"),
    (lambda: ToyReward(spread_scale=0.0), "spread_scale"),
    (lambda: ToyReward(object_low=0.8, object_high=0.5), "object_low"),
    (lambda: ToyReward()(torch.rand(2, 8, 3, 16, 16), ["a cat", "a dog"]), "toy-world prompt"),
    (lambda: ToyReward()(torch.rand(1, 2, 3, 16, 16), ["a red square moving left"]), "3 frames"),
]


@pytest.mark.parametrize(
    ("call", "words"), REWARD_CASES, ids=[f"{i}-{w}" for i, (_, w) in enumerate(REWARD_CASES)]
)
def test_rewards_name_the_problem(call: Callable[[], Any], words: str) -> None:
    with pytest.raises((ValueError, RuntimeError), match=words.replace("[", r"\[").replace("]", r"\]")):
        call()


# -- VideoAlign ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def videoalign_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.videoalign import build_tiny_videoalign

    return build_tiny_videoalign(tmp_path_factory.mktemp("videoalign")).path


def _broken_videoalign(folder: Path, tmp_path: Path, breaking: str) -> Path:
    import shutil

    copy = tmp_path / "videoalign"
    shutil.copytree(folder, copy)
    if breaking == "config_json":
        (copy / "model_config.json").write_text("{not json")
    elif breaking == "no_config":
        (copy / "model_config.json").unlink()
    elif breaking == "no_checkpoint":
        for checkpoint in copy.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    elif breaking == "no_weights":
        for weights in copy.glob("checkpoint-*/model.pth"):
            weights.unlink()
    elif breaking == "corrupt_weights":
        for weights in copy.glob("checkpoint-*/model.pth"):
            weights.write_bytes(b"PK\x03\x04 truncated")
    return copy


VIDEOALIGN_CASES = [
    ("missing_folder", "does-not-exist"),
    ("config_json", "model_config.json"),
    ("no_config", "model_config.json"),
    ("no_checkpoint", "checkpoint"),
    ("no_weights", "model.pth"),
    ("corrupt_weights", "model.pth"),
]


@pytest.mark.parametrize(("breaking", "words"), VIDEOALIGN_CASES, ids=[c[0] for c in VIDEOALIGN_CASES])
def test_videoalign_names_the_broken_file(
    videoalign_folder: Path, tmp_path: Path, breaking: str, words: str
) -> None:
    from sage_env.rewards.videoalign import VideoAlignReward

    folder = tmp_path / "does-not-exist" if breaking == "missing_folder" else None
    folder = folder or _broken_videoalign(videoalign_folder, tmp_path, breaking)
    with pytest.raises((ValueError, OSError, RuntimeError)) as caught:
        reward = VideoAlignReward(folder, device="cpu")
        reward(torch.rand(1, 2, 3, 28, 28), ["a cat"], fps=2.0)
    assert words in str(caught.value)


@pytest.mark.parametrize(("fps", "words"), [(0.0, "fps"), (-2.0, "fps"), (math.nan, "fps")])
def test_videoalign_names_a_bad_frame_rate(videoalign_folder: Path, fps: float, words: str) -> None:
    from sage_env.rewards.videoalign import VideoAlignReward

    reward = VideoAlignReward(videoalign_folder, device="cpu", lazy=True)
    with pytest.raises(ValueError, match=words):
        reward(torch.rand(1, 2, 3, 28, 28), ["a cat"], fps=fps)
