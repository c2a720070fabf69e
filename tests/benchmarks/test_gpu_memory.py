"""benchmarks/gpu_memory.py: the preflight plan of training configs as tables, and its command line (no GPU here:
the measured comparison prints only on CUDA; its table is checked on a hand-made measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gpu_memory
from sage_trl.preflight import MemoryKind, PhasePlan, PreflightPlan
from sage_trl.preflight.measure import EXPERT_SWAP_PHASE, MeasuredPhase
from tests.fixtures.tiny_configs import CPU_OVERRIDES, tiny_substitutions

GIB = 2**30
SMALL_VIDEO = ["--num_frames=5", "--height=64", "--width=64"]
"""The Wan example config's full-size model on a small video: a plan in seconds."""


@pytest.fixture(scope="module")
def small_plan():
    return gpu_memory.plan_config(gpu_memory.EXAMPLE_CONFIGS[1], SMALL_VIDEO, gpu="H100")


def test_example_configs_exist_and_parse() -> None:
    for path in gpu_memory.EXAMPLE_CONFIGS:
        script_args, config = gpu_memory.parse_config(path)
        assert script_args.use_peft and config.diffusers_gradient_checkpointing


@pytest.mark.slow
def test_tables_show_every_kind_and_phase(small_plan) -> None:
    resident = gpu_memory.resident_table([small_plan])
    assert "| transformer weights | 2.6 |" in resident and "(host)" in resident  # offloaded text encoders
    phases = gpu_memory.phase_table([small_plan])
    for phase in small_plan.phases:
        assert f"| Wan2.1-T2V-1.3B-Diffusers | {phase.name} |" in phases
    assert "**peak + margins**" in phases and " s |" in phases  # times at H100 throughput


def test_comparison_table_puts_traced_beside_measured() -> None:
    phases = [
        PhasePlan("rollout step", GIB, 3 * GIB, 0, 1, True),
        PhasePlan("decode", GIB, 2 * GIB, 0, 1, False),
    ]
    plan = PreflightPlan("m", "tests", "LoRA", [MemoryKind("VAE", GIB)], phases, largest_block_bytes=0)
    measured = [
        MeasuredPhase(p.name, p.peak_bytes - p.start_bytes, p.start_bytes, 2 * p.peak_bytes, 1.5, 3 * p.peak_bytes)
        for p in phases
    ]
    table = gpu_memory.comparison_table(plan, measured, device_used_bytes=20 * GIB)
    assert "| rollout step | 1.0 | 1.0 | 3.0 | 6.0 | 0.500 | 9.0 | - | 1.5 |" in table
    assert table.count("| 0.500 |") == 2
    # The whole step: the plan's peak (3 GiB) + 10% + 1 GiB beside the driver's count.
    assert "| **4.3** | **20.0** |" in table
    swap = MeasuredPhase("expert swap to transformer_2", 0, 4 * GIB, 4 * GIB, 2.5, 5 * GIB)
    swapped = gpu_memory.comparison_table(plan, [*measured, swap])
    assert swapped.splitlines()[-1] == "| expert swap to transformer_2 | - | 4.0 | - | 4.0 | - | 5.0 | - | 2.5 |"


def test_measure_only_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="--measure_only measures on a CUDA GPU"):
        gpu_memory.main(["--measure_only"])


def test_measured_file_from_another_machine_is_compared_with_a_fresh_plan(tmp_path: Path) -> None:
    config = gpu_memory.EXAMPLE_CONFIGS[1]
    phase = {"transient_bytes": GIB, "start_bytes": GIB, "peak_bytes": 2 * GIB, "seconds": 0.5, "reserved_bytes": 3 * GIB}
    record = {
        "config": config.name, "overrides": SMALL_VIDEO, "weights": "random", "device": "NVIDIA H200",
        "torch": "2.11.0", "date": "2026-11-26", "device_used_bytes": 4 * GIB,
        "phases": [{"name": name, **phase} for name in ("encode prompts", "rollout step")],
    }
    parts = gpu_memory.compare_measured([record], [config], gpu="H200")
    assert parts[0] == f"## {config.name}: traced vs measured on NVIDIA H200"
    assert "random weights, torch 2.11.0, 2026-11-26, overrides --num_frames=5" in parts[1]
    assert "| encode prompts |" in parts[2] and "| 2.0 | " in parts[2] and "**4.0**" in parts[2]
    with pytest.raises(ValueError, match="pass its path with --config"):
        gpu_memory.compare_measured([record], [gpu_memory.EXAMPLE_CONFIGS[0]], gpu=None)


@pytest.mark.slow
def test_command_line_writes_the_report(tmp_path: Path) -> None:
    output = tmp_path / "memory.md"
    plans = gpu_memory.main(
        ["--config", str(gpu_memory.EXAMPLE_CONFIGS[1]), "--output", str(output), *SMALL_VIDEO]
    )
    report = output.read_text()
    assert len(plans) == 1 and "# Preflight of the example configs" in report
    assert "| rollout step |" in report and plans[0].setting.endswith("micro-batch 1")


@pytest.mark.parametrize("weights", ["random", "pretrained"])
def test_the_measured_backbone_has_the_configs_expert_options(
    weights: str, tiny_wan22_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Wan 2.2 A14B config (both experts trained, the idle one swapped) is measured so, as the trainer loads it:
    the benchmark once measured the backbone's defaults (one expert trained, both on the device). Here on its tiny
    pipeline, on CPU: random weights are made on the host instead of the GPU; "pretrained" loads the tiny
    pipeline's saved folder."""
    config = gpu_memory.EXAMPLE_CONFIGS[0].parent / "wan22_a14b_lora_1gpu_80gb.yaml"
    overrides = [*CPU_OVERRIDES, *tiny_substitutions(config, tmp_path / "run", {"wan22": tiny_wan22_path})]
    monkeypatch.setattr(gpu_memory, "_device_of", lambda config: lambda name: "cpu")
    phases = gpu_memory.measure_config(config, overrides, weights=weights)
    assert [phase.name for phase in phases][-2:] == [
        f"{EXPERT_SWAP_PHASE} to transformer_2",
        f"{EXPERT_SWAP_PHASE} to transformer",
    ]
