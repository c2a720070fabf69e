"""The bad-input sweep: what a user who mistypes gets from every entry point.

Each case must fail (a non-zero exit or an exception) with a message naming the offending field or path; the
``sage-train`` cases must fail before any video model is loaded and without changing an existing run folder.
Entry points: ``sage-train`` (its flags and its config file), `SageGRPOConfig`, the environment, the SDE step,
rewards, VideoAlign, ``sage-push`` and ``sage-generate``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sage_env import sde
from sage_env.env import DenoisingVectorEnv
from sage_env.rewards import CompositeReward, RewardFailureMonitor, check_videos
from sage_env.rewards.toy import ToyReward
from sage_trl import SageGRPOConfig
from sage_trl.cli import train_main
from sage_trl.hub import push_main
from sage_trl.run_folder import RunFolder
from sage_trl.run_folder.manifest import create_manifest
from tests.doubles import LinearBackbone, mean_brightness


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Paths the cases refer to (``{name}`` in a case's arguments)."""
    paths = {
        "missing": tmp_path / "missing",
        "file": tmp_path / "a-file.txt",
        "empty_prompts": tmp_path / "empty.txt",
        "prompts": tmp_path / "prompts.txt",
        "not_a_pipeline": tmp_path / "not-a-pipeline",
        "bad_yaml": tmp_path / "bad.yaml",
        "list_yaml": tmp_path / "list.yaml",
        "typo_yaml": tmp_path / "typo.yaml",
        "out": tmp_path / "out",
    }
    paths["file"].write_text("not a folder")
    paths["empty_prompts"].write_text("\n\n")
    paths["prompts"].write_text("a cat\na dog\n")
    paths["not_a_pipeline"].mkdir()
    paths["bad_yaml"].write_text("max_steps: [2\n")
    paths["list_yaml"].write_text("- max_steps\n- 2\n")
    paths["typo_yaml"].write_text("lerning_rate: 0.001\n")
    return paths


def _format(arguments: list[str], files: dict[str, Path]) -> list[str]:
    return [argument.format(**{k: str(v) for k, v in files.items()}) for argument in arguments]


# -- sage-train: (flags, words the message must contain) -------------------------------------------------------

