"""diffusers as the oracle: ``sage-generate`` and the environments' default rollouts against the pipeline's own
``__call__``, adapters against ``pipe.load_lora_weights`` / ``pipe.transformer.load_lora_adapter``, and the toy
model folder against ``DiffusionPipeline.from_pretrained``.

The oracle pipelines are loaded from the saved tiny folders with ``DiffusionPipeline.from_pretrained`` and
called as a user calls them; sage-grpo's code is reached through ``sage-generate``'s argument parsing
(`parse_generate_arguments`) and the registered gymnasium ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from peft import LoraConfig

import sage_env  # noqa: F401  (registers the environment ids)
from sage_env.backbones import load_backbone, sampling_defaults
from sage_env.backbones.toy import TOY_PRIOR_PATH
from sage_env.env import BackbonePolicy, DenoisingVectorEnv, run_episode
from sage_trl.generate import generate_videos, parse_generate_arguments
from sage_trl.lora import add_lora, save_lora_adapter
from tests.doubles import mean_brightness
from tests.fixtures.markdown import first_block
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

PROMPT = "a red ball rolls left"
SEEDS = (3, 4)
TOLERANCE = 1e-6
SIZE_ARGUMENTS = [f"--{name.replace('_', '-')}={value}" for name, value in TINY_VIDEO_SIZE.items()]
WAN_STEPS = sampling_defaults("WanPipeline").num_steps
HUNYUAN_STEPS = 4  # HunyuanVideo 1.5's tiny forward attends over ~2000 tokens: fewer steps keep it fast
HUNYUAN_SHIFT = 7.0


@pytest.fixture(scope="module")
def hunyuan_shift7_path(tiny_hunyuan_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny HunyuanVideo 1.5 folder with a scheduler shipped at shift 7 (the fixture's is the paper's 5):
    the schedule must follow the checkpoint, not a number written in sage-grpo."""
    folder = shutil.copytree(tiny_hunyuan_path, tmp_path_factory.mktemp("hunyuan_shift7") / "model")
    config_path = folder / "scheduler" / "scheduler_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "shift": HUNYUAN_SHIFT}))
    return folder


def sage_generate(model: Path, *arguments: str, seeds: tuple[int, ...] = SEEDS) -> torch.Tensor:
    """``sage-generate --model ... --prompt ... --seeds ...`` on the CPU: the videos before they are written."""
    argv = ["--model", str(model), "--prompt", PROMPT, "--seeds", *map(str, seeds), "--device", "cpu"]
    return generate_videos(parse_generate_arguments([*argv, *SIZE_ARGUMENTS, *arguments]))


def pipeline_videos(
    pipeline: DiffusionPipeline, num_steps: int, seeds: tuple[int, ...] = SEEDS
) -> torch.Tensor:
    """``pipe(prompt, generator=torch.Generator().manual_seed(seed), ...)``: one video per seed, as users call it."""
    videos = [
        pipeline(
            prompt=PROMPT,
            generator=torch.Generator().manual_seed(seed),
            num_inference_steps=num_steps,
            output_type="pt",
            **TINY_VIDEO_SIZE,
        ).frames
        for seed in seeds
    ]
    return torch.cat(videos).float()


def max_difference(first: torch.Tensor, second: torch.Tensor) -> float:
    assert first.shape == second.shape
    return (first.float() - second.float()).abs().max().item()


