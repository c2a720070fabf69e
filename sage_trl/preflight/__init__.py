"""Preflight: the full-size memory and compute plan of a training config, traced on a CPU in seconds.

``sage-train --config X.yaml --preflight [--gpu H100] [--gpu_memory_gib 24]`` (or `plan_training` /
`preflight_main`) builds the configured backbone at full size under fake tensors (no weights: the model's
configuration files are enough, from a local folder, the Hugging Face cache, or the configs shipped for the models
the library supports), runs the trainer's own code for one rollout round (prompt encoding, one denoising step with
CFG and the SDE step, the decode) and one training step (a micro-step of the loss with the moving anchor, dual KL
and equalizer, backward, the optimizer step), and reports:

* resident memory by kind (weights, trainable parameters, optimizer state, anchor, second expert, VAE, text
  encoders, reward model, rollout buffer), on the device or offloaded to the host;
* the device peak of every phase, per process (DDP or FSDP2 world sizes by stated arithmetic, `plan`);
* FLOPs per phase and per optimizer step, and the time they take at a GPU's throughput (`gpus`);
* whether it fits a memory budget, and if not which savers would make it fit (`savers`);
* what a trace cannot see, with the margin added for it (`plan.LIMITS`).

How it works: `tracing` (fake tensors, a live-storage meter, real values for program-decided tensors: how
HunyuanVideo 1.5's data-dependent branches trace faithfully), `replay` (repeated VAE decoder calls traced once),
`models` (configs and the fake-tensor build), `steps` and `sequence` (the trainer's phases through the library's
code, in the trainer's order), `runner` (the traced run), `measure` (the same phases measured on real tensors),
`plan` (the result).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sage_trl.preflight.gpus import DEFAULT_UTILISATION, GPUS, GpuSpec, resolve_gpu
from sage_trl.preflight.models import ModelConfigs, resolve_model_configs
from sage_trl.preflight.plan import LIMITS, MemoryKind, PhasePlan, PreflightPlan
from sage_trl.preflight.runner import trace_plan
from sage_trl.preflight.savers import SAVERS, find_savers, saver_cost

__all__ = [
    "DEFAULT_UTILISATION",
    "GPUS",
    "LIMITS",
    "SAVERS",
    "GpuSpec",
    "MemoryKind",
    "ModelConfigs",
    "PhasePlan",
    "PreflightPlan",
    "plan_training",
    "preflight_main",
    "resolve_model_configs",
]


def _world(world_size: int | None, fsdp: bool | None) -> tuple[int, bool]:
    """The world size and sharding: as given, else what ``accelerate launch`` put in the environment."""
    size = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    sharded = fsdp if fsdp is not None else os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if size < 1:
        raise ValueError(f"world_size must be >= 1, got {size}.")
    return size, sharded and size > 1


def _check_budget(gpu_memory_gib: float | None, utilisation: float) -> None:
    if gpu_memory_gib is not None and not gpu_memory_gib > 0:
        raise ValueError(f"gpu_memory_gib must be > 0, got {gpu_memory_gib}.")
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must lie in (0, 1], got {utilisation}.")


def plan_training(
    config: Any,
    *,
    lora_config: Any = None,
    world_size: int | None = None,
    fsdp: bool | None = None,
    gpu: str | GpuSpec | float | None = None,
    gpu_memory_gib: float | None = None,
    utilisation: float = DEFAULT_UTILISATION,
    rewards: Sequence[str] = (),
    model_configs: ModelConfigs | None = None,
    suggest_savers: bool = True,
) -> PreflightPlan:
    """The preflight plan of a `sage_trl.SageGRPOConfig` (see the module docstring).

    Args:
        config: the training config.
        lora_config: the ``peft.LoraConfig`` of a LoRA run; None for full fine-tuning.
        world_size: processes (default: ``$WORLD_SIZE``, else 1).
        fsdp: FSDP2 instead of DDP when ``world_size > 1`` (default: ``$ACCELERATE_USE_FSDP``).
        gpu: a name of `GPUS` or a dense bf16 throughput in TFLOP/s, for time (and the default budget).
        gpu_memory_gib: the memory budget per GPU (default: the GPU's capacity, if known).
        utilisation: the assumed fraction of the GPU's peak throughput.
        rewards: reward specs as ``sage-train --reward`` takes them (``videoalign:<folder>`` counts VideoAlign).
        model_configs: the model's configs (default: resolved from ``config.model_name_or_path``).
        suggest_savers: when the plan does not fit the budget, find the savers that make it fit.
    """
    gpu_spec = resolve_gpu(gpu)
    _check_budget(gpu_memory_gib, utilisation)
    size, sharded = _world(world_size, fsdp)
    configs = model_configs or resolve_model_configs(config.model_name_or_path)

    def trace(run_config: Any) -> PreflightPlan:
        single = trace_plan(run_config, lora_config, rewards=rewards, model_configs=configs)
        return single.for_world(size, sharded)

    plan = trace(config)
    plan.gpu, plan.utilisation, plan.memory_budget_gib = gpu_spec, utilisation, gpu_memory_gib
    if suggest_savers and plan.fits is False:
        plan.savers, plan.saver_peak_bytes = find_savers(config, lora_config, plan, trace)
        plan.saver_costs = [saver_cost(name) for name in plan.savers]
    return plan


def preflight_main(
    script_args: Any,
    config: Any,
    *,
    gpu: str | float | None = None,
    gpu_memory_gib: float | None = None,
    lora_config: Any = None,
    world_size: int | None = None,
    fsdp: bool | None = None,
) -> int:
    """``sage-train --preflight``: print the plan; exit code 0 if it fits (or no budget was given), 1 if not."""
    plan = plan_training(
        config,
        lora_config=lora_config if lora_config is not None else script_args.peft_config(),
        world_size=world_size,
        fsdp=fsdp,
        gpu=gpu,
        gpu_memory_gib=gpu_memory_gib,
        rewards=script_args.reward,
    )
    print(plan.format())
    return 0 if plan.fits in (None, True) else 1
