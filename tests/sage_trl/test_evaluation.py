"""`sage_trl.evaluation.evaluate_policy`: deterministic held-out videos scored in batches, a batch the reward failed
on whole kept as NaN rows, and `sampling_held_out` set only while it samples; the logged names of its results."""

from __future__ import annotations

import math

import pytest
import torch

from sage_env.backbones.toy import ToyBackbone
from sage_env.rewards import CompositeReward
from sage_trl.evaluation import (
    EvaluationResult,
    evaluate_policy,
    evaluation_metrics,
    logged_name,
    sampling_held_out,
)

PROMPTS = ["a red square moving left", "a blue circle moving up", "a green square moving right"]


def test_a_batch_the_reward_failed_on_whole_is_nan_and_the_others_are_scored() -> None:
    """The evaluation concatenated the batches' components itself and raised KeyError('brightness') when one batch
    (here of one video) had none because its reward call failed."""
    seen = []

    def brightness(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        seen.append(sampling_held_out())
        if "a blue circle moving up" in prompts:
            raise ConnectionError("reward server restarting")
        return videos.mean(dim=(1, 2, 3, 4))

    backbone = ToyBackbone.from_scratch(seed=0)
    result = evaluate_policy(backbone, CompositeReward(brightness), PROMPTS, [0, 0, 1], batch_size=1)
    scores = result.components["brightness"]
    assert torch.isnan(scores[1]) and torch.isfinite(scores[[0, 2]]).all()
    assert result.means()["brightness"] == float(scores[[0, 2]].mean())
    again = evaluate_policy(backbone, CompositeReward(brightness), PROMPTS[:1], [0])
    assert torch.equal(again.videos[0], result.videos[0])  # the same prompt and seed, the same video
    assert seen and all(seen) and not sampling_held_out()


def test_every_batch_failing_leaves_no_component_and_a_nan_total() -> None:
    def broken(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        raise ConnectionError("reward server down")

    result = evaluate_policy(ToyBackbone.from_scratch(seed=0), CompositeReward(broken), PROMPTS, [0, 0, 0], batch_size=2)
    assert result.components == {} and math.isnan(result.means()["total"])


def test_a_measure_of_the_users_own_is_logged_as_a_measure_not_as_a_reward() -> None:
    values = torch.tensor([0.5, 0.7])
    result = EvaluationResult(
        prompts=["a", "b"], seeds=[0, 0], components={"vq": values}, total=values,
        videos=torch.zeros(2, 1, 3, 2, 2), measures={"sharpness": values, "world_distance": values},
    )  # fmt: skip
    assert evaluation_metrics(result) == pytest.approx(
        {"eval_reward/vq": 0.6, "eval_reward/total": 0.6, "eval_world/sharpness": 0.6, "eval_world/world_distance": 0.6}
    )
    assert logged_name("sharpness") == "eval_reward/sharpness"  # not a toy-world measure unless named as one
    assert logged_name("sharpness", measures={"sharpness"}) == "eval_world/sharpness"
