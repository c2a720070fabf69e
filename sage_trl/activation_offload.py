"""Activation offload: gradient checkpointing whose saved block inputs wait in host memory.

With gradient checkpointing (diffusers' ``enable_gradient_checkpointing``) a training forward keeps only each
transformer block's inputs and recomputes the block in backward. At video sizes those inputs are most of what the
training micro-step holds: HunyuanVideo 1.5 at 81 x 480 x 848 has 33k tokens per video, and CFG's two branches
through 54 blocks keep ~14 GiB of them (``sage-train --preflight`` shows the phase). `offloaded_checkpoint` is
a checkpointing function that copies the inputs that carry gradients (the hidden states flowing block to block)
to the host, drops the device copy, and brings them back when backward recomputes the block: the device keeps
one block's activations instead of every block's inputs. The update is unchanged (same arithmetic: the forward
runs on the device tensors themselves, the recompute on their copies); the cost is two copies of every offloaded
input over PCIe (to the host in the forward, back for the recompute) and as much host RAM. Measured on an H200
machine (HunyuanVideo 1.5 480p, 14 GiB offloaded): the micro-step took 34.5 s against 25.5-26.4 s without, far
more than 28 GiB at PCIe speed (~1.5 s): most likely because the copies go to pageable host memory, which the copy
engine cannot overlap with compute.

Inputs that do not carry gradients (rotary tables, the timestep embedding, the text states of a frozen base) are
shared by every block and stay on the device. ``torch.autograd.graph.save_on_cpu`` would not do this job:
non-reentrant checkpointing keeps its inputs by reference, not as saved tensors, so the hook never sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["HOST", "host_copies_marked", "offloaded_checkpoint"]

HOST = torch.device("cpu")

_host_allocations: Callable[[], AbstractContextManager[None]] = nullcontext


@contextmanager
def host_copies_marked(marking: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """Enter ``marking()`` around every host copy `offloaded_checkpoint` makes in the block: how the preflight's
    trace, where every tensor is on the CPU, learns which storages are host memory."""
    global _host_allocations
    previous, _host_allocations = _host_allocations, marking
    try:
        yield
    finally:
        _host_allocations = previous


def _offloaded(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def offloaded_checkpoint(block: torch.nn.Module, *args: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)`` with the arguments that carry
    gradients held on the host until the block runs (diffusers' ``gradient_checkpointing_func`` signature)."""
    devices = [arg.device if _offloaded(arg) else None for arg in args]  # None: stays where it is
    held = []
    for arg, device in zip(args, devices):
        if device is not None:
            with _host_allocations():
                arg = arg.to(HOST, copy=True, non_blocking=True)
        held.append(arg)

    originals: list[Any] | None = list(args)

    def run(*inputs: Any) -> Any:
        nonlocal originals
        if originals is not None:  # the forward itself: the device tensors, then only the host copies are held
            values, originals = originals, None
            return block(*values)
        # The recompute in backward. copy=True: a new device tensor also where host and device are one (CPU, traces).
        restored = [
            value.to(device, copy=True, non_blocking=True) if device is not None else value
            for value, device in zip(inputs, devices)
        ]
        return block(*restored)

    return checkpoint(run, *held, use_reentrant=False)

