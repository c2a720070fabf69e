"""The same phases on real tensors, measured: what checks the trace (tests on CPU, the benchmark on a GPU).

`measure_training_step` runs `sequence.prepare_and_encode` and `sequence.run_training_step` on a real backbone and
measures every phase: on CUDA the caching allocator's ``torch.cuda.memory_allocated`` at the start and
``max_memory_allocated`` over the phase; on CPU the allocator's own accounting through ``torch.profiler``
(``profile_memory``: every allocation and free of tensor storage, in order), whose running total's maximum is the
phase's peak above its start. The traced `PhasePlan` of the same config must match: its ``peak_bytes -
start_bytes`` is the same quantity.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from sage_env.backbones import VideoBackbone
from sage_trl.preflight import sequence

__all__ = ["EXPERT_SWAP_PHASE", "MODEL_TO_DEVICE_PHASE", "MeasuredPhase", "measure_training_step", "profiled_peak"]

logger = logging.getLogger(__name__)
"""Logs each phase as JSON when it is measured, so that a GPU lease that ends mid-step keeps the phases it ran (and
`benchmarks.gpu_memory` logs here how long the random weights took to make)."""

EXPERT_SWAP_PHASE = "expert swap"
"""Name of the measured phases that swap the idle expert in (measured only: the trace counts swaps, not their time)."""

MODEL_TO_DEVICE_PHASE = "model to device (accelerate's prepare)"
"""Name of the measured phase that moves the whole trained module to the device, as transformers' Trainer and
accelerate's ``prepare`` do when training starts: with the idle expert on the host, nothing of it may come back."""


@dataclass(frozen=True)
class MeasuredPhase:
    """One measured phase.

    Args:
        name: the phase (as in `sage_trl.preflight.PhasePlan`).
        transient_bytes: the peak above the bytes allocated when the phase started.
        start_bytes: bytes allocated at the start (CUDA only; None on CPU).
        peak_bytes: ``max_memory_allocated`` over the phase (CUDA only; None on CPU).
        seconds: wall-clock time of the phase.
        reserved_bytes: ``max_memory_reserved`` over the phase, what the caching allocator held from the driver
            (CUDA only; None on CPU): the allocated peak plus fragmentation, what an out-of-memory error compares
            with the card.
    """

    name: str
    transient_bytes: int
    start_bytes: int | None
    peak_bytes: int | None
    seconds: float
    reserved_bytes: int | None = None


@contextmanager
def _profiled() -> Iterator[list[int]]:
    """Profile the block's CPU allocations; afterwards the yielded list holds the peak of their running total."""
    from torch.profiler import ProfilerActivity, profile

    result: list[int] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        yield result
    result.append(_running_peak(profiler))


def profiled_peak(work: Callable[[], Any]) -> int:
    """Peak of the CPU allocator's running total during ``work`` (allocations minus frees, in order), in bytes."""
    with _profiled() as result:
        work()
    return result[0]


def _running_peak(profiler: Any) -> int:
    events = [event for event in profiler.profiler.kineto_results.events() if event.name() == "[memory]"]
    running = peak = 0
    for event in sorted(events, key=lambda event: event.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


class _MeasureRecorder:
    """`sequence.PhaseRecorder` on real tensors (offloads are real moves: nothing to book-keep)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.phases: list[MeasuredPhase] = []

    @contextmanager
    def phase(
        self, name: str, runs: float, *, transformer: bool, gradients: int = 0, note: str = ""
    ) -> Iterator[None]:
        start_time = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            seconds = time.perf_counter() - start_time
            self._add(MeasuredPhase(name, peak - start, start, peak, seconds, reserved))
            return
        with _profiled() as result:
            yield
        self._add(MeasuredPhase(name, result[0], None, None, time.perf_counter() - start_time))

    def _add(self, phase: MeasuredPhase) -> None:
        self.phases.append(phase)
        logger.info("measured phase %s", json.dumps(dataclasses.asdict(phase)))

    def live(self) -> None:
        return None

    def to_host_since(self, marker: Any) -> None:
        """The library's own ``.to("cpu")`` already moved the prompt cache."""

    def to_host(self, tensors: Sequence[torch.Tensor], host: bool = True) -> None:
        """The library's own ``.to("cpu")`` already moved them."""

    def replay_calls(self, owner: Any, name: str) -> AbstractContextManager[None]:
        return nullcontext()


def measure_training_step(
    backbone: VideoBackbone, config: Any, lora_config: Any = None
) -> list[MeasuredPhase]:
    """Run the preflight's phases for ``config`` on the real ``backbone`` and measure each (see the module docstring)
    on the run's device (``config.device``: the backbone may wait on the host until the prompts are encoded), then,
    for a backbone that swaps its idle expert, one swap each way (phases the trace does not have)."""
    device = torch.device(config.device)
    recorder = _MeasureRecorder(device)
    with _one_cpu_thread(device):
        run = sequence.prepare_and_encode(recorder, backbone, config, lora_config)
        sequence.run_training_step(recorder, run)
        _measure_expert_moves(recorder, backbone)
    return recorder.phases


def _measure_expert_moves(recorder: _MeasureRecorder, backbone: VideoBackbone) -> None:
    """With ``offload_idle_expert``: the trainer's whole-model move (`MODEL_TO_DEVICE_PHASE`), which must leave the
    idle expert on the host, then one swap to the idle expert and one back, each measured as a phase (named
    `EXPERT_SWAP_PHASE`): the time of the copies the trace counts but does not time (`PreflightPlan.expert_swaps`
    per optimizer step). Nothing is added for a backbone that swaps nothing."""
    transformer = backbone.transformer
    if not getattr(transformer, "offload_idle", False):
        return
    note = "model.to(device), as transformers' Trainer and accelerate's prepare move the model"
    with recorder.phase(MODEL_TO_DEVICE_PHASE, 0, transformer=False, note=note):
        transformer.to(recorder.device)
    computing = transformer.computing
    transformer.activate(computing)
    idle = next(name for name in transformer.experts() if name != computing)
    for name in (idle, computing):
        note = f"{name}'s frozen weights in, the other's out"
        with recorder.phase(f"{EXPERT_SWAP_PHASE} to {name}", 0, transformer=False, note=note):
            transformer.activate(name)


@contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On CPU, measure with one intra-op thread: parallel CPU kernels allocate per-thread scratch buffers (7% more
    in HunyuanVideo's prompt encoding with two threads) that neither the trace nor a GPU has."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
