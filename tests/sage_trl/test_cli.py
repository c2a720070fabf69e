"""sage-train as a user runs it (sage-generate: tests/sage_trl/test_generate.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agents.registry import algorithm_spec
from sage_trl import SageGRPOConfig, cli
from sage_trl.presets import PER_ALGORITHM, load_preset


def run_cli(module_function: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    module, function = module_function.split(":")
    code = f"import sys; from {module} import {function}; {function}(sys.argv[1:])"
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )


def test_default_parse_uses_the_toy_preset() -> None:
    script_args, config = cli.parse_train_arguments([])
    toy = load_preset("toy")
    assert config.model_name_or_path == "toy" and config.algorithm == "sage_grpo" and config.sde == "sage"
    assert config.max_steps == toy["max_steps"] and config.sde_window == toy["sde_window"]
    assert script_args.reward == ["toy"] and script_args.use_peft


def test_overrides_and_other_models_skip_the_toy_defaults() -> None:
    _, config = cli.parse_train_arguments(["--max_steps", "3", "--algorithm", "flow_grpo"])
    assert config.max_steps == 3 and config.sde == "flow_grpo" and config.num_inference_steps == 10
    wan_id = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    _, wan = cli.parse_train_arguments(
        ["--model_name_or_path", wan_id, "--backbone", "WanPipeline", "--use_cpu"]
    )
    assert (wan.num_inference_steps, wan.num_frames, wan.sde_window) == (20, 81, None)  # Wan's, not the toy's
    _, unknown = cli.parse_train_arguments(["--model_name_or_path", wan_id, "--use_cpu"])
    assert unknown.num_frames is None  # not in the Hub cache: the trainer fills it from the loaded model


def test_a_config_file_keeps_the_toy_preset_underneath(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"model_name_or_path": "toy", "max_steps": 2, "eta": 0.3}))
    _, config = cli.parse_train_arguments(["--config", str(run), "--learning_rate", "1e-3"])
    toy = load_preset("toy")
    assert (config.max_steps, config.eta, config.learning_rate) == (2, 0.3, 1e-3)  # YAML, then flags, on top
    assert config.micro_batch_size == toy["micro_batch_size"] and config.sde_window == toy["sde_window"]
    assert (config.num_inference_steps, config.shift) == (10, 3.0)


def test_python_api_applies_presets_the_same_way(tmp_path: Path) -> None:
    _, parsed = cli.parse_train_arguments(["--max_steps", "2", "--output_dir", str(tmp_path)])
    built = SageGRPOConfig.from_preset("toy", max_steps=2, output_dir=str(tmp_path))
    # but the evaluation schedule, which goes with sage-train's held-out prompts (eval_prompts)
    schedule = {"eval_strategy", "eval_steps", "eval_on_start", "do_eval"}  # do_eval: transformers derives it
    assert {k: v for k, v in parsed.to_dict().items() if k not in schedule} == {
        k: v for k, v in built.to_dict().items() if k not in schedule
    }
    assert (parsed.eval_strategy, built.eval_strategy, built.eval_on_start) == ("steps", "no", False)


def test_the_presets_per_algorithm_values_reach_their_algorithm_only(tmp_path: Path) -> None:
    tuned = load_preset("toy")[PER_ALGORITHM]["sage_grpo"]
    assert tuned, "the toy preset tunes sage_grpo's KL"
    _, sage = cli.parse_train_arguments([])
    assert {name: getattr(sage, name) for name in tuned} == tuned
    flow_defaults = algorithm_spec("flow_grpo").config_class.defaults
    _, flow = cli.parse_train_arguments(["--algorithm", "flow_grpo"])
    assert {name: getattr(flow, name) for name in tuned} == {name: flow_defaults[name] for name in tuned}
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"anchor_update_steps": 7}))
    _, mine = cli.parse_train_arguments(["--config", str(run), "--beta", "0.5"])
    assert (mine.beta, mine.anchor_update_steps) == (0.5, 7)  # the user's file and flags win
    assert SageGRPOConfig.from_preset("toy", output_dir=str(tmp_path)).beta == tuned["beta"]
    from_python = SageGRPOConfig.from_preset("toy", output_dir=str(tmp_path), algorithm="flow_grpo")
    assert from_python.beta == flow_defaults["beta"]


@pytest.mark.parametrize(
    ("section", "words"),
    [({"sage_gpro": {"beta": 2.0}}, "sage_gpro"), ({"sage_grpo": 2.0}, "must map algorithm names"),
     ({"sage_grpo": {"bta": 2.0}}, "'bta'")],
)  # fmt: skip
def test_a_bad_per_algorithm_section_is_an_error_naming_it(tmp_path: Path, section: dict, words: str) -> None:
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"model_name_or_path": "toy", PER_ALGORITHM: section}))
    with pytest.raises(ValueError, match=words):
        cli.parse_train_arguments(["--preset", str(preset)])


def test_a_misspelt_config_key_is_an_error(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"lerning_rate": 1e-4}))
    with pytest.raises(ValueError, match=r"'lerning_rate'.*did you mean 'learning_rate'"):
        cli.parse_train_arguments(["--config", str(run)])


def test_reward_specs() -> None:
    assert type(cli.resolve_reward("toy")).__name__ == "ToyReward"
    assert cli.resolve_reward("tests.doubles:mean_brightness").__name__ == "mean_brightness"
    with pytest.raises(ValueError, match="cannot be imported"):
        cli.resolve_reward("tests.doubles:missing_function")
    with pytest.raises(ValueError, match="Unknown reward 'brightest'; known: toy"):
        cli.resolve_reward("brightest")


def test_eval_prompts_pair_every_prompt_with_every_seed(tmp_path: Path) -> None:
    from sage_trl.evaluation_trainer import held_out_pairs

    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("a cat\n\na dog\na cow\n")
    assert cli.resolve_eval_prompts(str(prompts_file), 2) == ["a cat", "a dog"]
    assert cli.resolve_eval_prompts("none", 8) == []
    prompts, seeds = held_out_pairs(["a cat", "a dog"], [0, 1])
    assert prompts == ["a cat", "a cat", "a dog", "a dog"] and seeds == [0, 1, 0, 1]


def test_sage_train_default_run_writes_the_output_folder(tmp_path: Path) -> None:
    result = run_cli(
        "sage_trl.cli:train_main",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--num_eval_prompts",
        "2",
        "--eval_seeds",
        "0",
        "--output_dir",
        str(tmp_path / "out"),
        "--save_steps",
        "1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    for name in (
        "pytorch_lora_weights.safetensors",
        "sage_config.json",
        "metrics.jsonl",
        "reward_total.png",
        "reward_vq.png",
        "reward_mq.png",
        "reward_ta.png",
        "samples_before_after.gif",
        "summary.md",
        "eval_results.json",
        "run_config.yaml",
        "training_complete.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "checkpoint-2").is_dir()
    status_lines = [
        line for line in result.stdout.splitlines() + result.stderr.splitlines() if line.startswith("step ")
    ]
    assert len(status_lines) == 2 and "reward" in status_lines[0] and "kl coef" in status_lines[0]
    results = json.loads((out / "eval_results.json").read_text())
    toy_world = {"world_distance", "object_area_ratio"}  # the gold measurements beside the toy reward
    assert set(results["before"]) == {"vq", "mq", "ta", "total", *toy_world} and len(results["prompts"]) == 2
    summary = (out / "summary.md").read_text()
    assert "| **total (overall)** |" in summary and "| world_distance |" in summary


def test_the_run_config_is_a_valid_config_file(tmp_path: Path) -> None:
    from sage_trl.cli.train import run_config_text

    script_args, config = cli.parse_train_arguments(
        ["--max_steps", "3", "--eta", "0.4", "--output_dir", str(tmp_path)]
    )
    written = tmp_path / "run_config.yaml"
    written.write_text(run_config_text(script_args, config))
    again_script, again = cli.parse_train_arguments(["--config", str(written)])
    assert again.to_dict() == config.to_dict() and again_script == script_args


def test_sage_train_evaluates_on_the_schedule_with_evaluation_rewards(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Train on the hackable toy reward, evaluate every step with the toy world's own reward beside it."""
    from tests.sage_trl.test_run_folder_rules import TOY_SMALL

    out = tmp_path / "run"
    flags = ["--reward", "toy_hackable", "--eval_reward", "toy", "--eval_strategy", "steps", "--eval_steps", "1"]
    assert cli.train_main(["--output_dir", str(out), *TOY_SMALL, *flags]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_reward/total" in r]
    assert [r["step"] for r in evaluations] == [0, 1, 2]  # the toy preset evaluates on start
    assert {"eval_eval_reward/vq", "eval_eval_reward/total", "eval_world/world_distance"} <= set(evaluations[0])
    assert sorted(p.name for p in (out / "eval_samples").iterdir()) == [f"eval-step-00000{i}.gif" for i in range(3)]
    summary = (out / "summary.md").read_text()
    assert "| eval_reward/total |" in summary and "| world_distance |" in summary
    # The last scheduled evaluation and the "after" evaluation are the same sampling of the same model.
    after = json.loads((out / "eval_results.json").read_text())["after"]
    assert after["total"] == pytest.approx(evaluations[-1]["eval_reward/total"], abs=1e-6)
    assert after["eval_reward/total"] == pytest.approx(evaluations[-1]["eval_eval_reward/total"], abs=1e-6)
    # The report says what ran, what each head measures, the overall score, the evaluation points and the alarms.
    for text in (
        "# Run summary: SAGE-GRPO on `toy`", "trained a LoRA adapter (rank 8) of `toy` for 2 of 2 optimizer steps in",
        "| vq | 0.5 | visual quality: a background without noise", "| **total (overall)** |", "| eval_reward/total |",
        "## Evaluations during training", "| step | reward/total | eval_reward/total | world/world_distance |",
        "## Alarms",
    ):  # fmt: skip
        assert text in summary, text
    # The before/after GIF: a header (before | after) and a label strip over each row (prompt and seed).
    from PIL import Image

    with Image.open(out / "samples_before_after.gif") as gif:
        width, height = gif.size
    assert (width, height) == (2 * 64 + 2, 14 + 1 * (26 + 64 + 2) - 2)  # one held-out video, 16 px x 4


def test_sage_train_without_held_out_prompts_evaluates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.sage_trl.test_run_folder_rules import TOY_SMALL

    out = tmp_path / "run"
    assert cli.train_main(["--output_dir", str(out), *TOY_SMALL, "--num_eval_prompts", "0", "--eval_steps", "1"]) == 0
    assert "no evaluation during training (eval_strategy no)" in capsys.readouterr().out
    assert not any("eval_reward/total" in line for line in (out / "metrics.jsonl").read_text().splitlines())
    assert not (out / "eval_samples").exists()
