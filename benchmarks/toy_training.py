"""Short RL runs on the toy world through the library's own training path, for the ablation benchmarks.

A run is what ``examples/`` and the `agents` docs show: ``agents.make("sage_grpo", ...)`` on a LoRA-adapted
toy prior, rolling out ``sage_env/Toy-v0`` (`sage_env.toy.env.make_toy_vector_env`) and calling
``agent.update(trajectory)`` once per rollout; only the settings under study change (SDE type, equalizer, KL
strategy, reward weights). The other settings are those of ``sage-train``'s toy preset
(``sage_trl/presets/toy.yaml``): eta 0.7 with the SDE on the first 5 of 10 steps, LoRA r8 / alpha 16 on the
attention projections, AdamW lr 3e-3; the adaptive KL coefficient keeps the 20-step warm-up the preset had when
the ablations in docs/benchmarks.md were run (the preset's 40-step run now warms up over 8). The held-out
evaluation before and after is `sage_trl.evaluation.evaluate_policy` (deterministic ODE sampling of the 8
held-out prompts, fixed seeds), as ``sage-train`` does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

import agents
from agents import AlgorithmAgent
from benchmarks import reporting, workloads
from sage_env.env import Trajectory
from sage_env.models import TOY_SAMPLING_DEFAULTS
from sage_env.rewards import CompositeReward
from sage_env.rewards.toy import ToyReward
from sage_env.toy.env import make_toy_vector_env
from sage_env.toy.world import TOY_EVAL_PROMPTS

__all__ = [
    "CURVE_KEYS",
    "ToyRunResult",
    "ToyRunSpec",
    "aggregate_curves",
    "final_mean_std",
    "run_toy_training",
]

CURVE_KEYS = (
    "reward/total",
    "reward/vq",
    "reward/mq",
    "reward/ta",
    "reward/overall",
    "reward/total_std",
    "reward/group_std",
    "rollout/exploration_std",
    "kl/total",
    "kl/coef",
    "grad_norm",
)
"""Per-update values every run records (rollout rewards are of the training rollouts, SDE sampling)."""


@dataclass(frozen=True)
class ToyRunSpec:
    """One short RL run on the toy world (defaults: the toy preset, ``sage_trl/presets/toy.yaml``, at a smaller batch).

    Args:
        sde: SDE type of the rollouts and the loss.
        eta: exploration scale.
        equalizer: the temporal gradient equalizer (Eq. 9).
        kl_strategy: none | fixed | stepwise | moving | dual.
        reward_preset: ``setting_a`` (VQ/MQ/TA 1/1/1) or ``setting_b`` (0.5/0.5/1).
        num_updates: rollouts = optimizer steps.
        num_prompts, group_size: videos per rollout = ``num_prompts * group_size``.
        learning_rate: AdamW learning rate of the LoRA weights.
        kl_warmup_steps: warm-up of the adaptive KL coefficient (App. A.6).
        beta: the KL coefficient's upper bound (the paper's 1e-5 unless changed).
        anchor_update_steps: refresh interval of the moving anchor (the paper's 10 unless changed).
        eval_seeds: seeds per held-out prompt for the before/after evaluation.
        eval_prompts: how many of the 8 held-out prompts are evaluated.
        seed: seeds the LoRA initialisation, the rollouts and the timestep selection.
    """

    sde: str = "sage"
    eta: float = 0.7
    equalizer: bool = True
    kl_strategy: str = "dual"
    reward_preset: str = "setting_b"
    num_updates: int = 12
    num_prompts: int = 4
    group_size: int = 4
    learning_rate: float = 3e-3
    kl_warmup_steps: int = 20
    beta: float = 1e-5
    anchor_update_steps: int = 10
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    eval_prompts: int = 8
    seed: int = 0

    def label(self, fields_: Sequence[str]) -> str:
        """``"sde=sage, kl_strategy=dual"`` for the given field names."""
        return ", ".join(f"{name}={getattr(self, name)}" for name in fields_)


@dataclass
class ToyRunResult:
    """Curves and held-out scores of one run.

    Args:
        spec: the run's settings.
        curves: ``{key: [value per update]}`` for `CURVE_KEYS`.
        before, after: held-out mean per component (``vq``, ``mq``, ``ta``), the weighted ``total``, the
            unweighted ``overall`` (mean of the three heads, comparable across reward settings) and the gold score
            the reward cannot fool (``world_distance``, ``object_area_ratio``: `sage_trl.evaluation.world_measures`).
        seconds: wall-clock time of the run.
        inspection: what the ``inspect`` callback of `run_toy_training` returned.
    """

    spec: ToyRunSpec
    curves: dict[str, list[float]] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    inspection: dict[str, float] = field(default_factory=dict)


def _held_out(backbone: object, reward: CompositeReward, spec: ToyRunSpec) -> dict[str, float]:
    from sage_trl.evaluation import evaluate_policy, world_measures

    held_out = TOY_EVAL_PROMPTS[: spec.eval_prompts]
    prompts = [p for p in held_out for _ in spec.eval_seeds]
    all_seeds = [s for _ in held_out for s in spec.eval_seeds]
    result = evaluate_policy(
        backbone, reward, prompts, all_seeds, TOY_SAMPLING_DEFAULTS, measure=world_measures
    )
    means = result.means()
    means["overall"] = (means["vq"] + means["mq"] + means["ta"]) / 3
    return means


def _rollout_record(trajectory: Trajectory, metrics: dict[str, float]) -> dict[str, float]:
    rewards = trajectory.rewards
    total = rewards.total[rewards.valid]
    heads = rewards.components
    group_stds = [
        float(total[trajectory.group_index[rewards.valid] == g].std(unbiased=False))
        for g in torch.unique(trajectory.group_index)
    ]
    record = {
        "reward/total": float(total.mean()),
        "reward/overall": float(((heads["vq"] + heads["mq"] + heads["ta"]) / 3)[rewards.valid].mean()),
        "reward/total_std": float(total.std(unbiased=False)),
        "reward/group_std": sum(group_stds) / len(group_stds),
    }
    for key in CURVE_KEYS:
        if key not in record:
            record[key] = float(metrics.get(key, math.nan))
    return record


def run_toy_training(
    spec: ToyRunSpec,
    progress: Callable[[int, dict[str, float]], None] | None = None,
    inspect: Callable[[AlgorithmAgent, Trajectory], dict[str, float]] | None = None,
) -> ToyRunResult:
    """Train with ``spec`` and return its curves and held-out scores (see the module docstring).

    ``progress(update, record)`` is called after every update; ``inspect(agent, last_trajectory)`` once after
    training, its result stored in `ToyRunResult.inspection`.
    """
    start = time.perf_counter()
    torch.manual_seed(spec.seed)  # the LoRA initialisation (peft draws from the global generator)
    backbone = workloads.toy_backbone("prior")
    workloads.add_lora_adapter(backbone, rank=8, alpha=16)
    reward = CompositeReward(ToyReward(), spec.reward_preset)
    env = make_toy_vector_env(
        num_envs=spec.num_prompts * spec.group_size, group_size=spec.group_size, backbone=backbone,
        reward_fn=reward, sde=spec.sde, eta=spec.eta,
    )  # fmt: skip
    agent = agents.make(
        "sage_grpo", policy=backbone, sde=spec.sde, eta=spec.eta, equalizer=spec.equalizer,
        kl_strategy=spec.kl_strategy, learning_rate=spec.learning_rate, kl_warmup_steps=spec.kl_warmup_steps,
        beta=spec.beta, anchor_update_steps=spec.anchor_update_steps, micro_batch_size=40,
        seed=spec.seed,
    )  # fmt: skip
    result = ToyRunResult(spec, {key: [] for key in CURVE_KEYS})
    result.before = _held_out(backbone, reward, spec)
    for update in range(spec.num_updates):
        trajectory = workloads.agent_rollout(env, agent, seed=spec.seed if update == 0 else None)
        record = _rollout_record(trajectory, agent.update(trajectory))
        for key in CURVE_KEYS:
            result.curves[key].append(record[key])
        if progress is not None:
            progress(update, record)
    if inspect is not None:
        result.inspection = inspect(agent, trajectory)
    result.after = _held_out(backbone, reward, spec)
    result.seconds = time.perf_counter() - start
    return result


def aggregate_curves(results: Sequence[ToyRunResult], key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population std over runs of one curve, per update: two ``(num_updates,)`` tensors."""
    values = torch.tensor([run.curves[key] for run in results], dtype=torch.float64)
    return values.mean(dim=0), values.std(dim=0, unbiased=False)


def final_mean_std(results: Sequence[ToyRunResult], name: str, which: str = "after") -> str:
    """``mean ± std`` over runs of a held-out score (``which``: ``before`` or ``after``)."""
    return reporting.format_mean_std([getattr(run, which)[name] for run in results])
