"""sage_trl.preflight: the trace against real runs of the same step on the CPU allocator (one expert and both,
prompt encoding, the savers that change the traced peaks)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from sage_env.backbones import load_backbone
from sage_trl.preflight import PhasePlan, resolve_model_configs
from sage_trl.preflight.measure import EXPERT_SWAP_PHASE, MODEL_TO_DEVICE_PHASE, measure_training_step
from sage_trl.preflight.runner import trace_plan
from sage_trl.preflight.steps import rollout_rounds_per_optimizer_step
from tests.fixtures.tiny_pipelines import build_tiny_wan_pipeline
from tests.sage_trl.preflight.tiny_plans import EXACT_PHASES, TOLERANCE, tiny_config, tiny_lora


@pytest.mark.parametrize("model", ["wan", "hunyuan"])
def test_traced_peaks_equal_the_cpu_allocators_peaks_of_the_same_step(
    model: str, tiny_wan_path: Path, tiny_hunyuan_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = {"wan": tiny_wan_path, "hunyuan": tiny_hunyuan_path}[model]
    config = tiny_config(path, tmp_path)
    traced = trace_plan(config, tiny_lora(), model_configs=resolve_model_configs(str(path)))
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="sage_trl.preflight.measure"):
        measured = measure_training_step(load_backbone(str(path)), config, tiny_lora())
    assert [p.name for p in traced.phases] == [m.name for m in measured]
    logged = [
        json.loads(record.getMessage().removeprefix("measured phase "))
        for record in caplog.records
        if record.name == "sage_trl.preflight.measure"
    ]
    assert logged == [dataclasses.asdict(m) for m in measured]  # each phase as it ends: a killed run keeps them
    for phase, real in zip(traced.phases, measured):
        transient = phase.peak_bytes - phase.start_bytes
        if phase.name in EXACT_PHASES:
            assert (1 - TOLERANCE) * real.transient_bytes <= transient <= real.transient_bytes, phase.name
        else:  # decode: CPU convolutions allocate im2col buffers the trace cannot see (kernel workspaces)
            assert 0 < transient <= real.transient_bytes, phase.name


def test_both_wan22_experts_trace_as_the_cpu_allocator_counts_and_the_idle_one_waits_on_the_host(
    tiny_wan22_path: Path, tmp_path: Path
) -> None:
    configs = resolve_model_configs(str(tiny_wan22_path))
    config = tiny_config(tiny_wan22_path, tmp_path, expert="both")
    resident = trace_plan(config, tiny_lora(), model_configs=configs)
    torch.manual_seed(0)
    measured = measure_training_step(load_backbone(str(tiny_wan22_path), expert="both"), config, tiny_lora())
    for phase, real in zip(resident.phases, measured, strict=True):
        transient = phase.peak_bytes - phase.start_bytes
        if phase.name in EXACT_PHASES:
            assert (1 - TOLERANCE) * real.transient_bytes <= transient <= real.transient_bytes, phase.name
    swapping = tiny_config(tiny_wan22_path, tmp_path, expert="both", offload_idle_expert=True)
    swapped = trace_plan(swapping, tiny_lora(), model_configs=configs)
    idle = next(kind for kind in swapped.kinds if kind.name == "idle expert (swapped to the host)")
    expert = build_tiny_wan_pipeline().transformer
    expert_bytes = sum(t.numel() * t.element_size() for t in (*expert.parameters(), *expert.buffers()))
    assert not idle.on_device and idle.num_bytes == pytest.approx(expert_bytes, rel=0.01)
    for phase, kept in zip(swapped.phases[1:], resident.phases[1:], strict=True):  # after the prompt encoding
        assert phase.start_bytes == kept.start_bytes - idle.num_bytes, phase.name
        assert phase.peak_bytes - phase.start_bytes == kept.peak_bytes - kept.start_bytes, phase.name
    rounds = rollout_rounds_per_optimizer_step(swapping)
    assert (swapped.expert_swaps, resident.expert_swaps) == (2 * rounds + 2 * swapping.gradient_accumulation_steps, 0)
    assert swapped.expert_swap_bytes == idle.num_bytes


def test_the_idle_experts_swaps_are_measured_after_the_step_and_the_computing_expert_is_back(
    tiny_wan22_path: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_wan22_path, tmp_path, expert="both", offload_idle_expert=True)
    traced = trace_plan(config, tiny_lora(), model_configs=resolve_model_configs(str(tiny_wan22_path)))
    backbone = load_backbone(str(tiny_wan22_path), expert="both", offload_idle_expert=True)
    measured = measure_training_step(backbone, config, tiny_lora())
    names = [phase.name for phase in measured]
    assert names == [p.name for p in traced.phases] + [
        MODEL_TO_DEVICE_PHASE,
        f"{EXPERT_SWAP_PHASE} to transformer_2",
        f"{EXPERT_SWAP_PHASE} to transformer",
    ]
    assert backbone.transformer.active == "transformer" and all(m.seconds > 0 for m in measured[-2:])
    resident = measure_training_step(load_backbone(str(tiny_wan22_path), expert="both"), config, tiny_lora())
    assert not any(phase.name.startswith(EXPERT_SWAP_PHASE) for phase in resident)


def test_precomputed_prompts_are_encoded_with_only_the_text_encoders_on_the_device(
    tiny_wan_path: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_wan_path, tmp_path, precompute_prompt_embeddings=True, offload_text_encoders=True)
    plan = trace_plan(config, tiny_lora(), model_configs=resolve_model_configs(str(tiny_wan_path)))
    encode = next(p for p in plan.phases if p.name == "encode prompts")
    kinds = {kind.name: kind for kind in plan.kinds}
    text, parked = kinds["text encoders"].num_bytes, kinds["transformer weights"].num_bytes + kinds["VAE"].num_bytes
    # The text encoders and little else (the scheduler's tables): the transformer and the VAE wait on the host.
    assert text <= encode.start_bytes < text + parked / 10
    assert plan.phases[1].start_bytes >= kinds["transformer weights"].num_bytes  # and are back for the rollout


def test_the_encode_batch_saver_traces_as_the_cpu_allocator_counts(tiny_wan_path: Path, tmp_path: Path) -> None:
    """``prompt_encode_batch_size: 1`` against the real encoding of the same prompts (UMT5, one thread)."""
    configs, measured = resolve_model_configs(str(tiny_wan_path)), {}
    for batch_size in (1, 8):
        config = tiny_config(
            tiny_wan_path, tmp_path, precompute_prompt_embeddings=True, prompt_encode_batch_size=batch_size
        )
        traced = next(p for p in trace_plan(config, tiny_lora(), model_configs=configs).phases if p.name == "encode prompts")
        real = next(m for m in measure_training_step(load_backbone(str(tiny_wan_path)), config, tiny_lora()) if m.name == "encode prompts")
        transient = traced.peak_bytes - traced.start_bytes
        assert (1 - TOLERANCE) * real.transient_bytes <= transient <= real.transient_bytes, batch_size
        measured[batch_size] = real.transient_bytes
    assert measured[1] < measured[8]


def test_the_prompt_encode_batch_size_bounds_the_traced_encode_phase(tiny_wan_path: Path, tmp_path: Path) -> None:
    configs = resolve_model_configs(str(tiny_wan_path))

    def encode_phase(batch_size: int) -> PhasePlan:
        config = tiny_config(tiny_wan_path, tmp_path, precompute_prompt_embeddings=True, prompt_encode_batch_size=batch_size)
        plan = trace_plan(config, tiny_lora(), model_configs=configs)
        return next(p for p in plan.phases if p.name == "encode prompts")

    one, eight = encode_phase(1), encode_phase(8)
    assert (one.note, eight.note) == ("1 prompt + the negative", "8 prompts + the negative")
    assert one.start_bytes == eight.start_bytes and one.peak_bytes < eight.peak_bytes
    assert one.flops < eight.flops


def test_checkpointing_and_micro_batch_change_the_traced_training_peak(
    tiny_wan_path: Path, tmp_path: Path
) -> None:
    configs = resolve_model_configs(str(tiny_wan_path))

    def training_peak(**overrides: object) -> int:
        plan = trace_plan(
            tiny_config(tiny_wan_path, tmp_path, **overrides), tiny_lora(), model_configs=configs
        )
        phase = next(p for p in plan.phases if p.name == "training micro-step")
        return phase.peak_bytes - phase.start_bytes

    checkpointed = training_peak()
    assert training_peak(gradient_checkpointing=False) > checkpointed
    assert training_peak(micro_batch_size=1) < checkpointed
