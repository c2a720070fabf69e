"""Reference policies for the KL terms, without a second copy of the model where avoidable.

* `ParameterSnapshot`: a copy of the *trainable* parameters only. With LoRA that is the adapter (a few MB):
  the paper's moving anchor (Eq. 13) costs one adapter, never a second model. With full fine-tuning it is
  a full copy, optionally kept on CPU between uses.
* `DisabledAdapters`: the initial model of a LoRA run is the base with its adapters switched off, so the
  fixed-KL reference (FlowGRPO) needs no memory at all.

A reference is used through ``with reference.applied(): ...``: inside the block the policy module computes
with the reference weights. Swapping is in place, so evaluate references *before* the policy forward
whose graph you will backpropagate through (the loss in `agents.algorithm` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["DisabledAdapters", "ParameterSnapshot", "has_lora_adapters", "initial_model", "trainable_parameters"]


def has_lora_adapters(module: torch.nn.Module) -> bool:
    """True when peft adapter layers are injected into ``module``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(layer, BaseTunerLayer) for layer in module.modules())


def trainable_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` of every parameter with ``requires_grad``."""
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


class ParameterSnapshot:
    """A frozen copy of a module's trainable parameters that can be swapped in temporarily.

    Parameters are looked up by name at every use, never held: a wrapper that shards the module in place
    (FSDP2's ``fully_shard``, applied when training starts) replaces the parameter objects by sharded DTensors.
    The copy then follows the layout of the live parameters: each process holds (and swaps in) only its own
    shard, so the anchor costs ``1 / world_size`` of the trainable weights per process.

    Args:
        module: the policy module (e.g. ``backbone.transformer``); only ``requires_grad`` parameters are
            copied, which for a LoRA run are exactly the adapter weights.
        offload: keep the copy on CPU between uses (worth it for full fine-tuning of large models).
    """

    def __init__(self, module: torch.nn.Module, offload: bool = False) -> None:
        self.module = module
        self.offload = offload
        self.names = tuple(trainable_parameters(module))
        if not self.names:
            raise ValueError(
                "The module has no trainable parameters to snapshot; enable training or add LoRA first."
            )
        self.values: dict[str, torch.Tensor] = {}
        self.refresh()

    @property
    def parameters(self) -> dict[str, torch.nn.Parameter]:
        """The module's current parameters of the snapshot, by name, in their sharded form when sharded.

        FSDP2 registers the gathered (unsharded) parameters while a unit stays unsharded after a forward (the
        root unit does, until its backward) and gathers again only from the sharded storage: values must be
        written there, with the unsharded copies dropped, so that the next forward gathers them.
        """
        _reshard(self.module)
        live = dict(self.module.named_parameters())
        return {name: live[name] for name in self.names}

    def refresh(self) -> None:
        """Copy the current trainable parameters into the snapshot (the paper's anchor update every N steps)."""
        with torch.no_grad():
            for name, parameter in self.parameters.items():
                target = "cpu" if self.offload else parameter.device
                self.values[name] = parameter.detach().to(target, copy=True)

    def blend(self, decay: float) -> None:
        """Move the snapshot toward the current parameters, ``snapshot <- decay * snapshot + (1 - decay) * live``
        (DiffusionNFT's soft update of its old policy; ``decay`` 0 is `refresh`)."""
        with torch.no_grad():
            for name, parameter in self.parameters.items():
                blended = torch.lerp(parameter.detach(), self._value_like(name, parameter), decay)
                self.values[name] = blended.to("cpu") if self.offload else blended

    def num_bytes(self) -> int:
        """Memory held by the snapshot (on this process)."""
        return sum(_local(v).numel() * v.element_size() for v in self.values.values())

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Compute with the snapshot's weights inside the block; the live weights are restored after.

        Values are copied into the parameters in place (not swapped by reassigning ``.data``): FSDP2 gathers
        from its own sharded storage, which a reassignment would leave untouched.
        """
        parameters = self.parameters
        with torch.no_grad():
            live = {name: parameter.detach().clone() for name, parameter in parameters.items()}
            for name, parameter in parameters.items():
                parameter.copy_(self._value_like(name, parameter))
        try:
            yield
        finally:
            with torch.no_grad():  # looked up again: units left unsharded by the block hold the snapshot
                for name, parameter in self.parameters.items():
                    parameter.copy_(live[name])

    def _value_like(self, name: str, parameter: torch.Tensor) -> torch.Tensor:
        """The snapshot of ``name`` in the layout of ``parameter`` (sharded once, when the module was sharded
        after the snapshot was taken) and on its device."""
        value = self.values[name]
        if _is_dtensor(parameter) and not _is_dtensor(value):
            value = _shard_like(value, parameter)
            self.values[name] = value.to("cpu") if self.offload else value
        return value.to(parameter.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The snapshot as full CPU tensors (for checkpoints).

        With sharded parameters this gathers the shards: every process must call it, as every process calls
        `refresh`.
        """
        parameters = self.parameters
        return {name: _full(self._value_like(name, parameters[name])) for name in self.names}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore `state_dict` (full tensors); names and shapes must match the module's trainable parameters."""
        if state.keys() != set(self.names):
            missing, unexpected = set(self.names) - state.keys(), state.keys() - set(self.names)
            raise ValueError(
                f"Snapshot does not match the module: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}."
            )
        for name, parameter in self.parameters.items():
            target = "cpu" if self.offload else parameter.device
            value = state[name].to(parameter.device, parameter.dtype, copy=True)
            value = _shard_like(value, parameter) if _is_dtensor(parameter) else value
            self.values[name] = value.to(target)


def _reshard(module: torch.nn.Module) -> None:
    """Put every FSDP2 unit of ``module`` in its sharded state (nothing to do for a module that is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of ``tensor`` (the tensor itself unless it is a sharded DTensor)."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _shard_like(full: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """Cut a full tensor, identical on every process, into ``parameter``'s layout (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(
        full.to(parameter.device), parameter.device_mesh, parameter.placements, src_data_rank=None
    )


def _full(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor on CPU (a collective for a sharded DTensor: every process must call it)."""
    return (value.full_tensor() if _is_dtensor(value) else value).detach().cpu()


class DisabledAdapters:
    """The base model of a LoRA run: adapters are switched off inside `applied`."""

    def __init__(self, module: torch.nn.Module) -> None:
        if not has_lora_adapters(module):
            raise ValueError(
                "DisabledAdapters needs a module with LoRA adapters; use ParameterSnapshot otherwise."
            )
        self.module = module

    def _layers(self) -> list[torch.nn.Module]:
        from peft.tuners.tuners_utils import BaseTunerLayer

        return [layer for layer in self.module.modules() if isinstance(layer, BaseTunerLayer)]

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Compute with the adapters disabled inside the block."""
        layers = self._layers()
        previously_disabled = [layer.disable_adapters for layer in layers]
        # peft's enable_adapters also toggles requires_grad: remember the flags and put them back after.
        requires_grad = {name: p.requires_grad for name, p in self.module.named_parameters()}
        for layer in layers:
            layer.enable_adapters(False)
        try:
            yield
        finally:
            for layer, disabled in zip(layers, previously_disabled):
                layer.enable_adapters(not disabled)
            for name, parameter in self.module.named_parameters():
                parameter.requires_grad_(requires_grad[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Nothing to save: the base weights are the reference."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Nothing to restore."""


def initial_model(module: torch.nn.Module, offload: bool = False) -> DisabledAdapters | ParameterSnapshot:
    """The initial model as a reference of ``module``: its adapter-free base when LoRA adapters are injected (nothing
    copied), else a copy of its trainable parameters (on CPU with ``offload``)."""
    return DisabledAdapters(module) if has_lora_adapters(module) else ParameterSnapshot(module, offload)
