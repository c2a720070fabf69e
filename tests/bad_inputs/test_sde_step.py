"""The bad-input sweep through the public SDE step: each case names the input."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sage_env import sde

X = torch.randn(2, 3)
SDE_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: sde.sde_step("langevin", X, X, 0.5, 0.4, 0.5), "langevin"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, -0.5), "eta"),
    (lambda: sde.sde_step("cps", X, X, 0.5, 0.4, 1.5), "eta"),
    (lambda: sde.sde_step("sage", [[0.0]], X, 0.5, 0.4, 0.5), "latents"),
    (lambda: sde.sde_step("sage", X, torch.randn(2, 4), 0.5, 0.4, 0.5), "velocity"),
    (lambda: sde.sde_step("sage", X, torch.full((2, 3), math.nan), 0.5, 0.4, 0.5), "velocity"),
    (lambda: sde.sde_step("sage", X, X, 1.5, 0.4, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", X, X, 0.4, 0.5, 0.5), "sigma_next"),
    (lambda: sde.sde_step("sage", X, X, 0.0, 0.0, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", X, X, torch.tensor([0.5, 0.4, 0.3]), 0.1, 0.5), "sigma"),
    (lambda: sde.sde_step("sage", torch.ones(2, 3, dtype=torch.long), X, 0.5, 0.4, 0.5), "floating"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, x_next=torch.zeros(3)), "x_next"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, log_prob_kind="laplace"), "log-prob kind"),
    (lambda: sde.sde_step("sage", X, X, 0.5, 0.4, 0.5, generator=[torch.Generator()]), "generators"),
    (lambda: sde.flow_match_sigmas(0), "num_steps"),
    (lambda: sde.flow_match_sigmas(4, shift=math.nan), "shift"),
    (lambda: sde.equalizer_weights(torch.ones(3), eps=0), "equalizer_eps"),
    (lambda: sde.equalizer_weights(torch.ones(3), median="upper"), "equalizer_median"),
]


@pytest.mark.parametrize(("call", "words"), SDE_CASES, ids=[f"{i}-{w}" for i, (_, w) in enumerate(SDE_CASES)])
def test_the_sde_step_names_the_input(call: Callable[[], Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        call()
