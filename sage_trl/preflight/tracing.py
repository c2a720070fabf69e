"""Run real code at full size without memory: fake tensors, a live-storage meter, and real values for small tensors.

`trace_session` enters three modes together:

* ``torch._subclasses.fake_tensor.FakeTensorMode``: every tensor created inside is a *fake* tensor (shape, dtype,
  strides, no data), so an 8B-parameter model and a 33k-token forward cost nothing but Python time;
* `MemoryMeter` (a ``TorchDispatchMode``): every operator's outputs register their storage with a weak
  reference, so the meter knows, after every operator, how many bytes of storage are alive; a phase's peak is
  the largest such total while the phase runs. Views and in-place results share their input's storage and are
  counted once; a storage is released when the last tensor using it dies (what the CUDA caching allocator sees
  as ``memory_allocated``). Storages can be marked as host memory (offloaded text encoders, a CPU anchor): they
  are reported apart from the device total.
* real values beside fake ones (the *shadow* values, also `MemoryMeter`): a tensor whose content is decided by
  the program alone (``torch.tensor(...)`` literals, ``zeros``/``ones``/``full``/``arange``, and every small
  result of operators on such tensors) keeps a real CPU copy (a ``zeros``/``ones``/``full`` result keeps one
  element for all, expanded only when the program writes known values into it, such as a mask being built). Data-dependent code then runs exactly as it
  would: ``bool(torch.all(sigma >= 0))``, ``mask.tolist()``, ``x[mask]`` (the boolean index becomes the real
  positions of its ``True`` entries), ``torch.nonzero(mask)``. This is how HunyuanVideo 1.5 traces: its forward
  asks ``torch.all(image_embeds == 0)`` (text-to-video passes zero image embeddings, a ``zeros`` literal, so the
  answer is the real ``True``) and reorders its text tokens with boolean masks built from the prompt's attention
  masks (real tensors from the tokenizer), so every branch and every data-dependent shape is the one a real run
  takes; only activations and weights, whose values no control flow reads, are fake. Memory and FLOPs depend
  on shapes and dtypes only, so they are those of the real run.

Why this and not the alternatives for HunyuanVideo 1.5: a ``ShapeEnv`` with unbacked symbols would make the
reordered text length a sum of unknown sizes, and every later operator on the joint video + text sequence
(concatenation, the key-padding mask, attention) would need guards on them that fake tensors cannot decide; an
attention processor of our own cannot remove the branch and the reorder, which live in diffusers' forward (the
library's key-padding processor, `sage_env.backbones._hunyuan_attention`, is installed as in a real run). The
shadow values run diffusers' forward unchanged with the values a real run reads, so the numbers do not change.

One kind of value read is not decided by the program: finiteness checks of activations
(``torch.isfinite(velocity).all()`` in `sage_env.sde`). `FiniteActivations` answers them as a finite run would,
with an all-``True`` (``isfinite``) or all-``False`` (``isnan``/``isinf``) mask of the same shape and size.
Any other read of a fake value raises `TraceError` naming the operator, so nothing is silently guessed.

The meter also counts FLOPs with ``torch.utils.flop_counter``'s formulas (plus PyTorch's fused CPU attention);
``FlopCounterMode`` itself is not used on top of a trace: it keeps gradient checkpointing from freeing activations.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper

__all__ = ["FiniteActivations", "MemoryMeter", "PhaseMemory", "TraceError", "trace_session"]

aten = torch.ops.aten

SHADOW_LIMIT = 1 << 22
"""Largest number of elements a real shadow value is computed for (4M: masks, sigmas, timesteps, indices)."""

_FILL_FACTORIES = {
    aten.zeros.default: 0,
    aten.zeros_like.default: 0,
    aten.new_zeros.default: 0,
    aten.ones.default: 1,
    aten.ones_like.default: 1,
    aten.new_ones.default: 1,
}
_EMPTY_FACTORIES = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
}


@shape_wrapper
def _cpu_attention_flops(
    query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return sdpa_flop_count(query, key, value)


@shape_wrapper
def _cpu_attention_backward_flops(
    grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return sdpa_backward_flop_count(grad, query, key, value)


FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    **flop_registry,
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flops,
}
"""``torch.utils.flop_counter``'s formulas (matmuls, convolutions, CUDA attention kernels) plus PyTorch's fused CPU
attention, which the traced attention runs on. Counted by the meter itself: ``FlopCounterMode`` on top of a trace
keeps gradient checkpointing from freeing activations."""


class TraceError(RuntimeError):
    """The traced code read a value that fake tensors do not have."""


@dataclass(frozen=True)
class PhaseMemory:
    """Device bytes of one traced phase: alive when it started, its peak, alive when it ended; and the same of
    device and host memory together (``total_*``: what one allocator would hold if both were one, as on a CPU)."""

    name: str
    start_bytes: int
    peak_bytes: int
    end_bytes: int
    flops: int = 0
    total_start_bytes: int = 0
    total_peak_bytes: int = 0

    @property
    def transient_bytes(self) -> int:
        """Peak above the bytes alive at the start: what the phase itself allocates at its worst moment."""
        return self.peak_bytes - self.start_bytes


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in operator arguments or outputs (flat values, lists/tuples of them, dicts)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)) and all(not isinstance(v, (list, tuple, dict)) for v in tree):
        return [v for v in tree if isinstance(v, torch.Tensor)]
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


_WRITTEN: dict[Any, tuple[tuple[int, str], ...]] = {}


def _mutated_arguments(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensor arguments the operator writes to (its schema's ``Tensor(a!)`` arguments)."""
    written = _WRITTEN.get(func)
    if written is None:
        arguments = enumerate(func._schema.arguments)
        written = tuple(
            (i, a.name) for i, a in arguments if a.alias_info is not None and a.alias_info.is_write
        )
        _WRITTEN[func] = written
    mutated: list[torch.Tensor] = []
    for position, name in written:
        mutated += _tensors(args[position] if position < len(args) else kwargs.get(name))
    return mutated


