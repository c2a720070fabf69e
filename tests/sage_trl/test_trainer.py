"""SageGRPOTrainer on a tiny analytic backbone: LoRA, losses, invalid rewards, saving, atomic checkpoints, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from sage_trl import SageGRPOConfig, SageGRPOTrainer, _trl_compat
from sage_trl.lora import LORA_WEIGHT_NAME
from tests.doubles import LinearBackbone, mean_brightness
from tests.sage_trl.tiny_trainer import PROMPTS, make_args, make_trainer, named_params

# ------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------


def test_config_defaults_follow_the_paper_and_switch_with_the_algorithm(tmp_path: Path) -> None:
    sage = make_args(tmp_path)
    assert (sage.sde, sage.eta, sage.kl_strategy, sage.beta, sage.epsilon, sage.adv_clip_max) == (
        "sage",
        0.5,
        "dual",
        1e-5,
        1e-4,
        5.0,
    )
    assert sage.num_generations == 4 and sage.logging_steps == 1 and sage.bf16 is False
    toy = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True)  # the model's own defaults fill the video
    assert (toy.num_frames, toy.height, toy.num_inference_steps, toy.shift, toy.guidance_scale) == (
        8,
        16,
        10,
        3.0,
        1.0,
    )
    assert toy.learning_rate == 1e-5 and toy.micro_batch_size == 4
    flow = make_args(tmp_path, algorithm="flow_grpo", learning_rate=None)
    assert (flow.sde, flow.eta, flow.kl_strategy, flow.beta, flow.kl_coef_schedule) == (
        "flow_grpo",
        0.7,
        "fixed",
        0.04,
        "constant",
    )
    assert make_args(tmp_path, algorithm="flow_grpo", eta=0.3).eta == 0.3  # explicit values win
    algorithm_config = make_args(tmp_path, beta=2e-5).algorithm_config()
    assert algorithm_config.beta == 2e-5 and algorithm_config.micro_batch_size == 5


def test_gradient_checkpointing_maps_to_diffusers(tmp_path: Path) -> None:
    args = make_args(tmp_path, gradient_checkpointing=True)
    assert args.diffusers_gradient_checkpointing and not args.gradient_checkpointing


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "ppo"}, "algorithm: Unknown algorithm 'ppo'"),
        ({"use_vllm": True}, "vLLM"),
        ({"sde_window": [3, 9]}, "sde_window"),
        ({"reward_component_weights": "{vq: 1"}, "JSON"),
        ({"reward_preset": "setting_c"}, "reward_preset"),
        ({"kl_strategy": "reverse"}, "kl_strategy"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"temperature": 0.7}, "temperature=0.7 is not supported.*eta"),
        ({"max_completion_length": 64}, "max_completion_length.*text-generation"),
        ({"loss_type": "dr_grpo"}, "loss_type.*algorithm"),
        ({"top_p": 0.9}, "top_p"),
    ],
)
def test_config_errors_explain_the_fix(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **kwargs)


def test_reward_component_weights_parse_from_json(tmp_path: Path) -> None:
    args = make_args(tmp_path, reward_component_weights='{"mean_brightness": 2.0}')
    assert args.reward_weights_for_composite() == {"mean_brightness": 2.0}


@pytest.mark.parametrize("argument", ["tools", "rollout_func", "environment_factory", "processing_class"])
def test_llm_only_arguments_are_refused(tmp_path: Path, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        SageGRPOTrainer(
            LinearBackbone(),
            mean_brightness,
            args=make_args(tmp_path),
            train_dataset=PROMPTS,
            **{argument: object()},
        )


# ------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------


def test_two_steps_change_every_lora_parameter_and_no_base_parameter(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    before = named_params(trainer.backbone.transformer)
    trainer.train()
    after = named_params(trainer.backbone.transformer)
    lora_names = [n for n in before if "lora_" in n]
    assert lora_names and all(not torch.equal(before[n], after[n]) for n in lora_names)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
    first = trainer.state.log_history[0]
    assert first["ratio_mean"] == 1.0 and first["ratio_std"] == 0.0  # on-policy first update
    assert {
        "reward/mean_brightness",
        "kl/coef",
        "kl/position",
        "kl/velocity",
        "clip_fraction",
        "rollout/exploration_std",
        "time/rollout",
        "reward/invalid_count",
    } <= set(first)


def test_invalid_rewards_are_masked_and_reported(tmp_path: Path) -> None:
    def fragile(videos, prompts, **kwargs):
        if any("cube" in p for p in prompts):
            raise RuntimeError("reward model cannot score cubes")
        return videos.mean(dim=(1, 2, 3, 4))

    trainer = make_trainer(tmp_path, reward=fragile, max_steps=3)
    trainer.train()
    history = [h for h in trainer.state.log_history if "reward/invalid_count" in h]
    assert sum(h["reward/invalid_count"] for h in history) > 0
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)


def test_kl_fixed_with_lora_uses_the_adapter_free_base(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, algorithm="flow_grpo", max_steps=2)
    assert type(trainer.references.fixed).__name__ == "DisabledAdapters" and trainer.references.anchor is None
    trainer.train()
    assert trainer.state.log_history[1]["kl/position"] > 0


def test_lora_anchor_is_an_adapter_snapshot(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    anchor = trainer.references.anchor
    lora_bytes = sum(
        p.numel() * 4 for n, p in trainer.backbone.transformer.named_parameters() if "lora_" in n
    )
    assert anchor.num_bytes() == lora_bytes
    assert set(anchor.values) == {
        n for n, _ in trainer.backbone.transformer.named_parameters() if "lora_" in n
    }


# ------------------------------------------------------------------------------------------
# Saving and resuming
# ------------------------------------------------------------------------------------------


def test_saved_adapter_reloads_and_reproduces_the_policy(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / LORA_WEIGHT_NAME).is_file()
    config = json.loads((tmp_path / "final" / "sage_config.json").read_text())
    assert config["algorithm"] == "sage_grpo" and config["sde"] == "sage"
    fresh = LinearBackbone()
    fresh.load_lora_weights(tmp_path / "final")
    latents, sigma = torch.randn(2, 3, 2, 4, 4), torch.tensor([0.9, 0.3])
    conditioning = fresh.encode_prompts(PROMPTS[:2])
    with torch.no_grad():
        expected = trainer.backbone.predict_velocity(
            latents, sigma, trainer.backbone.encode_prompts(PROMPTS[:2])
        )
        torch.testing.assert_close(fresh.predict_velocity(latents, sigma, conditioning), expected)


def test_full_fine_tuning_saves_a_diffusers_transformer_folder(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, peft=False, learning_rate=1e-3)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    reloaded = type(trainer.backbone.transformer).from_pretrained(tmp_path / "final" / "transformer")
    for name, parameter in trainer.backbone.transformer.named_parameters():
        torch.testing.assert_close(reloaded.state_dict()[name], parameter.detach())


class StopAfter(TrainerCallback):
    """Interrupt training after ``step`` optimizer steps, as a crash or a pre-emption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


