"""The cost of validating inside the denoising step: the validating `sde_step` against the inner `step`.

Before, the environment and the loss called `sage_env.sde.sde_step`, which validates every call (types,
shapes, finiteness of latents and velocity, sigma ranges): each check reads a value back from the device, a
host synchronisation on an accelerator, twice per training micro-batch and once per rollout step. Now they
call `sage_env.sde.step` (arithmetic only) and validation happens where data enters. This script counts the
host reads of one call of each (`aten._local_scalar_dense` / ``is_nonzero``, the ops that copy a value to the
host) and times both, interleaved, for latents of the toy world and of a 480p Wan video. On a CPU a host read
costs nothing extra, so the CPU time ratio only shows the checks' own arithmetic; on a GPU each host read also
stalls the launch queue until the device catches up (not measurable here: no GPU).

    python -m benchmarks.sde_step_overhead [--quick]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import reporting, timing
from sage_env import sde

NAME = "sde_step_overhead"
_HOST_READS = frozenset({"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default"})
CASES = {
    "toy world: 32 videos x (3, 8, 16, 16)": (32, (3, 8, 16, 16)),
    "Wan 2.1 480p x 81 frames: 1 video x (16, 21, 60, 104)": (1, (16, 21, 60, 104)),
}


@dataclass
class OverheadRow:
    """One SDE type on one latent shape."""

    case: str
    sde_type: str
    validated_reads: int
    inner_reads: int
    ratio: float


class HostReadCounter(TorchDispatchMode):
    """Counts the ops that copy a tensor value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func) in _HOST_READS
        return func(*args, **(kwargs or {}))


def _inputs(batch: int, shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(batch, *shape, generator=generator)
    velocity = torch.randn(batch, *shape, generator=generator)
    sigma = torch.linspace(0.9, 0.5, batch)
    return latents, velocity, sigma, sigma - 0.05


def _calls(sde_type: str, inputs: tuple[torch.Tensor, ...]) -> dict[str, object]:
    latents, velocity, sigma, sigma_next = inputs
    x_next = latents + 0.01  # scoring a stored transition: the training-phase call
    return {
        "validated": lambda: sde.sde_step(sde_type, latents, velocity, sigma, sigma_next, 0.5, x_next=x_next),
        "inner": lambda: sde.step(sde_type, latents, velocity, sigma, sigma_next, 0.5, x_next=x_next),
    }


def _reads(call: object) -> int:
    with HostReadCounter() as counter:
        call()
    return counter.count


def measure(repeats: int) -> list[OverheadRow]:
    """Host reads and the validated / inner time ratio of every stochastic SDE type and case."""
    rows = []
    for case, (batch, shape) in CASES.items():
        inputs = _inputs(batch, shape)
        for sde_type in sde.stochastic_sde_types():
            calls = _calls(sde_type, inputs)
            times = timing.interleaved_times(calls, repeats=repeats)
            ratio = timing.paired_ratio(times["validated"], times["inner"])
            rows.append(
                OverheadRow(case, sde_type, _reads(calls["validated"]), _reads(calls["inner"]), ratio)
            )
    return rows


def report(context: reporting.BenchmarkContext, rows: list[OverheadRow]) -> str:
    """The markdown section."""
    header = [
        "latents",
        "SDE",
        "host reads: validated sde_step",
        "host reads: inner step",
        "time validated / inner",
    ]
    table = reporting.markdown_table(
        header, [[r.case, r.sde_type, r.validated_reads, r.inner_reads, r.ratio] for r in rows], digits=3
    )
    return f"""## 10. The denoising step: validation where data enters, arithmetic inside the step

{context.provenance()}

One call scoring a stored transition (the training-phase call; a rollout step draws noise on top). "Host reads"
are the ops that copy a value from the device to the host (each a synchronisation on a GPU); the inner step, which
the environment and the loss now call, has none. Time ratios are medians of interleaved repeats on the CPU, where
a host read costs nothing, so they show only the checks' own arithmetic; a GPU adds one stall per host read.

{table}
"""


def main(argv: Sequence[str] | None = None) -> list[OverheadRow]:
    """Run the benchmark, print its table, write its section; return the rows."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    context = reporting.start_benchmark(NAME, parser, argv)
    rows = measure(3 if context.quick else context.arguments.repeats)
    body = report(context, rows)
    print(body)
    reporting.write_section(context.output, NAME, body)
    return rows


if __name__ == "__main__":
    main()
