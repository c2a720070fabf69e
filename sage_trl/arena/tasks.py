"""The arena's tasks: toy-world settings an algorithm is compared on, each with its held-out prompts and seeds and
a held-out score (docs/arena.md, "Tasks").

A task is a set of ``sage-train`` flags on top of the toy preset (the held-out evaluation included) and the name of
the score read from the run's ``eval_results.json``: the score of a run is its held-out change, after training
minus before, signed so that higher is better.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TASKS", "ArenaTask", "task_named"]


@dataclass(frozen=True)
class ArenaTask:
    """One task of the arena.

    Args:
        name: the task's name on the command line and in the report.
        tests: what the task tests and why (the report and docs/arena.md print it).
        flags: the ``sage-train`` flags it adds to the toy preset.
        score: the held-out metric of ``eval_results.json`` whose change is the run's score.
        higher_is_better: the metric's direction (a distance: False); the score is signed to rise.
        gold: a second held-out metric the training reward cannot fool, reported beside the score.
    """

    name: str
    tests: str
    flags: tuple[str, ...]
    score: str
    higher_is_better: bool = True
    gold: str = "world_distance"

    def score_of(self, before: dict[str, float], after: dict[str, float]) -> float:
        """The run's score: the held-out change of `score`, higher is better."""
        change = after[self.score] - before[self.score]
        return change if self.higher_is_better else -change

    def gold_of(self, before: dict[str, float], after: dict[str, float]) -> float:
        """The run's gold change: the distance to the world's videos fallen (higher is better)."""
        return before[self.gold] - after[self.gold]


TASKS: dict[str, ArenaTask] = {
    task.name: task
    for task in (
        ArenaTask(
            "toy",
            "The toy world as `sage-train` runs it (10 steps, SDE on the first 5, eta 0.7): the default comparison.",
            (),
            "total",
        ),
        ArenaTask(
            "few_step",
            "The same world sampled with 4 denoising steps, SDE on the first 2: each step is 2.5 times as long, so "
            "the discretisation error the paper's SDE is built against (Sec. 3, Fig. 2) is largest.",
            ("--num_inference_steps", "4", "--sde_window", "0", "2"),
            "total",
        ),
        ArenaTask(
            "temporal",
            "Clips of 12 frames where the shipped prior was trained on 8, with motion quality weighted 2 and visual "
            "quality and text alignment 0.5 each. The prior keeps colour and direction at 12 frames but its motion "
            "falls apart (held-out mq 0.48 against 0.67 at 8 frames), so the reward is dominated by motion "
            "consistency over time: what the temporal gradient equalizer and the paper's temporal claims are about.",
            ("--num_frames", "12", "--reward_component_weights", '{"vq": 0.5, "mq": 2, "ta": 0.5}'),
            "total",
        ),
        ArenaTask(
            "hackable",
            "A training reward that can be gamed (`toy_hackable`: nothing in it scores the object's size, so RL "
            "learns to draw bigger objects), scored by the toy reward (`--eval_reward toy`), which the policy does "
            "not see: over-optimisation shows as a falling score while the training reward still rises.",
            ("--reward", "toy_hackable", "--eval_reward", "toy"),
            "eval_reward/total",
        ),
    )
}
"""The built-in tasks, by name (docs/arena.md, "Tasks")."""


def task_named(name: str) -> ArenaTask:
    """The task called ``name``, or an error listing the tasks."""
    if name not in TASKS:
        raise ValueError(f"Unknown arena task {name!r}; the tasks are {', '.join(TASKS)} (--tasks).")
    return TASKS[name]
