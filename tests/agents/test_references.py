"""`ParameterSnapshot` on a module FSDP2 shards in place (``fully_shard``), as accelerate does when training starts.

A one-process gloo group is enough for FSDP2 to register sharded DTensor parameters, gather them in forward hooks
and keep the root unit unsharded after its forward: the cases the moving anchor must follow. The two-process
runs of tests/sage_trl/test_distributed.py train with it end to end.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from agents.references import ParameterSnapshot


@pytest.fixture
def process_group(tmp_path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def shard(module: torch.nn.Module) -> torch.nn.Module:
    """accelerate's FSDP2 wrapping: each block its own unit, the root last (kept unsharded after its forward)."""
    fully_shard(module[0])
    fully_shard(module, reshard_after_forward=False)
    return module


def perturb(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.5)


def test_the_snapshot_is_computed_with_after_the_module_was_sharded(process_group) -> None:
    module = model()
    snapshot = ParameterSnapshot(module)  # taken before sharding, as the trainer does
    initial = copy.deepcopy(module)
    shard(module)
    perturb(module)
    live = copy.deepcopy(initial)
    perturb(live)
    x = torch.randn(5, 4)
    torch.testing.assert_close(module(x), live(x))  # leaves the root unit unsharded
    with snapshot.applied():
        torch.testing.assert_close(module(x), initial(x))
    torch.testing.assert_close(module(x), live(x))
    assert all(isinstance(value, DTensor) for value in snapshot.values.values())


def test_a_refreshed_sharded_snapshot_saves_full_tensors_and_loads_them_back(process_group) -> None:
    module = shard(model())
    perturb(module)
    snapshot = ParameterSnapshot(module)
    module(torch.randn(2, 4))
    snapshot.refresh()  # values are shards of the live parameters
    state = snapshot.state_dict()
    assert all(type(value) is torch.Tensor for value in state.values())
    full = {name: p.full_tensor() for name, p in module.named_parameters()}
    assert state.keys() == full.keys() and all(torch.equal(state[n], full[n]) for n in full)
    perturb(module)
    snapshot.load_state_dict(state)
    with snapshot.applied():
        assert all(torch.equal(p.full_tensor(), full[n]) for n, p in module.named_parameters())
