"""Training several experts in one run (Wan 2.2 A14B with ``expert: both``): micro-batches, optimizer groups,
per-expert metrics.

Each training pair is computed by the expert that produced its rollout step (`VideoBackbone.expert_of` of its
sigma: the pipeline's own routing), so its gradient reaches that expert only. The trainer groups a step's pairs by
expert and cuts each group into micro-batches, so that a micro-batch runs one expert:

* with ``offload_idle_expert`` the other expert's frozen weights can wait on the host (a swap per group, not per
  micro-batch: `sage_env.backbones.wan_experts`);
* every process runs the same number of micro-batches of each expert, in the same order (FSDP gathers an expert's
  weights in each forward: two processes running different experts at once would gather each other's shards);
  a process with fewer pairs of an expert runs weightless micro-batches routed to that expert (`routed_to`).

Each expert's loss is the mean over its own pairs (over all processes), as if it trained alone: one expert's
gradient does not shrink because the other has more pairs in the step (`sage_trl.trainer.SageGRPOTrainer`'s
``_loss_chunks``). The optimizer gets one parameter group per expert and weight-decay class, each marked with its ``"expert"``,
so that a callback or scheduler can treat the experts apart; the moving anchor is a snapshot by parameter name,
hence one per expert; the KL, clip fraction and policy loss are also logged per expert (``expert/<name>/...``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

__all__ = ["EXPERT_METRICS", "expert_groups", "expert_parameter_groups", "routed_to"]

EXPERT_METRICS = ("policy_loss", "kl/total", "clip_fraction", "ratio_mean")
"""Loss metrics logged per expert as well (``expert/<name>/<metric>``) when several experts train."""


def expert_groups(batch: Any, backbone: Any) -> dict[int, Any]:
    """``{expert index: the rows of batch that expert computes}`` for each expert that trains
    (`VideoBackbone.trained_experts`), in that order; the whole batch for a single-expert model. Rows of an expert
    that does not train are left out: their loss reaches no trainable weight (Wan 2.2 A14B with one expert trained
    computes only that expert's steps)."""
    if len(backbone.expert_names) == 1:
        return {0: batch}
    experts = backbone.expert_of(batch.sigma).to(batch.sample_index.device)
    return {index: batch.select(torch.nonzero(experts == index).flatten()) for index in backbone.trained_experts}


def routed_to(chunk: Any, trajectory: Any, backbone: Any, expert: int) -> Any:
    """``chunk`` (a weightless padding micro-batch) with every row's noise level moved to a trainable step of
    ``expert``, so that the micro-batch runs that expert; a chunk already all of ``expert`` is returned as it is."""
    if bool((backbone.expert_of(chunk.sigma) == expert).all()):
        return chunk
    sigmas = trajectory.sigmas[0]
    candidates = trajectory.trainable.any(0).to(sigmas.device) & (backbone.expert_of(sigmas[:-1]) == expert)
    if not bool(candidates.any()):
        raise ValueError(
            f"No trainable step of expert {backbone.expert_names[expert]!r} in this rollout, while another process "
            "trains one: every process must share the schedule and sde_window."
        )
    step = int(torch.nonzero(candidates)[0])
    changes = {"sigma": torch.full_like(chunk.sigma, float(sigmas[step]))}
    if hasattr(chunk, "sigma_next"):
        changes["sigma_next"] = torch.full_like(chunk.sigma_next, float(sigmas[step + 1]))
    return replace(chunk, **changes)


def expert_parameter_groups(groups: list[dict[str, Any]], model: torch.nn.Module, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """transformers' parameter groups (by weight decay) split by expert: each group's parameters named
    ``<expert>.…`` in ``model`` form a group of their own, marked ``"expert": <expert>``."""
    expert_of = {id(p): name.split(".", 1)[0] for name, p in model.named_parameters()}
    split = []
    for group in groups:
        for expert in names:
            params = [p for p in group["params"] if expert_of.get(id(p)) == expert]
            if params:
                split.append({**group, "params": params, "expert": expert})
    return split
