"""What a multi-process run needs beyond accelerate: a launch check, DDP without unused-parameter search, and a
clean shutdown of the process group at exit.

**The launch check** (`check_launch`). accelerate resolves a launch into a distributed type from the environment
the launcher set and the devices it finds, and falls back silently where the two disagree. Each of these trains
something else than the launch asked for, so the trainer refuses them when it is built, before training:

* ``accelerate launch --cpu --num_processes N`` (or a ``MULTI_CPU`` config without ``mpirun``) starts one process
  with the per-process batch of N: the global batch is 1/N of what was asked for;
* a GPU config (``MULTI_GPU``, FSDP, DeepSpeed) on a machine without GPUs: every process runs alone, N copies of
  the same single-process run writing into one folder;
* an FSDP or DeepSpeed config whose engine accelerate did not turn on (it does so only on accelerator devices):
  the model trains unsharded (FSDP) or without ZeRO (DeepSpeed);
* more processes on a node than it has GPUs: accelerate puts process ``i`` on GPU ``i % count``, so several
  processes share one GPU.

**Unused parameters under DDP.** transformers asks DDP to search the autograd graph for parameters without
gradient after every backward (``find_unused_parameters=True``) for models that are not transformers models, and
DDP warns at every run where none is found. `SageGRPOConfig` turns the search off (``ddp_find_unused_parameters`` left
unset becomes False) and instead adds zero times every trainable parameter the first loss did not reach to each loss
(`parameters_outside`): DDP then sees a gradient for every parameter. HunyuanVideo 1.5 has such parameters (its
last block's text-stream output projections, whose output the model discards).

**The shutdown** (`release_process_group_at_exit`). With the gloo backend (CPU runs, and the collectives of a CPU
launch), the last collective of a run is often `transformers.Trainer.store_flos`'s all-gather at the end of ``train()``. gloo runs every
collective on worker threads; after a collective completes, the worker drops its reference to the work
object, and with it the last reference to the Python-owned tensors the work holds. When the script ends right
away, that drop can happen while the interpreter is already finalizing: the worker then cannot take the GIL,
the thread is unwound through a ``noexcept`` frame and the process dies with ``terminate called without an
active exception`` (SIGABRT), although training finished. torchrun then kills the other ranks, so the launch
fails. Seen here about once in 15 two-process runs.

The fix: before the interpreter finalizes (``atexit``), drop the trainer's references to the wrapped model
(a DDP module holds the process group) and destroy the process group. Its destructor joins the worker
threads while Python can still run their last reference drops. This is what `accelerate.Accelerator.end_training`
recommends at the end of a script, done for the user because a trainer script usually just ends.
"""

from __future__ import annotations

import atexit
import gc
import os
import weakref
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import DistributedType

__all__ = [
    "LaunchError",
    "check_launch",
    "launch_problems",
    "parameters_outside",
    "release_process_group_at_exit",
]

_ENGINES = {
    "ACCELERATE_USE_FSDP": DistributedType.FSDP,
    "ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED,
}
_HOW_TO_LAUNCH = (
    "Several CPU processes: `torchrun --nproc_per_node N $(command -v sage-train) ...` or `accelerate launch "
    "--multi_gpu --num_processes N ...`, each with use_cpu: true in the training config."
)


class LaunchError(RuntimeError):
    """The processes that run differ from what the launch asked for."""


def check_launch(accelerator: Any) -> None:
    """Refuse a launch that accelerate resolved into something else than it asked for (see the module docstring)."""
    state = accelerator.state
    problems = launch_problems(
        os.environ,
        distributed_type=state.distributed_type,
        num_processes=state.num_processes,
        device=state.device,
        device_count=torch.cuda.device_count() if state.device.type == "cuda" else None,
    )
    if problems:
        raise LaunchError(" ".join(problems))


def launch_problems(
    environ: Mapping[str, str],
    *,
    distributed_type: DistributedType,
    num_processes: int,
    device: torch.device,
    device_count: int | None,
) -> list[str]:
    """What differs between the launch (its environment) and the run accelerate set up; empty when nothing does."""
    problems = []
    asked = int(environ.get("WORLD_SIZE", "0"))
    if asked and asked != num_processes:
        problems.append(
            f"The launch started {asked} processes (WORLD_SIZE) but accelerate set this one up as one of "
            f"{num_processes} ({distributed_type.value} on {device.type}): each process would train on its own. "
            "On a machine without GPUs set use_cpu: true in the training config, or launch on GPUs."
        )
    elif "ACCELERATE_USE_CPU" in environ and "MASTER_ADDR" in environ and not asked:
        problems.append(
            "accelerate launch was asked for several processes (it set MASTER_ADDR) but started this one alone: its "
            "CPU launcher (--cpu, or a MULTI_CPU config without mpirun) runs one process, which would train with "
            f"1/N of the global batch. {_HOW_TO_LAUNCH} (Unset MASTER_ADDR to run one process on purpose.)"
        )
    for variable, engine in _ENGINES.items():
        if environ.get(variable, "").lower() == "true" and distributed_type != engine:
            problems.append(
                f"The launch asked for {engine.value} ({variable}=true) but accelerate set up "
                f"{distributed_type.value} on {device.type}: accelerate turns {engine.value} on only on GPUs and "
                "other accelerators, so the model would train without it. On GPUs leave use_cpu false in the "
                "training config; on CPU use a DDP launch."
            )
    local = int(environ.get("LOCAL_WORLD_SIZE", "0"))
    if device_count is not None and local > device_count:
        problems.append(
            f"{local} processes run on this node but it has {device_count} GPUs: accelerate would put several "
            "processes on one GPU. Launch at most one process per GPU (num_processes per node)."
        )
    return problems


def parameters_outside(output: torch.Tensor, module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """``module``'s trainable parameters that ``output``'s autograd graph does not reach (no gradient from it)."""
    reached: set[int] = set()
    seen: set[Any] = set()
    stack = [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf tensor it accumulates into
        if variable is not None:
            reached.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return [p for p in module.parameters() if p.requires_grad and id(p) not in reached]


_TRAINERS: weakref.WeakSet = weakref.WeakSet()
_REGISTERED = False


def release_process_group_at_exit(trainer: Any) -> None:
    """Release ``trainer``'s distributed wrappers and destroy the process group when the interpreter exits.

    Holds the trainer weakly: a trainer that is garbage-collected earlier is simply skipped. Idempotent.
    """
    global _REGISTERED
    _TRAINERS.add(trainer)
    if not _REGISTERED:
        atexit.register(_shutdown)
        _REGISTERED = True


def _release_wrappers(trainer: Any) -> None:
    """Forget the DDP/FSDP-wrapped model and accelerate's prepared objects (they keep the process group alive)."""
    if getattr(trainer, "model", None) is not None:
        trainer.model_wrapped = trainer.model
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None:
        accelerator.free_memory()


def _shutdown() -> None:
    for trainer in list(_TRAINERS):
        _release_wrappers(trainer)
    gc.collect()  # DDP modules sit in reference cycles: free them before the process group goes
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
