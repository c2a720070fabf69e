"""benchmarks/gpu_memory.py: the preflight plan of training configs as tables, and its command line (no GPU here:
the measured comparison prints only on CUDA; its table is checked on a hand-made measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gpu_memory
from sage_trl.preflight import MemoryKind, PhasePlan, PreflightPlan
from sage_trl.preflight.measure import MeasuredPhase

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
        MeasuredPhase(p.name, p.peak_bytes - p.start_bytes, p.start_bytes, 2 * p.peak_bytes, 1.0)
        for p in phases
    ]
    table = gpu_memory.comparison_table(plan, measured)
    assert "| rollout step | 1.0 | 1.0 | 3.0 | 6.0 | 0.500 |" in table and table.count("| 0.500 |") == 2


@pytest.mark.slow
def test_command_line_writes_the_report(tmp_path: Path) -> None:
    output = tmp_path / "memory.md"
    plans = gpu_memory.main(
        ["--config", str(gpu_memory.EXAMPLE_CONFIGS[1]), "--output", str(output), *SMALL_VIDEO]
    )
    report = output.read_text()
    assert len(plans) == 1 and "# Preflight of the example configs" in report
    assert "| rollout step |" in report and plans[0].setting.endswith("micro-batch 1")
