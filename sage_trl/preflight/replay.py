"""Replaying repeated calls in a trace: a decode of N videos in tiles at the cost of its distinct decoder calls.

`replay_calls` wraps a method for the duration of a block. The first call with given argument metadata runs
under the meter and records its effect; a later call with the same metadata is not run: its effect is applied
instead (see `replay_calls`). The tests check a replayed VAE decode against the same decode run call by call.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from sage_trl.preflight.tracing import MemoryMeter

__all__ = ["replay_calls"]


@contextmanager
def replay_calls(meter: MemoryMeter, owner: Any, name: str) -> Iterator[None]:
    """Within the block, a call of ``owner.<name>`` whose arguments have the metadata of an earlier call is
    replayed instead of run: the earlier call's transient peak and FLOPs are added at the current memory, and
    tensors of the same shapes, strides and dtypes are returned and written where the earlier call wrote.

    For deterministic calls whose only effects are their outputs and item assignments in list arguments:
    a VAE's per-video ``_decode`` and its decoder's ``forward`` (Wan's causal-convolution cache is such a
    list). Decoding N videos of T latent frames in tiles then costs the trace a few distinct decoder calls,
    with the memory and FLOPs of all of them. A call that changes a list's length is never replayed.
    """
    original, memo = getattr(owner, name), {}

    def call(*args: Any, **kwargs: Any) -> Any:
        lists = [value for value in (*args, *kwargs.values()) if isinstance(value, list)]
        key = _call_key(args, kwargs)
        if key in memo:
            return _replay(meter, memo[key], lists)
        before = [[_reference(item) for item in items] for items in lists]
        start, flops, outer_peak = meter.device_bytes, meter.flops, meter.peak_bytes
        meter.peak_bytes = start
        out = original(*args, **kwargs)
        writes = _list_writes(before, lists)
        if writes is not None:
            memo[key] = (meter.peak_bytes - start, meter.flops - flops, tree_map(_metadata, out), writes)
        meter.peak_bytes = max(outer_peak, meter.peak_bytes)
        return out

    had_own = name in vars(owner)
    setattr(owner, name, call)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _replay(meter: MemoryMeter, record: tuple, lists: list[list]) -> Any:
    """Apply a recorded call's effect: its transient peak and FLOPs, its list writes, outputs like its own."""
    transient, flops, template, writes = record
    meter.peak_bytes = max(meter.peak_bytes, meter.device_bytes + transient)
    meter.flops += flops
    for which, slot, value in writes:
        lists[which][slot] = _empty_like_meta(value)
    return tree_map(_empty_like_meta, template)


@dataclass(frozen=True)
class _TensorMetadata:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


def _metadata(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _TensorMetadata(
            tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad
        )
    return value


def _empty_like_meta(value: Any) -> Any:
    if isinstance(value, _TensorMetadata):
        empty = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device=value.device)
        return empty.requires_grad_(value.requires_grad)
    return value


def _reference(item: Any) -> Any:
    """A tensor by weak reference (holding it would keep alive what the call frees), anything else as is."""
    return weakref.ref(item) if isinstance(item, torch.Tensor) else item


def _list_writes(before: list[list], after: list[list]) -> list[tuple[int, int, Any]] | None:
    """Item assignments a call made in its list arguments, as ``(list, slot, metadata or value)``; None if a
    list changed length (not replayable). ``before`` holds `_reference` of the items before the call."""
    writes = []
    for which, (old, new) in enumerate(zip(before, after)):
        if len(old) != len(new):
            return None
        for slot, item in enumerate(new):
            previous = old[slot]() if isinstance(old[slot], weakref.ref) else old[slot]
            if item is not previous:
                writes.append((which, slot, _metadata(item)))
    return writes


def _call_key(args: tuple, kwargs: dict) -> str:
    """The arguments of a call with tensors replaced by their metadata, as a hashable key."""
    return repr(tree_map(_metadata, (args, sorted(kwargs.items()))))
