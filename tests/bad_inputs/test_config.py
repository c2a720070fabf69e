"""The bad-input sweep through `SageGRPOConfig` from Python (values the command line cannot express), the
scripts' arguments and the agents: each case names the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from sage_trl import SageGRPOConfig
from tests.doubles import LinearBackbone

CONFIG_CASES: list[tuple[dict[str, Any], str]] = [
    ({"eval_seeds": [0, -1]}, "eval_seeds"),
    ({"eval_seeds": []}, "eval_seeds"),
    ({"sde_window": "0,5"}, "sde_window"),
    ({"sde_window": [0.5, 2]}, "sde_window"),
    ({"sde_window": [0, 2, 4]}, "sde_window"),
    ({"seed": True}, "seed"),
    ({"num_frames": 8.5}, "num_frames"),
    ({"num_generations": 2.5}, "num_generations"),
    ({"reward_component_weights": 3}, "reward_component_weights"),
    ({"eta": float("nan")}, "eta"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"micro_batch_size": True}, "micro_batch_size"),
    ({"max_steps": 3.7}, "max_steps"),
    ({"max_steps": True}, "max_steps"),
    ({"learning_rate": True}, "learning_rate"),
    ({"learning_rate": "3e-4"}, "learning_rate"),
    ({"eta": 0.0}, "eta"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": "inf"}, "epsilon"),
    ({"negative_prompt": "a\x00b"}, "negative_prompt"),
    ({"negative_prompt": "x" * 5000}, "negative_prompt"),
    ({"sde": "ode"}, "sde"),
    ({"report_to": "nosuchtracker"}, "report_to"),
    ({"report_to": ["tensorboard", 3]}, "report_to"),
    ({"backbone": "NoSuchPipeline"}, "backbone"),
    ({"algorithm": "ddpo", "algorithm_args": {"stat_buffer_size": 0}}, "stat_buffer_size"),
    ({"algorithm": "ddpo", "algorithm_args": {"nosuch": 1}}, "nosuch"),
    ({"algorithm": "sage_grpo", "algorithm_args": {"stat_buffer_size": 8}}, "declares no fields"),
    ({"algorithm_args": {"eta": 0.3}}, "eta"),
    ({"reward_component_weights": {"vq": True}}, "reward_component_weights"),
    ({"reward_component_weights": {"vq": float("inf")}}, "reward_component_weights"),
    ({"reward_weights": [0.0, 0.0]}, "every reward weight 0"),
    ({"torch_dtype": "float64"}, "torch_dtype"),
    ({"seed": 2**40}, "seed"),
    ({"num_train_epochs": -3.0, "max_steps": -1}, "num_train_epochs"),
    ({"steps_per_generation": 0}, "steps_per_generation"),
    ({"output_dir": ""}, "output_dir"),
    ({"logging_first_step": "yes"}, "logging_first_step"),
]


@pytest.mark.parametrize(("kwargs", "words"), CONFIG_CASES, ids=[str(c[0])[:60] for c in CONFIG_CASES])
def test_the_python_config_names_the_field(kwargs: dict[str, Any], words: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=words):
        SageGRPOConfig(**{"output_dir": str(tmp_path), "use_cpu": True, **kwargs})


def test_bf16_without_a_gpu_names_the_ways_on(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=r"bf16 is on.*--preflight.*--use_cpu true"):
        SageGRPOConfig(output_dir=str(tmp_path), bf16=True)


VALID_EDGES: list[dict[str, Any]] = [
    {"epsilon": math.inf},  # no clipping
    {"eta": 10.0},
    {"learning_rate": 1.0},
    {"weight_decay": 1.0},
    {"adam_beta1": 0.0},
    {"kl_warmup_steps": 0},
    {"beta": 0.0, "kl_coef_min": 0.0},
    {"timestep_fraction": 1.0},
    {"algorithm": "ddpo", "algorithm_args": {"stat_buffer_size": 1, "stat_min_count": 1}},
    {"reward_component_weights": {"vq": 0.0, "ta": 1.0}},
    {"negative_prompt": ""},
    {"learning_rate": 1},  # an integer where a real number is asked for
]


@pytest.mark.parametrize("kwargs", VALID_EDGES, ids=[str(c)[:60] for c in VALID_EDGES])
def test_valid_edge_values_are_accepted(kwargs: dict[str, Any], tmp_path: Path) -> None:
    config = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)
    config.algorithm_config()


SCRIPT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"reward": "toy"}, "reward"),
    ({"reward": []}, "reward"),
    ({"eval_reward": "toy"}, "eval_reward"),
    ({"eval_reward": ["videoalign:"]}, "names no checkpoint"),
    ({"use_peft": "yes"}, "use_peft"),
    ({"lora_r": True}, "lora_r"),
    ({"lora_dropout": 1.0}, "lora_dropout"),
    ({"num_eval_prompts": -1}, "num_eval_prompts"),
    ({"lora_target_modules": "to_q"}, "lora_target_modules"),
    ({"use_peft": False, "lora_alpha": 64}, "lora_alpha"),
]


@pytest.mark.parametrize(("kwargs", "words"), SCRIPT_CASES, ids=[str(c[0]) for c in SCRIPT_CASES])
def test_the_script_arguments_name_the_field(kwargs: dict[str, Any], words: str) -> None:
    from sage_trl.cli import TrainScriptArguments

    with pytest.raises(ValueError, match=words):
        TrainScriptArguments(**kwargs)


AGENT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"eta": -1.0}, "eta"),
    ({"sde": "ode"}, "sde"),
    ({"num_iterations": 0}, "num_iterations"),
    ({"num_minibatches": 0}, "num_minibatches"),
    ({"seed": -1}, "seed"),
    ({"nosuch": 1}, "nosuch"),
    ({"epsilon": "0.1"}, "epsilon"),
    ({"kl_coef_min": 1.0, "beta": 0.1}, "kl_coef_min"),
    ({"learning_rate": float("nan")}, "learning_rate"),
]


@pytest.mark.parametrize(("kwargs", "words"), AGENT_CASES, ids=[str(c[0]) for c in AGENT_CASES])
def test_agents_name_the_field(kwargs: dict[str, Any], words: str) -> None:
    import agents

    with pytest.raises(ValueError, match=words):
        agents.make("sage_grpo", policy=LinearBackbone(), **kwargs)
