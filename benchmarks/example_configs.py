"""The 1-GPU example configs train through ``sage-train`` on this machine's device: each config as the user launches
it (``sage-train --config examples/configs/<name>.yaml``), with its precision, batch, KL, equalizer and memory
savers, on the tiny random pipeline with its model's layout (nothing is downloaded), a stand-in for VideoAlign
with its three components, the tiny video size and a few optimizer steps.

It checks the training loop end to end on a GPU (bf16 weights and autocast, the savers' device moves, the
offloads, LoRA saving) where the tests can only run it on a CPU in float32. It does not measure full-size memory
or speed (``benchmarks.gpu_memory`` does). Without CUDA the configs run on the CPU in float32, as the tests run them.

Run::

    python -m benchmarks.example_configs                           # every 1-GPU config, 2 optimizer steps each
    python -m benchmarks.example_configs --max_steps 4 --output report.md

Per config the table gives ``sage-train``'s exit status, the optimizer steps logged, the last logged loss and
reward, whether every logged loss and gradient norm is finite, whether the adapter was saved, and the wall time
(process start, pipeline load and the steps).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import reporting
from sage_trl.lora import LORA_WEIGHT_NAME
from sage_trl.run_folder import RunFolder
from tests.fixtures.tiny_configs import (
    CPU_OVERRIDES,
    PROMPTS,
    save_tiny_pipelines,
    tiny_model_kind,
    tiny_substitutions,
)

NAME = "example_configs"
REPOSITORY = Path(__file__).resolve().parents[1]
ONE_GPU_CONFIGS = tuple(sorted((REPOSITORY / "examples" / "configs").glob("*_1gpu*.yaml")))
"""The example configs written for one GPU (launched without accelerate)."""
QUICK_CONFIG = REPOSITORY / "examples" / "configs" / "wan21_1.3b_lora_1gpu_16gb.yaml"
"""The ``--quick`` run's config: the fastest on a CPU (tiny Wan) with the most savers (sequential CFG)."""


@dataclass
class ConfigRun:
    """The outcome of one config's ``sage-train`` run."""

    config: str
    model: str
    exit_code: int
    steps: int
    loss: float
    reward: float
    finite: bool
    adapter_saved: bool
    seconds: float
    error: str


def sage_train_command() -> str:
    """The installed ``sage-train`` entry point (the command a user types)."""
    command = shutil.which("sage-train")
    if command is None:
        raise SystemExit("sage-train is not on PATH: install the package first (pip install -e .).")
    return command


def run_config(path: Path, pipelines: dict[str, Path], prompts: Path, work: Path, max_steps: int) -> ConfigRun:
    """Train ``path`` for ``max_steps`` through the ``sage-train`` entry point (prompts from the file ``prompts``)
    and read its run folder."""
    output_dir = work / path.stem
    overrides = [
        *tiny_substitutions(path, output_dir, pipelines),
        f"--dataset_name={prompts}",
        f"--max_steps={max_steps}",
        "--num_inference_steps=4",
        "--save_strategy=no",
        "--disable_tqdm=true",
        "--report_to=none",
        *(() if torch.cuda.is_available() else CPU_OVERRIDES),
    ]
    # The stand-in reward is imported by sage-train from the repository's tests package.
    python_path = [str(REPOSITORY), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    started = time.perf_counter()
    result = subprocess.run(
        [sage_train_command(), "--config", str(path), *overrides],
        capture_output=True,
        text=True,
        env=environment,
        cwd=work,
    )
    seconds = time.perf_counter() - started
    records = [record for record in RunFolder(output_dir).read_metrics() if "loss" in record]  # evaluations log none
    last = records[-1] if records else {}
    values = [record[key] for record in records for key in ("loss", "grad_norm") if key in record]
    error = "" if result.returncode == 0 else (result.stderr.strip().splitlines() or [""])[-1][:300]
    return ConfigRun(
        config=path.stem,
        model=tiny_model_kind(path),
        exit_code=result.returncode,
        steps=len(records),
        loss=float(last.get("loss", math.nan)),
        reward=float(last.get("reward/total", math.nan)),
        finite=bool(values) and all(math.isfinite(value) for value in values),
        adapter_saved=any(output_dir.rglob(LORA_WEIGHT_NAME)),
        seconds=seconds,
        error=error,
    )


def device_line() -> str:
    """The device the runs used, in words."""
    if not torch.cuda.is_available():
        return "CPU (no CUDA device: the configs ran in float32 with --use_cpu)"
    properties = torch.cuda.get_device_properties(0)
    return f"{properties.name} ({properties.total_memory // 2**20:,} MiB), torch {torch.__version__}"


def report(context: reporting.BenchmarkContext, runs: Sequence[ConfigRun], max_steps: int) -> str:
    """The markdown section."""
    header = ["config", "tiny model", "exit", "steps", "last loss", "last reward", "finite", "adapter", "wall s"]
    rows = [
        [r.config, r.model, r.exit_code, r.steps, r.loss, r.reward, r.finite, r.adapter_saved, r.seconds]
        for r in runs
    ]
    failures = "\n".join(f"* `{r.config}`: {r.error}" for r in runs if r.exit_code != 0)
    return f"""## 11. The 1-GPU example configs through `sage-train` on the tiny pipelines

{context.provenance()} Device: {device_line()}.

Each config as launched by `sage-train --config`, with its own precision and memory savers, on the tiny random
pipeline of its model, {max_steps} optimizer step(s) of 4 denoising steps at the tiny video size, a stand-in
reward with VideoAlign's three components. This checks the loop end to end on the device, not full-size memory.

{reporting.markdown_table(header, rows, digits=4)}
{failures}
"""


def main(argv: Sequence[str] | None = None) -> list[ConfigRun]:
    """Run every 1-GPU config (``--quick``: `QUICK_CONFIG`, one step), print the table, write the section."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--max_steps", type=int, default=2, help="optimizer steps per config")
    parser.add_argument("--configs", nargs="*", type=Path, default=None, help="config files (default: 1-GPU ones)")
    context = reporting.start_benchmark(NAME, parser, argv)
    max_steps = 1 if context.quick else context.arguments.max_steps
    configs = context.arguments.configs or ([QUICK_CONFIG] if context.quick else ONE_GPU_CONFIGS)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        pipelines = save_tiny_pipelines(work / "pipelines")
        prompts = work / "prompts.txt"
        prompts.write_text("\n".join(PROMPTS) + "\n")
        runs = []
        for path in configs:
            runs.append(run_config(Path(path).resolve(), pipelines, prompts, work, max_steps))
            print(runs[-1], flush=True)
    body = report(context, runs, max_steps)
    print(body)
    reporting.write_section(context.output, NAME, body)
    return runs


if __name__ == "__main__":
    main()
