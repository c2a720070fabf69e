"""Two CPU processes (gloo DDP through torchrun) reproduce the single-process run on the same data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("distributed_run.py")


def run(command: list[str], tmp_path: Path) -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_advantages_and_first_update_equal_single_process(tmp_path: Path) -> None:
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    run([sys.executable, str(SCRIPT), "--output", str(single)], tmp_path)
    run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(SCRIPT),
            "--output",
            str(double),
            "--world-size",
            "2",
        ],
        tmp_path,
    )
    one, two = torch.load(single), torch.load(double)
    assert one["prompts"] == two["prompts"]  # groups span both processes in the same global order
    torch.testing.assert_close(two["rewards"], one["rewards"], rtol=0, atol=1e-6)
    torch.testing.assert_close(two["advantages"], one["advantages"], rtol=0, atol=1e-5)
    assert one["lora"].keys() == two["lora"].keys()
    for name in one["lora"]:
        torch.testing.assert_close(two["lora"][name], one["lora"][name], rtol=0, atol=1e-5)
