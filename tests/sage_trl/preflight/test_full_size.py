"""sage_trl.preflight at full size: the plans of the example configs back their claims, a config that does not
fit is reported with the savers that make it fit, and ``sage-train`` plans a multi-GPU launch from one CPU
process."""

from __future__ import annotations

from pathlib import Path

import pytest

from sage_trl.cli import train_main
from sage_trl.preflight import plan_training
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE
from tests.sage_trl.preflight.tiny_plans import CONFIGS, GIB, example


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
