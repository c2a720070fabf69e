"""An SDE type: DanceGRPO's noise rule at half its variance."""

from __future__ import annotations

import torch

from sage_env import sde


class HalfDanceSDE(sde.SDE):
    """``std^2 = eta^2 d / 2``: DanceGRPO's variance halved (the mean is Eq. 7's score-corrected Euler step)."""

    name = "half_dance"
    notes = "half of DanceGRPO's variance"
    reference = "sage_example_plugins.sde (an example)"

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return 0.5 * eta**2 * (sigma - sigma_next)
