"""sage_trl.preflight's configs, GPUs and world sizes: random weights on each component's device, the shipped
model configs, where configs come from, the checks before tracing, DDP and FSDP, time and fit, the saver search
and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
import torch

from sage_trl import SageGRPOConfig
from sage_trl.preflight import (
    GPUS,
    MemoryKind,
    PhasePlan,
    PreflightPlan,
    plan_training,
    resolve_model_configs,
)
from sage_trl.preflight.gpus import resolve_gpu
from sage_trl.preflight.models import build_pipeline
from sage_trl.preflight.plan import ALLOCATOR_HINT, TIGHT_FIT_HEADROOM
from sage_trl.preflight.savers import SAVERS, find_savers, saver_cost
from sage_trl.preflight.tracing import trace_session
from tests.sage_trl.preflight.tiny_plans import GIB, tiny_config, tiny_lora


def test_random_weights_made_on_one_device_end_on_each_components_own(tiny_wan_path: Path) -> None:
    configs = resolve_model_configs(str(tiny_wan_path))
    homes = {"transformer": "meta"}  # meta stands in for the host, the CPU for the GPU they are made on
    pipeline = build_pipeline(configs, torch.float32, lambda name: homes.get(name, "cpu"), made_on="cpu")
    assert {p.device.type for p in pipeline.transformer.parameters()} == {"meta"}
    for name in ("vae", "text_encoder"):
        assert {p.device.type for p in getattr(pipeline, name).parameters()} == {"cpu"}, name


def test_shipped_configs_build_the_published_model_sizes() -> None:
    expected = {
        "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v": (8.33e9, None),
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": (1.42e9, None),
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers": (14.29e9, 14.29e9),  # two experts
    }
    for name, (first, second) in expected.items():
        configs = resolve_model_configs(name)
        assert "shipped" in configs.source
        with trace_session():
            pipeline = build_pipeline(configs, torch.bfloat16)
            assert sum(p.numel() for p in pipeline.transformer.parameters()) == pytest.approx(
                first, rel=0.005
            )
            expert = getattr(pipeline, "transformer_2", None)
            assert (expert is None) == (second is None)


def test_configs_come_from_a_folder_then_the_cache_then_the_shipped_files(
    tiny_wan_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model_configs(str(tiny_wan_path)).source.startswith("local folder")
    snapshot = tmp_path / "hub" / "models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers" / "snapshots" / "abc"
    (snapshot / "transformer").mkdir(parents=True)
    index = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    (snapshot / "model_index.json").write_text(json.dumps(index))
    (snapshot / "transformer" / "config.json").write_text(json.dumps({"num_layers": 2}))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = resolve_model_configs("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert cached.source == "the Hugging Face cache" and cached.components["transformer"] == {"num_layers": 2}
    with pytest.raises(ValueError, match="huggingface-cli download"):
        resolve_model_configs("someone/unknown-model")


def test_gpus_and_bad_inputs_are_checked_before_tracing(tiny_wan_path: Path, tmp_path: Path) -> None:
    assert resolve_gpu("h100") is GPUS["H100"] and resolve_gpu(500).bf16_tflops == 500
    config = tiny_config(tiny_wan_path, tmp_path)
    for arguments, message in [
        ({"gpu": "B300"}, "Unknown GPU"),
        ({"gpu_memory_gib": 0}, "gpu_memory_gib"),
        ({"world_size": 0}, "world_size"),
        ({"utilisation": 1.5}, "utilisation"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan_training(config, **arguments)


def _hand_plan() -> PreflightPlan:
    kinds = [
        MemoryKind("transformer weights", 16 * GIB),
        MemoryKind("trainable parameters", 2 * GIB),
        MemoryKind("optimizer state", 4 * GIB),
        MemoryKind("VAE", 1 * GIB),
    ]
    gradients = 2 * GIB
    phases = [
        PhasePlan("rollout step", 23 * GIB, 30 * GIB, 10**15, 40, True),
        PhasePlan("training micro-step", 23 * GIB, 40 * GIB, 3 * 10**15, 10, True, gradients),
        PhasePlan("optimizer step", 25 * GIB, 25 * GIB, 0, 1, False, gradients),
    ]
    return PreflightPlan("m", "tests", "LoRA", kinds, phases, largest_block_bytes=GIB // 4)


def test_world_sizes_add_ddp_buckets_or_shard_with_fsdp() -> None:
    plan = _hand_plan()
    ddp = plan.for_world(8, fsdp=False)
    assert [p.peak_bytes - q.peak_bytes for p, q in zip(ddp.phases, plan.phases)] == [2 * GIB] * 3
    fsdp = plan.for_world(4, fsdp=True)
    sharded = 22 * GIB * 3 // 4  # weights, trainable, optimizer: all but one shard
    gathered = 2 * (GIB // 4)  # the block computing and the one prefetched
    assert fsdp.phases[0].peak_bytes == 30 * GIB - sharded + gathered
    assert fsdp.phases[1].peak_bytes == 40 * GIB - sharded - 2 * GIB * 3 // 4 + gathered
    assert fsdp.phases[2].peak_bytes == 25 * GIB - sharded - 2 * GIB * 3 // 4
    assert {k.name: k.num_bytes for k in fsdp.kinds}["VAE"] == GIB  # not sharded


def test_the_prompt_precompute_runs_before_ddp_or_fsdp_wrap_the_model() -> None:
    plan = _hand_plan()
    encode = PhasePlan("encode prompts", 14 * GIB, 17 * GIB, 10**14, 0, False)  # once, at the start
    plan.phases = [encode, *plan.phases]
    for world in (plan.for_world(8, fsdp=False), plan.for_world(32, fsdp=True)):
        assert world.phases[0] == encode and world.phases[1] != plan.phases[1]


def test_time_and_fit_use_the_gpu_throughput_and_the_stated_margins() -> None:
    plan = _hand_plan()
    plan.gpu = GPUS["H100"]
    assert plan.flops_per_optimizer_step == 40 * 10**15 + 30 * 10**15
    assert plan.seconds(989e12 * 0.4) == pytest.approx(1.0)
    assert plan.required_gib() == pytest.approx(40 * 1.1 + 1)
    assert plan.fits and plan.budget_gib == 80
    plan.memory_budget_gib = 40
    assert plan.fits is False and "Does NOT fit in 40 GiB" in plan.format()


def test_a_tight_fit_names_the_allocator_setting_that_made_one_measured_on_a_gpu() -> None:
    plan = _hand_plan()  # peak 40 GiB: 45 GiB with the margins
    plan.memory_budget_gib = 45 * (1 + TIGHT_FIT_HEADROOM) - 0.1
    assert plan.fits and ALLOCATOR_HINT in plan.format()
    assert "expandable_segments:True" in ALLOCATOR_HINT
    plan.memory_budget_gib = 45 * (1 + TIGHT_FIT_HEADROOM) + 0.1
    assert plan.fits and ALLOCATOR_HINT not in plan.format()


def test_the_saver_search_leaves_out_savers_that_do_not_lower_the_peak(tiny_wan_path: Path, tmp_path: Path) -> None:
    """A saver for a phase that is not the peak (here the encode batch, with the training micro-step at 40 GiB) is
    traced and dropped from the advice; the search goes on to the ones that help."""
    config = tiny_config(tiny_wan_path, tmp_path, precompute_prompt_embeddings=True, rollout_batch_size=1)
    plan = _hand_plan()
    plan.memory_budget_gib = 40
    traced: list[str] = []

    def trace(candidate: SageGRPOConfig) -> PreflightPlan:
        traced.append(f"{candidate.prompt_encode_batch_size} {candidate.sequential_cfg}")
        planned = _hand_plan()
        if candidate.sequential_cfg:
            planned.phases[1] = PhasePlan("training micro-step", 23 * GIB, 30 * GIB, 10**15, 10, True)
        return planned

    savers, peak = find_savers(config, tiny_lora(), plan, trace)
    assert savers == ["sequential_cfg: true"] and peak == 30 * GIB
    first = traced.index("1 False")  # tried, did not lower the peak, and stayed off for the next savers
    assert all(entry.startswith("8 ") for entry in traced[first + 1 :]) and traced[-1] == "8 True"


def test_the_verdict_names_each_saver_with_what_it_costs() -> None:
    plan = _hand_plan()
    plan.memory_budget_gib = 40
    plan.savers, plan.saver_peak_bytes = ["activation_offload: true"], 30 * GIB
    plan.saver_costs = [saver_cost(name) for name in plan.savers]
    verdict = plan.format()
    assert "With activation_offload: true: 34.0 GiB, fits. What each costs: activation_offload: true: two PCIe" in verdict
    assert {saver.name for saver in SAVERS} >= {
        "activation_offload: true", "sequential_cfg: true", "gradient_checkpointing: true"
    }
    assert all(saver.cost for saver in SAVERS)
