"""Training-phase throughput: micro-batched (sample x timestep) pairs vs one pair per forward.

The library trains on a `TransitionBatch` of (sample, timestep) pairs in micro-batches
(``AlgorithmConfig.micro_batch_size``): one transformer forward per micro-batch, whatever mix of samples and
timesteps it holds. The official SAGE-GRPO / DanceGRPO training loops run one sample and one timestep per
forward. This script runs both through the same loss, ``PolicyGradientAlgorithm.loss`` (SAGE-GRPO: clipped
ratio, equalizer weights, dual KL with the moving-anchor forward), on the pairs of one real rollout of the toy
world, and reports (sample x timestep) pairs per second and the speed-up. Both accumulate
``loss * len(chunk) / len(batch)``, so their gradients must be identical up to float rounding: the script
checks ``torch.allclose`` on every trainable parameter.

Run: ``python -m benchmarks.training_throughput [--quick] [--repeats 5] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import agents
from agents import AlgorithmAgent, TransitionBatch
from benchmarks import reporting, timing, workloads
from sage_env.toy.env import make_toy_vector_env

NAME = "training_throughput"
TARGET_SPEEDUP = 2.0
ETA = 0.7
RTOL, ATOL_FRACTION = 1e-4, 1e-5


@dataclass(frozen=True)
class ThroughputCase:
    """One configuration: backbone, adapter, the rollout that supplies the pairs, micro-batch sizes."""

    label: str
    backbone: str
    num_prompts: int
    group_size: int
    micro_batch_sizes: tuple[int, ...]
    threads: int = 1
    repeats: int | None = None  # None: the command line's --repeats


CASES = (
    ThroughputCase("toy prior, LoRA r8", "prior", 4, 4, (4, 16, 40, 80), threads=1),
    # Two threads on cores shared with other jobs make tiny per-pair forwards very slow: fewer pairs and repeats.
    ThroughputCase("toy prior, LoRA r8", "prior", 2, 4, (4, 8, 20, 40), threads=2, repeats=3),
    ThroughputCase("toy wide (CPU-heavy), LoRA r8", "wide", 2, 4, (4, 8, 20, 40), threads=1),
)
QUICK_CASES = (ThroughputCase("toy prior, LoRA r8", "prior", 1, 2, (4, 10)),)


@dataclass
class ThroughputResult:
    """Seconds per pass over all pairs for each micro-batch size (1 = the per-pair reference)."""

    case: ThroughputCase
    num_pairs: int
    seconds: dict[int, list[float]]
    gradient_max_difference: float
    gradient_scale: float
    gradients_allclose: bool

    def pairs_per_second(self, micro_batch: int) -> float:
        """Median throughput at ``micro_batch``."""
        return self.num_pairs / timing.median(self.seconds[micro_batch])

    def speedup(self, micro_batch: int) -> float:
        """Median per-repeat ratio of the per-pair time to the micro-batched time."""
        return timing.paired_ratio(self.seconds[1], self.seconds[micro_batch])


def accumulate_gradients(agent: AlgorithmAgent, batch: TransitionBatch, micro_batch: int) -> None:
    """One training pass over ``batch`` in chunks of ``micro_batch`` pairs, gradients accumulated as the
    agent's optimizer step does (``loss * len(chunk) / len(batch)``), without the optimizer update."""
    agent.optimizer.zero_grad(set_to_none=True)
    for chunk in batch.chunks(micro_batch):
        loss, _ = agent.algorithm.loss(agent.policy, chunk, agent.references)
        (loss * len(chunk) / len(batch)).backward()


def flat_gradient(agent: AlgorithmAgent) -> torch.Tensor:
    """Every trainable parameter's gradient, concatenated."""
    return torch.cat([p.grad.detach().flatten().clone() for p in agent.parameters])


def prepare(case: ThroughputCase, seed: int) -> tuple[AlgorithmAgent, TransitionBatch]:
    """A LoRA agent on the case's backbone and the training pairs of one rollout of the toy world."""
    backbone = workloads.toy_backbone(case.backbone, seed)
    workloads.add_lora_adapter(backbone)
    env = make_toy_vector_env(
        num_envs=case.num_prompts * case.group_size, group_size=case.group_size, backbone=backbone, eta=ETA
    )
    agent = agents.make("sage_grpo", policy=backbone, eta=ETA, kl_strategy="dual")
    trajectory = workloads.agent_rollout(env, agent, seed=seed)
    advantages, _ = agent.algorithm.advantages(trajectory)
    # Every sample is trained (a group without reward spread would otherwise drop out of this one batch).
    usable = torch.ones(len(trajectory), dtype=torch.bool)
    batch = agent.algorithm.training_batch(trajectory, advantages, usable, backbone, on_policy=True)
    return agent, batch


def compare_gradients(
    agent: AlgorithmAgent, batch: TransitionBatch, micro_batch: int
) -> tuple[float, float, bool]:
    """``(max |difference|, max |gradient|, allclose)`` between per-pair and micro-batched gradients."""
    accumulate_gradients(agent, batch, 1)
    per_pair = flat_gradient(agent)
    accumulate_gradients(agent, batch, micro_batch)
    batched = flat_gradient(agent)
    scale = float(per_pair.abs().max())
    close = torch.allclose(batched, per_pair, rtol=RTOL, atol=ATOL_FRACTION * scale)
    return float((batched - per_pair).abs().max()), scale, bool(close)


