"""Compute counted, not timed: every forward of a run's diffusers transformer is counted with its rows (with and
without gradient, and whether it was a held-out evaluation's), and torch's FLOP counter prices one row's forward,
and one row's forward plus backward, of the run's own transformer at the end. The counts compare across machines;
the wall time beside them does not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["TransformerRowCounter", "count_transformer_rows"]


class TransformerRowCounter:
    """A global module forward hook counting the rows of every top-level diffusers transformer forward, by kind:
    ``grad`` (training forwards, priced with their backward), ``no_grad`` (rollouts, references, old policies) and
    ``evaluation`` (held-out evaluations: `sage_trl.evaluation.sampling_held_out`)."""

    KINDS = ("grad", "no_grad", "evaluation")

    def __init__(self) -> None:
        self.rows = dict.fromkeys(self.KINDS, 0)
        self.module: torch.nn.Module | None = None
        self.inputs: dict[str, torch.Tensor] = {}

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        from diffusers import ModelMixin

        from sage_trl.evaluation import sampling_held_out

        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if not isinstance(module, ModelMixin) or not isinstance(hidden, torch.Tensor):
            return
        kind = "evaluation" if sampling_held_out() else "grad" if torch.is_grad_enabled() else "no_grad"
        self.rows[kind] += int(hidden.shape[0])
        if self.module is None:
            self.module = module
            self.inputs = {k: v[:1].detach() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}

    def flops(self) -> dict[str, float]:
        """FLOPs of the counted rows by kind, and ``train`` (rollouts and training: what the algorithm spends) and
        ``total``; priced on the first transformer seen."""
        from torch.utils.flop_counter import FlopCounterMode

        if self.module is None:
            return {kind: 0.0 for kind in (*self.KINDS, "train", "total")}
        with torch.no_grad(), FlopCounterMode(display=False) as forward:
            self.module(**self.inputs)
        with FlopCounterMode(display=False) as training:
            output = self.module(**self.inputs)
            output = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
            output.float().sum().backward()
        self.module.zero_grad(set_to_none=True)
        per_row = {"grad": training.get_total_flops(), "no_grad": forward.get_total_flops()}
        per_row["evaluation"] = per_row["no_grad"]
        flops = {kind: float(per_row[kind] * self.rows[kind]) for kind in self.KINDS}
        flops["train"] = flops["grad"] + flops["no_grad"]
        flops["total"] = flops["train"] + flops["evaluation"]
        return flops


@contextlib.contextmanager
def count_transformer_rows() -> Iterator[TransformerRowCounter]:
    """Count every transformer forward in this process while the block runs; the forwards of held-out evaluations
    (`sage_trl.evaluation.evaluate_policy`, the trainer's included) count as ``evaluation``."""
    counter = TransformerRowCounter()
    handle = torch.nn.modules.module.register_module_forward_hook(counter, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()
