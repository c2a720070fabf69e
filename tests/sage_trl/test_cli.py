"""sage-train and sage-generate as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sage_trl import cli


def run_cli(module_function: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    module, function = module_function.split(":")
    code = f"import sys; from {module} import {function}; {function}(sys.argv[1:])"
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", code, *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=environment)


def test_default_parse_uses_the_toy_config() -> None:
    script_args, config = cli.parse_train_arguments([])
    toy = yaml.safe_load(cli.TOY_CONFIG.read_text())
    assert config.model_name_or_path == "toy" and config.algorithm == "sage_grpo" and config.sde == "sage"
    assert config.max_steps == toy["max_steps"] and config.sde_window == toy["sde_window"]
    assert script_args.reward == ["toy"] and script_args.use_peft


def test_overrides_and_other_models_skip_the_toy_defaults() -> None:
    _, config = cli.parse_train_arguments(["--max_steps", "3", "--algorithm", "flow_grpo"])
    assert config.max_steps == 3 and config.sde == "flow_grpo" and config.num_inference_steps == 10
    _, wan = cli.parse_train_arguments(["--model_name_or_path", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "--use_cpu"])
    assert wan.num_inference_steps == 20 and wan.sde_window is None  # paper defaults, not the toy's


def test_reward_specs() -> None:
    assert type(cli.resolve_reward("toy")).__name__ == "ToyReward"
    assert cli.resolve_reward("tests.doubles:mean_brightness").__name__ == "mean_brightness"
    with pytest.raises(ValueError, match="Unknown reward"):
        cli.resolve_reward("brightest")
    with pytest.raises(ValueError, match="Cannot import reward"):
        cli.resolve_reward("tests.doubles:missing_function")


def test_eval_prompts_pair_every_prompt_with_every_seed(tmp_path: Path) -> None:
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("a cat\n\na dog\na cow\n")
    prompts, seeds = cli.resolve_eval_prompts(str(prompts_file), 2, [0, 1])
    assert prompts == ["a cat", "a cat", "a dog", "a dog"] and seeds == [0, 1, 0, 1]
    assert cli.resolve_eval_prompts("none", 8, [0]) == ([], [])


@pytest.mark.slow
def test_sage_train_default_run_writes_the_output_folder(tmp_path: Path) -> None:
    result = run_cli("sage_trl.cli:train_main", "--max_steps", "2", "--per_device_train_batch_size", "8",
                     "--num_eval_prompts", "2", "--eval_seeds", "0", "--output_dir", str(tmp_path / "out"),
                     "--save_steps", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    for name in ("pytorch_lora_weights.safetensors", "sage_config.json", "metrics.jsonl", "reward_total.png",
                 "reward_vq.png", "reward_mq.png", "reward_ta.png", "samples_before_after.gif", "summary.md",
                 "eval_results.json", "run_config.yaml", "training_complete.json"):
        assert (out / name).is_file(), name
    assert (out / "checkpoint-2").is_dir()
    status_lines = [line for line in result.stdout.splitlines() + result.stderr.splitlines()
                    if line.startswith("step ")]
    assert len(status_lines) == 2 and "reward" in status_lines[0] and "kl coef" in status_lines[0]
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results["before"]) == {"vq", "mq", "ta", "total"} and len(results["prompts"]) == 2
    assert "| total |" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_sage_generate_with_and_without_an_adapter(tmp_path: Path) -> None:
    base = tmp_path / "base.gif"
    cli.generate_main(["--prompt", "a red square moving left", "--seeds", "0", "1", "--output", str(base)])
    assert base.is_file()
    from sage_env.backbones import load_backbone
    from sage_trl.lora import add_lora, save_lora_adapter

    backbone = load_backbone("toy")
    from peft import LoraConfig

    add_lora(backbone, LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian"))
    with torch.no_grad():
        for name, parameter in backbone.transformer.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.05)
    save_lora_adapter(backbone, tmp_path / "adapter")
    adapted = tmp_path / "adapted.gif"
    cli.generate_main(["--prompt", "a red square moving left", "--seeds", "0", "1", "--adapter",
                       str(tmp_path / "adapter"), "--output", str(adapted)])
    assert adapted.read_bytes() != base.read_bytes()