def measure_case(
    case: ThroughputCase, micro_batch_sizes: Sequence[int], repeats: int, seed: int
) -> ThroughputResult:
    """Time one pass over the pairs at micro-batch 1 (reference) and at each size, interleaved."""
    torch.set_num_threads(case.threads)
    agent, batch = prepare(case, seed)
    sizes = [1, *[size for size in micro_batch_sizes if size > 1]]
    candidates = {size: (lambda size=size: accumulate_gradients(agent, batch, size)) for size in sizes}
    seconds = timing.interleaved_times(candidates, repeats, warmup=1)
    difference, scale, close = compare_gradients(agent, batch, max(sizes))
    return ThroughputResult(case, len(batch), seconds, difference, scale, close)


def result_table(results: Sequence[ThroughputResult]) -> str:
    """Markdown: pairs/s and speed-up per micro-batch size, and the gradient check."""
    rows = []
    for result in results:
        for size in sorted(result.seconds):
            speedup = result.speedup(size)
            rows.append(
                [
                    result.case.label,
                    result.case.threads,
                    result.num_pairs,
                    "1 (per pair, as the official loop)" if size == 1 else size,
                    f"{result.pairs_per_second(size):.1f}",
                    f"{speedup:.2f}x",
                    "" if size == 1 else ("yes" if speedup >= TARGET_SPEEDUP else "no"),
                ]
            )
    header = [
        "configuration",
        "threads",
        "pairs",
        "micro-batch",
        "pairs / s (median)",
        "speed-up",
        f">= {TARGET_SPEEDUP}x",
    ]
    return reporting.markdown_table(header, rows)


def gradient_table(results: Sequence[ThroughputResult]) -> str:
    """Markdown: the gradient identity check per configuration."""
    rows = [
        [
            f"{r.case.label}, {r.case.threads} thread(s)",
            max(r.seconds),
            f"{r.gradient_max_difference:.2e}",
            f"{r.gradient_scale:.2e}",
            "yes" if r.gradients_allclose else "NO",
        ]
        for r in results
    ]
    header = ["configuration", "micro-batch compared with 1", "max abs difference", "max abs gradient",
              f"allclose (rtol {RTOL}, atol {ATOL_FRACTION} x max)"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def plot_throughput(results: Sequence[ThroughputResult], path: Path) -> None:
    """Pairs per second against the micro-batch size, one line per configuration."""
    figure, (axis,) = reporting.new_figure()
    for result in results:
        sizes = sorted(result.seconds)
        label = f"{result.case.label}, {result.case.threads} thread(s)"
        axis.plot(sizes, [result.pairs_per_second(size) for size in sizes], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("micro-batch size ((sample, timestep) pairs per forward)")
    axis.set_ylabel("pairs / s")
    axis.set_title("Training-phase throughput (loss + backward)")
    axis.legend(fontsize=8)
    reporting.save_figure(figure, path)


def report(context: reporting.BenchmarkContext, results: Sequence[ThroughputResult], repeats: int) -> str:
    """The markdown section."""
    image = context.image_path("pairs_per_second")
    plot_throughput(results, image)
    best = {
        f"{r.case.label}, {r.case.threads} thread(s)": max(r.speedup(size) for size in r.seconds if size > 1)
        for r in results
    }
    summary = "; ".join(f"{label}: {value:.1f}x" for label, value in best.items())
    identical = all(r.gradients_allclose for r in results)
    return f"""## 2. Training-phase throughput: micro-batched pairs vs one pair per forward

{context.provenance()}

Pairs from one toy-world rollout (SAGE SDE, eta {ETA}, 10 steps with the SDE on the first 5), SAGE-GRPO loss
(`PolicyGradientAlgorithm.loss`: clipped ratio, equalizer, dual KL with the anchor forward) and backward, no
optimizer step. Micro-batch 1 is the official loop's structure (one sample and one timestep per forward);
speed-ups are medians of {repeats} interleaved repeats.

{result_table(results)}

Best speed-up: {summary} (target >= {TARGET_SPEEDUP}x). Gradient identity between micro-batching and the per-pair
loop ({"holds" if identical else "FAILS"}):

{gradient_table(results)}

The gain comes from fewer, larger forwards: with the tiny toy prior a per-pair forward is dominated by fixed
per-call costs (module dispatch, the SDE math, the anchor swap); with a compute-heavy transformer the gain is
smaller because a batched CPU matmul costs nearly as much per pair as an unbatched one.

{context.image_link(image, "pairs per second vs micro-batch size")}
"""


def main(argv: Sequence[str] | None = None) -> list[ThroughputResult]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per micro-batch size")
    context = reporting.start_benchmark(NAME, parser, argv)
    cases = QUICK_CASES if context.quick else CASES
    if context.arguments.threads is not None:
        cases = tuple(replace(case, threads=context.arguments.threads) for case in cases)
    repeats = 1 if context.quick else context.arguments.repeats
    threads = torch.get_num_threads()
    results = [
        measure_case(
            case, case.micro_batch_sizes, min(repeats, case.repeats or repeats), context.arguments.seed
        )
        for case in cases
    ]
    torch.set_num_threads(threads)
    print(result_table(results))
    print()
    print(gradient_table(results))
    reporting.write_section(context.output, NAME, report(context, results, repeats))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
