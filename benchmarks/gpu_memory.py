"""Memory and compute of the example training configs at full size: the preflight's plan, and on a GPU the same
step measured beside it.

The plan is `sage_trl.preflight.plan_training`: the configured backbone built at full size under fake tensors
from its configuration files, the trainer's own code traced for one rollout round and one training step
(see `sage_trl.preflight`). On a CUDA GPU the script also runs the same phases for real
(`sage_trl.preflight.measure.measure_training_step`) and prints traced vs ``torch.cuda.max_memory_allocated``
side by side. The real run builds the same modules from the same configs, with random weights created on the
GPU (``--weights random``, the default: nothing is downloaded) or loads the checkpoint
(``--weights pretrained``, as the trainer loads it: `sage_trl.training_setup.load_training_backbone`), in both
cases with the config's expert options (Wan 2.2 A14B). With ``offload_idle_expert`` it also measures, after the
step, the trainer's whole-model move (which must leave the idle expert on the host) and one swap of the idle
expert each way (the trace counts the swaps and does not time them). VideoAlign is not part of the comparison
(the measured run scores nothing).

Tracing takes minutes of CPU per config, so a short GPU lease can measure only and compare elsewhere: on the
GPU ``--measure_only --output measured.json`` writes the measurements (with the device, torch version and
date), and ``--measured measured.json`` on any machine traces the same configs and prints the comparison.

Run::

    python -m benchmarks.gpu_memory                                  # both example configs: plan (CPU or GPU)
    python -m benchmarks.gpu_memory --gpu H100 --output memory.md    # with step times at H100 throughput
    python -m benchmarks.gpu_memory --config examples/configs/wan21_1.3b_lora_1gpu_24gb.yaml --gradient_checkpointing false
    python -m benchmarks.gpu_memory --measure_only --output measured.json          # on the GPU: measure only
    python -m benchmarks.gpu_memory --measured measured.json --gpu H200            # anywhere: compare

Extra ``--field value`` arguments override the training configs (any `sage_trl.SageGRPOConfig` field).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from sage_trl.preflight import PreflightPlan, plan_training
from sage_trl.preflight.measure import MeasuredPhase
from sage_trl.preflight.plan import GIB

__all__ = [
    "EXAMPLE_CONFIGS",
    "cap_device_memory",
    "compare_measured",
    "comparison_table",
    "main",
    "measure_config",
    "measured_record",
    "parse_config",
    "phase_table",
    "plan_config",
    "resident_table",
]

REPOSITORY = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIGS = (
    REPOSITORY / "examples" / "configs" / "hunyuanvideo15_480p_lora_1gpu.yaml",
    REPOSITORY / "examples" / "configs" / "wan21_1.3b_lora_1gpu_24gb.yaml",
)
"""The configs whose claims the docs back with the plan (one 80 GB GPU; one 24 GB GPU)."""


def parse_config(path: Path, overrides: Sequence[str] = ()) -> tuple[Any, Any]:
    """``(script_args, config)`` as ``sage-train --config path`` parses them (on a machine without CUDA, with
    ``use_cpu``: bf16 configs otherwise refuse to parse; the plan is the same)."""
    from sage_trl.cli import parse_train_arguments

    device = [] if torch.cuda.is_available() else ["--use_cpu=true"]
    return parse_train_arguments(["--config", str(path), *device, *overrides])


def plan_config(
    path: Path, overrides: Sequence[str] = (), *, gpu: str | None = None, rewards: bool = True
) -> PreflightPlan:
    """The preflight plan of one training config file."""
    script_args, config = parse_config(path, overrides)
    return plan_training(
        config,
        lora_config=script_args.peft_config(),
        gpu=gpu,
        rewards=script_args.reward if rewards else (),
        suggest_savers=False,
    )


def _gib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / GIB:.1f}"


def resident_table(plans: Sequence[PreflightPlan]) -> str:
    """Markdown: resident state by kind (GiB), one column per plan."""
    names = list(dict.fromkeys(kind.name for plan in plans for kind in plan.kinds))
    header = "| resident state | " + " | ".join(_short(plan) for plan in plans) + " |"
    rows = [header, "|---|" + "---|" * len(plans)]
    for name in names:
        cells = []
        for plan in plans:
            kind = next((k for k in plan.kinds if k.name == name), None)
            cells.append(
                "-" if kind is None else _gib(kind.num_bytes) + ("" if kind.on_device else " (host)")
            )
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _short(plan: PreflightPlan) -> str:
    return plan.model.split("/")[-1]


def phase_table(plans: Sequence[PreflightPlan]) -> str:
    """Markdown: every phase of every plan (GiB, TFLOPs, runs per optimizer step, time per run at the plan's GPU)."""
    rows = [
        "| model | phase | resident at start GiB | peak GiB | TFLOPs | runs per optimizer step | time per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for plan in plans:
        for phase in plan.phases:
            seconds = plan.seconds(phase.flops)
            runs = f"{phase.per_optimizer_step:g}" if phase.per_optimizer_step else "once"
            rows.append(
                f"| {_short(plan)} | {phase.name} | {_gib(phase.start_bytes)} | {_gib(phase.peak_bytes)} | "
                f"{phase.flops / 1e12:,.0f} | {runs} | {'-' if seconds is None else f'{seconds:,.1f} s'} |"
            )
        required = plan.required_gib()
        rows.append(f"| {_short(plan)} | **peak + margins** | | **{required:.1f}** | | | |")
    return "\n".join(rows)


def measure_config(path: Path, overrides: Sequence[str] = (), *, weights: str = "random") -> list[Any]:
    """The same phases for real on the current CUDA device (see the module docstring)."""
    from sage_trl.preflight import measure, resolve_model_configs
    from sage_trl.preflight.models import build_pipeline
    from sage_trl.preflight.runner import backbone_for
    from sage_trl.training_setup import load_training_backbone

    script_args, config = parse_config(path, overrides)
    lora_config = script_args.peft_config()
    if weights == "pretrained":  # the trainer's own loading: dtype, device, backbone class, expert options
        backbone = load_training_backbone(None, config, lora=lora_config is not None)
    else:
        configs = resolve_model_configs(config.model_name_or_path)
        dtype = config.parameter_dtype(lora_config is not None)
        started = time.perf_counter()
        on_gpu = torch.cuda.is_available()  # the tests run this on CPU
        pipeline = build_pipeline(configs, dtype, _device_of(config), made_on="cuda" if on_gpu else None)
        if on_gpu:
            torch.cuda.empty_cache()  # what the components made there and moved to the host left in the cache
        measure.logger.info("made the random weights in %.1f s", time.perf_counter() - started)
        backbone = backbone_for(configs, pipeline, config)
    return measure.measure_training_step(backbone, config, lora_config)


def _device_of(config: Any) -> Callable[[str], str]:
    """Where each component's random weights go (they are made on the GPU: `build_pipeline`'s ``made_on``): on
    the GPU; with ``precompute_prompt_embeddings`` all but the text encoders on the host, as the trainer loads them
    (`training_setup.load_training_backbone`) and as the prompt precompute moves them
    (`training_setup.precompute_prompt_embeddings`)."""
    from sage_trl.training_setup import TEXT_ENCODER_NAMES

    if not config.precompute_prompt_embeddings:
        return lambda name: "cuda"
    return lambda name: "cuda" if name in TEXT_ENCODER_NAMES else "cpu"


def cap_device_memory(card_gib: float) -> None:
    """Leave this process only what a card of ``card_gib`` GiB would: the caching allocator may reserve the card
    less the CUDA context already made (``torch.cuda.set_per_process_memory_fraction``). On a bigger card the
    allocator keeps every segment it ever reserved, so its reservation over a step says little about a smaller
    card, where it frees cached segments and retries before it fails; running under the cap says whether the
    step fits. cuBLAS and cuDNN handles made later are outside the cap (a few hundred MiB)."""
    torch.empty(1, device="cuda")  # the context
    free, total = torch.cuda.mem_get_info()
    allowed = card_gib * GIB - (total - free)
    if not 0 < allowed <= free:
        raise ValueError(f"--card_gib {card_gib:g} is not between this process's context and the card's free memory.")
    torch.cuda.set_per_process_memory_fraction(allowed / total)


def measured_record(
    path: Path, overrides: Sequence[str] = (), *, weights: str = "random", card_gib: float | None = None
) -> dict[str, Any]:
    """`measure_config` on the current CUDA device as JSON-ready data: the config's file name, the device, torch's
    version, the date, the card size simulated (``card_gib``, see `cap_device_memory`), every phase
    (`MeasuredPhase` fields) and what the driver reports in use at the end (the caching allocator's reservation
    plus the CUDA context: what the preflight's margins stand for)."""
    if card_gib is not None:
        cap_device_memory(card_gib)
    phases = measure_config(path, overrides, weights=weights)
    free, total = torch.cuda.mem_get_info()
    return {
        "config": path.name,
        "overrides": list(overrides),
        "weights": weights,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "card_gib": card_gib,
        "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "device_used_bytes": total - free,
        "phases": [dataclasses.asdict(phase) for phase in phases],
    }


def _seconds(plan: PreflightPlan, phase: Any) -> str:
    seconds = plan.seconds(phase.flops)
    return "-" if seconds is None else f"{seconds:,.1f}"


def comparison_table(plan: PreflightPlan, measured: Sequence[Any], device_used_bytes: int | None = None) -> str:
    """Markdown: traced vs measured start and peak of every phase (GiB) and their ratio, the caching allocator's
    reserved peak, and the time per run (traced FLOPs at the plan's GPU throughput, and measured); phases measured
    beyond the plan's (the idle expert's swaps, `sage_trl.preflight.measure.EXPERT_SWAP_PHASE`) get rows of their
    own; with ``device_used_bytes`` (the driver's count at the end) a last row puts it beside the plan's peak + margins."""
    rows = [
        "| phase | traced start | measured start | traced peak | measured peak | traced / measured peak "
        "| measured reserved | time traced s | time measured s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for traced, real in zip(plan.phases, measured):
        ratio = "-" if not real.peak_bytes else f"{traced.peak_bytes / real.peak_bytes:.3f}"
        rows.append(
            f"| {traced.name} | {_gib(traced.start_bytes)} | {_gib(real.start_bytes)} | {_gib(traced.peak_bytes)} | "
            f"{_gib(real.peak_bytes)} | {ratio} | {_gib(real.reserved_bytes)} | {_seconds(plan, traced)} | "
            f"{real.seconds:,.1f} |"
        )
    for real in measured[len(plan.phases) :]:  # measured only (the idle expert's swaps): no traced columns
        rows.append(
            f"| {real.name} | - | {_gib(real.start_bytes)} | - | {_gib(real.peak_bytes)} | - | "
            f"{_gib(real.reserved_bytes)} | - | {real.seconds:,.1f} |"
        )
    if device_used_bytes is not None:
        rows.append(
            f"| **whole step: traced peak + margins / in use at the end (driver)** | | | **{plan.required_gib():.1f}** | "
            f"**{_gib(device_used_bytes)}** | | | | |"
        )
    return "\n".join(rows)


def compare_measured(records: Sequence[dict[str, Any]], configs: Sequence[Path], gpu: str | None) -> list[str]:
    """Markdown sections: each measured record (`measured_record`) beside the plan of the same config file (found
    among ``configs`` by name) with the same overrides."""
    by_name = {path.name: path for path in configs}
    parts = []
    for record in records:
        if record["config"] not in by_name:
            raise ValueError(
                f"--measured holds {record['config']!r}, which is not among --config "
                f"({', '.join(by_name)}); pass its path with --config."
            )
        path, overrides = by_name[record["config"]], record["overrides"]
        plan = plan_config(path, overrides, gpu=gpu, rewards=False)
        measured = [MeasuredPhase(**phase) for phase in record["phases"]]
        title = f"## {path.name}: traced vs measured on {record['device']}"
        setting = f"{record['weights']} weights, torch {record['torch']}, {record['date']}"
        if record.get("card_gib") is not None:
            setting += f", run as a {record['card_gib']:g} GiB card (the allocator capped; it fit)"
        if record.get("allocator_conf"):
            setting += f", PYTORCH_CUDA_ALLOC_CONF={record['allocator_conf']}"
        if overrides:
            setting += ", overrides " + " ".join(overrides)
        parts += [title, setting, comparison_table(plan, measured, record["device_used_bytes"])]
    return parts


def _parse_arguments(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--config", type=Path, nargs="+", default=list(EXAMPLE_CONFIGS), help="training configs"
    )
    parser.add_argument(
        "--gpu", default=None, help="GPU name of sage_trl.preflight.GPUS or TFLOP/s, for times."
    )
    parser.add_argument(
        "--weights", choices=("random", "pretrained"), default="random", help="for the measured run"
    )
    parser.add_argument("--output", type=Path, default=None, help="Also write the report (markdown) here.")
    parser.add_argument(
        "--measure_only",
        action="store_true",
        help="On a CUDA GPU: measure, skip the plan, and write the measurements as JSON (--output, else stdout).",
    )
    parser.add_argument(
        "--card_gib",
        type=float,
        default=None,
        help="With --measure_only: run as if the GPU had this many GiB (the allocator capped), to check a plan.",
    )
    parser.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="A --measure_only JSON file (made on a GPU): trace the same configs here and print the comparison.",
    )
    return parser.parse_known_args(argv)


def _measure_only(args: argparse.Namespace, overrides: Sequence[str]) -> None:
    if not torch.cuda.is_available():
        raise ValueError("--measure_only measures on a CUDA GPU and none is visible; drop it to plan only.")
    _log_phases_to_stderr()
    records = []
    for path in args.config:
        records.append(measured_record(path, overrides, weights=args.weights, card_gib=args.card_gib))
        torch.cuda.empty_cache()
    text = json.dumps(records, indent=1)
    print(text)
    if args.output is not None:
        args.output.write_text(text)


def _log_phases_to_stderr() -> None:
    """Print each phase's measurement (JSON) as it ends: a lease that stops the run mid-step keeps what it measured."""
    from sage_trl.preflight import measure

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    measure.logger.addHandler(handler)
    measure.logger.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> list[PreflightPlan]:
    """Command-line entry point; returns the plans (none with ``--measure_only``)."""
    args, overrides = _parse_arguments(argv)
    if args.measure_only:
        _measure_only(args, overrides)
        return []
    plans = [plan_config(path, overrides, gpu=args.gpu) for path in args.config]
    parts = [
        "# Preflight of the example configs (traced at full size)",
        resident_table(plans),
        phase_table(plans),
    ]
    if args.measured is not None:
        parts += compare_measured(json.loads(args.measured.read_text()), args.config, args.gpu)
    elif torch.cuda.is_available():
        _log_phases_to_stderr()
        for path in args.config:
            record = measured_record(path, overrides, weights=args.weights)
            parts += compare_measured([record], [path], args.gpu)
            torch.cuda.empty_cache()
    report = "\n\n".join(parts) + "\n"
    print(report)
    if args.output is not None:
        args.output.write_text(report)
    return plans


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
