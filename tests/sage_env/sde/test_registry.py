"""SDE types are units in a registry: a new one is one class plus `register_sde`, nothing else branches on names,
and the inner step never waits for the device."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import agents
from sage_env import sde
from sage_env.env import DenoisingVectorEnv, run_episode
from sage_env.env.policy import BackbonePolicy
from tests.doubles import LinearBackbone, mean_brightness

ROOT = Path(__file__).resolve().parents[3]


class QuarterDanceSDE(sde.SDE):
    """A toy SDE type for the test, registered in-process: DanceGRPO's rule at a quarter of the variance (the
    example plug-in package declares another, ``half_dance``, as an entry point)."""

    name = "quarter_dance"
    notes = "a quarter of DanceGRPO's variance (test only)"
    reference = "tests/sage_env/sde/test_registry.py"

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return eta**2 * (sigma - sigma_next) / 4


@pytest.fixture
def quarter_dance() -> Iterator[sde.SDE]:
    unit = sde.register_sde(QuarterDanceSDE())
    try:
        yield unit
    finally:
        sde.SDE_REGISTRY.pop(unit.name)


def test_a_new_sde_type_is_one_class_and_its_registration(quarter_dance: sde.SDE) -> None:
    assert "quarter_dance" in sde.stochastic_sde_types()
    step = sde.sde_step(
        "quarter_dance", torch.randn(2, 3), torch.randn(2, 3), 0.6, 0.5, 0.8, x_next=torch.zeros(2, 3)
    )
    torch.testing.assert_close(step.std, torch.full((2,), (0.25 * 0.64 * 0.1) ** 0.5))
    assert torch.isfinite(
        sde.gradient_scale("quarter_dance", torch.tensor([0.6]), torch.tensor([0.5]), 0.8)
    ).all()
    env = DenoisingVectorEnv(
        LinearBackbone(), mean_brightness, ["a", "b"], num_envs=4, group_size=2, num_frames=2, height=4, width=4,
        num_steps=3, shift=1.0, sde="quarter_dance", eta=0.8, array_mode="torch",
    )  # fmt: skip
    agent = agents.make("reinforce", policy=env.backbone, sde="quarter_dance", eta=0.8)
    metrics = agent.update(run_episode(env, BackbonePolicy(env.backbone), seed=0))
    assert metrics["rollout/exploration_std"] > 0 and "policy_loss" in metrics


def test_unknown_and_duplicate_sde_types_are_refused(quarter_dance: sde.SDE) -> None:
    with pytest.raises(
        ValueError, match=r"Unknown SDE type 'langevin'; known: cps, dance_grpo, .*quarter_dance"
    ):
        sde.get_sde("langevin")
    with pytest.raises(ValueError, match="already registered"):
        sde.register_sde(QuarterDanceSDE())


_NAME_BRANCH = re.compile(
    r"""(==|!=|\bin\b)\s*\(?["'](sage|flow_grpo|dance_grpo|cps|ode)["']|["'](sage|flow_grpo|dance_grpo|cps|ode)["']\s*(==|!=)"""
)


def test_nothing_outside_the_sde_units_branches_on_sde_names() -> None:
    offenders = []
    for package in ("sage_env", "agents", "sage_trl"):
        for path in (ROOT / package).rglob("*.py"):
            if path.is_relative_to(ROOT / "sage_env" / "sde"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _NAME_BRANCH.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


class SynchronisationCounter(TorchDispatchMode):
    """Counts the ops that copy a tensor value to the host (a device synchronisation on an accelerator)."""

    HOST_READS: ClassVar[set[str]] = {
        "aten._local_scalar_dense.default",
        "aten.is_nonzero.default",
        "aten.item.default",
    }

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func) in self.HOST_READS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("sde_type", ["sage", "flow_grpo", "dance_grpo", "cps", "ode"])
def test_the_inner_step_reads_nothing_back_from_the_device(sde_type: str) -> None:
    latents, velocity = torch.randn(4, 3, 2, 4, 4), torch.randn(4, 3, 2, 4, 4)
    sigma, sigma_next = torch.tensor([0.9, 0.7, 0.5, 0.3]), torch.tensor([0.8, 0.6, 0.4, 0.0])
    generators = [torch.Generator().manual_seed(seed) for seed in range(4)]
    with SynchronisationCounter() as inner:
        sde.step(sde_type, latents, velocity, sigma, sigma_next, 0.5, generator=generators)
        sde.step(sde_type, latents, velocity, sigma, sigma_next, 0.5, x_next=latents)
    assert inner.count == 0
    with SynchronisationCounter() as validated:  # the public entry point validates, which reads values back
        sde.sde_step(sde_type, latents, velocity, sigma, sigma_next, 0.5, x_next=latents)
    assert validated.count > 0


def test_inner_and_validated_steps_agree() -> None:
    latents, velocity = torch.randn(3, 5), torch.randn(3, 5)
    sigma, sigma_next = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0.7, 0.4, 0.0])
    for sde_type in sde.SDE_TYPES:
        fast = sde.step(sde_type, latents, velocity, sigma, sigma_next, 0.6, x_next=latents + 0.1)
        checked = sde.sde_step(sde_type, latents, velocity, sigma, sigma_next, 0.6, x_next=latents + 0.1)
        for name in ("x_next", "mean", "std", "log_prob", "trainable"):
            assert torch.equal(getattr(fast, name), getattr(checked, name)), (sde_type, name)
