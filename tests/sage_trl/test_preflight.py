"""sage_trl.preflight: the trace against real runs of the same step, the full-size plans of the example configs,
the savers that make a config fit, and the pieces (meter, shadow values, replayed calls, configs, GPUs, world sizes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import huggingface_hub
import pytest
import torch
from peft import LoraConfig

from sage_env.backbones import load_backbone
from sage_trl import SageGRPOConfig
from sage_trl.cli import parse_train_arguments, train_main
from sage_trl.preflight import (
    GPUS,
    MemoryKind,
    PhasePlan,
    PreflightPlan,
    plan_training,
    resolve_model_configs,
)
from sage_trl.preflight.gpus import resolve_gpu
from sage_trl.preflight.measure import EXPERT_SWAP_PHASE, MODEL_TO_DEVICE_PHASE, measure_training_step
from sage_trl.preflight.models import build_pipeline
from sage_trl.preflight.plan import ALLOCATOR_HINT, TIGHT_FIT_HEADROOM
from sage_trl.preflight.replay import replay_calls
from sage_trl.preflight.runner import trace_plan
from sage_trl.preflight.savers import SAVERS, find_savers, saver_cost
from sage_trl.preflight.steps import rollout_rounds_per_optimizer_step
from sage_trl.preflight.tracing import TraceError, trace_session
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE, build_tiny_wan_pipeline

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIGS = REPOSITORY / "examples" / "configs"
GIB = 2**30
EXACT_PHASES = ("encode prompts", "rollout step", "training micro-step", "optimizer step")
TOLERANCE = 0.05
"""Traced transient bytes lie within 5% below the CPU allocator's (PyTorch's CPU attention and matmul kernels
allocate small internal buffers that are not tensors: the "kernel workspaces" of `sage_trl.preflight.LIMITS`)."""


def tiny_config(model: Path, tmp_path: Path, **overrides: object) -> SageGRPOConfig:
    """A CPU run of the tiny pipeline: 2 videos of 5 x 32 x 32 per training step, 2 steps per round, CFG."""
    fields = {
        "output_dir": str(tmp_path / "run"),
        "model_name_or_path": str(model),
        "use_cpu": True,
        "bf16": False,
        "torch_dtype": "float32",
        "num_frames": 5,
        "height": 32,
        "width": 32,
        "num_inference_steps": 4,
        "guidance_scale": 5.0,
        "per_device_train_batch_size": 2,
        "steps_per_generation": 2,
        "gradient_accumulation_steps": 2,
        "num_generations": 2,
        "micro_batch_size": 2,
        "gradient_checkpointing": True,
        "vae_slicing": True,
        "report_to": "none",
        **overrides,
    }
    return SageGRPOConfig(**fields)


def tiny_lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8)


def example(name: str, *overrides: str) -> tuple[object, SageGRPOConfig]:
    """An example config parsed as ``sage-train --config`` parses it (``use_cpu``: this machine has no GPU)."""
    return parse_train_arguments(["--config", str(CONFIGS / name), "--use_cpu=true", *overrides])


# -- the trace against the same step run for real -------------------------------------------------------


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


# -- full size: the example configs -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "gpu", "budget_gib", "weights_bytes"),
    [
        ("hunyuanvideo15_480p_lora_1gpu.yaml", "H100", None, 2 * 8.33e9),  # 8.33B parameters in bf16
        ("hunyuanvideo15_480p_lora_1gpu_48gb.yaml", "L40S", 44.0, 2 * 8.33e9),
        ("wan21_1.3b_lora_1gpu_24gb.yaml", "RTX4090", None, 2 * 1.42e9),  # 1.42B
        ("wan21_1.3b_lora_1gpu_16gb.yaml", "RTX4090", 14.5, 2 * 1.42e9),
        # Wan 2.2 A14B, both experts trained: one 14.29B expert on the device, the idle one on the host
        ("wan22_a14b_lora_1gpu_80gb.yaml", "H100", 79.0, 2 * 14.29e9),
    ],
)
def test_full_size_plans_of_the_example_configs_back_their_claims(
    name: str, gpu: str, budget_gib: float | None, weights_bytes: float
) -> None:
    script_args, config = example(name)
    plan = plan_training(
        config, lora_config=script_args.peft_config(), gpu=gpu, rewards=script_args.reward, gpu_memory_gib=budget_gib
    )
    # "one 80 GB GPU" / "one 24 GB GPU" (the GPUs' capacities), 44 and 14.5 GiB for 48 and 16 GB cards; margins included
    assert plan.fits, plan.format()
    kinds = {kind.name: kind for kind in plan.kinds}
    assert kinds["transformer weights"].num_bytes == pytest.approx(weights_bytes, rel=0.01)
    encode = next(phase for phase in plan.phases if phase.name == "encode prompts")
    assert encode.start_bytes < kinds["text encoders"].num_bytes + GIB  # the transformer waits on the host
    assert (
        not kinds["text encoders"].on_device and not kinds["reward model"].on_device
    )  # offloaded by the configs
    phases = {phase.name: phase for phase in plan.phases}
    assert set(phases) == {
        "encode prompts",
        "rollout step",
        "decode",
        "training micro-step",
        "optimizer step",
    }
    assert max(phases.values(), key=lambda phase: phase.peak_bytes) is not encode  # a one-time phase is never the peak
    for phase in phases.values():
        resident = kinds["text encoders" if phase is encode else "transformer weights"].num_bytes
        assert phase.peak_bytes >= phase.start_bytes >= resident
    assert (
        phases["rollout step"].flops > 0
        and phases["training micro-step"].flops > phases["rollout step"].flops / 8
    )
    assert plan.trace_seconds > 0  # its duration is benchmarks.gpu_memory's to report, not a test's to time
    text = plan.format()
    assert "Fits in" in text and "traced, not measured" in text
    if "wan22" in name:  # both experts train: two adapters, the idle expert on the host, its swaps planned
        assert kinds["idle expert (swapped to the host)"].num_bytes == pytest.approx(weights_bytes, rel=0.01)
        assert not kinds["idle expert (swapped to the host)"].on_device
        assert plan.expert_swaps == 2 * 2 + 2 * config.gradient_accumulation_steps and "Expert swaps" in text


@pytest.mark.slow
def test_a_config_that_does_not_fit_is_reported_with_the_savers_that_make_it_fit(
    capsys: pytest.CaptureFixture,
) -> None:
    """Through ``sage-train`` as a user calls it: a bf16 config is planned on a machine without a GPU."""
    config = str(CONFIGS / "wan21_1.3b_lora_1gpu_24gb.yaml")
    status = train_main(
        [
            "--config",
            config,
            "--gradient_checkpointing=false",
            "--preflight",
            "--gpu",
            "RTX4090",
            "--gpu_memory_gib",
            "24",
        ]
    )
    output = capsys.readouterr().out
    assert status == 1
    assert "Does NOT fit in 24 GiB. With gradient_checkpointing: true:" in output and "fits." in output


def test_sage_train_plans_a_multi_gpu_launch_from_one_cpu_process(
    tiny_wan22_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    size = [f"--{name}={value}" for name, value in TINY_VIDEO_SIZE.items()]
    common = ["--model_name_or_path", str(tiny_wan22_path), "--expert", "both", *size, "--num_inference_steps", "4"]
    common += ["--use_cpu", "true", "--output_dir", str(tmp_path / "run"), "--preflight"]
    assert train_main(common) == 0
    alone = capsys.readouterr().out
    assert train_main([*common, "--preflight_world_size", "2", "--preflight_fsdp", "true"]) == 0
    sharded = capsys.readouterr().out
    assert "(1 process)" in alone and "(2 processes, FSDP2)" in sharded


# -- the meter and the shadow values ----------------------------------------------------------------------


def test_meter_counts_live_storages_once_and_follows_frees() -> None:
    with trace_session() as meter:
        base = meter.device_bytes
        first = torch.empty(1000, 1000)  # 4 MB
        view = first[:10]  # same storage: counted once
        with meter.phase("work"):
            second = torch.empty(500, 1000)  # 2 MB
            del second
            torch.empty(250, 1000)  # 1 MB, freed at once
        assert meter.phases[-1].peak_bytes - meter.phases[-1].start_bytes == 2_000_000
        assert meter.device_bytes - base == 4_000_000 and view.shape == (10, 1000)
        meter.set_host([first])
        assert meter.device_bytes == base


def test_meter_counts_host_copies_apart_and_in_the_total() -> None:
    with trace_session() as meter:
        device = torch.empty(1000, 1000)  # 4 MB on the device
        with meter.phase("offload"):
            with meter.host_allocations():
                host = device.to("cpu", copy=True)  # a saver's copy to the host
            del device
        phase = meter.phases[-1]
        assert phase.peak_bytes == phase.start_bytes and phase.end_bytes == phase.start_bytes - 4_000_000
        assert phase.total_peak_bytes - phase.total_start_bytes == 4_000_000  # both copies alive for a moment
        assert meter.host_bytes == 4_000_000 and meter.on_host([host])
        del host
        assert meter.host_bytes == 0


def test_program_decided_values_are_known_and_activations_are_not() -> None:
    with trace_session():
        sigma = torch.tensor([0.5, 0.25])
        assert bool(torch.all((sigma >= 0) & (sigma <= 1))) and sigma.tolist() == [0.5, 0.25]
        mask = torch.zeros(1000, dtype=torch.bool)
        mask[:100] = True
        activations = torch.randn(4, 1000)
        assert activations[:, mask].shape == (4, 100)  # the data-dependent shape of a known mask
        assert bool(torch.all(torch.zeros(2, 729, 1152) == 0))  # HunyuanVideo 1.5's text-to-video test
        assert bool(torch.isfinite(activations).all())  # finiteness checks answer as for a finite run
        with pytest.raises(TraceError, match="value of a fake tensor"):
            float(activations.sum())


def test_replayed_vae_decode_equals_running_every_call(tiny_wan_path: Path) -> None:
    configs = resolve_model_configs(str(tiny_wan_path))

    def decode(replay: bool) -> tuple[int, int]:
        with trace_session() as meter:
            pipeline = build_pipeline(configs, torch.float32)
            vae = pipeline.vae
            vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64)
            vae.enable_slicing()
            latents = torch.randn(3, 4, 3, 24, 24)
            with torch.no_grad(), meter.phase("decode"):
                if replay:
                    with replay_calls(meter, vae, "_decode"), replay_calls(meter, vae.decoder, "forward"):
                        vae.decode(latents)
                else:
                    vae.decode(latents)
            phase = meter.phases[-1]
            return phase.peak_bytes - phase.start_bytes, phase.flops

    assert decode(replay=True) == decode(replay=False)


# -- configs, GPUs, world sizes -----------------------------------------------------------------------------


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
