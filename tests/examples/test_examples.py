"""The example scripts run end to end as a user runs them (tiny step budgets)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *arguments: str) -> str:
    environment = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *arguments], capture_output=True, text=True,
                            timeout=600, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dance_grpo", "reinforce", "mix_grpo", "diffusion_nft"])
def test_swap_algorithms_runs_with_any_registered_agent(algorithm: str) -> None:
    output = run_example("swap_algorithms.py", "--algorithm", algorithm, "--iterations", "2",
                         "--prompts-per-batch", "2", "--group-size", "2")
    lines = [line for line in output.splitlines() if line.startswith("iteration")]
    assert len(lines) == 2 and all("reward/total=" in line and "time/iteration=" in line for line in lines)


def test_custom_agent_registers_and_trains() -> None:
    output = run_example("custom_agent.py", "--iterations", "2", "--prompts-per-batch", "2", "--group-size", "2")
    assert sum(line.startswith("iteration") for line in output.splitlines()) == 2
