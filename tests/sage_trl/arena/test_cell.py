"""A cell's result names the logged metrics as the evaluation logs them (sage_trl.evaluation.logged_name)."""

from __future__ import annotations

import torch

from sage_trl.arena import TASKS
from sage_trl.evaluation import EvaluationResult, evaluation_metrics, logged_name


def test_every_result_name_maps_to_the_metric_the_evaluation_logs() -> None:
    values = torch.tensor([0.5, 0.7])
    result = EvaluationResult(
        prompts=["a", "b"], seeds=[0, 0], components={"vq": values, "mq": values}, total=values,
        videos=torch.zeros(2, 1, 3, 2, 2), measures={"world_distance": values, "object_area_ratio": values},
        eval_rewards={"eval_reward/vq": values, "eval_reward/total": values},
    )  # fmt: skip
    logged = evaluation_metrics(result)
    assert {logged_name(name) for name in result.means()} == set(logged)
    for task in TASKS.values():  # every task's score and gold are among them
        assert logged_name(task.score) in logged and logged_name(task.gold) in logged
