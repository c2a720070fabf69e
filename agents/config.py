"""`AlgorithmConfig`: every hyperparameter of the policy-gradient algorithms, declared once.

Each field is declared once, here, with its help string written the TRL way (what it does, what changing it
costs, the recommended value, the paper reference; "official" means the SAGE-GRPO release's parameter table) and
its declared check (`sage_env.checks`). A field left None takes the algorithm's default: `AlgorithmConfig.defaults`
holds SAGE-GRPO's, and each algorithm's config class (`agents.flow_grpo`, `agents.ddpo`, ...) changes some of
them in its own ``defaults``. `sage_trl.SageGRPOConfig` inherits these very fields, so ``algorithm="flow_grpo"``
switches every default in one line, and the trainer, the command line (``--eta 0.3``) and the agents read the
same text, the same defaults and the same checks.

An algorithm may declare fields of its own in its config class (DDPO's per-prompt statistics): they carry their
own defaults and checks, and reach the trainer and ``sage-train`` through ``SageGRPOConfig.algorithm_args``.

Paper references are to "Manifold-Aware Exploration for Reinforcement Learning in Video Generation"
(arXiv 2603.21872).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar

from agents import objective
from sage_env.checks import Check, Choice, Flag, Integer, Real, Text, check_fields, hyperparameter
from sage_env.plugins import PluginName
from sage_env.sde import LOG_PROB_KINDS, MEDIAN_KINDS, SDES, get_sde, stochastic_sde_types

__all__ = ["KL_STRATEGIES", "AlgorithmConfig", "Unclipped"]

KL_STRATEGIES = ("none", "fixed", "stepwise", "moving", "dual")
"""KL regularisers (paper Sec. 3.2.2): none; fixed (initial model); step-wise (previous policy, Eq. 15);
moving (anchor refreshed every N optimizer steps, Eq. 13); dual (moving + step-wise, Eq. 14)."""


@dataclass(frozen=True)
class Unclipped(Check):
    """A PPO clip range: a number in (0, 1), or ``inf`` for no clipping (plain policy gradient)."""

    optional: bool = False

    def describe(self) -> str:
        return "a number in (0, 1), or inf for no clipping" + (" (or None)" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        if value == math.inf and not isinstance(value, bool):
            return
        Real(0.0, 1.0, low_open=True, high_open=True, hint="inf disables clipping").check(name, value)


@dataclass
class AlgorithmConfig:
    """Hyperparameters of a policy-gradient algorithm over denoising steps; None takes the algorithm's default.

    `defaults` are SAGE-GRPO's (the paper and its official release). An algorithm's config class subclasses this
    one, names the algorithm (``display_name``, ``summary``), changes defaults in its own ``defaults`` (merged
    over its parent's) and may declare fields of its own.
    """

    display_name: ClassVar[str] = "SAGE-GRPO"
    """How the algorithm is named in model cards."""
    summary: ClassVar[str | None] = None
    """One line on what sets it apart, for model cards."""
    algorithm_class: ClassVar[type | None] = None
    """The update rule (an `agents.Algorithm` subclass); None: `agents.PolicyGradientAlgorithm`."""
    defaults: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {
            "sde": "sage",
            "eta": 0.5,
            "log_prob_kind": "gaussian",
            "guidance_scale": None,
            "negative_prompt": None,
            "scale_rewards": "group",
            "advantage_eps": 1e-4,
            "adv_clip_max": 5.0,
            "epsilon": 1e-4,
            "epsilon_high": None,
            "ratio_norm": False,
            "equalizer": True,
            "equalizer_eps": 1e-8,
            "equalizer_median": "lower",
            "timestep_fraction": 1.0,
            "timestep_permutation": True,
            "kl_strategy": "dual",
            "beta_pos": 1.0,
            "beta_vel": 0.1,
            "anchor_update_steps": 10,
            "kl_coef_schedule": "adaptive",
            "kl_coef_min": 1e-7,
            "beta": 1e-5,
            "kl_warmup_steps": 100,
            "kl_target": 1e-5,
            "kl_history": 10,
            "reference_offload": False,
            "learning_rate": 1e-5,
            "max_grad_norm": 1.0,
            "num_iterations": 1,
            "micro_batch_size": 4,
            "max_consecutive_reward_failures": 3,
        }
    )
    """Every field's default for SAGE-GRPO (paper and official release); subclasses change some in theirs."""

    # -- rollout (the environment samples with the same values) --------------------------------------
    sde: str | None = hyperparameter(
        None,
        "SDE of the rollouts' stochastic steps: a built-in (sage, flow_grpo, dance_grpo, cps), an installed "
        "package's (entry-point group sage_grpo.sdes) or 'module:Class'. Decides how exploration noise is injected "
        "and how transitions are scored; every choice costs the same compute. Recommended: sage, the paper's "
        "precise manifold-aware SDE (Eq. 5-7); flow_grpo, dance_grpo, cps reproduce the baselines of Table 2.",
        PluginName(SDES),
    )
    eta: float | None = hyperparameter(
        None,
        "Exploration scale of the SDE (the noise std grows linearly with it). Higher explores more but drifts "
        "further off the video manifold; 0 injects no noise and leaves nothing to learn. Recommended: 0.5 for "
        "sage (official); Flow-GRPO 0.7, DanceGRPO 0.3 (their papers). Paper Eq. 5.",
        Real(0.0, low_open=True, hint="typical 0.3-1.0; 0 injects no noise and leaves nothing to learn"),
    )
    log_prob_kind: str | None = hyperparameter(
        None,
        "How a transition is scored: gaussian (the Gaussian log-density averaged per element) or cps (the "
        "published CPS score -mean((x' - mean)^2)). Changes the scale of the ratio, not the compute. "
        "Recommended: gaussian; cps for the CPS baseline.",
        Choice(LOG_PROB_KINDS),
    )
    guidance_scale: float | None = hyperparameter(
        None,
        "Classifier-free guidance in rollouts and in the training forward (they must match). Above 1 doubles "
        "the transformer forwards of both phases. Recommended and None: the model's own (Wan 5, HunyuanVideo 1.5 "
        "its pipeline's guider, the toy 1 = no CFG).",
        Real(0.0, 100.0, optional=True, hint="1 disables classifier-free guidance; typical 1-10"),
    )
    negative_prompt: str | None = hyperparameter(
        None,
        "Negative prompt of classifier-free guidance (used when guidance_scale > 1). None: the model's.",
        Text(max_length=4096, allow_empty=True, optional=True),
    )
    # -- advantages (Eq. 10, App. A.4) ----------------------------------------------------------------
    scale_rewards: str | None = hyperparameter(
        None,
        "Advantage scaling (TRL's scale_rewards): group (each group's std, Eq. 10), batch (the std of all "
        "rewards) or none (only the group mean is subtracted). Recommended: group (paper Eq. 10).",
        Choice(objective.SCALE_REWARDS),
    )
    advantage_eps: float | None = hyperparameter(
        None,
        "Epsilon added to the std in Eq. 10; larger damps groups of nearly equal rewards. Recommended: 1e-4.",
        Real(0.0, 1.0, low_open=True),
    )
    adv_clip_max: float | None = hyperparameter(
        None,
        "Advantages are clipped to [-adv_clip_max, adv_clip_max] (bounds one outlier). Official: 5.",
        Real(0.0, low_open=True),
    )
    # -- policy loss (Eq. 43) ---------------------------------------------------------------------------
    epsilon: float | None = hyperparameter(
        None,
        "PPO clip range of the ratio (TRL's epsilon). Log-probabilities are averaged per element, so ratios move "
        "by ~1e-4 per update: larger ranges barely clip, smaller stall learning. Acts only when the policy "
        "changed since the rollout (num_iterations > 1, or several optimizer steps per rollout). Recommended: "
        "1e-4 (official); inf: no clipping (REINFORCE).",
        Unclipped(),
    )
    epsilon_high: float | None = hyperparameter(
        None,
        "Upper clip range of the ratio (TRL's epsilon_high). None: epsilon.",
        Unclipped(optional=True),
    )
    ratio_norm: bool | None = hyperparameter(
        None,
        "GRPO-Guard's regulariser (arXiv 2510.22319): normalise each transition's log-ratio by its noise scale, "
        "with the bias that shifts it below 0 removed (ratio exp(std x (log p - log p_old + mean_d (mu - mu_old)^2 "
        "/ (2 std^2)))), and weight each step's loss by 1 / |sigma - sigma_next|, so that no denoising step's "
        "ratio is always clipped on one side. Costs the rollout's transition means in memory (one latent per "
        "step and sample). Recommended: on for grpo_guard; off for the others (their published setting).",
        Flag(),
    )
    equalizer: bool | None = hyperparameter(
        None,
        "Temporal gradient equalizer: weight each step by S_t = median(N) / N_t so every denoising step "
        "contributes gradients of the same size (Eq. 9, Fig. 4). No compute cost. Recommended: on for "
        "SAGE-GRPO (official use_grad_balancing); the baselines run without it.",
        Flag(),
    )
    equalizer_eps: float | None = hyperparameter(
        None,
        "The epsilon of Eq. 9: S_t = median(N) / (N_t + eps). Recommended: 1e-8.",
        Real(0.0, 1.0, low_open=True),
    )
    equalizer_median: str | None = hyperparameter(
        None,
        "The median of Eq. 9 over an even number of steps: lower (torch.median, the official code's) or mean "
        "(the average of the two middle values; over 20 steps it makes every S_t up to 9% larger). "
        "Recommended: lower.",
        Choice(MEDIAN_KINDS),
    )
    timestep_fraction: float | None = hyperparameter(
        None,
        "Fraction of each trajectory's stochastic steps trained per update (a random subset per sample). "
        "Training compute scales with it. Recommended: 1.0 (paper); DanceGRPO uses 0.6.",
        Real(0.0, 1.0, low_open=True),
    )
    timestep_permutation: bool | None = hyperparameter(
        None,
        "Train each sample's steps in a random order (official enable_timestep_permutation): decorrelates "
        "micro-batches at no cost. Recommended: on.",
        Flag(),
    )
    # -- KL (Sec. 3.2.2, App. A.6) ---------------------------------------------------------------------
    kl_strategy: str | None = hyperparameter(
        None,
        "KL regulariser (Sec. 3.2.2): none | fixed (the initial model) | stepwise (the previous policy, Eq. 15) "
        "| moving (an anchor refreshed every anchor_update_steps, Eq. 13) | dual (moving + stepwise, Eq. 14). "
        "moving and dual hold one copy of the trainable weights (the adapter only, with LoRA). "
        "Recommended: dual (paper Table 2).",
        Choice(KL_STRATEGIES),
    )
    beta_pos: float | None = hyperparameter(
        None,
        "Weight of the position (moving-anchor) KL in dual KL (Eq. 14). Official dual_kl_moving_weight: 1.0.",
        Real(0.0),
    )
    beta_vel: float | None = hyperparameter(
        None,
        "Weight of the step-wise (velocity) KL in dual KL (Eq. 14). Official dual_kl_step_weight: 0.1.",
        Real(0.0),
    )
    anchor_update_steps: int | None = hyperparameter(
        None,
        "Refresh the moving anchor every N optimizer steps (Eq. 13): smaller tracks the policy more closely "
        "(a weaker trust region). Official update_ref_model_step: 10.",
        Integer(1, 10**6),
    )
    kl_coef_schedule: str | None = hyperparameter(
        None,
        "adaptive (linear warm-up, then feedback towards kl_target; App. A.6, Eq. 41-42) or constant "
        "(beta throughout). Recommended: adaptive.",
        Choice(("adaptive", "constant")),
    )
    kl_coef_min: float | None = hyperparameter(
        None,
        "lambda_min of the adaptive KL coefficient: its start and floor (Eq. 41-42). Official: 1e-7.",
        Real(0.0),
    )
    beta: float | None = hyperparameter(
        None,
        "KL coefficient (TRL's beta): lambda_max of the adaptive schedule (Eq. 41-42), or the constant one. "
        "Larger keeps the policy nearer its reference and slows reward gains. Official kl_weight: 1e-5.",
        Real(0.0),
    )
    kl_warmup_steps: int | None = hyperparameter(
        None,
        "K: optimizer steps of the linear warm-up from kl_coef_min to beta (Eq. 41). Paper: 100; shorten it "
        "for short runs.",
        Integer(0, 10**7),
    )
    kl_target: float | None = hyperparameter(
        None,
        "D_target of Eq. 42: above 1.5x it the coefficient shrinks by 0.9, below 0.5x it grows by 1.1. Not given "
        "by the paper; the official code uses 1e-5.",
        Real(0.0, low_open=True),
    )
    kl_history: int | None = hyperparameter(
        None, "H: recent KL values averaged by the feedback rule (Eq. 42). Paper: 10.", Integer(1, 10**6)
    )
    reference_offload: bool | None = hyperparameter(
        None,
        "Full fine-tuning: keep the KL reference copy on the CPU between uses (saves one model copy of "
        "accelerator memory, costs two transfers per micro-batch). LoRA anchors are adapter snapshots and do not "
        "need it. Official reference_mode_offload.",
        Flag(),
    )
    # -- optimisation ------------------------------------------------------------------------------------
    learning_rate: float | None = hyperparameter(
        None,
        "Adam learning rate. Official (full fine-tuning): 1e-5; LoRA usually needs about 10x (the example "
        "configs use 1e-4).",
        Real(0.0, 1.0, low_open=True, hint="Adam learning rates are about 1e-6 to 1e-2"),
    )
    max_grad_norm: float | None = hyperparameter(
        None,
        "Gradients are clipped to this global norm before each step. Recommended: 1.0.",
        Real(0.0, low_open=True),
    )
    num_iterations: int | None = hyperparameter(
        None,
        "Optimizer passes over each rollout (TRL's num_iterations). > 1 reuses rollouts (cheaper per update) and "
        "makes the ratio and its clipping act; 1 is on-policy, as in the paper.",
        Integer(1, 64, hint="each pass is a full training pass over the rollout; PPO-style reuse uses 1-8"),
    )
    micro_batch_size: int | None = hyperparameter(
        None,
        "(sample, step) pairs per forward in the training phase; gradients accumulate over micro-batches, so the "
        "update does not depend on it. Memory grows linearly with it, throughput until the accelerator is "
        "saturated. Recommended: the largest that fits (sage-train --preflight shows the memory).",
        Integer(1, 2**16),
    )
    max_consecutive_reward_failures: int | None = hyperparameter(
        None,
        "Stop with an error when every sample's reward failed in this many rollouts in a row; a single failed "
        "rollout is tolerated and counted (reward/failed_calls). Recommended: 3.",
        Integer(1, 10**6),
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's ``defaults`` hold only what it changes: merge them over its parent's, known names only. A
        shared field redeclared in its body would change `agents.make`'s default but not the trainer's: refused."""
        super().__init_subclass__(**kwargs)
        redeclared = set(inspect.get_annotations(cls)) & set(AlgorithmConfig.defaults)
        if redeclared:
            raise TypeError(
                f"{cls.__name__} redeclares {sorted(redeclared)}, fields of AlgorithmConfig; change their defaults in "
                "its `defaults` mapping instead (the trainer and sage-train read only that)."
            )
        changes = dict(cls.__dict__.get("defaults", {}))
        parent = next(base.defaults for base in cls.__mro__[1:] if "defaults" in base.__dict__)
        unknown = set(changes) - set(AlgorithmConfig.defaults)
        if unknown:
            raise TypeError(
                f"{cls.__name__}.defaults names {sorted(unknown)}, which are not AlgorithmConfig fields; an "
                "algorithm's own fields carry their default in their declaration."
            )
        cls.defaults = MappingProxyType({**parent, **changes})

    def __post_init__(self) -> None:
        self.fill_algorithm_defaults()
        self.check_algorithm_fields()

    def algorithm_defaults(self) -> Mapping[str, Any]:
        """The defaults None-valued fields take (this class's `defaults`)."""
        return type(self).defaults

    def fill_algorithm_defaults(self) -> None:
        """Replace every None field of `defaults` by the algorithm's default."""
        for name, value in self.algorithm_defaults().items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def check_algorithm_fields(self) -> None:
        """Every declared check of this config's fields, then the rules between algorithm fields."""
        check_fields(self)
        self.check_algorithm_rules()

    def check_algorithm_rules(self) -> None:
        """The rules between fields: ``eta`` within the chosen SDE's range, ``kl_coef_min <= beta``."""
        unit = get_sde(self.sde)
        if not unit.stochastic:
            raise ValueError(
                f"sde={self.sde!r} injects no noise, so there is no policy gradient; choose one of "
                f"{', '.join(stochastic_sde_types())}."
            )
        unit.validate_eta(self.eta)
        if self.kl_coef_min > self.beta:
            raise ValueError(
                f"kl_coef_min ({self.kl_coef_min}) must not exceed beta ({self.beta}), the largest KL coefficient."
            )

    def check_rollouts(self, group_size: int, sde_window: Sequence[int] | None) -> None:
        """Raise ``ValueError`` unless the algorithm can train on groups of ``group_size`` samples per prompt whose
        steps ``sde_window`` (``[start, end)``; None: every step, or not known yet) are stochastic. Every shape by
        default; BranchGRPO needs a power of its branching factor and room for its splits in the window. Drivers
        call it before any rollout."""

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> set[str]:
        """Names of every field."""
        return {f.name for f in fields(cls)}

    @classmethod
    def own_fields(cls) -> tuple[Any, ...]:
        """The fields this algorithm declares beyond `AlgorithmConfig`'s (``sage-train`` lists them under
        ``--algorithm NAME --help``; `sage_trl.SageGRPOConfig` takes them in ``algorithm_args``)."""
        shared = {f.name for f in fields(AlgorithmConfig)}
        return tuple(f for f in fields(cls) if f.name not in shared)
