"""Memory: LoRA with the adapter-snapshot anchor vs full fine-tuning with a copied anchor.

Each configuration runs in its own subprocess (``python -m benchmarks.memory --child ...``) so every peak is
clean. A child builds a toy backbone (a random-init ``large`` toy transformer, ~25M parameters, so that
parameter state is not lost in the interpreter's own footprint), makes a SAGE-GRPO agent with the dual KL
(`agents.algorithm.PolicyGradientAlgorithm.build_references`: an adapter snapshot for LoRA, a copy of every
weight for full fine-tuning), rolls out the toy env and takes two optimizer steps (the second with Adam's
state resident). Peaks are the kernel's ``VmHWM`` from ``/proc/self/status``, reset per phase through
``/proc/self/clear_refs``; "above imports" subtracts the RSS the process had before the model was built.

The second part is a projection, not a measurement: peak GPU memory of HunyuanVideo 1.5 (8.3B) training, LoRA
vs full fine-tuning, from its parameter count (weights, gradients, AdamW states, the dual-KL anchor) plus the
activation memory per (token x layer x channel) measured here on the toy transformer (with and without
gradient checkpointing) and scaled to HunyuanVideo 1.5's shapes. ``python -m benchmarks.gpu_memory`` measures
the real-size model on a GPU and projects from scaled-down real architectures; see its section of
``docs/training_on_gpus.md``.

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

from benchmarks import reporting, timing

NAME = "memory"
ETA = 0.7
MIB = 2**20
GIB = 2**30


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
    gradient_checkpointing: bool = False
    lora_rank: int = 8

    @property
    def tokens_per_video(self) -> int:
        """Transformer tokens of one video (patch 1 x 2 x 2)."""
        return self.num_frames * (self.height // 2) * (self.width // 2)

    @property
    def micro_batch(self) -> int:
        """(video, step) pairs per forward: all trained pairs in one micro-batch."""
        return self.num_videos * self.sde_steps


COMPARISON = (
    MemoryCase("LoRA r8 + dual KL (anchor = adapter snapshot)", "lora", "dual"),
    MemoryCase("full fine-tuning + dual KL (anchor = full copy)", "full", "dual"),
    MemoryCase("full fine-tuning, no KL (no anchor)", "full", "none"),
)
ACTIVATION_SIZES = ((8, 8), (16, 16), (24, 24))
"""(height, width) of the LoRA runs that measure activation memory against tokens (4 frames)."""
ACTIVATION_BACKBONE = "wide"
"""The toy transformer of the activation runs (a cheaper forward than ``large``; the same layer layout)."""


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
    if case.gradient_checkpointing:
        backbone.transformer.enable_gradient_checkpointing()
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
# Activation scaling and the HunyuanVideo 1.5 projection
# ----------------------------------------------------------------------------------------------


@dataclass
class ActivationFit:
    """Training-phase activation bytes per token and channel, fitted on the toy transformer.

    ``points`` are ``(tokens in the micro-batch, bytes without checkpointing, bytes with)``; the bytes are the
    training-phase peak above the set-up RSS, and the slope of a line through them (the intercept holds what
    does not grow with tokens: gradients, AdamW state, allocator slack) is the activation cost.

    Without checkpointing every layer keeps its activations: ``slope = layer_bytes * layers * width``. With
    gradient checkpointing every layer keeps only its input and one layer's activations live at a time during
    the recomputation: ``slope = (input_bytes * layers + layer_bytes) * width``.

    Args:
        layer_bytes: bytes per (token x channel) one layer keeps for backward (fp32).
        input_bytes: bytes per (token x channel) a checkpointed layer keeps (its input).
        points: the measurements.
    """

    layer_bytes: float
    input_bytes: float
    points: list[tuple[int, float, float]]

    def activation_bytes(self, tokens: int, layers: int, width: int, checkpointing: bool) -> float:
        """Projected fp32 activation bytes of a training forward over ``tokens`` tokens."""
        per_channel = (
            self.input_bytes * layers + self.layer_bytes if checkpointing else self.layer_bytes * layers
        )
        return per_channel * tokens * width


def fit_activations(
    measured: Sequence[tuple[MemoryCase, dict, dict]], layers: int, width: int
) -> ActivationFit:
    """Slopes of the training-phase peak above set-up against the micro-batch's tokens (see `ActivationFit`)."""
    points = []
    for case, plain, checkpointed in measured:
        tokens = case.micro_batch * case.tokens_per_video
        points.append(
            (tokens, plain["train_peak"] - plain["setup"], checkpointed["train_peak"] - checkpointed["setup"])
        )
    tokens = [p[0] for p in points]
    plain_slope, _ = timing.fit_line(tokens, [p[1] for p in points])
    checkpointed_slope, _ = timing.fit_line(tokens, [p[2] for p in points])
    layer_bytes = plain_slope / (layers * width)
    input_bytes = max(checkpointed_slope / width - layer_bytes, 0.0) / layers
    return ActivationFit(layer_bytes, input_bytes, points)


