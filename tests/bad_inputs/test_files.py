"""The bad-input sweep, continued: config files, prompt files and resumes, through ``sage-train`` as the user runs it.

Each case must fail with a message naming the field, the file or the line, before any video model is loaded, and
without changing an existing run folder. A config file may come from anywhere: it is read as data (no aliases, no
duplicate keys, no environment block, strict types).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest

from sage_trl.cli import train_main
from sage_trl.config_files import read_config_file
from tests.sage_trl.test_run_folder_rules import TOY_SMALL
from tests.sage_trl.test_run_safety import fingerprint

ALIAS_BOMB = (
    "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    + "eval_seeds: *i\n"
)
"""The "billion laughs" file of issue 28: 9^9 list items from 436 bytes."""
DEEP = "max_steps: " + "[" * 5000 + "]" * 5000 + "\n"


def _refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as caught:
        train_main(argv)
    assert caught.value.code not in (0, None)
    return f"{caught.value.code} {capsys.readouterr().err}"


# -- config files ---------------------------------------------------------------------------------------------------

YAML_CASES: list[tuple[str, str]] = [
    (ALIAS_BOMB, "alias"),
    (DEEP, "nests deeper"),
    ("max_steps: 2\nmax_steps: 3\n", "appears twice"),
    ("env:\n  HF_ENDPOINT: http://example.invalid\n", "env: block"),
    ("env:\n  HF_TOKEN: hf_planted\n", "env: block"),
    ("max_steps: true\n", "max_steps"),
    ("max_steps: 3.7\n", "max_steps"),
    ("max_steps: '3.7'\n", "max_steps"),
    ("learning_rate: fast\n", "learning_rate"),
    ("learning_rate: .nan\n", "learning_rate"),
    ("learning_rate: .inf\n", "learning_rate"),
    ("use_peft: 'maybe'\n", "use_peft"),
    ("use_peft: 1\n", "use_peft"),
    ("reward: toy\n", "reward"),
    ("reward: []\n", "reward"),
    ("eval_seeds: '0,1'\n", "eval_seeds"),
    ("eval_seeds: [0, 1.5]\n", "eval_seeds"),
    ("lora_target_modules: to_q\n", "lora_target_modules"),
    ("lora_r: 8.0\n", "lora_r"),
    ("sde_window: [0]\n", "sde_window"),
    ("sde_window: '0,5'\n", "sde_window"),
    ("sde_window: [0, 5, 7]\n", "sde_window"),
    ("eta: [0.5]\n", "eta"),
    ("seed: -1\n", "seed"),
    ("num_generations: 0\n", "num_generations"),
    ("reward_component_weights: [1, 2]\n", "reward_component_weights"),
    ("reward_component_weights: {vq: .nan}\n", "reward_component_weights"),
    ("algorithm: ddpo\nstat_buffer_size: 0\n", "stat_buffer_size"),
    ("stat_buffer_size: 8\n", "stat_buffer_size"),
    ("algorithm: ddpo\nalgorithm_args: {nosuch: 1}\n", "nosuch"),
    ("lerning_rate: 0.001\n", "learning_rate"),
    ("- max_steps\n- 2\n", "mapping"),
    ("max_steps: [2\n", "not valid YAML"),
    ("1: 2\n", "mapping"),
    ("report_to: [tensorboard, nosuch]\n", "report_to"),
    ("negative_prompt: " + "x" * 5000 + "\n", "negative_prompt"),
    ("model_name_or_path: " + "y" * 5000 + "\n", "model_name_or_path"),
]


@pytest.mark.parametrize(("text", "words"), YAML_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(YAML_CASES)])
def test_a_config_file_is_data(
    text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture, no_model_loads: None
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    message = _refused(["--config", str(config), "--output_dir", str(tmp_path / "out")], capsys)
    assert words in message, message
    assert "HF_ENDPOINT" not in os.environ and "HF_TOKEN" not in os.environ  # nothing reaches the environment
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00m\x00a\x00x", b"\x00" * 64, b"a" * (2 << 20)], ids=["utf16", "nul", "huge"]
)
def test_a_config_file_that_is_not_text_is_named(
    content: bytes, tmp_path: Path, capsys, no_model_loads: None
) -> None:
    config = tmp_path / "run.yaml"
    config.write_bytes(content)
    assert str(config) in _refused(["--config", str(config), "--output_dir", str(tmp_path / "out")], capsys)


@pytest.mark.parametrize("text", [ALIAS_BOMB, DEEP], ids=["alias-bomb", "5000-deep"])
def test_hostile_yaml_is_refused_in_time_and_memory(text: str, tmp_path: Path) -> None:
    config = tmp_path / "hostile.yaml"
    config.write_text(text)
    start = time.process_time()  # this process's CPU time: other jobs on the machine do not count
    with pytest.raises(ValueError, match=str(config)):
        read_config_file(config)
    seconds = time.process_time() - start
    tracemalloc.start()  # a second pass: tracing slows Python down severalfold
    with pytest.raises(ValueError, match=str(config)):
        read_config_file(config)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 2 and peak < 200 * 2**20, (seconds, peak)


# -- prompt files -----------------------------------------------------------------------------------------------------

PROMPT_CASES: list[tuple[str, bytes, str]] = [
    ("dataset_name", "a red square moving left\ncaf\xe9\n".encode("latin-1"), "not UTF-8"),
    ("dataset_name", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8"),
    ("dataset_name", b"a red square moving left\na\x00b\n", "NUL"),
    ("dataset_name", b"a red square moving left\n" + b"x" * 10_000 + b"\n", "prompt 2 is 10000 characters"),
    ("dataset_name", b"a cat playing piano\n", "toy reward reads only such prompts"),
    ("dataset_name", b"a purple square moving left\n", "toy reward reads only such prompts"),
    ("dataset_name", b"\n \n\t\n", "holds no prompts"),
    ("eval_prompts", "a red square moving left\n\xe9t\xe9\n".encode("latin-1"), "not UTF-8"),
    ("eval_prompts", b"a red square moving left\na green circle moving up\n", "num_eval_prompts"),
    ("eval_prompts", b"a dog\n", "toy reward reads only such prompts"),
]


@pytest.mark.parametrize(
    ("argument", "content", "words"), PROMPT_CASES, ids=[f"{c[0]}-{c[2]}" for c in PROMPT_CASES]
)
def test_prompt_files_are_checked_when_read(
    argument: str, content: bytes, words: str, tmp_path: Path, capsys, no_model_loads: None
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(content)
    message = _refused(["--output_dir", str(tmp_path / "out"), f"--{argument}", str(prompts)], capsys)
    assert words in message and str(prompts) in message, message


# -- resuming: everything is checked before a file is touched or a model loaded --------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("finished") / "run"
    assert train_main(["--output_dir", str(folder), *TOY_SMALL]) == 0
    return folder


def _edit_global_step(run: Path) -> None:
    state = run / "checkpoint-2" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "global_step": 999}))


def _stage(run: Path) -> None:
    shutil.copytree(run / "checkpoint-2", run / "tmp-checkpoint-3")


RESUME_CASES: list[tuple[list[str], str, object]] = [
    (["--algorithm", "flow_grpo"], "algorithm", None),
    (["--lora_r", "4"], "r is 8 in the checkpoint", None),
    (["--lora_alpha", "8"], "lora_alpha", None),
    (["--use_peft", "false"], "use_peft", None),
    (["--lora_target_modules", "nosuch"], "lora_target_modules", None),
    (["--seed", "5"], "seed", None),
    (["--eta", "0.3"], "eta", None),
    (["--num_generations", "4"], "num_generations", None),
    (["--sde", "flow_grpo"], "sde", None),
    ([], "global_step 999", _edit_global_step),
    (["--resume_from_checkpoint", "{run}/tmp-checkpoint-3"], "staging", _stage),
    (["--resume_from_checkpoint", "{run}/sage_config.json"], "does not exist (or is not a folder)", None),
    (["--resume_from_checkpoint", "{run}/checkpoint-9"], "does not exist", None),
    (["--resume_from_checkpoint", "{run}"], "not a checkpoint-N folder", None),
]


@pytest.mark.parametrize(("flags", "words", "damage"), RESUME_CASES, ids=[c[1] for c in RESUME_CASES])
def test_a_resume_that_cannot_work_changes_nothing(
    flags: list[str], words: str, damage, finished_run: Path, tmp_path: Path, capsys, no_model_loads: None
) -> None:
    run = shutil.copytree(finished_run, tmp_path / "run")
    if damage is not None:
        damage(run)
    before = fingerprint(run)
    resume = ["--resume_from_checkpoint", "true"] if "--resume_from_checkpoint" not in flags else []
    argv = [
        "--output_dir",
        str(run),
        *TOY_SMALL,
        "--max_steps",
        "6",
        *resume,
        *[f.format(run=run) for f in flags],
    ]
    message = _refused(argv, capsys)
    assert words in message, message
    assert fingerprint(run) == before
