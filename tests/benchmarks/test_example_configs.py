"""The example-configs benchmark: a config trains through the ``sage-train`` entry point and its run is read."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import example_configs


def test_quick_run_trains_the_16gb_config_through_sage_train(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    (run,) = example_configs.main(["--quick", "--output", str(output)])
    assert (run.config, run.model, run.exit_code, run.error) == ("wan21_1.3b_lora_1gpu_16gb", "wan", 0, "")
    assert run.steps == 1 and run.finite and run.adapter_saved
    assert math.isfinite(run.loss) and math.isfinite(run.reward)
    text = output.read_text()
    assert "<!-- begin: example_configs -->" in text and "| wan21_1.3b_lora_1gpu_16gb | wan | 0 | 1 |" in text


def test_a_failed_run_reports_its_error_and_no_steps(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    text = example_configs.QUICK_CONFIG.read_text().replace("num_generations: 4", "num_generations: 3")
    broken.write_text(text)
    output = tmp_path / "benchmarks.md"
    (run,) = example_configs.main(["--configs", str(broken), "--max_steps", "1", "--output", str(output)])
    assert run.exit_code != 0 and run.steps == 0 and not run.finite and not run.adapter_saved
    assert "num_generations" in run.error
    assert f"* `broken`: {run.error}" in output.read_text()
