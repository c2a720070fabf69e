"""Memory: LoRA with the adapter-snapshot anchor vs full fine-tuning with a copied anchor.

Each configuration runs in its own subprocess (``python -m benchmarks.memory --child ...``) so every peak is
clean. A child builds a toy backbone (a random-init ``large`` toy transformer, ~25M parameters, so that
parameter state is not lost in the interpreter's own footprint), makes a SAGE-GRPO agent with the dual KL
(`agents.algorithm.PolicyGradientAlgorithm.build_references`: an adapter snapshot for LoRA, a copy of every
weight for full fine-tuning), rolls out the toy env and takes two optimizer steps (the second with Adam's
state resident). Peaks are the kernel's ``VmHWM`` from ``/proc/self/status``, reset per phase through
``/proc/self/clear_refs``; "above imports" subtracts the RSS the process had before the model was built.

The section also shows the full-size plan of the example configs (HunyuanVideo 1.5 480p and Wan 2.1 1.3B) that
``sage_trl.preflight`` traces (``python -m benchmarks.gpu_memory``, which also measures it on a GPU): the same
table as ``docs/training_on_gpus.md``. ``--quick`` traces the Wan config at a small video size instead.

Run: ``python -m benchmarks.memory [--quick] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import reporting

NAME = "memory"
ETA = 0.7
MIB = 2**20


@dataclass(frozen=True)
class MemoryCase:
    """One child process: how the backbone is trained and the size of the work."""

    label: str
    mode: str  # "lora" or "full"
    kl_strategy: str
    backbone: str = "large"
    num_frames: int = 4
    height: int = 8
    width: int = 8
    num_videos: int = 4
    num_steps: int = 4
    sde_steps: int = 2
    lora_rank: int = 8

    @property
    def micro_batch(self) -> int:
        """(video, step) pairs per forward: all trained pairs in one micro-batch."""
        return self.num_videos * self.sde_steps


COMPARISON = (
    MemoryCase("LoRA r8 + dual KL (anchor = adapter snapshot)", "lora", "dual"),
    MemoryCase("full fine-tuning + dual KL (anchor = full copy)", "full", "dual"),
    MemoryCase("full fine-tuning, no KL (no anchor)", "full", "none"),
)


# ----------------------------------------------------------------------------------------------
# Child process
# ----------------------------------------------------------------------------------------------


def _status_kib(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field_name}; peak RSS needs Linux.")
    return int(match.group(1))


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def rss_bytes() -> int:
    """Current resident set size."""
    return _status_kib("VmRSS") * 1024


def peak_bytes() -> int:
    """Peak resident set size since the last `reset_peak`."""
    return _status_kib("VmHWM") * 1024


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def run_child(case: MemoryCase, seed: int) -> dict[str, Any]:
    """Build, roll out and train one configuration; return its memory measurements."""
    import agents
    import sage_trl.lora  # noqa: F401  (imported before the baseline: LoRA and full runs load the same modules)
    from benchmarks import workloads
    from sage_env.toy.env import make_toy_vector_env

    baseline = rss_bytes()
    backbone = workloads.toy_backbone(case.backbone, seed)
    if case.mode == "lora":
        workloads.add_lora_adapter(backbone, rank=case.lora_rank, alpha=2 * case.lora_rank)
    env = make_toy_vector_env(
        num_envs=case.num_videos, group_size=case.num_videos // 2, backbone=backbone, reward_fn=workloads.brightness,
        num_frames=case.num_frames,
        height=case.height, width=case.width, num_steps=case.num_steps, sde_window=(0, case.sde_steps), eta=ETA,
    )  # fmt: skip
    agent = agents.make(
        "sage_grpo", policy=backbone, eta=ETA, kl_strategy=case.kl_strategy, learning_rate=1e-4,
        micro_batch_size=case.micro_batch,
    )  # fmt: skip
    setup = rss_bytes()
    reset_peak()
    trajectory = workloads.agent_rollout(env, agent, seed=seed)
    rollout_peak = peak_bytes()
    reset_peak()
    for _ in range(2):
        agent.update(trajectory)
    train_peak = peak_bytes()
    anchor = agent.references.anchor
    return {
        "baseline": baseline,
        "setup": setup,
        "rollout_peak": rollout_peak,
        "train_peak": train_peak,
        "total_parameters": workloads.count_parameters(backbone.transformer),
        "trainable_parameters": workloads.count_parameters(backbone.transformer, trainable_only=True),
        "anchor_bytes": anchor.num_bytes() if anchor is not None else 0,
        "optimizer_bytes": _tensor_bytes(
            v for state in agent.optimizer.state.values() for v in state.values()
        ),
    }


def launch_child(case: MemoryCase, seed: int, threads: int) -> dict[str, Any]:
    """Run `run_child` in a fresh interpreter and return its measurements."""
    command = [sys.executable, "-m", "benchmarks.memory", "--child", json.dumps(asdict(case)), "--seed", str(seed),
               "--threads", str(threads)]  # fmt: skip
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"Memory child {case.label!r} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def comparison_table(results: Sequence[tuple[MemoryCase, dict]]) -> str:
    """Measured peaks (MiB) and parameter/anchor ratios against the LoRA run."""
    lora = results[0][1]
    rows = []
    for case, measured in results:
        above = measured["train_peak"] - measured["baseline"]
        rows.append(
            [
                case.label,
                f"{measured['trainable_parameters'] / 1e6:.3f} M",
                f"{measured['anchor_bytes'] / MIB:.2f}",
                f"{measured['optimizer_bytes'] / MIB:.2f}",
                f"{measured['rollout_peak'] / MIB:.0f}",
                f"{measured['train_peak'] / MIB:.0f}",
                f"{above / MIB:.0f}",
                f"{above / (lora['train_peak'] - lora['baseline']):.2f}x",
            ]
        )
    header = ["configuration", "trainable params", "anchor MiB", "AdamW state MiB", "rollout peak RSS MiB",
              "training peak RSS MiB", "training peak above imports MiB", "vs LoRA"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def ratio_lines(results: Sequence[tuple[MemoryCase, dict]]) -> str:
    """Trainable-parameter and anchor-size ratios full / LoRA."""
    lora, full = results[0][1], results[1][1]
    parameters = full["trainable_parameters"] / lora["trainable_parameters"]
    anchor = full["anchor_bytes"] / max(lora["anchor_bytes"], 1)
    total = lora["total_parameters"]
    return (
        f"Transformer: {total / 1e6:.1f} M parameters. Full fine-tuning trains {parameters:.0f}x more parameters "
        f"than LoRA r8 ({lora['trainable_parameters'] / total:.2%} of the model) and its anchor is {anchor:.0f}x "
        f"larger ({full['anchor_bytes'] / MIB:.1f} MiB vs {lora['anchor_bytes'] / MIB:.2f} MiB)."
    )


def preflight_tables(quick: bool) -> str:
    """The traced full-size plan of the example configs (`benchmarks.gpu_memory`); a small video with ``quick``."""
    from benchmarks import gpu_memory

    if quick:
        overrides = ["--num_frames=5", "--height=64", "--width=64"]
        plans = [gpu_memory.plan_config(gpu_memory.EXAMPLE_CONFIGS[1], overrides, gpu="H100")]
    else:
        plans = [gpu_memory.plan_config(path, gpu="H100") for path in gpu_memory.EXAMPLE_CONFIGS]
    return f"{gpu_memory.resident_table(plans)}\n\n{gpu_memory.phase_table(plans)}"


def report(context: reporting.BenchmarkContext, results: list, preflight: str) -> str:
    """The markdown section."""
    case = results[0][0]
    return f"""## 3. Memory: LoRA + adapter-snapshot anchor vs full fine-tuning + copied anchor