TRAIN_CASES: list[tuple[list[str], str]] = [
    (["--max_steps", "0"], "max_steps"),
    (["--max_steps", "-5"], "max_steps"),
    (["--save_strategy", "steps", "--save_steps", "0"], "save_steps"),
    (["--fps", "0"], "fps"),
    (["--fps", "-8"], "fps"),
    (["--fps", "nan"], "fps"),
    (["--num_generations", "0"], "num_generations"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
    (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps"),
    (["--guidance_scale", "-1"], "guidance_scale"),
    (["--beta", "-1e-5"], "beta"),
    (["--beta_pos", "-1"], "beta_pos"),
    (["--beta_vel", "-0.1"], "beta_vel"),
    (["--kl_coef_min", "-1e-7"], "kl_coef_min"),
    (["--kl_coef_min", "1", "--beta", "0.1"], "kl_coef_min"),
    (["--eta", "1e30"], "eta"),
    (["--eta", "-0.5"], "eta"),
    (["--eta", "inf"], "eta"),
    (["--sde", "cps", "--eta", "1.5"], "eta"),
    (["--sde", "ode"], "sde"),
    (["--sde", "langevin"], "Unknown SDE type 'langevin'; known: cps"),
    (["--sde_window", "3"], "sde_window"),
    (["--sde_window", "4", "2"], "sde_window"),
    (["--sde_window", "0", "99"], "sde_window"),
    (["--seed", "-1"], "seed"),
    (["--seed", "1.5"], "--seed"),
    (["--reward", "nope"], "reward 'nope'"),
    (["--reward", "videoalign:"], "videoalign"),
    (["--reward", "videoalign:{missing}"], "{missing}"),
    (["--reward", "tests.doubles:no_such_reward"], "no_such_reward"),
    (["--reward", "no_such_module_xyz:score"], "no_such_module_xyz"),
    (["--dataset_name", "{missing}.txt"], "dataset_name"),
    (["--dataset_name", "{empty_prompts}"], "holds no prompts"),
    (["--eval_prompts", "{missing}.txt"], "eval_prompts"),
    (["--num_eval_prompts", "-1"], "num_eval_prompts"),
    (["--eval_seeds", "-1"], "eval_seeds"),
    (["--lora_r", "0"], "lora_r"),
    (["--lora_alpha", "0"], "lora_alpha"),
    (["--lora_dropout", "1.5"], "lora_dropout"),
    (["--output_dir", "{file}"], "{file}"),
    (["--model_name_or_path", "{missing}"], "{missing}"),
    (["--model_name_or_path", "./{missing}"], "does not exist"),
    (["--model_name_or_path", "{not_a_pipeline}"], "model_index.json"),
    (["--output_dir", "{out}", "--resume_from_checkpoint", "true"], "no checkpoint-N"),
    (["--output_dir", "{out}", "--resume_from_checkpoint", "{missing}"], "{missing}"),
    (["--config", "{missing}.yaml"], "config"),
    (["--config", "{bad_yaml}"], "not valid YAML"),
    (["--config", "{list_yaml}"], "mapping"),
    (["--config", "{typo_yaml}"], "lerning_rate"),
    (["--preset", "no_such_preset"], "preset"),
    (["--algorithm", "ppo"], "Unknown algorithm 'ppo'; known: awm, branch_grpo, cps"),
    (["--scale_rewards", "per_token"], "scale_rewards"),
    (["--kl_strategy", "reverse"], "kl_strategy"),
    (["--kl_coef_schedule", "cosine"], "kl_coef_schedule"),
    (["--log_prob_kind", "laplace"], "log_prob_kind"),
    (["--equalizer_median", "upper"], "equalizer_median"),
    (["--epsilon", "1.5"], "epsilon"),
    (["--epsilon", "0"], "epsilon"),
    (["--epsilon_high", "2"], "epsilon_high"),
    (["--timestep_fraction", "0"], "timestep_fraction"),
    (["--timestep_fraction", "1.5"], "timestep_fraction"),
    (["--anchor_update_steps", "0"], "anchor_update_steps"),
    (["--kl_history", "0"], "kl_history"),
    (["--kl_warmup_steps", "-1"], "kl_warmup_steps"),
    (["--kl_target", "0"], "kl_target"),
    (["--micro_batch_size", "0"], "micro_batch_size"),
    (["--num_iterations", "0"], "num_iterations"),
    (["--max_consecutive_reward_failures", "0"], "max_consecutive_reward_failures"),
    (["--learning_rate", "0"], "learning_rate"),
    (["--learning_rate", "-1e-4"], "learning_rate"),
    (["--max_grad_norm", "0"], "max_grad_norm"),
    (["--adv_clip_max", "0"], "adv_clip_max"),
    (["--advantage_eps", "0"], "advantage_eps"),
    (["--equalizer_eps", "-1"], "equalizer_eps"),
    (["--torch_dtype", "int8"], "torch_dtype"),
    (["--reward_preset", "setting_c"], "reward_preset"),
    (["--reward_component_weights", "{{vq: 1"], "reward_component_weights"),
    (["--reward_component_weights", "[1, 2]"], "reward_component_weights"),
    (["--temperature", "0.7"], "temperature"),
    (["--top_p", "0.9"], "top_p"),
    (["--max_completion_length", "64"], "max_completion_length"),
    (["--loss_type", "dr_grpo"], "loss_type"),
    (["--use_vllm", "true"], "use_vllm"),
    (["--num_frames", "0"], "num_frames"),
    (["--height", "-16"], "height"),
    (["--width", "0"], "width"),
    (["--num_inference_steps", "0"], "num_inference_steps"),
    (["--rollout_batch_size", "0"], "rollout_batch_size"),
    (["--activation_offload", "true"], "activation_offload holds the block inputs"),
    (["--shift", "0"], "shift"),
    (["--shift", "-3"], "shift"),
    (["--gpu_memory_gib", "0"], "gpu_memory_gib"),
    (["--lerning_rate", "1e-4"], "--lerning_rate"),
    (["--max_steps", "two"], "--max_steps"),
    # numbers out of range, found on 2dec1df to be accepted or misreported
    (["--learning_rate", "inf"], "learning_rate"),
    (["--learning_rate", "1e9"], "learning_rate"),
    (["--learning_rate", "-1e-3"], "learning_rate must be"),
    (["--learning_rate", "nan"], "learning_rate"),
    (["--eta", "1e6"], "eta"),
    (["--eta", "0"], "eta"),
    (["--eta", "11"], "eta"),
    (["--adam_beta1", "2"], "adam_beta1"),
    (["--adam_beta2", "-0.1"], "adam_beta2"),
    (["--adam_epsilon", "0"], "adam_epsilon"),
    (["--weight_decay", "-1"], "weight_decay"),
    (["--weight_decay", "2"], "weight_decay"),
    (["--num_iterations", "1000000"], "num_iterations"),
    (["--max_steps", "-1", "--num_train_epochs", "-3"], "num_train_epochs"),
    (["--max_steps", "-1", "--num_train_epochs", "0"], "num_train_epochs"),
    (["--max_steps", "-2"], "max_steps"),
    (["--steps_per_generation", "0"], "steps_per_generation"),
    (["--num_generations", "1"], "num_generations"),
    (["--seed", "9999999999999"], "seed"),
    (["--logging_steps", "0"], "logging_steps"),
    (["--save_total_limit", "0"], "save_total_limit"),
    (["--dataloader_num_workers", "-1"], "dataloader_num_workers"),
    (["--guidance_scale", "1e9"], "guidance_scale"),
    (["--guidance_scale", "nan"], "guidance_scale"),
    (["--beta", "inf"], "beta"),
    (["--beta", "nan"], "beta"),
    (["--beta_pos", "inf"], "beta_pos"),
    (["--kl_history", "10000000"], "kl_history"),
    (["--kl_warmup_steps", "1.5"], "--kl_warmup_steps"),
    (["--anchor_update_steps", "-3"], "anchor_update_steps"),
    (["--timestep_fraction", "nan"], "timestep_fraction"),
    (["--epsilon_high", "-0.2"], "epsilon_high"),
    (["--advantage_eps", "2"], "advantage_eps"),
    (["--equalizer_eps", "nan"], "equalizer_eps"),
    (["--micro_batch_size", "1e9"], "--micro_batch_size"),
    (["--micro_batch_size", "100000000"], "micro_batch_size"),
    (["--max_consecutive_reward_failures", "-2"], "max_consecutive_reward_failures"),
    (["--sde_window", "0", "-1"], "sde_window"),
    (["--sde_window", "-1", "3"], "sde_window"),
    (["--gpu_memory_gib", "-5"], "gpu_memory_gib"),
    (["--gpu_memory_gib", "inf"], "gpu_memory_gib"),
    (["--fps", "1e9"], "fps"),
    (["--shift", "inf"], "shift"),
    (["--num_inference_steps", "100000"], "num_inference_steps"),
    (["--rollout_batch_size", "-4"], "rollout_batch_size"),
    (["--num_eval_prompts", "100"], "num_eval_prompts"),
    (["--eval_seeds", "-3", "1"], "eval_seeds"),
    # sizes the model cannot make, refused from its configuration before any weight loads
    (["--num_frames", "100000"], "num_frames"),
    (["--num_frames", "40"], "frames"),
    (["--height", "1000000"], "height"),
    (["--width", "7"], "width"),
    (["--height", "200"], "height"),
    (["--lora_r", "100000"], "lora_r"),
    (["--lora_r", "100"], "lora_r"),
    (["--lora_target_modules", "nosuch"], "lora_target_modules"),
    (["--lora_target_modules", "to_q", "nosuch_either"], "lora_target_modules"),
    # options that do not apply, or conflict
    (["--use_peft", "false", "--lora_r", "32"], "lora_r"),
    (["--use_peft", "false", "--lora_target_modules", "to_q"], "lora_target_modules"),
    (["--use_peft", "false", "--lora_dropout", "0.1"], "lora_dropout"),
    (["--reward_component_weights", '{{"vq": 1}}', "--reward_preset", "setting_b"], "reward_preset"),
    (["--reward_component_weights", '{{"vq": 1}}', "--reward_weights", "1"], "reward_weights"),
    (["--reward_preset", "setting_a", "--reward_weights", "1"], "reward_weights"),
    (["--reward_component_weights", '{{"vq": 0, "mq": 0, "ta": 0}}'], "every reward weight 0"),
    (["--reward_weights", "0"], "every reward weight 0"),
    (["--reward_component_weights", '{{"vq": NaN}}'], "reward_component_weights"),
    (["--reward_component_weights", '{{"vq": "high"}}'], "reward_component_weights"),
    (["--reward_component_weights", "{{}}"], "reward_component_weights"),
    # late or misdirected on 2dec1df
    (["--report_to", "nosuchtracker"], "report_to"),
    (["--backbone", "NoSuchPipeline"], "backbone"),
    (["--output_dir", ""], "output_dir"),
    (["--torch_dtype", "float64"], "torch_dtype"),
    (["--algorithm", "ddpo", "--stat_buffer_size", "0"], "stat_buffer_size"),
    (["--algorithm", "ddpo", "--stat_min_count", "-1"], "stat_min_count"),
    (["--stat_buffer_size", "8"], "--stat_buffer_size"),
    (["--algorithm_args", '{{"stat_buffer_size": 8}}'], "algorithm_args"),
    (["--algorithm", "ddpo", "--algorithm_args", '{{"nosuch": 1}}'], "nosuch"),
    (["--algorithm", "ddpo", "--algorithm_args", "[1]"], "algorithm_args"),
    # the algorithms of issue 23: their own rules, before any model load
    (["--algorithm", "awm", "--num_iterations", "2"], "num_iterations=2: AWM trains on-policy only"),
    (["--algorithm", "diffusion_nft", "--kl_strategy", "dual"], "kl_strategy='dual' needs transition"),
    (["--algorithm", "mix_grpo", "--sde_window_size", "0"], "sde_window_size"),
    (["--algorithm", "diffusion_nft", "--nft_beta", "0"], "nft_beta"),
    (["--algorithm", "awm", "--awm_weighting", "cubic"], "awm_weighting"),
    (["--algorithm", "branch_grpo", "--branch_factor", "3"], "is not a power of branch_factor 3"),
    (["--algorithm", "branch_grpo", "--branch_steps", "0", "3", "6"], "give 2 branch steps"),
    (["--algorithm", "branch_grpo", "--branch_width_pruning_ratio", "2"], "branch_width_pruning_ratio"),
    (["--algorithm", "mix_grpo_flash", "--post_window_compress_ratio", "0"], "post_window_compress_ratio"),
    (["--bf16", "true", "--use_cpu", "false"], "bf16"),
    (["--preset", "/etc/passwd"], "preset"),
    (["--num_frames", "8", "--resume_from_checkpoint", "{file}"], "{file}"),
]


@pytest.mark.parametrize(("arguments", "words"), TRAIN_CASES, ids=[" ".join(c[0]) for c in TRAIN_CASES])
def test_sage_train_refuses_before_loading_a_model(
    arguments: list[str], words: str, files: dict[str, Path], no_model_loads: None, capsys, tmp_path: Path
) -> None:
    argv = ["--output_dir", str(tmp_path / "default-out"), *_format(arguments, files)]
    with pytest.raises(SystemExit) as caught:
        train_main(argv)
    message = f"{caught.value.code} {capsys.readouterr().err}"
    assert caught.value.code not in (0, None)
    assert words.format(**{k: str(v) for k, v in files.items()}) in message, message


@pytest.mark.parametrize("owned", [True, False])
def test_sage_train_into_an_existing_run_changes_nothing(
    files: dict[str, Path], no_model_loads: None, owned: bool
) -> None:
    folder = RunFolder(files["out"])
    folder.path.mkdir()
    if owned:
        create_manifest(folder.path, ["metrics.jsonl", "training_complete.json"])
    (folder.path / "metrics.jsonl").write_text('{"step": 1}\n')
    folder.mark_complete(1, 1)
    before = {p.name: p.read_bytes() for p in folder.path.iterdir()}
    expected = "already holds a run" if owned else "not created by sage-train"
    with pytest.raises(SystemExit, match=expected):
        train_main(["--output_dir", str(folder.path), "--reward", "nope:x"])  # a bad reward on top
    with pytest.raises(SystemExit, match=expected):
        train_main(["--output_dir", str(folder.path), "--overwrite_output_dir", str(not owned).lower()])
    assert {p.name: p.read_bytes() for p in folder.path.iterdir()} == before


# -- SageGRPOConfig from Python: values the command line cannot even express -------------------------------------

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


# -- the environment ----------------------------------------------------------------------------------------------


def _env(**overrides: Any) -> DenoisingVectorEnv:
    values = {
        "num_envs": 4,
        "group_size": 2,
        "num_frames": 2,
        "height": 4,
        "width": 4,
        "num_steps": 3,
        "shift": 1.0,
    }
    values.update(overrides)
    backbone = values.pop("backbone", LinearBackbone())
    reward = values.pop("reward_fn", mean_brightness)
    prompts = values.pop("prompts", ["a", "b"])
    return DenoisingVectorEnv(backbone, reward, prompts, **values)


ENV_CASES: list[tuple[dict[str, Any], str]] = [
    ({"num_envs": 0}, "num_envs"),
    ({"group_size": 3}, "group_size"),
    ({"array_mode": "jax"}, "array_mode"),
    ({"render_mode": "human"}, "render_mode"),
    ({"sde": "langevin"}, "langevin"),
    ({"eta": -1.0}, "eta"),
    ({"eta": float("nan")}, "eta"),
    ({"eta": 1e30}, "eta"),
    ({"log_prob_kind": "laplace"}, "log_prob_kind"),
    ({"sde_window": (2, 1)}, "sde_window"),
    ({"sde_window": (0, 99)}, "sde_window"),
    ({"num_steps": 0}, "num_steps"),
    ({"shift": 0.0}, "shift"),
    ({"sigmas": torch.tensor([1.0, 0.5, 0.7, 0.0])}, "decreasing"),
    ({"sigmas": torch.tensor([1.0, 0.5, 0.1])}, "end at sigma = 0"),
    ({"prompts": "a cat"}, "prompts"),
    ({"prompts": ["a", ""]}, "prompt"),
    ({"reward_fn": None}, "reward_fn"),
    ({"num_frames": 0}, "num_frames"),
    ({"fps": 0.0}, "fps"),
    ({"fps": -8.0}, "fps"),
    ({"backbone": "{missing}"}, "{missing}"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"num_envs": True}, "num_envs"),
    ({"group_size": 0}, "group_size"),
    ({"eta": 11.0}, "eta"),
    ({"sde_window": (0,)}, "sde_window"),
    ({"sigmas": torch.tensor([1.0, float("nan"), 0.0])}, "sigma"),
    ({"fps": float("inf")}, "fps"),
    ({"prompts": ["a", "b\x00c"]}, "NUL"),
    ({"prompts": ["a", 3]}, "prompt"),
]


@pytest.mark.parametrize(("kwargs", "words"), ENV_CASES, ids=[str(c[0]) for c in ENV_CASES])
def test_the_environment_names_the_argument(
    kwargs: dict[str, Any], words: str, files: dict[str, Path], no_model_loads: None
) -> None:
    kwargs = {k: v.format(**files) if isinstance(v, str) and "{" in v else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=words.format(**files)):
        _env(**kwargs)


STEP_CASES: list[tuple[Callable[[DenoisingVectorEnv], Any], str]] = [
    (lambda env: env.step(torch.zeros(4, 3, 2, 4, 4)), "reset"),
    (lambda env: (env.reset(seed=0), env.step(torch.zeros(3, 3, 2, 4, 4))), "shape"),
    (lambda env: (env.reset(seed=0), env.step(torch.full((4, 3, 2, 4, 4), math.nan))), "NaN"),
    (lambda env: (env.reset(seed=0), env.step("velocity")), "action"),
    (lambda env: env.reset(options={"temperature": 1.0}), "temperature"),
    (lambda env: env.reset(options={"seeds": [1, 2]}), "seeds"),
    (lambda env: env.reset(options={"seeds": [-1, 2, 3, 4]}), "seed"),
    (lambda env: env.reset(options={"prompts": ["a"]}), "prompts"),
    (lambda env: env.reset(options={"prompts": "ab"}), "prompts"),
    (lambda env: env.reset(options={"seeds": [0, 1, 2, 2**40]}), "seeds"),
    (lambda env: (env.reset(seed=0), env.step(torch.zeros(4, 3, 2, 4, 4, dtype=torch.long))), "float"),
    (lambda env: (env.reset(seed=0), env.step(torch.full((4, 3, 2, 4, 4), 1e5))), "bound"),
]


@pytest.mark.parametrize(("action", "words"), STEP_CASES, ids=[w for _, w in STEP_CASES])
def test_reset_and_step_name_the_problem(action: Callable[[DenoisingVectorEnv], Any], words: str) -> None:
    with pytest.raises((ValueError, RuntimeError), match=words):
        action(_env(array_mode="torch"))


# -- the SDE step ---------------------------------------------------------------------------------------------------

X = torch.randn(2, 3)
SDE_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: sde.sde_step("langevin", X, X, 0.5, 0.4, 0.5), "langevin"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, -0.5), "eta"),
    (lambda: sde.sde_step("cps", X, X, 0.5, 0.4, 1.5), "eta"),
    (lambda: sde.sde_step("sage", [[0.0]], X, 0.5, 0.4, 0.5), "latents"),
    (lambda: sde.sde_step("sage", X, torch.randn(2, 4), 0.5, 0.4, 0.5), "velocity"),
    (lambda: sde.sde_step("sage", X, torch.full((2, 3), math.nan), 0.5, 0.4, 0.5), "velocity"),
    (lambda: sde.sde_step("sage", X, X, 1.5, 0.4, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", X, X, 0.4, 0.5, 0.5), "sigma_next"),
    (lambda: sde.sde_step("sage", X, X, 0.0, 0.0, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", X, X, torch.tensor([0.5, 0.4, 0.3]), 0.1, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", torch.ones(2, 3, dtype=torch.long), X, 0.5, 0.4, 0.5), "floating"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, x_next=torch.zeros(3)), "x_next"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, log_prob_kind="laplace"), "log-prob kind"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, generator=[torch.Generator()]), "generators"),
    (lambda: sde.flow_match_sigmas(0), "num_steps"),
    (lambda: sde.flow_match_sigmas(4, shift=math.nan), "shift"),
    (lambda: sde.equalizer_weights(torch.ones(3), eps=0), "equalizer_eps"),
    (lambda: sde.equalizer_weights(torch.ones(3), median="upper"), "equalizer_median"),
]


