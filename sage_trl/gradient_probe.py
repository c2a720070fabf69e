"""The gradient norm per denoising step, live: every ``gradient_norm_steps`` optimizer steps the trainer
backpropagates each denoising step's loss on its own (`agents.diagnostics.per_step_gradient_norms`) and logs
``diagnostics/step_<k>/grad_norm`` and their spread ``diagnostics/grad_norm_spread`` (largest over smallest). The
paper's Fig. 4 / Eq. 8 predicts the norm grows as the noise falls; its temporal gradient equalizer (Eq. 9) is
there to flatten it, so the spread is the equalizer's effect, seen during training. The probe only reads
gradients: training is bit-identical with it on or off."""

from __future__ import annotations

from typing import Any

import torch

from agents.diagnostics import GRADIENT_NORM, per_step_gradient_norms, per_step_prefix

__all__ = ["SPREAD_METRIC", "GradientProbe"]

SPREAD_METRIC = "diagnostics/grad_norm_spread"


class GradientProbe:
    """Called with each training batch from `SageGRPOTrainer.compute_loss`; measures the first batch (the first
    gradient-accumulation part) of the optimizer steps ``gradient_norm_steps`` apart, the first included, and
    appends to the trainer's metrics: the norms and their spread come from the same batch."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.every = trainer.args.gradient_norm_steps
        self.probed_step: int | None = None
        if self.every and (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled):
            raise ValueError(
                "gradient_norm_steps needs the whole trainable weights on each process; FSDP and DeepSpeed shard "
                "them. Set gradient_norm_steps 0 (off) for this launch, or probe on one GPU or under DDP."
            )

    def __call__(self, batch: Any) -> None:
        trainer = self.trainer
        step = trainer.state.global_step
        if not self.every or step % self.every or step == self.probed_step:
            return
        self.probed_step = step
        parameters = [p for p in trainer.backbone.transformer.parameters() if p.requires_grad]
        norms = per_step_gradient_norms(
            trainer.algorithm, trainer.backbone, batch, trainer.references, parameters, trainer.args.micro_batch_size
        )
        self._log(norms, trainer.env.num_steps)

    def _log(self, norms: dict[int, float], num_steps: int) -> None:
        """Each step's mean over the processes that trained it (one reduction; every process calls it)."""
        trainer = self.trainer
        local = torch.zeros(2, num_steps, dtype=torch.float64, device=trainer.accelerator.device)
        for step, norm in norms.items():
            local[0, step], local[1, step] = norm, 1.0
        summed = trainer.accelerator.reduce(local, "sum").tolist()
        means = {step: total / count for step, (total, count) in enumerate(zip(*summed)) if count}
        metrics = trainer._metrics["train"]
        for step, mean in means.items():
            metrics[per_step_prefix(step) + GRADIENT_NORM].append(mean)
        if len(means) > 1 and min(means.values()) > 0:
            metrics[SPREAD_METRIC].append(max(means.values()) / min(means.values()))
