"""Benchmark smoke tests run every script's ``main(["--quick", ...])`` in-process; the scripts set torch's
thread count, which this fixture restores so other tests are not affected."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    """Put torch's intra-op thread count back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
