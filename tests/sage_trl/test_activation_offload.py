"""sage_trl/activation_offload.py: checkpointing with the block inputs that carry gradients held on the host (and the
other saver of the training micro-step, ``sequential_cfg``, against the CPU allocator the same way).

On this CPU machine host and device are one, so the tests check what does not depend on that: the gradients equal
plain checkpointing's, exactly the inputs that carry gradients are copied (and through the trace's marking), and
the preflight's trace of a tiny WanPipeline counts the copies as host memory, with device and host together equal
to the CPU allocator's count of the same step."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from sage_env.backbones import load_backbone
from sage_trl.activation_offload import host_copies_marked, offloaded_checkpoint
from sage_trl.preflight import resolve_model_configs
from sage_trl.preflight.measure import measure_training_step
from sage_trl.preflight.runner import trace_plan
from tests.sage_trl.preflight.tiny_plans import TOLERANCE, tiny_config, tiny_lora


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, hidden: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(hidden)) * scale


def gradients(function) -> list[torch.Tensor]:
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(3))
    hidden, scale = torch.randn(4, 8, requires_grad=True), torch.full((8,), 0.5)
    out = hidden
    for block in blocks:
        out = function(block, out, scale)
    out.square().sum().backward()
    return [hidden.grad, *(p.grad for p in blocks.parameters())]


def test_gradients_equal_plain_checkpointing_and_only_gradient_inputs_are_copied() -> None:
    copies: list[int] = []

    @contextmanager
    def marking():
        copies.append(1)
        yield

    with host_copies_marked(marking):
        offloaded = gradients(offloaded_checkpoint)
    plain = gradients(lambda block, *args: checkpoint(block, *args, use_reentrant=False))
    assert len(copies) == 3  # the hidden state into each block; the shared scale (no gradient) stays
    for mine, reference in zip(offloaded, plain, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)


def traced_micro_step(path: Path, tmp_path: Path, **overrides) -> tuple[object, object]:
    """``(config, its traced training micro-step)`` of the tiny config with ``overrides``."""
    config = tiny_config(path, tmp_path, **overrides)
    plan = trace_plan(config, tiny_lora(), model_configs=resolve_model_configs(str(path)))
    return config, next(p for p in plan.phases if p.name == "training micro-step")


def measured_micro_step(path: Path, config: object) -> object:
    """The CPU allocator's count of the same training micro-step (`measure_training_step`)."""
    torch.manual_seed(0)
    measured = measure_training_step(load_backbone(str(path)), config, tiny_lora())
    return next(m for m in measured if m.name == "training micro-step")


def test_trace_counts_the_copies_as_host_memory_and_matches_the_cpu_allocator(
    tiny_wan_path: Path, tmp_path: Path
) -> None:
    _, checkpointed = traced_micro_step(tiny_wan_path, tmp_path)
    config, offloaded = traced_micro_step(tiny_wan_path, tmp_path, activation_offload=True)
    offloaded_transient = offloaded.peak_bytes - offloaded.start_bytes
    assert offloaded_transient < checkpointed.peak_bytes - checkpointed.start_bytes  # the device holds less
    assert offloaded.total_transient_bytes > offloaded_transient  # the host holds the copies
    real = measured_micro_step(tiny_wan_path, config)
    # On a CPU host and device are one allocator: the trace's device + host is what it counts.
    assert (1 - TOLERANCE) * real.transient_bytes <= offloaded.total_transient_bytes <= real.transient_bytes


def test_sequential_cfg_trace_holds_one_branch_and_matches_the_cpu_allocator(
    tiny_wan_path: Path, tmp_path: Path
) -> None:
    # The other saver of the training micro-step (sequential_cfg), checked the same way.
    _, together = traced_micro_step(tiny_wan_path, tmp_path)
    config, taking_turns = traced_micro_step(tiny_wan_path, tmp_path, sequential_cfg=True)
    transient = taking_turns.peak_bytes - taking_turns.start_bytes
    assert transient < together.peak_bytes - together.start_bytes
    real = measured_micro_step(tiny_wan_path, config)
    assert (1 - TOLERANCE) * real.transient_bytes <= transient <= real.transient_bytes
