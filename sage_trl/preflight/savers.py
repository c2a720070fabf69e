"""Which memory savers would make a config fit a budget: switched on one by one, each plan traced again.

The savers are the config switches of docs/training_on_gpus.md that leave the trained model the same (or, for
``torch_dtype: bfloat16`` with LoRA, change only the frozen base's precision). They are tried in a fixed order,
cumulatively, skipping those already on, until the traced peak plus the margins fits; the result names the
switches needed. Changes that alter the task (fewer frames, LoRA instead of full fine-tuning, more GPUs) are
never applied, only mentioned when nothing else is left.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sage_trl.preflight.plan import PreflightPlan
from sage_trl.training_setup import videos_per_round

__all__ = ["SAVERS", "Saver", "find_savers", "saver_cost"]


@dataclass(frozen=True)
class Saver:
    """One switch: how the user writes it, whether it is off in a config, the fields it sets, and what it costs
    (time or precision, estimated or measured as the text says)."""

    name: str
    is_off: Callable[[Any, Any], bool]
    fields: dict[str, Any]
    cost: str


SAVERS: tuple[Saver, ...] = (
    Saver(
        "gradient_checkpointing: true",
        lambda c, lora: not c.diffusers_gradient_checkpointing,
        {"diffusers_gradient_checkpointing": True},
        "one more forward per training forward (~+30% training time)",
    ),
    Saver(
        "micro_batch_size: 1",
        lambda c, lora: c.micro_batch_size > 1,
        {"micro_batch_size": 1},
        "none measurable at video sizes (one pair fills a GPU)",
    ),
    Saver(
        "rollout_batch_size: 1",
        lambda c, lora: (c.rollout_batch_size or videos_per_round(c)) > 1,
        {"rollout_batch_size": 1},
        "smaller rollout forwards, less throughput",
    ),
    Saver(
        "precompute_prompt_embeddings + offload_text_encoders",
        lambda c, lora: not (c.precompute_prompt_embeddings and c.offload_text_encoders),
        {"precompute_prompt_embeddings": True, "offload_text_encoders": True},
        "one pass of the text encoders over the prompt set at the start",
    ),
    Saver(
        "prompt_encode_batch_size: 1",
        lambda c, lora: c.precompute_prompt_embeddings and c.prompt_encode_batch_size > 1,
        {"prompt_encode_batch_size": 1},
        "one text-encoder call per prompt at the start, each also encoding the negative prompt",
    ),
    Saver(
        "reward_offload: true",
        lambda c, lora: not c.reward_offload,
        {"reward_offload": True},
        "the reward model over PCIe once per rollout round (~1 s for VideoAlign)",
    ),
    Saver(
        "vae_tiling + vae_slicing",
        lambda c, lora: not (c.vae_tiling and c.vae_slicing),
        {"vae_tiling": True, "vae_slicing": True},
        "a slightly slower decode",
    ),
    Saver(
        "reference_offload: true",
        lambda c, lora: lora is None and not c.reference_offload,
        {"reference_offload": True},
        "the full anchor over PCIe per training micro-batch (~1-2 s at 31 GiB)",
    ),
    Saver(
        "sequential_cfg: true",
        lambda c, lora: not c.sequential_cfg,
        {"sequential_cfg": True},
        "one more forward per CFG branch of each training micro-step (traced on HunyuanVideo 1.5 480p: +20% FLOPs "
        "per micro-step, +11% per optimizer step); no PCIe traffic",
    ),
    Saver(
        "activation_offload: true",
        lambda c, lora: not c.activation_offload,
        {"activation_offload": True, "diffusers_gradient_checkpointing": True},
        "two PCIe copies of the block inputs per training micro-step (measured on an H200 machine: +8-9 s, about "
        "+35%, per HunyuanVideo 1.5 480p micro-step) and as much host RAM",
    ),
    Saver(
        "torch_dtype: bfloat16",
        lambda c, lora: lora is not None and c.torch_dtype != "bfloat16",
        {"torch_dtype": "bfloat16", "bf16": True},
        "the frozen base in bf16 (rollouts match fp32 to bf16 accuracy)",
    ),
)
"""Savers in the order they are tried."""


def with_fields(config: Any, fields: dict[str, Any]) -> Any:
    """A shallow copy of ``config`` with ``fields`` set (no re-validation: the values are the savers' own)."""
    changed = copy.copy(config)
    for name, value in fields.items():
        setattr(changed, name, value)
    return changed


def find_savers(
    config: Any, lora_config: Any, plan: PreflightPlan, trace: Callable[[Any], PreflightPlan]
) -> tuple[list[str], int | None]:
    """The savers that bring ``plan`` under its budget and the peak they reach (traced with ``trace(config)``).

    A saver that does not lower the peak (it saves in a phase that is not the peak) is left out of the advice.
    Returns ``([], None)`` when no saver that is off lowers the peak; the last peak when even all of them do not
    suffice.
    """
    budget = plan.budget_gib
    applied: list[str] = []
    peak: int | None = None
    for saver in SAVERS:
        if budget is None or not saver.is_off(config, lora_config):
            continue
        saving = with_fields(config, saver.fields)
        saving_peak = trace(saving).peak_bytes
        if saving_peak >= (plan.peak_bytes if peak is None else peak):
            continue
        config, peak = saving, saving_peak
        applied.append(saver.name)
        if plan.required_gib(peak) <= budget:
            break
    return applied, peak


def saver_cost(name: str) -> str:
    """What the saver called ``name`` (`Saver.name`) costs."""
    return next(saver.cost for saver in SAVERS if saver.name == name)
