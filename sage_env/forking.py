"""One torch thread in forked worker processes, so that gymnasium's ``AsyncVectorEnv`` workers never hang.

torch's CPU kernels run on an OpenMP thread pool. A process forked after its parent used that pool inherits a
pool whose threads do not exist in the child, and the child's first parallel kernel waits for them forever:
``gym.make_vec("sage_env/Toy-v0", vectorization_mode="async")`` after a rollout in the parent hung in the toy
reward's ``einsum`` until killed. A forked worker is one process among several on the same cores anyway, so it
runs with one thread, as PyTorch's own ``DataLoader`` workers do; `register_fork_handler` installs that rule for
every fork of a process that imported `sage_env` (``subprocess`` launches, which exec at once, are not affected).
Raise it again in a worker with ``torch.set_num_threads(n)`` if you know the pool is fresh there.
"""

from __future__ import annotations

import os

import torch

__all__ = ["register_fork_handler"]

_REGISTERED = False


def _one_thread_in_child() -> None:
    torch.set_num_threads(1)


def register_fork_handler() -> None:
    """Make every forked child of this process use one torch thread (idempotent)."""
    global _REGISTERED
    if not _REGISTERED and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_one_thread_in_child)
        _REGISTERED = True
