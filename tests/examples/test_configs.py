"""The ready configs of examples/configs: they parse as `sage-train` parses them, keep the paper's settings, and
build a trainer on the tiny pipelines with the paths substituted; the accelerate configs load in accelerate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from peft import LoraConfig
from trl import TrlParser

from sage_trl import SageGRPOConfig, SageGRPOTrainer
from sage_trl.cli import TrainScriptArguments, resolve_reward
from tests.fixtures.tiny_configs import CPU_OVERRIDES, HUB_IDS, PROMPTS, tiny_substitutions

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIGS = REPOSITORY / "examples" / "configs"
TRAINING_CONFIGS = sorted(CONFIGS.glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((CONFIGS / "accelerate").glob("*.yaml"))
# The processes each config is written for (the accelerate config it is launched with).
WORLD_SIZES = {"_1gpu": 1, "_8gpu": 8, "_multinode": 32}


def parse(path: Path, *overrides: str) -> tuple[TrainScriptArguments, SageGRPOConfig]:
    """What ``sage-train --config path <overrides>`` parses."""
    parser = TrlParser((TrainScriptArguments, SageGRPOConfig))
    return parser.parse_args_and_config(["--config", str(path), *overrides])


def tiny_overrides(path: Path, tmp_path: Path, fixtures: dict[str, Path]) -> list[str]:
    """Substitute the tiny pipeline for the Hub model, a CPU-sized video, a test reward and a CPU run."""
    return [*tiny_substitutions(path, tmp_path / "run", fixtures), *CPU_OVERRIDES]


def world_size(path: Path) -> int:
    return next(size for suffix, size in WORLD_SIZES.items() if suffix in path.stem)


@pytest.fixture
def fixtures(tiny_wan_path: Path, tiny_hunyuan_path: Path, tiny_wan22_path: Path) -> dict[str, Path]:
    return {"wan": tiny_wan_path, "hunyuan": tiny_hunyuan_path, "wan22": tiny_wan22_path}


def test_the_expected_configs_exist() -> None:
    names = {path.stem for path in TRAINING_CONFIGS}
    assert names == {
        "hunyuanvideo15_480p_lora_1gpu",
        "hunyuanvideo15_480p_lora_1gpu_48gb",
        "hunyuanvideo15_480p_lora_8gpu_ddp",
        "hunyuanvideo15_480p_lora_multinode_fsdp",
        "wan21_1.3b_lora_1gpu_16gb",
        "wan21_1.3b_lora_1gpu_24gb",
        "wan22_a14b_lora_1gpu_80gb",
        "wan22_a14b_lora_8gpu_fsdp",
    }


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda path: path.stem)
def test_config_parses_with_placeholders_and_every_saver_on(path: Path) -> None:
    script_args, config = parse(path, "--use_cpu=true", "--bf16=false")
    assert script_args.reward == ["videoalign:/path/to/VideoAlign"]
    assert config.model_name_or_path in HUB_IDS
    assert script_args.use_peft and script_args.lora_r >= 1
    assert config.diffusers_gradient_checkpointing and config.micro_batch_size == 1
    assert config.precompute_prompt_embeddings and config.offload_text_encoders
    assert config.vae_tiling and config.vae_slicing and config.reward_offload
    assert config.torch_dtype == "bfloat16"
    raw = yaml.safe_load(path.read_text())
    assert raw["bf16"] is True  # the GPU setting, overridden above only because this machine has no GPU


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda path: path.stem)
def test_config_keeps_the_papers_sampling_and_algorithm(path: Path) -> None:
    _, config = parse(path, "--use_cpu=true", "--bf16=false")
    assert (config.num_inference_steps, config.sde, config.eta, config.num_generations) == (
        20,
        "sage",
        0.5,
        4,
    )
    assert (config.kl_strategy, config.beta_pos, config.beta_vel, config.anchor_update_steps) == (
        "dual",
        1,
        0.1,
        10,
    )
    assert config.equalizer and config.reward_preset == "setting_b"
    assert config.num_frames == 81 and (config.num_frames - 1) % 4 == 0  # both VAEs compress time 4x
    assert config.height % 16 == 0 and config.width % 16 == 0  # HunyuanVideo 16 x patch 1, Wan 8 x patch 2
    if "hunyuan" in path.stem:
        assert (config.height, config.width, config.shift, config.guidance_scale) == (480, 848, 5.0, 6.0)
    assert config.learning_rate == pytest.approx(1e-4)  # LoRA: 10x the paper's full fine-tuning rate


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda path: path.stem)
def test_groups_fit_the_intended_number_of_processes(path: Path) -> None:
    _, config = parse(path, "--use_cpu=true", "--bf16=false")
    rollout_videos = config.per_device_train_batch_size * world_size(path) * config.steps_per_generation
    assert rollout_videos % config.num_generations == 0
    assert config.gradient_accumulation_steps % config.steps_per_generation == 0  # on-policy updates


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda path: path.stem)
def test_config_builds_a_trainer_on_the_tiny_pipeline(path: Path, tmp_path: Path, fixtures) -> None:
    script_args, config = parse(path, *tiny_overrides(path, tmp_path, fixtures))
    lora = LoraConfig(
        r=script_args.lora_r,
        lora_alpha=script_args.lora_alpha,
        target_modules=script_args.lora_target_modules,
    )
    rewards = [resolve_reward(spec, offload=config.reward_offload) for spec in script_args.reward]
    trainer = SageGRPOTrainer(None, rewards, args=config, train_dataset=list(PROMPTS), peft_config=lora)
    transformer = trainer.backbone.transformer
    assert transformer.is_gradient_checkpointing
    assert trainer.backbone.vae.use_tiling and trainer.backbone.vae.use_slicing
    trainable = [name for name, p in transformer.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert trainer.peft_config.r == script_args.lora_r
    assert trainer.env.num_envs == config.per_device_train_batch_size * config.steps_per_generation
    if "wan22" in path.stem:  # both Wan 2.2 experts train, each with its own adapter
        assert config.expert == "both" and trainer.backbone.trained_experts == (0, 1)
        assert {name.split(".")[0] for name in trainable} == {"transformer", "transformer_2"}


def test_wan_config_trains_one_step_on_the_tiny_pipeline(tmp_path: Path, fixtures) -> None:
    path = CONFIGS / "wan21_1.3b_lora_1gpu_24gb.yaml"
    overrides = [
        *tiny_overrides(path, tmp_path, fixtures),
        "--max_steps=1",
        "--num_inference_steps=4",
        "--save_strategy=no",
        "--disable_tqdm=true",
    ]
    script_args, config = parse(path, *overrides)
    lora = LoraConfig(r=script_args.lora_r, lora_alpha=script_args.lora_alpha, init_lora_weights="gaussian")
    trainer = SageGRPOTrainer(
        None,
        [resolve_reward(s) for s in script_args.reward],
        args=config,
        train_dataset=list(PROMPTS),
        peft_config=lora,
    )
    before = {
        n: p.detach().clone() for n, p in trainer.backbone.transformer.named_parameters() if p.requires_grad
    }
    trainer.train()
    after = dict(trainer.backbone.transformer.named_parameters())
    assert trainer.state.global_step == 1
    assert any(not after[name].detach().equal(value) for name, value in before.items())


# ----------------------------------------------------------------------------------------------
# accelerate configs and the multi-node launcher
# ----------------------------------------------------------------------------------------------


def launch_option_names() -> set[str]:
    from accelerate.commands.launch import launch_command_parser

    return {action.dest for action in launch_command_parser()._actions}


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda path: path.stem)
def test_accelerate_config_loads_with_known_keys(path: Path) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(path))  # rejects unknown top-level keys
    options = launch_option_names()
    assert set(config.fsdp_config) <= options, set(config.fsdp_config) - options
    assert {key for key in config.deepspeed_config} <= options
    assert config.mixed_precision in ("bf16", None) and not config.use_cpu


def test_fsdp_config_is_fsdp2_without_double_checkpointing() -> None:
    raw = yaml.safe_load((CONFIGS / "accelerate" / "fsdp2_multinode.yaml").read_text())
    fsdp = raw["fsdp_config"]
    assert raw["distributed_type"] == "FSDP" and fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_activation_checkpointing"] is False
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert raw["num_processes"] == WORLD_SIZES["_multinode"] and raw["num_machines"] == 4


def test_ddp_config_matches_the_8gpu_training_config() -> None:
    raw = yaml.safe_load((CONFIGS / "accelerate" / "ddp_8gpu.yaml").read_text())
    assert raw["distributed_type"] == "MULTI_GPU" and raw["num_processes"] == WORLD_SIZES["_8gpu"]


def test_deepspeed_config_points_to_a_zero2_file_with_trainer_filled_values() -> None:
    raw = yaml.safe_load((CONFIGS / "accelerate" / "deepspeed_zero2.yaml").read_text())
    settings = json.loads((REPOSITORY / raw["deepspeed_config"]["deepspeed_config_file"]).read_text())
    assert raw["distributed_type"] == "DEEPSPEED" and settings["zero_optimization"]["stage"] == 2
    for name in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "gradient_clipping"):
        assert settings[name] == "auto"  # filled from the training config by transformers


def test_deepspeed_config_leaves_auto_only_what_the_training_config_fills() -> None:
    # transformers fills other "auto" values from model.config.hidden_size, which diffusers models do not have.
    settings = json.loads((CONFIGS / "accelerate" / "zero2.json").read_text())

    def auto_keys(values: dict, prefix: str = "") -> set[str]:
        keys = {f"{prefix}{k}" for k, v in values.items() if v == "auto"}
        return keys.union(*(auto_keys(v, f"{prefix}{k}.") for k, v in values.items() if isinstance(v, dict)))

    batch = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
    assert auto_keys(settings) <= {"bf16.enabled", "gradient_clipping", *batch}


def test_multinode_launcher_is_valid_bash_using_the_fsdp2_config() -> None:
    script = CONFIGS / "launch_multinode.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "accelerate/fsdp2_multinode.yaml" in text and "--machine_rank" in text
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert result.returncode != 0 and "usage" in result.stderr
