"""What ``sage-train``'s arguments name: reward functions, training prompts, held-out prompts.

Everything here is checked before any model is loaded: a missing prompt file, an empty one, one that is not UTF-8
text, a prompt with a NUL character, longer than a text encoder reads or (with the toy reward) outside the toy
grammar, a reward module that does not import or a VideoAlign folder without its files is an error naming the
argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_PROMPT_CHARACTERS",
    "check_prompts",
    "resolve_eval_prompts",
    "resolve_reward",
    "resolve_train_prompts",
]


def resolve_reward(spec: str, offload: bool = False) -> Callable:
    """Turn a reward spec (see `TrainScriptArguments.reward`) into a reward function: a name of
    `sage_env.rewards.REWARDS` (built in, an installed package's, or ``module:function``) or
    ``videoalign:<folder or Hub id>``.

    A VideoAlign model loads on first use (its folder is checked now); ``offload`` moves it off the accelerator
    between scoring calls.
    """
    if spec.startswith("videoalign:"):
        from sage_env.rewards.videoalign import VideoAlignReward

        return VideoAlignReward.from_pretrained(
            spec.split(":", 1)[1], lazy=True, offload_between_calls=offload
        )
    from sage_env.rewards import load_reward

    try:
        return load_reward(spec)
    except ValueError as error:
        raise ValueError(f"reward: {error}") from None


MAX_PROMPT_CHARACTERS = 2000
"""The longest prompt accepted. The supported text encoders read a few hundred tokens (Wan's UMT5 512, about 2000
characters of English; the toy's byte-level encoder 32 bytes): anything longer would be cut off without a word."""


def check_prompts(prompts: Sequence[str], source: str, toy_grammar: bool) -> list[str]:
    """``prompts`` if each is a non-empty string of at most `MAX_PROMPT_CHARACTERS` without NUL characters (and,
    with ``toy_grammar``, a prompt of the toy world's grammar, which its reward reads); else a ``ValueError``
    naming ``source`` and the line."""
    from sage_env.toy.world import parse_prompt

    for line, prompt in enumerate(prompts, start=1):
        where = f"{source}, prompt {line}"
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where} is empty or not text ({prompt!r}).")
        if "\x00" in prompt:
            raise ValueError(f"{where} holds a NUL character: is it a binary file?")
        if len(prompt) > MAX_PROMPT_CHARACTERS:
            raise ValueError(
                f"{where} is {len(prompt)} characters; prompts are at most {MAX_PROMPT_CHARACTERS} (the text encoders "
                "read a few hundred tokens and would cut the rest off)."
            )
        if toy_grammar:
            try:
                parse_prompt(prompt)
            except ValueError as error:
                raise ValueError(f"{where}: {error} The toy reward reads only such prompts.") from None
    return list(prompts)


def _prompts_from_file(path: Path, argument: str, toy_grammar: bool) -> list[str]:
    if not path.is_file():
        raise ValueError(f"{argument}: {path} does not exist (a text file with one prompt per line).")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{argument}: {path} is not UTF-8 text (byte {error.start}: {error.reason}); save it as UTF-8, one prompt "
            "per line."
        ) from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{argument}: {path} holds no prompts (one per line expected).")
    return check_prompts(prompts, f"{argument} {path}", toy_grammar)


def resolve_train_prompts(name: str, split: str, toy_grammar: bool = False) -> Any:
    """Training prompts as a `datasets.Dataset` with a ``prompt`` column, named after ``name`` (the run records it).

    ``toy_grammar``: every prompt must be of the toy world's grammar (a toy reward reads it).
    """
    from datasets import Dataset, DatasetInfo

    if name == "toy":
        from sage_env.toy.world import TOY_TRAIN_PROMPTS

        return Dataset.from_dict({"prompt": list(TOY_TRAIN_PROMPTS)}, info=DatasetInfo(dataset_name=name))
    if Path(name).suffix == ".txt":
        prompts = _prompts_from_file(Path(name), "dataset_name", toy_grammar)
        return Dataset.from_dict({"prompt": prompts}, info=DatasetInfo(dataset_name=name))
    from datasets import load_dataset

    dataset = load_dataset(name, split=split)
    if "prompt" not in dataset.column_names:
        raise ValueError(f"dataset_name: {name} has no 'prompt' column (columns: {dataset.column_names}).")
    check_prompts(dataset["prompt"], f"dataset_name {name}", toy_grammar)
    dataset.info.dataset_name = dataset.info.dataset_name or name
    return dataset


def resolve_eval_prompts(name: str, count: int, toy_grammar: bool = False) -> list[str]:
    """The held-out prompts: the first ``count`` (none for ``"none"`` or ``count == 0``); a ``count`` larger than
    the prompts available is an error. Each is sampled once per ``eval_seeds`` seed."""
    if name == "none" or count == 0:
        return []
    if name == "toy":
        from sage_env.toy.world import TOY_EVAL_PROMPTS

        prompts = list(TOY_EVAL_PROMPTS)
    else:
        prompts = _prompts_from_file(Path(name), "eval_prompts", toy_grammar)
    if count > len(prompts):
        raise ValueError(
            f"num_eval_prompts is {count} but eval_prompts {name} holds {len(prompts)} prompts; pass "
            f"--num_eval_prompts {len(prompts)} or fewer."
        )
    return prompts[:count]
