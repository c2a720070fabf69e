"""The step-overhead benchmark: the inner step reads nothing back, the validated one does."""

from __future__ import annotations

from pathlib import Path

from benchmarks import sde_step_overhead


def test_quick_run_counts_host_reads_and_writes_its_section(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    rows = sde_step_overhead.main(["--quick", "--output", str(output)])
    assert {row.sde_type for row in rows} == {"sage", "flow_grpo", "dance_grpo", "cps"}
    assert all(row.inner_reads == 0 < row.validated_reads for row in rows)
    assert "<!-- begin: sde_step_overhead -->" in output.read_text()