def trained_adapter(model: Path, directory: Path) -> Path:
    """An adapter saved by ``save_lora_adapter`` whose weights are perturbed, so that it changes the videos."""
    backbone = load_backbone(str(model))
    add_lora(backbone, LoraConfig(r=2, lora_alpha=4, init_lora_weights="gaussian"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in backbone.transformer.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    save_lora_adapter(backbone, directory)
    return directory


# -- sage-generate equals pipe(...) ------------------------------------------------------------------------------


def test_sage_generate_wan_equals_the_pipeline_at_its_defaults(tiny_wan_path: Path) -> None:
    videos = sage_generate(tiny_wan_path)  # steps, shift and guidance: the model's defaults
    expected = pipeline_videos(DiffusionPipeline.from_pretrained(tiny_wan_path), WAN_STEPS)
    assert max_difference(videos, expected) <= TOLERANCE


def test_sage_generate_wan_with_an_adapter_equals_pipe_load_lora_weights(
    tiny_wan_path: Path, tmp_path: Path
) -> None:
    adapter = trained_adapter(tiny_wan_path, tmp_path / "adapter")
    videos = sage_generate(tiny_wan_path, "--adapter", str(adapter))
    pipeline = DiffusionPipeline.from_pretrained(tiny_wan_path)
    base = pipeline_videos(pipeline, WAN_STEPS)
    pipeline.load_lora_weights(str(adapter))
    expected = pipeline_videos(pipeline, WAN_STEPS)
    assert max_difference(videos, expected) <= TOLERANCE
    assert max_difference(expected, base) > 0.01  # the adapter matters


def test_sage_generate_shift_replaces_the_scheduler_shift(tiny_wan_path: Path) -> None:
    videos = sage_generate(tiny_wan_path, "--steps", "4", "--shift", "7", seeds=SEEDS[:1])
    pipeline = DiffusionPipeline.from_pretrained(tiny_wan_path)
    pipeline.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipeline.scheduler.config, shift=7.0)
    expected = pipeline_videos(pipeline, 4, seeds=SEEDS[:1])
    assert max_difference(videos, expected) <= TOLERANCE


def test_sage_generate_hunyuan_equals_the_pipeline(hunyuan_shift7_path: Path, tmp_path: Path) -> None:
    steps = ("--steps", str(HUNYUAN_STEPS))
    adapter = trained_adapter(hunyuan_shift7_path, tmp_path / "adapter")
    base = sage_generate(hunyuan_shift7_path, *steps, seeds=SEEDS[:1])
    adapted = sage_generate(hunyuan_shift7_path, *steps, "--adapter", str(adapter), seeds=SEEDS[:1])
    pipeline = DiffusionPipeline.from_pretrained(hunyuan_shift7_path)
    assert pipeline.scheduler.config.shift == HUNYUAN_SHIFT
    expected_base = pipeline_videos(pipeline, HUNYUAN_STEPS, seeds=SEEDS[:1])
    # HunyuanVideo15Pipeline has no LoRA loader: users load into the transformer with the "transformer." prefix
    # (diffusers 0.42 looks for a .bin file in a folder unless told use_safetensors=True).
    pipeline.transformer.load_lora_adapter(str(adapter), prefix="transformer", use_safetensors=True)
    expected_adapted = pipeline_videos(pipeline, HUNYUAN_STEPS, seeds=SEEDS[:1])
    assert max_difference(base, expected_base) <= TOLERANCE
    assert max_difference(adapted, expected_adapted) <= TOLERANCE
    assert max_difference(expected_adapted, expected_base) > 0.01


# -- environments: the pipeline's own schedule -------------------------------------------------------------------


def registered_env(env_id: str, model: Path, num_envs: int) -> DenoisingVectorEnv:
    """``gym.make_vec(env_id)`` at its defaults, except the tiny video size and the deterministic ``ode`` step."""
    envs = gym.make_vec(
        env_id,
        num_envs=num_envs,
        backbone=str(model),
        reward_fn=mean_brightness,
        sde="ode",
        eta=0.0,
        array_mode="torch",
        **TINY_VIDEO_SIZE,
    )
    return envs.unwrapped


@pytest.mark.parametrize(
    ("env_id", "fixture", "seeds"),
    [
        ("sage_env/Wan-v0", "tiny_wan_path", (11, 12)),
        ("sage_env/HunyuanVideo15-v0", "hunyuan_shift7_path", (11,)),
    ],
)
def test_default_ode_rollout_equals_pipeline_latents(env_id, fixture, seeds, request) -> None:
    model = request.getfixturevalue(fixture)
    env = registered_env(env_id, model, len(seeds))
    prompts = [PROMPT, "a blue cube spins"][: len(seeds)]
    trajectory = run_episode(
        env, BackbonePolicy(env.backbone, None), options={"prompts": prompts, "seeds": seeds}
    )
    pipeline = DiffusionPipeline.from_pretrained(model)
    expected = pipeline(
        prompt=prompts,
        generator=[torch.Generator().manual_seed(seed) for seed in seeds],
        num_inference_steps=env.num_steps,
        output_type="latent",
        **TINY_VIDEO_SIZE,
    ).frames
    assert env.num_steps == sampling_defaults(type(pipeline).__name__).num_steps
    assert torch.equal(env.sigmas, pipeline.scheduler.sigmas)
    assert max_difference(trajectory.latents[:, -1], expected) <= TOLERANCE


def test_wan_has_one_default_schedule_in_env_registry_and_sage_generate(tiny_wan_path: Path) -> None:
    settings = parse_generate_arguments(["--model", str(tiny_wan_path), "--prompt", PROMPT, *SIZE_ARGUMENTS])
    registered = registered_env("sage_env/Wan-v0", tiny_wan_path, 1)
    direct = DenoisingVectorEnv(str(tiny_wan_path), mean_brightness, **TINY_VIDEO_SIZE)
    pipeline = DiffusionPipeline.from_pretrained(tiny_wan_path)
    pipeline(
        prompt=PROMPT,
        num_inference_steps=settings.sampling.num_steps,
        output_type="latent",
        **TINY_VIDEO_SIZE,
    )
    # sage-generate calls the pipeline on its own scheduler (shift None); both envs step on that scheduler's sigmas.
    assert (
        settings.sampling.shift is None
        and settings.sampling.num_steps == registered.num_steps == direct.num_steps
    )
    assert torch.equal(registered.sigmas, pipeline.scheduler.sigmas)
    assert torch.equal(direct.sigmas, pipeline.scheduler.sigmas)
    shifted = DenoisingVectorEnv(
        str(tiny_wan_path), mean_brightness, num_steps=4, shift=7.0, **TINY_VIDEO_SIZE
    )
    pipeline.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipeline.scheduler.config, shift=7.0)
    pipeline(prompt=PROMPT, num_inference_steps=4, output_type="latent", **TINY_VIDEO_SIZE)
    assert torch.equal(shifted.sigmas, pipeline.scheduler.sigmas)


# -- the toy model folder --------------------------------------------------------------------------------------


def model_card_snippet() -> str:
    return first_block(TOY_PRIOR_PATH / "README.md", "python", heading="Loading").code


def test_toy_folder_is_not_a_diffusers_pipeline_and_its_card_says_how_to_load_it() -> None:
    # What the model card states: DiffusionPipeline cannot load the folder (its class is sage-grpo's "toy").
    with pytest.raises(AttributeError, match="toy"):
        DiffusionPipeline.from_pretrained(TOY_PRIOR_PATH)
    namespace: dict = {}
    exec(compile(model_card_snippet(), "model card", "exec"), namespace)
    assert namespace["videos"].shape == (1, 8, 3, 16, 16)
    parts, loaded = (
        namespace["backbone"].transformer.state_dict(),
        load_backbone("toy").transformer.state_dict(),
    )
    assert all(torch.equal(parts[name], tensor) for name, tensor in loaded.items())
