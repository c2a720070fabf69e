"""The machine a measurement ran on, named so that timings from different machines are not compared unawares: the
arena's cells and the benchmarks' headers record it (docs/arena.md, "Reading the report")."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

__all__ = ["CPUINFO", "cpu_description"]

CPUINFO = Path("/proc/cpuinfo")
"""Where Linux names the processor's model."""


def cpu_description(cpuinfo: Path = CPUINFO) -> str:
    """The processor's model and the instruction set torch's CPU kernels use, as ``"AMD EPYC, AVX2"``: the wall time
    of one arena cell differs between processors (about twice between two of this project's machines), and other
    kernels may change a result's last digits."""
    model = ""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
                break
    model = model or platform.processor() or platform.machine() or "unknown processor"
    return f"{model}, {torch.backends.cpu.get_cpu_capability()}"
