"""Let accelerate run its FSDP and DeepSpeed engines on CPU processes (gloo), for the multi-process tests here.

accelerate 1.15 sets these engines up only on accelerator devices; on CPU it falls back silently (which
`sage_trl.distributed.check_launch` refuses). PyTorch's ``fully_shard`` and DeepSpeed's ZeRO-2 both run on CPU with
gloo. Each switch below adds the CPU case to accelerate's own decision, doing for it what accelerate does for GPUs;
everything after that (``accelerator.prepare`` sharding the model with ``fully_shard`` or wrapping it in a DeepSpeed
engine, state dicts, optimizer and checkpoint saving and loading) is accelerate's, transformers' and DeepSpeed's
own code, as on GPUs.

* `enable_fsdp`: `accelerate.state.AcceleratorState` switches ``distributed_type`` to ``FSDP`` for ``MULTI_GPU``
  and the other device types but leaves ``MULTI_CPU`` alone; the switch adds ``MULTI_CPU``.
* `enable_deepspeed`: a DeepSpeed launch (``ACCELERATE_USE_DEEPSPEED=true``) without GPUs finds no backend, so
  every process runs alone; the switch answers "gloo over CPU processes", after which accelerate initialises
  DeepSpeed's communication as it does on GPUs. The training config must leave ``use_cpu`` false (accelerate never
  uses DeepSpeed with it). DeepSpeed's optional shared-memory all-reduce kernel for CPUs is not built (a C++
  extension compiled on first use, a minute here): gloo does its all-reduces.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

__all__ = ["enable_deepspeed", "enable_fsdp"]


def enable_fsdp() -> None:
    """Make accelerate honour an FSDP plugin (or an FSDP launch) on CPU. Call before any Accelerator exists."""
    original = AcceleratorState.__init__

    @functools.wraps(original)
    def init(self: AcceleratorState, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


def enable_deepspeed() -> None:
    """Make a DeepSpeed launch on a machine without GPUs use gloo over its CPU processes. Call before any
    Accelerator exists."""
    import deepspeed.comm.torch

    deepspeed.comm.torch.build_shm_op = lambda: None
    original = PartialState._prepare_backend

    @functools.wraps(original)
    def prepare_backend(self: PartialState, *args: Any, **kwargs: Any) -> tuple[str | None, DistributedType]:
        backend, distributed_type = original(self, *args, **kwargs)
        launched = int(os.environ.get("LOCAL_RANK", "-1")) != -1
        if (
            distributed_type == DistributedType.NO
            and launched
            and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
        ):
            return "gloo", DistributedType.MULTI_CPU
        return backend, distributed_type

    PartialState._prepare_backend = prepare_backend
