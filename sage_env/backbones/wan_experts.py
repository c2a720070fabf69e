"""Both Wan 2.2 A14B experts as one trainable module (`WanExperts`), and the idle expert's swap to the host.

Wan 2.2 A14B denoises with two transformers of the same architecture: ``pipe.transformer`` at high noise
(``timestep >= boundary_ratio * 1000``) and ``pipe.transformer_2`` at low noise. Training both in one run
(``WanBackbone(expert="both")``) needs one module that holds both, because everything a trainer builds around
"the model" is built once: transformers' optimizer, DDP and FSDP wrapping, the moving anchor (a snapshot of the
trainable parameters by name), checkpoints. `WanExperts` is that module. Its parameters are the two experts'
under the prefixes ``transformer.`` and ``transformer_2.``, so every parameter, anchor value and optimizer group
keeps saying which expert it belongs to. The pipeline keeps the same two modules, so ``pipe(...)`` is unchanged.

``forward(expert, **inputs)`` runs one expert: a DDP-wrapped `WanExperts` is called as
``model("transformer_2", hidden_states=..., ...)`` and DDP sees a forward of the wrapped module, as it must.

Swapping (``offload_idle``): the experts never compute together, so with LoRA only one expert's frozen
weights (26.6 GiB in bf16 at 14B) need be on the accelerator at a time. `WanExperts.activate` moves the idle
expert's frozen tensors to the host and the active one's to the accelerator; trainable tensors (the adapters)
stay where they are, so the optimizer state and the anchor never move. Rollouts visit the high-noise steps
before the low-noise ones and the trainer groups its micro-batches by expert, so a swap happens at most twice per
rollout and twice per optimizer step (`sage_trl.preflight` counts them). Whole-module moves (``module.to(...)``: the
prompt precompute bringing the model back, transformers' Trainer and accelerate's ``prepare``) leave the idle expert's
frozen tensors on the host, so the accelerator never holds both experts' weights, not even during set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["EXPERT_NAMES", "WanExperts"]

EXPERT_NAMES = ("transformer", "transformer_2")
"""Wan 2.2 A14B's experts, high noise first: the pipeline's attribute names, the prefixes of `WanExperts`'s
parameters, and the ``load_into_transformer_2`` convention of diffusers' LoRA loader."""

SwapObserver = Callable[[Sequence[torch.Tensor], bool], None]
"""Called with the tensors a swap moved and ``True`` when they went to the host (the preflight's bookkeeping)."""


