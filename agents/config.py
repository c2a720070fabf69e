"""`AlgorithmConfig`: every hyperparameter of the policy-gradient algorithms, declared once.

Each field has one default (SAGE-GRPO's) and one help string written the TRL way: what it does, what changing
it costs, the recommended value, the paper reference ("official" means the SAGE-GRPO release's parameter
table). The built-in algorithms (`agents.sage_grpo`, `agents.flow_grpo`, ...) subclass it and change defaults
only; `sage_trl.SageGRPOConfig` generates its algorithm fields from these declarations (`trainer_fields`), so
the trainer, the CLI (``--eta 0.3``) and the agents read the same text and the same defaults.

Paper references are to "Manifold-Aware Exploration for Reinforcement Learning in Video Generation"
(arXiv 2603.21872).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from agents import objective
from sage_env import sde

__all__ = ["AGENT_ONLY_FIELDS", "KL_STRATEGIES", "AlgorithmConfig", "trainer_fields"]

KL_STRATEGIES = ("none", "fixed", "stepwise", "moving", "dual")
"""KL regularisers (paper Sec. 3.2.2): none; fixed (initial model); step-wise (previous policy, Eq. 15);
moving (anchor refreshed every N optimizer steps, Eq. 13); dual (moving + step-wise, Eq. 14)."""

AGENT_ONLY_FIELDS = ("num_minibatches", "seed")
"""Fields of the agents' own update loop; the TRL trainer uses its own (``gradient_accumulation_steps``, TRL's
``seed``)."""


def _hp(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class AlgorithmConfig:
    """Hyperparameters of a policy-gradient algorithm over denoising steps; the defaults are SAGE-GRPO's.

    Subclasses name the algorithm for model cards and logs (``display_name``, ``summary``) and change defaults.
    """

    display_name: ClassVar[str] = "policy-gradient algorithm"
    """How the algorithm is named in model cards."""
    summary: ClassVar[str | None] = None
    """One line on what sets it apart, for model cards."""

    # -- rollout (the environment samples with the same values) --------------------------------------
    sde: str = _hp(
        "sage",
        "SDE of the rollouts' stochastic steps: "
        + " | ".join(sde.stochastic_sde_types())
        + ". Decides how exploration noise is injected and how transitions are scored; every choice costs "
        "the same compute. Recommended: sage, the paper's precise manifold-aware SDE (Eq. 5-7); the others "
        "reproduce the baselines of Table 2.",
    )
    eta: float = _hp(
        0.5,
        "Exploration scale of the SDE (the noise std grows linearly with it). Higher explores more but drifts "
        "further off the video manifold; 0 injects no noise and leaves nothing to learn. Recommended: 0.5 for "
        "sage (official); Flow-GRPO 0.7, DanceGRPO 0.3 (their papers). Paper Eq. 5.",
    )
    log_prob_kind: str = _hp(
        "gaussian",
        "How a transition is scored: gaussian (the Gaussian log-density averaged per element) or cps (the "
        "published CPS score -mean((x' - mean)^2)). Changes the scale of the ratio, not the compute. "
        "Recommended: gaussian; cps for the CPS baseline.",
    )
    guidance_scale: float | None = _hp(
        None,
        "Classifier-free guidance in rollouts and in the training forward (they must match). Above 1 doubles "
        "the transformer forwards of both phases. Recommended and None: the model's own (Wan 5, HunyuanVideo 1.5 "
        "its pipeline's guider, the toy 1 = no CFG).",
    )
    negative_prompt: str | None = _hp(
        None, "Negative prompt of classifier-free guidance (used when guidance_scale > 1). None: the model's."
    )
    # -- advantages (Eq. 10, App. A.4) ----------------------------------------------------------------
    scale_rewards: str = _hp(
        "group",
        "Advantage scaling (TRL's scale_rewards): group (each group's std, Eq. 10), batch (the std of all "
        "rewards) or none (only the group mean is subtracted). Recommended: group (paper Eq. 10).",
    )
    advantage_eps: float = _hp(
        1e-4,
        "Epsilon added to the std in Eq. 10; larger damps groups of nearly equal rewards. Recommended: 1e-4.",
    )
    adv_clip_max: float = _hp(
        5.0, "Advantages are clipped to [-adv_clip_max, adv_clip_max] (bounds one outlier). Official: 5."
    )
    # -- policy loss (Eq. 43) ---------------------------------------------------------------------------
    epsilon: float | None = _hp(
        1e-4,
        "PPO clip range of the ratio (TRL's epsilon). Log-probabilities are averaged per element, so ratios move "
        "by ~1e-4 per update: larger ranges barely clip, smaller stall learning. Acts only when "
        "num_iterations > 1. Recommended: 1e-4 (official). None: no clipping.",
    )
    epsilon_high: float | None = _hp(
        None, "Upper clip range of the ratio (TRL's epsilon_high). None: epsilon."
    )
    equalizer: bool = _hp(
        True,
        "Temporal gradient equalizer: weight each step by S_t = median(N) / N_t so every denoising step "
        "contributes gradients of the same size (Eq. 9, Fig. 4). No compute cost. Recommended: on for "
        "SAGE-GRPO (official use_grad_balancing); the baselines run without it.",
    )
    equalizer_eps: float = _hp(
        1e-8, "The epsilon of Eq. 9: S_t = median(N) / (N_t + eps). Recommended: 1e-8."
    )
    equalizer_median: str = _hp(
        "lower",
        "The median of Eq. 9 over an even number of steps: lower (torch.median, the official code's) or mean "
        "(the average of the two middle values; over 20 steps it makes every S_t up to 9% larger). "
        "Recommended: lower.",
    )
    timestep_fraction: float = _hp(
        1.0,
        "Fraction of each trajectory's stochastic steps trained per update (a random subset per sample). "
        "Training compute scales with it. Recommended: 1.0 (paper); DanceGRPO uses 0.6.",
    )
    timestep_permutation: bool = _hp(
        True,
        "Train each sample's steps in a random order (official enable_timestep_permutation): decorrelates "
        "micro-batches at no cost. Recommended: on.",
    )
    # -- KL (Sec. 3.2.2, App. A.6) ---------------------------------------------------------------------
    kl_strategy: str = _hp(
        "dual",
        "KL regulariser (Sec. 3.2.2): none | fixed (the initial model) | stepwise (the previous policy, Eq. 15) "
        "| moving (an anchor refreshed every anchor_update_steps, Eq. 13) | dual (moving + stepwise, Eq. 14). "
        "moving and dual hold one copy of the trainable weights (the adapter only, with LoRA). "
        "Recommended: dual (paper Table 2).",
    )
    beta_pos: float = _hp(
        1.0,
        "Weight of the position (moving-anchor) KL in dual KL (Eq. 14). Official dual_kl_moving_weight: 1.0.",
    )
    beta_vel: float = _hp(
        0.1, "Weight of the step-wise (velocity) KL in dual KL (Eq. 14). Official dual_kl_step_weight: 0.1."
    )
    anchor_update_steps: int = _hp(
        10,
        "Refresh the moving anchor every N optimizer steps (Eq. 13): smaller tracks the policy more closely "
        "(a weaker trust region). Official update_ref_model_step: 10.",
    )
    kl_coef_schedule: str = _hp(
        "adaptive",
        "adaptive (linear warm-up, then feedback towards kl_target; App. A.6, Eq. 41-42) or constant "
        "(beta throughout). Recommended: adaptive.",
    )
    kl_coef_min: float = _hp(
        1e-7, "lambda_min of the adaptive KL coefficient: its start and floor (Eq. 41-42). Official: 1e-7."
    )
    beta: float = _hp(
        1e-5,
        "KL coefficient (TRL's beta): lambda_max of the adaptive schedule (Eq. 41-42), or the constant one. "
        "Larger keeps the policy nearer its reference and slows reward gains. Official kl_weight: 1e-5.",
    )
    kl_warmup_steps: int = _hp(
        100,
        "K: optimizer steps of the linear warm-up from kl_coef_min to beta (Eq. 41). Paper: 100; shorten it "
        "for short runs.",
    )
    kl_target: float = _hp(
        1e-5,
        "D_target of Eq. 42: above 1.5x it the coefficient shrinks by 0.9, below 0.5x it grows by 1.1. Not given "
        "by the paper; the official code uses 1e-5.",
    )
    kl_history: int = _hp(10, "H: recent KL values averaged by the feedback rule (Eq. 42). Paper: 10.")
    reference_offload: bool = _hp(
        False,
        "Full fine-tuning: keep the KL reference copy on the CPU between uses (saves one model copy of "
        "accelerator memory, costs two transfers per micro-batch). LoRA anchors are adapter snapshots and do not "
        "need it. Official reference_mode_offload.",
    )
    # -- optimisation ------------------------------------------------------------------------------------
    learning_rate: float = _hp(
        1e-5,
        "Adam learning rate. Official (full fine-tuning): 1e-5; LoRA usually needs about 10x (the example "
        "configs use 1e-4).",
    )
    max_grad_norm: float = _hp(
        1.0, "Gradients are clipped to this global norm before each step. Recommended: 1.0."
    )
    num_iterations: int = _hp(
        1,
        "Optimizer passes over each rollout (TRL's num_iterations). > 1 reuses rollouts (cheaper per update) and "
        "makes the ratio and its clipping act; 1 is on-policy, as in the paper.",
    )
    num_minibatches: int = _hp(
        1,
        "Agents only: optimizer steps per pass over a rollout (the trainer uses gradient_accumulation_steps).",
    )
    micro_batch_size: int = _hp(
        4,
        "(sample, step) pairs per forward in the training phase; gradients accumulate over micro-batches, so the "
        "update does not depend on it. Memory grows linearly with it, throughput until the accelerator is "
        "saturated. Recommended: the largest that fits (sage-train --preflight shows the memory).",
    )
    seed: int = _hp(0, "Agents only: seed of the timestep selection (the trainer uses TRL's seed).")
    max_consecutive_reward_failures: int = _hp(
        3,
        "Stop with an error when every sample's reward failed in this many rollouts in a row; a single failed "
        "rollout is tolerated and counted (reward/failed_calls). Recommended: 3.",
    )

    def __post_init__(self) -> None:
        unit = sde.get_sde(self.sde)
        if not unit.stochastic:
            raise ValueError(
                f"sde={self.sde!r} injects no noise, so there is no policy gradient; choose one of "
                f"{', '.join(sde.stochastic_sde_types())}."
            )
        unit.validate_eta(self.eta)
        for name, allowed in (
            ("log_prob_kind", sde.LOG_PROB_KINDS),
            ("scale_rewards", objective.SCALE_REWARDS),
            ("kl_strategy", KL_STRATEGIES),
            ("kl_coef_schedule", ("adaptive", "constant")),
            ("equalizer_median", sde.MEDIAN_KINDS),
        ):
            self._check_choice(name, allowed)
        self._check_numbers()

    def _check_choice(self, name: str, allowed: tuple[str, ...]) -> None:
        if getattr(self, name) not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}.")

    def _check_numbers(self) -> None:
        for name in (
            "adv_clip_max",
            "learning_rate",
            "max_grad_norm",
            "advantage_eps",
            "equalizer_eps",
            "kl_target",
        ):
            _require(self, name, lambda v: v > 0, "> 0")
        for name in ("beta_pos", "beta_vel", "kl_coef_min", "beta"):
            _require(self, name, lambda v: v >= 0, ">= 0")
        for name in ("epsilon", "epsilon_high"):
            if getattr(self, name) is not None:
                _require(self, name, lambda v: 0 < v < 1, "in (0, 1) or None (no clipping)")
        _require(self, "timestep_fraction", lambda v: 0 < v <= 1, "in (0, 1]")
        if self.guidance_scale is not None:
            _require(self, "guidance_scale", lambda v: v >= 0, ">= 0 (1 disables classifier-free guidance)")
        counts = (
            "anchor_update_steps",
            "num_iterations",
            "num_minibatches",
            "micro_batch_size",
            "kl_history",
        )
        for name in (*counts, "max_consecutive_reward_failures"):
            _require(self, name, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        _require(self, "kl_warmup_steps", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        if self.kl_coef_min > self.beta:
            raise ValueError(
                f"kl_coef_min ({self.kl_coef_min}) must not exceed beta ({self.beta}), the largest KL coefficient."
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> set[str]:
        """Names of every field."""
        return {f.name for f in fields(cls)}


def _require(config: Any, name: str, condition: Any, requirement: str) -> None:
    value = getattr(config, name)
    valid = not isinstance(value, bool) and isinstance(value, (int, float))
    if not valid or not condition(value) or value != value:  # value != value: NaN
        raise ValueError(f"{name} must be {requirement}, got {value!r}.")


def trainer_fields() -> list[dataclasses.Field]:
    """The `AlgorithmConfig` fields the TRL trainer exposes (all but `AGENT_ONLY_FIELDS`)."""
    return [f for f in fields(AlgorithmConfig) if f.name not in AGENT_ONLY_FIELDS]
