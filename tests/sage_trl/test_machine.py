"""The machine a measurement ran on: the processor's model and the kernels torch chose."""

from __future__ import annotations

from pathlib import Path

import torch

from sage_trl.machine import cpu_description


def test_the_description_names_the_processor_model_and_the_kernels_torch_chose(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n\nprocessor\t: 1\n")
    capability = torch.backends.cpu.get_cpu_capability()
    assert cpu_description(cpuinfo) == f"AMD EPYC 9B14, {capability}"
    elsewhere = cpu_description(tmp_path / "absent")  # not Linux: the platform's name for it
    assert elsewhere.endswith(f", {capability}") and not elsewhere.startswith(",")
