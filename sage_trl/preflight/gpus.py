"""A small table of GPUs: dense bf16 tensor throughput and memory, to turn traced FLOPs into time and a budget.

Throughputs are the vendors' datasheet peaks for dense bf16 tensor-core math with fp32 accumulation (what
PyTorch's bf16 matmuls and attention kernels use), without the 2x of structured sparsity. Real training reaches a
fraction of it; `DEFAULT_UTILISATION` is the fraction the preflight assumes unless told otherwise
(``--gpu_utilisation``): a stated assumption, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_UTILISATION", "GPUS", "GpuSpec", "resolve_gpu"]

DEFAULT_UTILISATION = 0.4
"""Assumed fraction of the peak throughput a training step sustains (model FLOPs utilisation)."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Args:
        name: the name used on the command line (``--gpu H100``).
        bf16_tflops: dense bf16 tensor throughput, TFLOP/s.
        memory_gib: memory capacity as sold (the CUDA context and driver take some of it: see the plan's margin).
    """

    name: str
    bf16_tflops: float
    memory_gib: float


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("H200", 989.0, 141.0),
        GpuSpec("H100", 989.0, 80.0),  # SXM5
        GpuSpec("H100-PCIe", 756.0, 80.0),
        GpuSpec("A100", 312.0, 80.0),
        GpuSpec("A100-40GB", 312.0, 40.0),
        GpuSpec("L40S", 362.0, 48.0),
        GpuSpec("L4", 121.0, 24.0),
        GpuSpec("RTX4090", 165.0, 24.0),
        GpuSpec("RTX3090", 71.0, 24.0),
    )
}
"""Known GPUs by name (case-insensitive on the command line)."""


def resolve_gpu(gpu: str | GpuSpec | float | None) -> GpuSpec | None:
    """A `GpuSpec` from a table name, a spec, or a throughput in TFLOP/s (memory unknown: 0)."""
    if gpu is None or isinstance(gpu, GpuSpec):
        return gpu
    if isinstance(gpu, (int, float)) and not isinstance(gpu, bool):
        if gpu <= 0:
            raise ValueError(f"A GPU throughput must be > 0 TFLOP/s, got {gpu}.")
        return GpuSpec(f"{gpu:g} TFLOP/s", float(gpu), 0.0)
    by_name = {name.lower(): spec for name, spec in GPUS.items()}
    spec = by_name.get(str(gpu).lower())
    if spec is None:
        try:
            return resolve_gpu(float(gpu))
        except ValueError:
            raise ValueError(
                f"Unknown GPU {gpu!r}; use one of {', '.join(GPUS)} or a dense bf16 throughput in TFLOP/s (e.g. 500)."
            ) from None
    return spec