def hunyuan_projection(fit: ActivationFit, lora_rank: int = 32) -> list[list[Any]]:
    """Rows of the projected peak GPU memory of HunyuanVideo 1.5 training (GiB), LoRA vs full fine-tuning."""
    from benchmarks.gpu_memory import HUNYUAN_VIDEO_15, parameter_counts

    spec = HUNYUAN_VIDEO_15
    counts = parameter_counts(spec, lora_rank)
    total, lora = counts["total"], counts["lora"]
    # CFG (guidance 6): the training forward runs the conditional and unconditional branch as a batch of 2.
    tokens = 2 * spec.attended_tokens
    bf16 = 0.5  # activations measured in fp32 on the CPU; bf16 autocast on the GPU halves them
    activations = {
        name: fit.activation_bytes(tokens, spec.num_layers, spec.width, checkpointing) * bf16
        for name, checkpointing in (("no checkpointing", False), ("gradient checkpointing", True))
    }
    settings = {
        # (static bytes, description)
        "LoRA r32, bf16 base": (2 * total + 20 * lora, "bf16 weights 2P; LoRA fp32 weights, grads, AdamW, anchor 20L"),
        "full FT, fp32 master + bf16 autocast": (22 * total, "weights 4P, grads 4P, AdamW 8P, anchor 4P, bf16 copy 2P"),
        "full FT, anchor offloaded to CPU": (18 * total, "as above without the 4P anchor on the GPU"),
    }  # fmt: skip
    rows = []
    for name, (static, description) in settings.items():
        for activation_name, activation in activations.items():
            rows.append(
                [
                    name,
                    activation_name,
                    description,
                    static / GIB,
                    activation / GIB,
                    (static + activation) / GIB,
                ]
            )
    return rows


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


def activation_table(fit: ActivationFit) -> str:
    """The measured activation points."""
    rows = [[tokens, plain / MIB, checkpointed / MIB] for tokens, plain, checkpointed in fit.points]
    header = ["tokens per micro-batch", "training peak above setup, MiB", "with gradient checkpointing, MiB"]
    return reporting.markdown_table(header, rows, digits=1)


def projection_table(rows: Sequence[Sequence[Any]]) -> str:
    """Markdown of `hunyuan_projection`."""
    header = ["setting", "activations", "static state", "static GiB", "activations GiB", "projected peak GiB"]
    return reporting.markdown_table(header, rows, digits=1)


def report(context: reporting.BenchmarkContext, results: list, fit: ActivationFit, projection: list) -> str:
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

Activation memory of the training phase (LoRA runs, 4 frames, growing resolution; peak above the set-up RSS).
The slope of a line through these points is the activation cost of a fp32 training step (anchor forward,
policy forward with its graph, backward): each layer keeps {fit.layer_bytes:.0f} bytes per (token x channel)
without checkpointing; with gradient checkpointing a layer keeps {fit.input_bytes:.1f} bytes per (token x
channel) plus one layer's activations during recomputation (see `ActivationFit`).

{activation_table(fit)}

**Projection (not a measurement): peak GPU memory of HunyuanVideo 1.5 480p T2V (8.3B) training**, one (video,
step) pair per micro-batch at 81 x 480 x 848 (33,390 video + 1,985 text/image tokens, CFG doubling the
forward batch), activations = the toy's bytes per (token x layer x channel) above, halved for bf16, times
HunyuanVideo 1.5's tokens x 54 layers x 2048 channels. Static state from the parameter count
(`benchmarks.gpu_memory.parameter_counts`: P parameters, L LoRA parameters). The toy's activation layout is
only a proxy for HunyuanVideo's (its dense text-attention mask, refiner and fused kernels differ); use
`python -m benchmarks.gpu_memory` on a GPU for measured numbers.

{projection_table(projection)}
"""


def measure_all(context: reporting.BenchmarkContext, threads: int) -> tuple[list, ActivationFit]:
    """Run every child process: the comparison rows and the activation-scaling runs."""
    seed = context.arguments.seed
    base = {"backbone": ACTIVATION_BACKBONE}
    if context.quick:
        base = {"backbone": "wide", "num_videos": 4, "num_steps": 2, "sde_steps": 1}
        comparison = [MemoryCase(c.label, c.mode, c.kl_strategy, **base) for c in COMPARISON[:2]]
        sizes = ((8, 8), (12, 12))
    else:
        comparison, sizes = list(COMPARISON), ACTIVATION_SIZES
    results = [(case, launch_child(case, seed, threads)) for case in comparison]
    measured = []
    for height, width in sizes:
        plain = MemoryCase("activations", "lora", "dual", height=height, width=width, **base)
        checkpointed = MemoryCase("activations", "lora", "dual", height=height, width=width,
                                  gradient_checkpointing=True, **base)  # fmt: skip
        plain_result = launch_child(plain, seed, threads)
        # The smoke run skips the checkpointed processes (each costs an interpreter start).
        checkpointed_result = plain_result if context.quick else launch_child(checkpointed, seed, threads)
        measured.append((plain, plain_result, checkpointed_result))
    from benchmarks.workloads import TOY_SIZES

    size = TOY_SIZES[base["backbone"]]
    return results, fit_activations(measured, size.num_layers, size.num_heads * size.head_dim)


def main(argv: Sequence[str] | None = None) -> tuple[list, ActivationFit] | None:
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
    results, fit = measure_all(context, torch.get_num_threads())
    projection = hunyuan_projection(fit)
    print(comparison_table(results))
    print(ratio_lines(results))
    print(activation_table(fit))
    print(projection_table(projection))
    reporting.write_section(context.output, NAME, report(context, results, fit, projection))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results, fit


if __name__ == "__main__":
    main()