@pytest.mark.parametrize(("call", "words"), SDE_CASES, ids=[f"{i}-{w}" for i, (_, w) in enumerate(SDE_CASES)])
def test_the_sde_step_names_the_input(call: Callable[[], Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        call()


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


# -- sage-push ----------------------------------------------------------------------------------------------------


def _finished_run(root: Path) -> Path:
    from safetensors.torch import save_file

    run = root / "run"
    run.mkdir()
    metadata = {"lora_adapter_metadata": json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["mix"]})}
    save_file(
        {"transformer.mix.lora_A.weight": torch.zeros(2, 3)},
        run / "pytorch_lora_weights.safetensors",
        metadata,
    )
    (run / "sage_config.json").write_text(json.dumps({"model_name_or_path": "toy", "run": {}}))
    RunFolder(run).mark_complete(2, 2)
    return run


PUSH_CASES: list[tuple[list[str], str]] = [
    (["{missing}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "{missing}"),
    (["{file}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "{file}"),
    (["{not_a_pipeline}", "--repo-id", "me/x", "--license", "mit", "--dry-run"], "no trained model"),
    (["{run}", "--repo-id", "me/x", "--dry-run"], "license is required"),
    (["{run}", "--repo-id", "me/x", "--license", "Apache 2.0", "--dry-run"], "license"),
    (["{run}", "--repo-id", "no/such/repo", "--license", "mit", "--dry-run"], "repo id"),
    (["{run}", "--repo-id", "bare-name", "--license", "mit", "--dry-run"], "user/name"),
    (
        ["{run}", "--repo-id", "me/x", "--license", "mit", "--base-model", "/data/wan", "--dry-run"],
        "base_model",
    ),
    (["{run}", "--repo-id", "me/x", "--license", "mit", "--dry-run", "{file}"], "{file}"),
    (["{run}", "--repo-id", "me/x", "--license", "mit", "--endpoint", "http://127.0.0.1:9"], "token"),
]


@pytest.mark.parametrize(
    ("arguments", "words"), PUSH_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(PUSH_CASES)]
)
def test_sage_push_names_the_problem(
    arguments: list[str], words: str, files: dict[str, Path], capsys, monkeypatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    paths = {**files, "run": _finished_run(tmp_path)}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in arguments]
    assert push_main(argv) != 0
    assert words.format(**{k: str(v) for k, v in paths.items()}) in capsys.readouterr().err


def test_sage_push_refuses_an_unfinished_run(tmp_path: Path, capsys) -> None:
    run = _finished_run(tmp_path)
    (run / "training_complete.json").unlink()
    assert push_main([str(run), "--repo-id", "me/x", "--license", "mit", "--dry-run"]) != 0
    assert "did not finish" in capsys.readouterr().err


# -- sage-generate (more cases, with the adapter ones, in tests/sage_trl/test_generate.py) ---------------------------

GENERATE_CASES: list[tuple[list[str], str]] = [
    (["--prompt", "a cat", "--model", "{missing}"], "{missing}"),
    (["--prompt", "a cat", "--adapter", "{missing}"], "{missing}"),
    (["--prompt", "a cat", "--output", "{not_a_pipeline}"], "--output"),
    (["--prompt", "a cat", "--width", "0"], "--width"),
    (["--prompt", "a cat", "--steps", "-3"], "--steps"),
    (["--prompt", "a cat", "--seeds", "-1"], "--seeds"),
    (["--prompt", "a cat", "--dtype", "int8"], "--dtype"),
    (["--prompt", "a cat", "--guidance-scale", "high"], "--guidance-scale"),
    (["--seeds", "0"], "--prompt"),
    (["--prompt", "a cat", "--steep", "4"], "--steep"),
    (["--prompt", ""], "--prompt"),
    (["--prompt", "a cat", "--prompt", "   "], "--prompt"),
    (
        ["--prompt", "a cat", "--device", "cuda"]
        if not torch.cuda.is_available()
        else ["--prompt", "a", "--device", "x"],
        "--device",
    ),
    (["--prompt", "a cat", "--device", "warp-drive"], "--device"),
    (["--prompt", "a cat", "--width", "7"], "width"),
    (["--prompt", "a cat", "--num-frames", "100000"], "frames"),
    (["--prompt", "a cat", "--shift", "nan"], "--shift"),
    (["--prompt", "a cat", "--guidance-scale", "inf"], "--guidance-scale"),
    (["--prompt", "a cat", "--output", "video.txt"], "--output"),
    (["--prompt", "a cat", "--seeds", "1.5"], "--seeds"),
    (["--prompt", "a cat", "--dtype", "float64"], "--dtype"),
]


@pytest.mark.parametrize(("arguments", "words"), GENERATE_CASES, ids=[c[1] for c in GENERATE_CASES])
def test_sage_generate_refuses_before_loading_a_model(
    arguments: list[str], words: str, files: dict[str, Path], no_model_loads: None, capsys
) -> None:
    from sage_trl.generate import generate_main

    with pytest.raises(SystemExit) as caught:
        generate_main(_format(arguments, files))
    message = f"{caught.value.code} {capsys.readouterr().err}"
    assert caught.value.code not in (0, None)
    assert words.format(**{k: str(v) for k, v in files.items()}) in message, message