RESUMED_ALGORITHMS = {  # policy gradients (one moving its SDE window, one on trees), likelihood-free ones
    "sage_grpo": {},
    "mix_grpo": {"algorithm_args": {"sde_window_size": 2, "sde_window_shift_interval": 1}},
    "grpo_guard": {},  # its second pass per rollout uses the recorded means
    "branch_grpo": {},  # advantages per tree level, buffered and checkpointed
    "mix_grpo_flash": {"algorithm_args": {"sde_window_size": 2, "sde_window_shift_interval": 1}},  # schedules vary
    "diffusion_nft": {},
    "awm": {"num_iterations": 1},  # on-policy only
}


@pytest.mark.parametrize("algorithm", sorted(RESUMED_ALGORITHMS))
def test_resumed_run_matches_the_uninterrupted_run(tmp_path: Path, algorithm: str) -> None:
    # num_iterations=2: checkpoint-2 falls in the middle of a rollout's reuse, the hardest case.
    settings = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "num_iterations": 2}
    settings.update(algorithm=algorithm, **RESUMED_ALGORITHMS[algorithm])
    straight = make_trainer(tmp_path / "a", **settings)
    straight.train()
    interrupted = make_trainer(tmp_path / "b", **settings)
    interrupted.add_callback(StopAfter(2))
    interrupted.train()
    checkpoint = get_last_checkpoint(str(tmp_path / "b" / "run"))
    assert checkpoint.endswith("checkpoint-2")
    resumed = make_trainer(tmp_path / "b", **settings)
    resumed.train(resume_from_checkpoint=checkpoint)
    expected, actual = named_params(straight.backbone.transformer), named_params(resumed.backbone.transformer)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6)
    assert resumed.algorithm.state_dict().keys() == straight.algorithm.state_dict().keys()
    for name, value in straight.algorithm.state_dict().items():
        assert torch.equal(value, resumed.algorithm.state_dict()[name]) if torch.is_tensor(value) else (
            value == resumed.algorithm.state_dict()[name]
        ), name
    if straight.references.anchor is not None:  # the moving anchor, or DiffusionNFT's old policy
        for name, value in straight.references.anchor.values.items():
            torch.testing.assert_close(resumed.references.anchor.values[name], value, rtol=0, atol=1e-6)
    assert resumed.algorithm.optimizer_steps == straight.algorithm.optimizer_steps == 4
    losses = [h["loss"] for h in straight.state.log_history if "loss" in h]
    resumed_losses = [h["loss"] for h in resumed.state.log_history if "loss" in h]
    assert resumed_losses[-2:] == pytest.approx(losses[-2:], rel=1e-5, abs=1e-9)


def test_crash_while_checkpointing_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    trainer = make_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=2)
    original = _trl_compat.save_trainer_checkpoint_parts
    calls = {"count": 0}

    def crash_on_second(trainer_, output_dir):
        calls["count"] += 1
        if calls["count"] == 2:
            raise OSError("disk full")
        original(trainer_, output_dir)

    monkeypatch.setattr(_trl_compat, "save_trainer_checkpoint_parts", crash_on_second)
    with pytest.raises(OSError, match="disk full"):
        trainer.train()
    run_dir = tmp_path / "run"
    assert get_last_checkpoint(str(run_dir)).endswith("checkpoint-2")
    assert not (run_dir / "checkpoint-4").exists()
    assert (run_dir / "checkpoint-2" / "sage_state.json").is_file()
    assert (run_dir / "checkpoint-2" / LORA_WEIGHT_NAME).is_file()
    assert os.path.isdir(run_dir / "tmp-checkpoint-4")  # the partial write never became a checkpoint


def test_the_runs_seed_seeds_the_timestep_selection(tmp_path: Path) -> None:
    """The algorithm's generator follows TRL's seed (it was left at 0 for every seed once)."""
    states = [
        make_trainer(tmp_path / str(seed), seed=seed).algorithm.generator.get_state() for seed in (0, 1)
    ]
    assert not torch.equal(*states)
    assert torch.equal(states[0], torch.Generator().manual_seed(0).get_state())
