"""Both Wan 2.2 A14B experts trained in one run (``expert: both``), on a tiny random two-expert ``WanPipeline``.

Each training pair goes to the expert that produced its step, so one optimizer step moves each expert's adapter as a
run training that expert alone would; the adapters are saved one file per expert and load with diffusers' own
``pipe.load_lora_weights(..., load_into_transformer_2=True)``; resume is exact; the idle expert's swap changes
nothing but where weights wait. (The rollout's parity with ``pipe(...)`` is in tests/sage_env/backbones/test_parity.py,
DDP and FSDP2 in test_distributed.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import WanPipeline
from peft import LoraConfig
from transformers.trainer_utils import get_last_checkpoint

from agents import objective
from sage_env.backbones.wan import WanBackbone
from sage_trl import SageGRPOConfig, SageGRPOTrainer, generate
from sage_trl.hub.card import render_model_card
from sage_trl.run_folder import layout, read_run
from sage_trl.training_setup import check_expert_launch
from tests.doubles import mean_brightness
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE, build_tiny_wan_pipeline
from tests.sage_trl.test_trainer import StopAfter

PROMPTS = ["a red ball", "a blue cube"]
WAN22_ID = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


def make_trainer(root: Path, pipeline: Path, expert: str, **kwargs) -> SageGRPOTrainer:
    values = {
        "output_dir": str(root / "run"),
        "max_steps": 1,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "num_inference_steps": 4,
        "micro_batch_size": 3,
        "learning_rate": 1e-2,
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        "report_to": "none",
        "logging_steps": 1,
        "expert": expert,
        **TINY_VIDEO_SIZE,
        **kwargs,
    }
    lora = LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_v"])
    return SageGRPOTrainer(
        str(pipeline), mean_brightness, args=SageGRPOConfig(**values), train_dataset=PROMPTS, peft_config=lora
    )


def adapters(trainer: SageGRPOTrainer, prefix: str = "") -> dict[str, torch.Tensor]:
    """The trainable weights, by name without the expert prefix (``transformer.`` / ``transformer_2.``)."""
    return {
        name.removeprefix(prefix): p.detach().clone()
        for name, p in trainer.backbone.transformer.named_parameters()
        if p.requires_grad and name.startswith(prefix)
    }


def copy_adapters(source: dict[str, torch.Tensor], trainer: SageGRPOTrainer, prefix: str = "") -> None:
    """Give ``trainer``'s adapter the values of ``source`` (and its anchor, snapshot at construction, too)."""
    with torch.no_grad():
        for name, p in trainer.backbone.transformer.named_parameters():
            if p.requires_grad:
                p.copy_(source[name.removeprefix(prefix)])
    trainer.references.anchor.refresh()


def test_one_step_trains_each_expert_from_its_own_steps(tmp_path: Path, tiny_wan22_path: Path) -> None:
    both = make_trainer(tmp_path / "both", tiny_wan22_path, "both")
    start = {name: adapters(both, f"{name}.") for name in ("transformer", "transformer_2")}
    assert [group["expert"] for group in both.create_optimizer().param_groups] == ["transformer", "transformer_2"]
    both.train()
    for name in ("transformer", "transformer_2"):
        alone = make_trainer(tmp_path / name, tiny_wan22_path, name)
        copy_adapters(start[name], alone)
        alone.train()
        trained, expected = adapters(both, f"{name}."), adapters(alone)
        assert trained.keys() == expected.keys()
        assert any(not torch.equal(trained[k], start[name][k]) for k in trained), f"{name} did not train"
        for key, value in expected.items():
            torch.testing.assert_close(trained[key], value, rtol=0, atol=1e-6, msg=f"{name}: {key}")
    logged = both.state.log_history[0]
    assert {"expert/transformer/kl/total", "expert/transformer_2/policy_loss"} <= logged.keys()


def velocities(backbone: WanBackbone, sigmas: list[float]) -> torch.Tensor:
    latents = torch.randn(len(sigmas), *backbone.latent_shape(**TINY_VIDEO_SIZE), generator=torch.Generator().manual_seed(0))
    conditioning = backbone.encode_prompts(PROMPTS)
    with torch.no_grad():
        return backbone.predict_velocity(latents, torch.tensor(sigmas), conditioning, 1.0)


