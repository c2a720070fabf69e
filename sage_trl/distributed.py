"""What a multi-process run needs beyond accelerate: a clean shutdown of the process group at exit.

Why the shutdown: with the gloo backend (CPU runs, and the collectives of a CPU launch), the last collective
of a run is often `transformers.Trainer.store_flos`'s all-gather at the end of ``train()``. gloo runs every
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
import weakref
from typing import Any

import torch.distributed as dist

__all__ = ["release_process_group_at_exit"]

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