class MemoryMeter(TorchDispatchMode):
    """Counts the bytes of live tensor storages operator by operator, and keeps real values of small tensors.

    Use through `trace_session`. ``fake_mode`` is the ``FakeTensorMode`` below this mode on the stack (it turns
    real index tensors into fake ones).
    """

    def __init__(self, fake_mode: FakeTensorMode, shadow_limit: int = SHADOW_LIMIT) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.shadow_limit = shadow_limit
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._host: set[int] = set()
        self._allocating_host = False
        self._shadows: dict[int, torch.Tensor] = {}
        self.device_bytes = 0
        self.host_bytes = 0
        self.peak_bytes = 0
        self.total_peak_bytes = 0
        self.flops = 0
        self.phases: list[PhaseMemory] = []

    # -- storages --------------------------------------------------------------------------------

    def _release(self, key: int) -> None:
        self._refs.pop(key, None)
        self._shadows.pop(key, None)
        size = self._sizes.pop(key, 0)
        if key in self._host:
            self._host.discard(key)
            self.host_bytes -= size
        else:
            self.device_bytes -= size

    def _raise_peaks(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.device_bytes)
        self.total_peak_bytes = max(self.total_peak_bytes, self.device_bytes + self.host_bytes)

    def track(self, tensor: torch.Tensor) -> int:
        """Register ``tensor``'s storage if it is new; returns the storage's key."""
        storage = tensor.untyped_storage()
        key, size = id(storage), storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            self._refs[key] = weakref.ref(storage, lambda _, key=key: self._release(key))
            if self._allocating_host:
                self._host.add(key)
        if known != size:  # new, or grown in place (``resize_``)
            self._sizes[key] = size
            if key in self._host:
                self.host_bytes += size - (known or 0)
            else:
                self.device_bytes += size - (known or 0)
            self._raise_peaks()
        return key

    @contextmanager
    def host_allocations(self) -> Iterator[None]:
        """Storages created in the block are host memory (the copies a saver makes to the host)."""
        previous, self._allocating_host = self._allocating_host, True
        try:
            yield
        finally:
            self._allocating_host = previous

    def storage_bytes(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bytes of the distinct storages behind ``tensors`` (views and shared storages counted once)."""
        return sum(self._sizes.get(self.track(tensor), 0) for tensor in {id(t): t for t in tensors}.values())

    def set_host(self, tensors: Iterable[torch.Tensor], host: bool = True) -> None:
        """Mark the storages of ``tensors`` as host (CPU) memory, or back as device memory."""
        for tensor in tensors:
            key = self.track(tensor)
            if host != (key in self._host):
                self._move(key, host)

    def _move(self, key: int, host: bool) -> None:
        size = self._sizes[key]
        if host:
            self._host.add(key)
        else:
            self._host.discard(key)
        self.device_bytes += -size if host else size
        self.host_bytes += size if host else -size
        self._raise_peaks()

    def on_host(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Whether every storage behind ``tensors`` is marked as host memory."""
        return all(self.track(tensor) in self._host for tensor in tensors)

    def live_storages(self) -> set[int]:
        """Keys of the storages alive now (to find, later, what a block of code left behind)."""
        return set(self._sizes)

    def set_host_storages(self, keys: Iterable[int]) -> None:
        """Mark storages, by key (see `live_storages`), as host memory."""
        for key in keys:
            if key in self._sizes and key not in self._host:
                self._move(key, host=True)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the device peak of the block as the phase ``name`` (appended to `phases`)."""
        start, flops, total_start = self.device_bytes, self.flops, self.device_bytes + self.host_bytes
        outer_peak, self.peak_bytes = self.peak_bytes, start
        outer_total_peak, self.total_peak_bytes = self.total_peak_bytes, total_start
        try:
            yield
        finally:
            self.phases.append(
                PhaseMemory(
                    name, start, self.peak_bytes, self.device_bytes, self.flops - flops,
                    total_start, self.total_peak_bytes,
                )
            )
            self.peak_bytes = max(outer_peak, self.peak_bytes)
            self.total_peak_bytes = max(outer_total_peak, self.total_peak_bytes)

    # -- shadow values ---------------------------------------------------------------------------

    def _known(self, tensor: torch.Tensor) -> bool:
        """Whether `real_value` of ``tensor`` is not None (without building it)."""
        if not isinstance(tensor, FakeTensor):
            return True
        base = self._shadows.get(id(tensor.untyped_storage()))
        return base is not None and base.dtype == tensor.dtype

    def real_value(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The real content of ``tensor`` when the program decided it (None for fake activations and weights)."""
        if not isinstance(tensor, FakeTensor):
            return tensor
        base = self._shadows.get(id(tensor.untyped_storage()))
        if base is None or base.dtype != tensor.dtype:
            return None
        with unset_fake_temporarily():
            if self._is_fill(tensor):
                return base.reshape(()).expand(tensor.shape)  # a fill: every element has the one value
            return base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())

    def _remember(self, fake: Any, real: Any) -> None:
        for fake_tensor, real_tensor in zip(_tensors(fake), _tensors(real)):
            if not isinstance(fake_tensor, FakeTensor) or real_tensor.numel() > self.shadow_limit:
                continue
            key = self.track(fake_tensor)
            if key in self._shadows:
                continue  # a view of a shadowed storage: the base shadow already holds it
            storage = real_tensor.untyped_storage()
            with unset_fake_temporarily():
                flat = torch.empty(0, dtype=real_tensor.dtype)
                flat.set_(storage, 0, (storage.nbytes() // real_tensor.element_size(),))
            self._shadows[key] = flat

    def _remember_fill(self, fake: torch.Tensor, value: float, dtype: torch.dtype) -> None:
        """A ``zeros``/``ones``/``full`` result: one element stands for all of them until the program writes known
        values into it (a mask being built: `_materialise`); gradients and optimizer states stay one element."""
        with unset_fake_temporarily():
            self._shadows[self.track(fake)] = torch.full((1,), value, dtype=dtype)

    def _materialise(self, tensor: torch.Tensor) -> bool:
        """Expand a fill's stand-in to the real storage (when small enough) so that a known write can go in."""
        storage = tensor.untyped_storage()
        elements = storage.nbytes() // tensor.element_size()
        if elements > self.shadow_limit:
            return False
        key = id(storage)
        with unset_fake_temporarily():
            self._shadows[key] = self._shadows[key].expand(elements).clone()
        return True

    def _forget(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            if isinstance(tensor, FakeTensor):
                self._shadows.pop(id(tensor.untyped_storage()), None)

    def _fake(self, real: torch.Tensor) -> torch.Tensor:
        return self.fake_mode.from_tensor(real)

    # -- dispatch --------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            return self._read_scalar(args[0])
        inputs = _tensors(args) + (_tensors(kwargs) if kwargs else [])
        known = all(self._known(tensor) for tensor in inputs)
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            out = self._data_dependent(func, args, kwargs, known)
        self._account(func, args, kwargs, out, known)
        formula = FLOP_FORMULAS.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out

    def _read_scalar(self, tensor: torch.Tensor) -> Any:
        real = self.real_value(tensor)
        if real is None:
            raise TraceError(
                "The traced code reads the value of a fake tensor (an activation or a weight) with .item(), bool() "
                "or .tolist(); only values the program decides itself (literals, masks, sigmas) are known."
            )
        with unset_fake_temporarily():
            return real.item()

    def _run_real(self, func: Any, args: tuple, kwargs: dict) -> Any:
        with unset_fake_temporarily():
            real_args, real_kwargs = tree_map(self._real_or_self, (args, kwargs))
            return func(*real_args, **real_kwargs)

    def _real_or_self(self, value: Any) -> Any:
        return self.real_value(value) if isinstance(value, torch.Tensor) else value

    def _data_dependent(self, func: Any, args: tuple, kwargs: dict, known: bool) -> Any:
        """An operator whose output shape depends on values: computed for real when its inputs are known, or
        with boolean indices replaced by the real positions of their ``True`` entries."""
        if known:
            real = self._run_real(func, args, kwargs)
            out = tree_map(lambda x: self._fake(x) if isinstance(x, torch.Tensor) else x, real)
            self._remember(out, real)
            return out
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            return func(*self._positional_indices(args), **kwargs)
        raise TraceError(
            f"{func} has an output shape that depends on the values of a fake tensor; the trace cannot follow it."
        )

    def _positional_indices(self, args: tuple) -> tuple:
        indices = []
        for index in args[1]:
            real = self.real_value(index) if isinstance(index, torch.Tensor) else None
            if index is not None and index.dtype in (torch.bool, torch.uint8):
                if real is None:
                    raise TraceError("A boolean index of fake values (not a known mask) has no known shape.")
                with unset_fake_temporarily():
                    positions = real.bool().nonzero(as_tuple=True)
                indices += [self._fake(position) for position in positions]
            else:
                indices.append(index)
        return (args[0], indices, *args[2:])

    def _account(self, func: Any, args: tuple, kwargs: dict, out: Any, known: bool) -> None:
        for tensor in _tensors(out):
            if isinstance(tensor, FakeTensor):
                self.track(tensor)
        mutated = _mutated_arguments(func, args, kwargs)
        if func in _FILL_FACTORIES:
            self._remember_fill(out, _FILL_FACTORIES[func], out.dtype)
        elif func is aten.full.default or func is aten.full_like.default or func is aten.new_full.default:
            self._remember_fill(out, args[1] if func is not aten.new_full.default else args[2], out.dtype)
        elif known and func not in _EMPTY_FACTORIES and self._decided(func, kwargs):
            self._shadow(func, args, kwargs, out, mutated)
        else:
            self._forget(mutated)

    @staticmethod
    def _decided(func: Any, kwargs: dict) -> bool:
        """Whether the program decides the result: any deterministic operator, and random ones drawn from an
        explicit ``torch.Generator`` (e.g. the algorithm's seeded timestep permutation), which the real computation
        advances exactly as the traced program would."""
        return torch.Tag.nondeterministic_seeded not in func.tags or kwargs.get("generator") is not None

    def _shadow(self, func: Any, args: tuple, kwargs: dict, out: Any, mutated: list[torch.Tensor]) -> None:
        outputs = _tensors(out)
        if not outputs + mutated or any(tensor.numel() > self.shadow_limit for tensor in outputs + mutated):
            self._forget(mutated)
            return
        fills = [t for t in mutated if isinstance(t, FakeTensor) and self._is_fill(t)]
        if not all(self._materialise(fill) for fill in fills):
            self._forget(mutated)
            return
        real = self._run_real(func, args, kwargs)
        if not mutated:
            self._remember(out, real)

    def _is_fill(self, tensor: torch.Tensor) -> bool:
        """True for the one-element stand-in of a large ``zeros``/``ones``/``full`` result."""
        base = self._shadows.get(id(tensor.untyped_storage()))
        return (
            base is not None and base.numel() == 1 and tensor.untyped_storage().nbytes() > base.element_size()
        )


class FiniteActivations(TorchFunctionMode):
    """``isfinite`` / ``isnan`` / ``isinf`` of a fake tensor answer as for finite values (see the module docstring)."""

    _ANSWERS: ClassVar[dict[Callable, bool]] = {
        torch.isfinite: True,
        torch.Tensor.isfinite: True,
        torch.isnan: False,
        torch.Tensor.isnan: False,
        torch.isinf: False,
        torch.Tensor.isinf: False,
    }

    def __init__(self, meter: MemoryMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func not in self._ANSWERS or not isinstance(args[0], FakeTensor):
            return func(*args, **kwargs)
        real = self.meter.real_value(args[0])
        if real is not None and args[0].numel() <= self.meter.shadow_limit:
            return func(*args, **kwargs)
        if real is not None:  # a large fill: the answer of its one value, everywhere
            with unset_fake_temporarily():
                answer = bool(func(real.reshape(-1)[:1])[0])
        else:
            answer = self._ANSWERS[func]
        return torch.full_like(args[0], answer, dtype=torch.bool)


def _no_memo(tensor: torch.Tensor, fake: torch.Tensor) -> None:
    """Replacement of ``FakeTensorConverter.set_tensor_memo`` that remembers nothing (see `trace_session`)."""


@contextmanager
def trace_session() -> Iterator[MemoryMeter]:
    """Fake tensors, the memory meter and `FiniteActivations` for the block; yields the meter."""
    fake_mode = FakeTensorMode()
    # The converter remembers every fake tensor it makes through a weak reference, and torch.nn.Module.to() swaps
    # fake parameters with torch.utils.swap_tensors, which refuses tensors that have weak references: without
    # the memo (an optimisation for converting the same real tensor twice) `module.to(dtype)` works on fake modules.
    fake_mode.fake_tensor_converter.set_tensor_memo = _no_memo
    meter = MemoryMeter(fake_mode)
    with fake_mode, meter, FiniteActivations(meter):
        yield meter