def test_saved_adapters_load_into_both_experts_with_diffusers(tmp_path: Path, tiny_wan22_path: Path) -> None:
    trainer = make_trainer(tmp_path, tiny_wan22_path, "both", learning_rate=5e-2)
    trainer.train()
    run = tmp_path / "run"
    assert (run / layout.LORA_WEIGHT_NAME).is_file() and (run / layout.EXPERT_2_LORA_WEIGHT_NAME).is_file()
    sigmas = [0.9, 0.2]  # one sample per expert (boundary 0.5)
    base = velocities(WanBackbone(WanPipeline.from_pretrained(tiny_wan22_path)), sigmas)
    pipe = WanPipeline.from_pretrained(tiny_wan22_path)
    pipe.load_lora_weights(run)
    pipe.load_lora_weights(run, weight_name=layout.EXPERT_2_LORA_WEIGHT_NAME, load_into_transformer_2=True)
    loaded = velocities(WanBackbone(pipe), sigmas)
    trained = velocities(trainer.backbone, sigmas)
    torch.testing.assert_close(loaded, trained, rtol=0, atol=1e-5)
    for row in range(2):  # each phase's output changed, each by its own expert's adapter
        assert (loaded[row] - base[row]).abs().max() > 1e-4, f"expert {row} did not change"
    # The library's own loader (sage-generate's) reads the same folder into both experts.
    backbone = WanBackbone(WanPipeline.from_pretrained(tiny_wan22_path), expert="both")
    backbone.load_lora_weights(run)
    torch.testing.assert_close(velocities(backbone, sigmas), trained, rtol=0, atol=1e-5)


def test_resumed_two_expert_run_matches_the_uninterrupted_run(tmp_path: Path, tiny_wan22_path: Path) -> None:
    settings = {"max_steps": 3, "save_strategy": "steps", "save_steps": 2, "num_iterations": 2,
                "kl_strategy": "dual", "anchor_update_steps": 1}  # fmt: skip
    straight = make_trainer(tmp_path / "a", tiny_wan22_path, "both", **settings)
    straight.train()
    interrupted = make_trainer(tmp_path / "b", tiny_wan22_path, "both", **settings)
    interrupted.add_callback(StopAfter(2))
    interrupted.train()
    checkpoint = get_last_checkpoint(str(tmp_path / "b" / "run"))
    assert checkpoint.endswith("checkpoint-2")
    assert (Path(checkpoint) / layout.EXPERT_2_LORA_WEIGHT_NAME).is_file()
    resumed = make_trainer(tmp_path / "b", tiny_wan22_path, "both", **settings)
    resumed.train(resume_from_checkpoint=checkpoint)
    expected, actual = adapters(straight), adapters(resumed)
    assert {name.split(".")[0] for name in expected} == {"transformer", "transformer_2"}
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name
    for name, value in straight.references.anchor.values.items():
        assert torch.equal(resumed.references.anchor.values[name], value), name


def test_swapping_the_idle_expert_changes_nothing_but_where_it_waits(tmp_path: Path, tiny_wan22_path: Path) -> None:
    plain = make_trainer(tmp_path / "plain", tiny_wan22_path, "both")
    plain.train()
    swapped = make_trainer(tmp_path / "swapped", tiny_wan22_path, "both", offload_idle_expert=True)
    moved = []
    swapped.backbone.transformer.swap_observer = lambda tensors, to_host: moved.append((len(tensors), to_host))
    swapped.train()
    for name, value in adapters(plain).items():
        assert torch.equal(adapters(swapped)[name], value), name
    # Parked at set-up; the whole-model moves after it (accelerate's ``model.to`` when training starts) leave the
    # idle expert on the host, so the rollout's first step moves nothing; the rollout goes high -> low noise once,
    # and training runs the high-noise micro-batches, then the low-noise ones.
    assert swapped.backbone.transformer.swaps == 4
    frozen = len([p for p in swapped.backbone.pipeline.transformer.parameters() if not p.requires_grad])
    frozen += len(list(swapped.backbone.pipeline.transformer.buffers()))
    assert moved[:2] == [(frozen, True), (frozen, False)]  # the idle one out, the active one in


def test_the_equalizer_takes_one_median_per_expert() -> None:
    sigmas = torch.tensor([[1.0, 0.8, 0.6, 0.4, 0.2, 0.0]])
    experts = (sigmas[:, :-1] < 0.5).long()
    joint = objective.equalizer_matrix(sigmas, ["sage"] * 5, 0.7)
    per_expert = objective.equalizer_matrix(sigmas, ["sage"] * 5, 0.7, experts=experts)
    for expert in (0, 1):
        mine = per_expert[experts == expert]
        alone = objective.equalizer_matrix(sigmas[:, [0, 1, 2, 3]] if expert == 0 else sigmas[:, [3, 4, 5]],
                                           ["sage"] * (3 if expert == 0 else 2), 0.7)  # fmt: skip
        torch.testing.assert_close(mine, alone.flatten())
    assert not torch.allclose(joint, per_expert)
    single = objective.equalizer_matrix(sigmas, ["sage"] * 5, 0.7, experts=torch.zeros_like(experts))
    torch.testing.assert_close(single, joint)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"offload_idle_expert": True, "expert": None}, "set expert: both"),
        ({"expert": "all"}, "expert"),
    ],
)
def test_bad_expert_settings_are_refused_by_the_config(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)


def test_experts_of_a_model_without_them_are_refused_before_loading(tmp_path: Path, tiny_hunyuan_path: Path, no_model_loads) -> None:
    with pytest.raises(ValueError, match="has no experts to choose from"):
        make_trainer(tmp_path, tiny_hunyuan_path, "both")


