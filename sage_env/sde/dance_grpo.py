"""DanceGRPO's SDE (Xue et al., 2025, arXiv 2505.07818; paper Table 1)."""

from __future__ import annotations

import torch

from sage_env.sde.base import SDE

__all__ = ["DanceGRPOSDE"]


class DanceGRPOSDE(SDE):
    """``std^2 = eta^2 d`` (Table 1), mean Eq. 7 (DanceGRPO's ``sde_solver`` score correction)."""

    name = "dance_grpo"
    notes = "DanceGRPO's variance"
    reference = (
        "XueZeyue/DanceGRPO, fastvideo/train_grpo_hunyuan.py, flux_step(sde_solver=True), read in the public "
        "fork hokindeng/DanceGRPO at commit c7c70f96bab41f3bdfbcdb3ed2154e5e65b7e2cf; also "
        "Tencent-Hunyuan/SAGE-GRPO's sde_type='dance_grpo' at c86886938386c4ae521cb08ac3d9f34928fbb7ae"
    )

    def variance(self, sigma: torch.Tensor, sigma_next: torch.Tensor, eta: float) -> torch.Tensor:
        return eta**2 * (sigma - sigma_next).clamp(min=0.0)