class WanExperts(torch.nn.Module):
    """Wan 2.2 A14B's two experts as one ``torch.nn.Module`` (see the module docstring).

    Args:
        transformer: the high-noise expert (``pipe.transformer``).
        transformer_2: the low-noise expert (``pipe.transformer_2``), of the same class.
    """

    def __init__(self, transformer: torch.nn.Module, transformer_2: torch.nn.Module) -> None:
        super().__init__()
        if type(transformer) is not type(transformer_2):
            raise ValueError(
                f"Both experts must be of one class, got {type(transformer).__name__} and "
                f"{type(transformer_2).__name__}."
            )
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.offload_idle = False
        self.swap_observer: SwapObserver | None = None
        self.active: str | None = None
        self.swaps = 0

    def forward(self, expert: str, **inputs: Any) -> Any:
        """``expert``'s forward on ``inputs`` (the diffusers transformer's keyword arguments)."""
        return self.expert(expert)(**inputs)

    def expert(self, name: str) -> torch.nn.Module:
        """The expert called ``name`` (one of `EXPERT_NAMES`)."""
        if name not in EXPERT_NAMES:
            raise ValueError(f"expert must be one of {EXPERT_NAMES}, got {name!r}.")
        return getattr(self, name)

    def experts(self) -> dict[str, torch.nn.Module]:
        """``{name: expert}``, high noise first."""
        return {name: getattr(self, name) for name in EXPERT_NAMES}

    # -- what diffusers models offer and the trainer uses ------------------------------------------

    @property
    def config(self) -> Any:
        """The experts' shared architecture config (the high-noise expert's)."""
        return self.transformer.config

    @property
    def dtype(self) -> torch.dtype:
        """The experts' compute dtype (diffusers' ``ModelMixin.dtype`` of the high-noise expert)."""
        return self.transformer.dtype

    @property
    def device(self) -> torch.device:
        """Where the experts compute: the device of the trainable parameters (which never swap), else of the
        first parameter."""
        trainable = next((p for p in self.parameters() if p.requires_grad), None)
        return (trainable if trainable is not None else next(self.parameters())).device

    @property
    def _no_split_modules(self) -> list[str]:
        """The experts' blocks (the unit FSDP wraps and the preflight measures)."""
        return list(getattr(self.transformer, "_no_split_modules", None) or [])

    @property
    def peft_config(self) -> dict[str, Any]:
        """The high-noise expert's adapters (`add_adapter` gives both experts the same ones)."""
        return getattr(self.transformer, "peft_config", None) or {}

    def add_adapter(self, adapter_config: Any, adapter_name: str = "default") -> None:
        """Inject the same LoRA config into both experts (each gets its own, independently trained weights). The
        adapters live where the computing expert computes: peft makes each next to its base layer, which for the idle
        expert may be waiting on the host, and trainable tensors never swap."""
        device = next(self.expert(self.computing).parameters()).device
        for module in self.experts().values():
            module.add_adapter(adapter_config, adapter_name=adapter_name)
        for parameter in self.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(device)

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether both experts checkpoint their blocks (diffusers' ``is_gradient_checkpointing``)."""
        return all(module.is_gradient_checkpointing for module in self.experts().values())

    def enable_gradient_checkpointing(self, **kwargs: Any) -> None:
        """diffusers' ``enable_gradient_checkpointing`` on both experts (same arguments)."""
        for module in self.experts().values():
            module.enable_gradient_checkpointing(**kwargs)

    # -- the idle expert on the host -----------------------------------------------------------------

    @property
    def computing(self) -> str:
        """The expert whose frozen weights are (or, before the first `activate`, will be) on the device: the active
        one, else the high-noise one, which computes first (rollouts start at high noise)."""
        return self.active or EXPERT_NAMES[0]

    def _apply(self, fn: Any, recurse: bool = True) -> WanExperts:
        """``module.to(...)``, ``.half()`` and the like, for every tensor but, with `offload_idle`, the idle expert's
        frozen ones: those take ``fn``'s dtype and stay on the host. Otherwise the prompt precompute's move back
        and accelerate's ``prepare`` (``model.to(device)``) would put both experts on the device at once, which a
        card smaller than the two (53.4 GiB in bf16) cannot hold."""
        if not self.offload_idle:
            self.active = None
            return super()._apply(fn, recurse)
        computing = self.computing
        held = {id(tensor) for name, module in self.experts().items() if name != computing
                for tensor in _frozen_tensors(module)}

        def hold_on_host(tensor: torch.Tensor) -> torch.Tensor:
            if id(tensor) not in held:
                return fn(tensor)
            converted = fn(torch.empty(0, dtype=tensor.dtype))  # fn's dtype for such a tensor, without moving it
            return tensor.to(device="cpu", dtype=converted.dtype)

        return super()._apply(hold_on_host, recurse)  # `active` stays: the placement it stands for is kept

    def activate(self, name: str) -> None:
        """Make ``name`` the computing expert: with `offload_idle`, the other one's frozen tensors go to the host
        and this one's to the trainable parameters' device (nothing moves when ``name`` is already active and the
        other one still on the host)."""
        self.expert(name)
        if self.active == name and any(self._frozen_on_device(o) for o in self.experts() if o != name):
            self.active = None  # an expert was moved from outside (``pipe.transformer_2.to(...)``)
        if not self.offload_idle or self.active == name:
            self.active = name
            return
        device = self.device
        for other, module in self.experts().items():  # out first: the device never holds both
            if other != name:
                self._move_frozen(module, device, to_host=True)
        self._move_frozen(self.expert(name), device, to_host=False)
        self.active = name
        self.swaps += 1

    def _move_frozen(self, module: torch.nn.Module, device: torch.device, *, to_host: bool) -> None:
        """Move ``module``'s frozen parameters and buffers to the host (``to_host``) or to ``device``, in place (their
        ``.data``): the module keeps its parameter objects, so the optimizer, the anchor and any hook still find
        them."""
        frozen = _frozen_tensors(module)
        for tensor in frozen:
            tensor.data = tensor.data.to("cpu" if to_host else device)
        if self.swap_observer is not None:
            self.swap_observer(frozen, to_host)

    def _frozen_on_device(self, name: str) -> bool:
        """Whether ``name``'s frozen weights are off the host (checked on its first frozen parameter)."""
        frozen = next((p for p in self.expert(name).parameters() if not p.requires_grad), None)
        return frozen is not None and frozen.device.type != "cpu"

    def frozen_bytes(self, name: str) -> int:
        """Bytes of ``name``'s frozen tensors: what one swap of that expert moves."""
        return sum(t.numel() * t.element_size() for t in _frozen_tensors(self.expert(name)))


def _frozen_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """What a swap moves: the module's parameters that do not train, and its buffers."""
    return [p for p in module.parameters() if not p.requires_grad] + list(module.buffers())
