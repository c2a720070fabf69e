"""Record the calls a test makes into a module (how many, and with which inputs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def recorded_calls(module: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Yield a list that receives the keyword arguments (detached copies) of every forward call of ``module``."""
    calls: list[dict[str, Any]] = []

    def record(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        inputs = dict(kwargs)
        if args:
            inputs["args"] = args
        calls.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})

    handle = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()