{context.provenance()}

Measured (one subprocess per row, `VmHWM` of `/proc/self/status` reset per phase): a random-init toy
transformer (`{case.backbone}`), {case.num_videos} videos of {case.num_frames} x {case.height} x {case.width},
{case.num_steps} steps ({case.sde_steps} with the SAGE SDE), two SAGE-GRPO optimizer steps (AdamW). "Above
imports" subtracts the RSS of the interpreter with torch/diffusers/transformers loaded.

{comparison_table(results)}

{ratio_lines(results)}

**Full size, traced (not measured on a GPU):** the example configs' plan from `sage_trl.preflight`
(`sage-train --config <config> --preflight`; `python -m benchmarks.gpu_memory` prints the same and, on a GPU,
the measured peaks beside it). The model is built at full size under fake tensors from its published
configuration, and the trainer's own code is traced for one rollout round and one training step: peaks are what
`torch.cuda.max_memory_allocated` would report, before the margins of `sage_trl.preflight.LIMITS` (CUDA context,
allocator fragmentation, kernel workspaces). Times per run at an H100's dense bf16 throughput and 40%
utilisation (an assumption). Details and savers: `docs/training_on_gpus.md`.

{preflight}
"""


def measure_all(context: reporting.BenchmarkContext, threads: int) -> list:
    """Run every child process of the comparison."""
    seed = context.arguments.seed
    if context.quick:
        base = {"backbone": "wide", "num_videos": 4, "num_steps": 2, "sde_steps": 1}
        comparison = [MemoryCase(c.label, c.mode, c.kl_strategy, **base) for c in COMPARISON[:2]]
    else:
        comparison = list(COMPARISON)
    return [(case, launch_child(case, seed, threads)) for case in comparison]


def main(argv: Sequence[str] | None = None) -> list | None:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    if "--child" in (sys.argv[1:] if argv is None else list(argv)):
        arguments = parser.parse_args(argv)
        if arguments.threads is not None:
            torch.set_num_threads(arguments.threads)
        print(json.dumps(run_child(MemoryCase(**json.loads(arguments.child)), arguments.seed)))
        return None
    context = reporting.start_benchmark(NAME, parser, argv, default_threads=1)
    results = measure_all(context, torch.get_num_threads())
    preflight = preflight_tables(context.quick)
    print(comparison_table(results))
    print(ratio_lines(results))
    print(preflight)
    reporting.write_section(context.output, NAME, report(context, results, preflight))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