def test_swapping_needs_frozen_weights(tmp_path: Path, tiny_wan22_path: Path, no_model_loads) -> None:
    args = SageGRPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, expert="both", offload_idle_expert=True,
                          **TINY_VIDEO_SIZE)  # fmt: skip
    with pytest.raises(ValueError, match="full fine-tuning freezes none"):
        SageGRPOTrainer(str(tiny_wan22_path), mean_brightness, args=args, train_dataset=PROMPTS)


def test_sage_generate_loads_each_experts_adapter_into_its_expert(tmp_path: Path, tiny_wan22_path: Path) -> None:
    trainer = make_trainer(tmp_path, tiny_wan22_path, "both", learning_rate=5e-2)
    trainer.train()
    arguments = ["--model", str(tiny_wan22_path), "--prompt", PROMPTS[0], "--steps", "4", "--device", "cpu"]
    arguments += [f"--{name.replace('_', '-')}={value}" for name, value in TINY_VIDEO_SIZE.items()]
    settings = generate.parse_generate_arguments([*arguments, "--adapter", str(tmp_path / "run"), "--output", "x.gif"])
    videos = generate.generate_videos(settings)
    pipe = WanPipeline.from_pretrained(tiny_wan22_path)  # what the model card tells a user to do
    pipe.load_lora_weights(tmp_path / "run")
    pipe.load_lora_weights(tmp_path / "run", weight_name=layout.EXPERT_2_LORA_WEIGHT_NAME, load_into_transformer_2=True)
    options = {"num_inference_steps": 4, "generator": torch.Generator().manual_seed(0), "output_type": "pt"}
    expected = pipe(PROMPTS[0], guidance_scale=5.0, **TINY_VIDEO_SIZE, **options).frames
    only_first = WanPipeline.from_pretrained(tiny_wan22_path)
    only_first.load_lora_weights(tmp_path / "run")
    options["generator"] = torch.Generator().manual_seed(0)
    missing_second = only_first(PROMPTS[0], guidance_scale=5.0, **TINY_VIDEO_SIZE, **options).frames
    # The tiny VAE's videos barely depend on the latents (a few 1e-7 here), but both runs are the same computation.
    assert torch.equal(videos, expected.float())
    assert not torch.equal(videos, missing_second.float())  # the low-noise adapter was loaded too


@pytest.mark.parametrize(
    ("settings", "processes", "deepspeed", "message"),
    [
        ({"expert": "both"}, 1, True, "DeepSpeed's one-backward-per-step engine"),
        ({"expert": "both", "offload_idle_expert": True}, 2, False, "offload_idle_expert is for one process"),
    ],
)
def test_launches_the_expert_options_do_not_support_are_refused(
    tmp_path: Path, settings: dict, processes: int, deepspeed: bool, message: str
) -> None:
    backbone = WanBackbone(build_tiny_wan_pipeline(two_experts=True), expert="both")
    config = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **settings)
    with pytest.raises(ValueError, match=message):
        check_expert_launch(backbone, config, processes, deepspeed)
    check_expert_launch(backbone, config, 1, False)  # one process without DeepSpeed: fine


def test_a_low_noise_expert_run_loads_into_transformer_2_everywhere(tmp_path: Path, tiny_wan22_path: Path) -> None:
    # Trained alone, the low-noise expert's adapter has the usual file name: the run's config says where it goes.
    trainer = make_trainer(tmp_path, tiny_wan22_path, "transformer_2", learning_rate=5e-2)
    trainer.train()
    run = tmp_path / "run"
    card = str(render_model_card(read_run(run), repo_id="me/low-noise", license="apache-2.0", base_model=WAN22_ID))
    assert 'pipe.load_lora_weights("me/low-noise", load_into_transformer_2=True)' in card
    arguments = ["--model", str(tiny_wan22_path), "--prompt", PROMPTS[0], "--steps", "4", "--device", "cpu"]
    arguments += [f"--{name.replace('_', '-')}={value}" for name, value in TINY_VIDEO_SIZE.items()]
    settings = generate.parse_generate_arguments([*arguments, "--adapter", str(run), "--output", "x.gif"])
    videos = generate.generate_videos(settings)
    pipe = WanPipeline.from_pretrained(tiny_wan22_path)
    pipe.load_lora_weights(run, load_into_transformer_2=True)
    options = {"num_inference_steps": 4, "generator": torch.Generator().manual_seed(0), "output_type": "pt"}
    assert torch.equal(videos, pipe(PROMPTS[0], guidance_scale=5.0, **TINY_VIDEO_SIZE, **options).frames.float())
    wrong = WanPipeline.from_pretrained(tiny_wan22_path)
    wrong.load_lora_weights(run)  # into the high-noise expert
    options["generator"] = torch.Generator().manual_seed(0)
    assert not torch.equal(videos, wrong(PROMPTS[0], guidance_scale=5.0, **TINY_VIDEO_SIZE, **options).frames.float())

