"""Each memory saver is a switch that leaves the training result unchanged (tiny WanPipeline, LoRA).

The step uses plain SGD with lr 1, so the update *is* the gradient: Adam's first step (~lr * sign(g)) would
turn rounding-level gradient differences of near-zero entries into visible ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from sage_env.backbones import load_backbone
from sage_trl import SageGRPOConfig, SageGRPOTrainer, activation_offload
from tests.doubles import mean_brightness
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

PROMPTS = ["a red ball rolls left", "a blue cube spins", "a green cone falls", "a white star glows"]


def train_one_step(
    wan_path: Path, output_dir: Path, **kwargs
) -> tuple[SageGRPOTrainer, dict[str, torch.Tensor]]:
    values = {
        "output_dir": str(output_dir),
        "max_steps": 1,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "num_generations": 4,
        "num_inference_steps": 3,
        "shift": 3.0,
        "learning_rate": 1.0,
        "optim": "sgd",
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        "micro_batch_size": 6,
        "guidance_scale": 2.0,
        **TINY_VIDEO_SIZE,
    }
    values.update(kwargs)
    lora = LoraConfig(r=2, lora_alpha=4, init_lora_weights="gaussian")
    trainer = SageGRPOTrainer(
        load_backbone(str(wan_path)),
        mean_brightness,
        args=SageGRPOConfig(**values),
        train_dataset=PROMPTS,
        peft_config=lora,
    )
    trainer.train()
    lora_weights = {
        n: p.detach().clone() for n, p in trainer.backbone.transformer.named_parameters() if "lora_" in n
    }
    return trainer, lora_weights


@pytest.fixture(scope="module")
def reference(tiny_wan_path: Path, tmp_path_factory) -> dict[str, torch.Tensor]:
    return train_one_step(tiny_wan_path, tmp_path_factory.mktemp("reference"))[1]


ROUNDING_ATOL = 1e-5
"""Savers that run the same arithmetic in another order of operations: the update agrees to float rounding."""
BATCHING_ATOL = 1e-4
"""``rollout_batch_size`` changes the batch of each rollout forward, so the kernels sum in another order: rewards
differ by ~1e-7, and the group normalisation divides by this tiny reward's spread (std ~1.6e-4 here), which turns
that into differences of up to 2e-5 in the update (measured; a wrong update differs by 1e-3 and more)."""


def assert_same_update(
    weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], atol: float = ROUNDING_ATOL
) -> None:
    assert weights.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(weights[name], reference[name], rtol=0, atol=atol)


@pytest.mark.parametrize(
    "saver",
    [
        {"gradient_checkpointing": True},
        {"micro_batch_size": 1},
        {"precompute_prompt_embeddings": True},
        {"vae_tiling": True, "vae_slicing": True},
        {"offload_text_encoders": False},
        {"rollout_batch_size": 3},
        {"gradient_checkpointing": True, "activation_offload": True},
        {"sequential_cfg": True},
        {"gradient_checkpointing": True, "activation_offload": True, "sequential_cfg": True},
    ],
    ids=[
        "gradient_checkpointing",
        "micro_batch_1",
        "precompute_prompts",
        "vae_tiling_slicing",
        "no_encoder_offload",
        "rollout_batch_3",
        "activation_offload",
        "sequential_cfg",
        "sequential_cfg_with_offload",
    ],
)
def test_saver_leaves_the_update_unchanged(
    tiny_wan_path: Path, tmp_path: Path, reference, saver: dict
) -> None:
    trainer, weights = train_one_step(tiny_wan_path, tmp_path, **saver)
    assert_same_update(weights, reference, BATCHING_ATOL if "rollout_batch_size" in saver else ROUNDING_ATOL)
    if saver.get("gradient_checkpointing"):
        assert trainer.backbone.transformer.is_gradient_checkpointing
    if saver.get("activation_offload"):
        function = trainer.backbone.transformer._gradient_checkpointing_func
        assert function is activation_offload.offloaded_checkpoint
    if saver.get("sequential_cfg"):
        assert trainer.backbone.sequential_cfg
    if saver.get("vae_tiling"):
        assert trainer.backbone.vae.use_tiling and trainer.backbone.vae.use_slicing


def test_precomputed_prompts_are_not_encoded_again(tiny_wan_path: Path, tmp_path: Path, monkeypatch) -> None:
    backbone = load_backbone(str(tiny_wan_path))
    calls: list[list[str]] = []
    encode = backbone._encode_uncached

    def counting(prompts, negative_prompt):
        calls.append(list(prompts))
        return encode(prompts, negative_prompt)

    monkeypatch.setattr(backbone, "_encode_uncached", counting)
    args = SageGRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=4,
        num_inference_steps=2,
        use_cpu=True,
        disable_tqdm=True,
        precompute_prompt_embeddings=True,
        **TINY_VIDEO_SIZE,
    )
    trainer = SageGRPOTrainer(backbone, mean_brightness, args=args, train_dataset=PROMPTS)
    assert sorted(p for batch in calls for p in batch) == sorted(PROMPTS)
    calls.clear()
    trainer.train()
    assert calls == []


def test_prompts_are_encoded_before_the_transformer_occupies_the_device(
    tiny_wan_path: Path, tmp_path: Path, monkeypatch
) -> None:
    """The trainer loads the backbone on the host, brings the text encoders to the run's device, encodes in chunks,
    sends them back, and only then moves the transformer and the VAE to the device (CPU here: the order is what a
    GPU run does, checked on moves and encoding calls)."""
    from sage_trl import training_setup

    events: list[tuple[str, str]] = []
    load = training_setup.load_backbone

    def spying_load(*args, **kwargs):
        backbone = load(*args, **kwargs)
        events.append(("load", str(kwargs["device"])))
        pipeline = backbone.pipeline
        for name in ("transformer", "vae", "text_encoder"):
            module, move = getattr(pipeline, name), getattr(pipeline, name).to
            module.to = lambda *a, name=name, move=move, **k: (events.append((name, str(a[0]) if a else str(k))), move(*a, **k))[1]
        encode = backbone._encode_uncached

        def encoding(prompts, negative_prompt):
            events.append(("encode", f"{len(prompts)} prompts on {backbone.device}"))
            return encode(prompts, negative_prompt)

        backbone._encode_uncached = encoding
        return backbone

    monkeypatch.setattr(training_setup, "load_backbone", spying_load)
    args = SageGRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=4, use_cpu=True,
        model_name_or_path=str(tiny_wan_path), precompute_prompt_embeddings=True, prompt_encode_batch_size=3,
        **TINY_VIDEO_SIZE,
    )  # fmt: skip
    SageGRPOTrainer(None, mean_brightness, args=args, train_dataset=PROMPTS)
    assert events[:4] == [("load", "cpu"), ("transformer", "cpu"), ("vae", "cpu"), ("text_encoder", "cpu")]
    encodes = [index for index, event in enumerate(events) if event[0] == "encode"]
    assert [events[i][1] for i in encodes] == ["3 prompts on cpu", "1 prompts on cpu"]  # chunks of 3
    after = events[encodes[-1] + 1 :]
    assert after[:3] == [("text_encoder", "cpu"), ("transformer", "cpu"), ("vae", "cpu")]  # then to args.device


def test_vae_savers_refuse_pixel_space_backbones() -> None:
    from tests.doubles import LinearBackbone

    with pytest.raises(ValueError, match="without a VAE"):
        LinearBackbone().enable_vae_memory_savers(tiling=True)
