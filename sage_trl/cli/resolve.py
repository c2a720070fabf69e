"""What ``sage-train``'s arguments name: reward functions, training prompts, held-out prompts.

Everything here is checked before any model is loaded: a missing prompt file, an empty one, a reward module that
does not import or a VideoAlign folder without its files is an error naming the argument.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["resolve_eval_prompts", "resolve_reward", "resolve_train_prompts"]


def resolve_reward(spec: str, offload: bool = False) -> Callable:
    """Turn a reward spec (see `TrainScriptArguments.reward`) into a reward function.

    A VideoAlign model loads on first use (its folder is checked now); ``offload`` moves it off the accelerator
    between scoring calls.
    """
    if spec == "toy":
        from sage_env.rewards.toy import ToyReward

        return ToyReward()
    if spec.startswith("videoalign:"):
        from sage_env.rewards.videoalign import VideoAlignReward

        return VideoAlignReward.from_pretrained(
            spec.split(":", 1)[1], lazy=True, offload_between_calls=offload
        )
    module_name, _, function_name = spec.partition(":")
    try:
        reward_fn = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"reward {spec!r} cannot be imported: {error}.") from error
    if not callable(reward_fn):
        raise ValueError(f"reward {spec!r} is a {type(reward_fn).__name__}, not a function.")
    return reward_fn


def _prompts_from_file(path: Path, argument: str) -> list[str]:
    if not path.is_file():
        raise ValueError(f"{argument}: {path} does not exist (a text file with one prompt per line).")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{argument}: {path} holds no prompts (one per line expected).")
    return prompts


def resolve_train_prompts(name: str, split: str) -> Any:
    """Training prompts as a `datasets.Dataset` with a ``prompt`` column, named after ``name`` (the run records it)."""
    from datasets import Dataset, DatasetInfo

    if name == "toy":
        from sage_env.toy.world import TOY_TRAIN_PROMPTS

        return Dataset.from_dict({"prompt": list(TOY_TRAIN_PROMPTS)}, info=DatasetInfo(dataset_name=name))
    if Path(name).suffix == ".txt":
        prompts = _prompts_from_file(Path(name), "dataset_name")
        return Dataset.from_dict({"prompt": prompts}, info=DatasetInfo(dataset_name=name))
    from datasets import load_dataset

    dataset = load_dataset(name, split=split)
    if "prompt" not in dataset.column_names:
        raise ValueError(f"dataset_name: {name} has no 'prompt' column (columns: {dataset.column_names}).")
    dataset.info.dataset_name = dataset.info.dataset_name or name
    return dataset


def resolve_eval_prompts(name: str, count: int, seeds: Sequence[int]) -> tuple[list[str], list[int]]:
    """Held-out ``(prompts, seeds)``: every prompt with every seed (none for ``"none"`` or ``count == 0``)."""
    if name == "none" or count == 0:
        return [], []
    if name == "toy":
        from sage_env.toy.world import TOY_EVAL_PROMPTS

        prompts = list(TOY_EVAL_PROMPTS)
    else:
        prompts = _prompts_from_file(Path(name), "eval_prompts")
    prompts = prompts[:count]
    return [p for p in prompts for _ in seeds], [s for _ in prompts for s in seeds]
