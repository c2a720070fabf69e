"""Scaling: rollout and training time as frames, resolution, group size and denoising steps grow.

One axis changes at a time from a base configuration (the toy world: 8 frames of 16 x 16 pixels, 2 prompts x
G = 4 videos, 10 steps with the SAGE SDE on the first half, LoRA r8 on the toy prior). A rollout is one
episode of ``DenoisingVectorEnv`` driven by ``agents.make("sage_grpo").act``; a training step is
``AlgorithmAgent.update`` (one optimizer step over every (video, SDE step) pair, micro-batches of 16).
The reward is the videos' mean brightness (its cost is negligible and every group has a learning signal).

For each axis the script fits ``time = c * size ** k`` (log-log least squares) over all points and reports the
local exponent between the two largest sizes: ``k = 1`` is linear, ``k > 1`` super-linear (attention's
quadratic term in tokens), ``k < 1`` sub-linear (fixed per-call costs still matter).

Run: ``python -m benchmarks.scaling [--quick] [--repeats 3] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import agents
from benchmarks import reporting, timing, workloads
from sage_env.toy.env import make_toy_vector_env

NAME = "scaling"
ETA = 0.7
MICRO_BATCH = 16


@dataclass(frozen=True)
class ScalingPoint:
    """One configuration of the sweep."""

    num_frames: int = 8
    resolution: int = 16
    group_size: int = 4
    num_steps: int = 10
    num_prompts: int = 2

    @property
    def tokens_per_video(self) -> int:
        """Transformer tokens of one video (patch 1 x 2 x 2)."""
        return self.num_frames * (self.resolution // 2) ** 2

    @property
    def num_videos(self) -> int:
        """Videos per rollout."""
        return self.num_prompts * self.group_size


AXES: dict[str, tuple[str, Sequence[int]]] = {
    "frames": ("num_frames", (4, 8, 16, 32)),
    "resolution": ("resolution", (16, 24, 32, 48)),
    "group size": ("group_size", (2, 4, 8, 16)),
    "denoising steps": ("num_steps", (5, 10, 20, 40)),
}
"""Axis name -> (the `ScalingPoint` field it varies, its values)."""
QUICK_AXES: dict[str, tuple[str, Sequence[int]]] = {
    "frames": ("num_frames", (4, 8)),
    "group size": ("group_size", (2, 4)),
}
QUICK_BASE = ScalingPoint(num_frames=4, group_size=2, num_steps=2, num_prompts=1)


@dataclass
class ScalingResult:
    """Median seconds of a rollout and of a training step at one point."""

    axis: str
    point: ScalingPoint
    value: int
    size: int
    rollout_seconds: float
    train_seconds: float


def axis_size(axis: str, point: ScalingPoint) -> int:
    """What time is plotted against: tokens per video for frames/resolution, videos, or steps."""
    if axis in ("frames", "resolution"):
        return point.tokens_per_video
    if axis == "group size":
        return point.num_videos
    return point.num_steps


def measure_point(axis: str, value: int, point: ScalingPoint, repeats: int, seed: int) -> ScalingResult:
    """Median rollout and training-step time of one configuration (one warm-up each)."""
    backbone = workloads.toy_backbone("prior", seed)
    workloads.add_lora_adapter(backbone)
    env = make_toy_vector_env(
        num_envs=point.num_videos, group_size=point.group_size, backbone=backbone, reward_fn=workloads.brightness,
        num_frames=point.num_frames, height=point.resolution, width=point.resolution, num_steps=point.num_steps,
        sde_window=(0, max(point.num_steps // 2, 1)), eta=ETA,
    )  # fmt: skip
    agent = agents.make(
        "sage_grpo", policy=backbone, eta=ETA, micro_batch_size=MICRO_BATCH, learning_rate=1e-4
    )
    trajectory = workloads.agent_rollout(env, agent, seed=seed)
    times = timing.interleaved_times(
        {
            "rollout": lambda: workloads.agent_rollout(env, agent, seed=seed),
            "train": lambda: agent.update(trajectory),
        },
        repeats,
        warmup=1,
    )
    return ScalingResult(
        axis,
        point,
        value,
        axis_size(axis, point),
        timing.median(times["rollout"]),
        timing.median(times["train"]),
    )


def axis_fit(results: Sequence[ScalingResult], phase: str) -> tuple[float, float, float]:
    """``(overall exponent, r2, local exponent between the two largest sizes)`` for one phase."""
    sizes = [r.size for r in results]
    values = [r.rollout_seconds if phase == "rollout" else r.train_seconds for r in results]
    exponent, r2 = timing.fit_power_law(sizes, values)
    local = math.log(values[-1] / values[-2]) / math.log(sizes[-1] / sizes[-2])
    return exponent, r2, local


def result_table(results_by_axis: dict[str, list[ScalingResult]]) -> str:
    """Per point: size and time relative to the axis' smallest point."""
    rows = []
    for axis, results in results_by_axis.items():
        first = results[0]
        for result in results:
            rows.append(
                [
                    axis,
                    result.value,
                    result.size,
                    f"{result.size / first.size:.2f}x",
                    f"{result.rollout_seconds / first.rollout_seconds:.2f}x",
                    f"{result.train_seconds / first.train_seconds:.2f}x",
                    f"{result.rollout_seconds:.2f} / {result.train_seconds:.2f}",
                ]
            )
    header = ["axis", "value", "size (tokens, videos or steps)", "size ratio", "rollout time ratio",
              "training time ratio", "seconds rollout / training (noisy)"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def fit_table(results_by_axis: dict[str, list[ScalingResult]]) -> str:
    """Fitted exponents per axis and phase."""
    rows = []
    for axis, results in results_by_axis.items():
        for phase in ("rollout", "training"):
            exponent, r2, local = axis_fit(results, "rollout" if phase == "rollout" else "train")
            rows.append([axis, phase, f"{exponent:.2f}", f"{r2:.3f}", f"{local:.2f}", _verdict(local)])
    header = ["axis", "phase", "exponent k (all points)", "r2", "local k (two largest)", "reading"]
    return reporting.markdown_table(header, rows)


def _verdict(exponent: float) -> str:
    if exponent > 1.15:
        return "super-linear"
    if exponent < 0.85:
        return "sub-linear"
    return "linear"


def plot_scaling(results_by_axis: dict[str, list[ScalingResult]], path: Path) -> None:
    """One log-log panel per axis: rollout and training time against size."""
    figure, axes = reporting.new_figure(columns=len(results_by_axis), size=(4.0, 3.4))
    for axis_plot, (axis, results) in zip(axes, results_by_axis.items()):
        sizes = [r.size for r in results]
        axis_plot.loglog(sizes, [r.rollout_seconds for r in results], marker="o", label="rollout")
        axis_plot.loglog(sizes, [r.train_seconds for r in results], marker="s", label="training step")
        reference = [results[0].rollout_seconds * s / sizes[0] for s in sizes]
        axis_plot.loglog(sizes, reference, linestyle=":", color="grey", label="linear")
        axis_plot.set_xlabel("tokens / video" if axis in ("frames", "resolution") else axis)
        axis_plot.set_title(axis)
    axes[0].set_ylabel("seconds (median)")
    axes[0].legend(fontsize=7)
    reporting.save_figure(figure, path)


def report(
    context: reporting.BenchmarkContext, results_by_axis: dict, repeats: int, base: ScalingPoint
) -> str:
    """The markdown section."""
    image = context.image_path("loglog")
    plot_scaling(results_by_axis, image)
    return f"""## 4. Scaling: rollout and training time against frames, resolution, group size and steps

{context.provenance()}

Base: {base.num_frames} frames of {base.resolution} x {base.resolution} ({base.tokens_per_video} tokens per
video), {base.num_prompts} prompts x G = {base.group_size}, {base.num_steps} steps with the SAGE SDE on the first
half; toy prior with LoRA r8; training micro-batches of {MICRO_BATCH} pairs. One axis varies at a time; times are
medians of {repeats} repeats after a warm-up (rollout and training step interleaved).

{result_table(results_by_axis)}

Fitted power laws `time = c * size^k`:

{fit_table(results_by_axis)}

Reading: frames and resolution grow the token count of every video, so the transformer's attention makes
time grow faster than tokens once it dominates (k > 1); at the smallest sizes fixed per-call costs keep k
below 1. Group size grows the batch: time per video falls while the batch is too small to keep the CPU busy
and is then linear. Steps: the rollout is one transformer call per step (linear); the training step trains
the SDE half of the steps, so its pairs also grow linearly with steps.

{context.image_link(image, "log-log scaling")}
"""


def main(argv: Sequence[str] | None = None) -> dict[str, list[ScalingResult]]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="repeats per point (after one warm-up)")
    context = reporting.start_benchmark(NAME, parser, argv, default_threads=1)
    axes, base = (QUICK_AXES, QUICK_BASE) if context.quick else (AXES, ScalingPoint())
    repeats = 1 if context.quick else context.arguments.repeats
    results_by_axis = {}
    for axis, (field_name, values) in axes.items():
        results_by_axis[axis] = [
            measure_point(axis, value, replace(base, **{field_name: value}), repeats, context.arguments.seed)
            for value in values
        ]
        print(f"{axis}: done")
    print(result_table(results_by_axis))
    print()
    print(fit_table(results_by_axis))
    reporting.write_section(context.output, NAME, report(context, results_by_axis, repeats, base))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results_by_axis


if __name__ == "__main__":
    main()
