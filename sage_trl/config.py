"""`SageGRPOConfig`: TRL's `GRPOConfig` with the fields of diffusion RL (paper arXiv 2603.21872)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from trl import GRPOConfig

from agents import ALGORITHM_CONFIGS, AlgorithmConfig
from sage_env.rewards import REWARD_PRESETS

__all__ = ["SageGRPOConfig"]

# SageGRPOConfig field -> AlgorithmConfig field, where TRL's name differs from ours.
_TRL_TO_ALGORITHM = {"beta": "kl_coef_max"}
# Fields that default to None and take the value of the chosen algorithm's config.
_ALGORITHM_DEFAULTED = (
    "sde",
    "eta",
    "log_prob_kind",
    "scale_rewards",
    "adv_clip_max",
    "epsilon",
    "epsilon_high",
    "equalizer",
    "timestep_fraction",
    "kl_strategy",
    "kl_coef_schedule",
    "kl_coef_min",
    "beta",
    "learning_rate",
)
_UNSUPPORTED_TRL_OPTIONS = {
    "use_vllm": "vLLM generates text, not videos",
    "use_transformers_paged": "paged text generation does not apply to video diffusion",
    "use_transformers_continuous_batching": "continuous text batching does not apply to video diffusion",
    "use_liger_kernel": "Liger kernels patch language-model heads",
    "sync_ref_model": "use kl_strategy='moving' (the paper's periodic anchor) instead",
}


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class SageGRPOConfig(GRPOConfig):
    r"""Configuration of `SageGRPOTrainer`: TRL's `GRPOConfig` plus the fields of RL for video diffusion.

    TRL names keep their TRL meaning where it carries over: ``num_generations`` is the group size G,
    ``per_device_train_batch_size`` the number of *videos* per process and training step,
    ``num_iterations`` the optimizer passes over each rollout, ``epsilon``/``epsilon_high`` the clip range,
    ``beta`` the (maximum) KL coefficient, ``scale_rewards`` the advantage scaling. Algorithm fields left at
    None take the defaults of ``algorithm`` (SAGE-GRPO unless changed), so one line switches algorithm.

    Defaults that differ from `GRPOConfig` because this is diffusion: ``num_generations=4`` (paper),
    ``logging_steps=1``, ``bf16`` only when CUDA is available (no bf16 autocast on CPU),
    ``gradient_checkpointing`` through diffusers' ``enable_gradient_checkpointing``, ``save_strategy="no"``.
    """

    # -- model --------------------------------------------------------------------------------
    model_name_or_path: str = field(
        default="toy",
        metadata=_help(
            "Diffusers pipeline folder or Hub id (WanPipeline, HunyuanVideo15Pipeline), or 'toy' for the built-in world."
        ),
    )
    backbone: str | None = field(
        default=None,
        metadata=_help("Force the backbone by pipeline class name instead of reading model_index.json."),
    )
    torch_dtype: str | None = field(
        default=None,
        metadata=_help(
            "Parameter dtype of the video model: float32 | bfloat16 | float16. None: float32 on CPU, bfloat16 on GPU."
        ),
    )
    algorithm: str = field(
        default="sage_grpo",
        metadata=_help(
            "Registered algorithm: sage_grpo | flow_grpo | dance_grpo | cps | ddpo | reinforce (agents.list_agents())."
        ),
    )
    # -- video and sampling -------------------------------------------------------------------
    num_frames: int = field(
        default=8, metadata=_help("Frames per video (81 in the paper; 8 for the toy world).")
    )
    height: int = field(default=16, metadata=_help("Video height in pixels (480 in the paper)."))
    width: int = field(default=16, metadata=_help("Video width in pixels (848 for HunyuanVideo 1.5 480p)."))
    fps: float | None = field(
        default=None, metadata=_help("Frame rate passed to the reward; None: the model's.")
    )
    num_inference_steps: int = field(default=20, metadata=_help("Denoising steps per rollout. Paper: 20."))
    shift: float = field(default=5.0, metadata=_help("Flow-matching time shift of the schedule. Paper: 5."))
    sde_window: list[int] | None = field(
        default=None,
        metadata=_help(
            "[start, end): only these steps use the SDE (and train); the others use the ODE. None: all steps."
        ),
    )
    guidance_scale: float = field(
        default=1.0,
        metadata=_help(
            "Classifier-free guidance in rollouts and training (HunyuanVideo 1.5 uses ~6, Wan 5; 1 disables)."
        ),
    )
    negative_prompt: str | None = field(
        default=None, metadata=_help("Negative prompt for CFG; None: model default.")
    )
    # -- algorithm (None: the algorithm's default) --------------------------------------------
    sde: str | None = field(
        default=None, metadata=_help("sage | flow_grpo | dance_grpo | cps. SAGE-GRPO: sage (Eq. 5-7).")
    )
    eta: float | None = field(default=None, metadata=_help("Exploration scale. SAGE-GRPO: 0.5."))
    log_prob_kind: str | None = field(default=None, metadata=_help("gaussian | cps (published CPS' -mse)."))
    adv_clip_max: float | None = field(default=None, metadata=_help("Advantage clip. Official: 5."))
    equalizer: bool | None = field(
        default=None, metadata=_help("Temporal gradient equalizer (Eq. 9). SAGE: on.")
    )
    timestep_fraction: float | None = field(
        default=None, metadata=_help("Fraction of steps trained per sample.")
    )
    timestep_permutation: bool = field(
        default=True, metadata=_help("Random per-sample order of trained steps.")
    )
    kl_strategy: str | None = field(
        default=None, metadata=_help("none | fixed | stepwise | moving | dual. SAGE: dual.")
    )
    beta_pos: float = field(
        default=1.0, metadata=_help("Position (anchor) KL weight in dual KL (Eq. 14). 1.0.")
    )
    beta_vel: float = field(default=0.1, metadata=_help("Step-wise (velocity) KL weight in dual KL. 0.1."))
    anchor_update_steps: int = field(
        default=10, metadata=_help("Moving-anchor refresh interval (optimizer steps). 10.")
    )
    kl_coef_schedule: str | None = field(
        default=None, metadata=_help("adaptive (App. A.6) | constant (beta).")
    )
    kl_coef_min: float | None = field(
        default=None, metadata=_help("lambda_min of the adaptive KL. Paper: 1e-7.")
    )
    kl_warmup_steps: int = field(
        default=100, metadata=_help("Warm-up of the KL coefficient (optimizer steps). 100.")
    )
    kl_target: float = field(
        default=1e-5, metadata=_help("Target KL of the feedback rule (official code: 1e-5).")
    )
    kl_history: int = field(default=10, metadata=_help("KL values averaged by the feedback rule. 10."))
    micro_batch_size: int = field(
        default=4,
        metadata=_help("(sample, step) pairs per forward in the training phase; lower it to save memory."),
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata=_help(
            "Videos per transformer forward during rollouts (memory); None: the whole rollout batch at once."
        ),
    )
    reference_offload: bool = field(
        default=False,
        metadata=_help(
            "Full fine-tuning: keep the KL reference copy on CPU between uses (LoRA anchors are adapter snapshots)."
        ),
    )
    precompute_prompt_embeddings: bool = field(
        default=False,
        metadata=_help(
            "Encode every training prompt once before training, then move the text encoders off the accelerator."
        ),
    )
    offload_text_encoders: bool = field(
        default=True,
        metadata=_help("Keep text encoders off the accelerator between prompt encodings (no-op on CPU)."),
    )
    vae_tiling: bool = field(default=False, metadata=_help("Decode rollouts in spatial tiles (less memory)."))
    vae_slicing: bool = field(
        default=False, metadata=_help("Decode rollouts one video at a time (less memory).")
    )
    reward_offload: bool = field(
        default=False,
        metadata=_help(
            "Move reward models off the accelerator between scoring calls (reward functions with an offload())."
        ),
    )
    diffusers_gradient_checkpointing: bool = field(
        default=False,
        metadata=_help(
            "Set automatically from gradient_checkpointing: diffusers models use enable_gradient_checkpointing()."
        ),
    )
    # -- rewards ------------------------------------------------------------------------------
    reward_preset: str | None = field(
        default=None,
        metadata=_help(
            "Component weights: setting_a (VQ/MQ/TA 1/1/1) | setting_b (0.5/0.5/1, the paper's best). None: Setting B "
            "for components named vq/mq/ta and 1.0 for every single-score reward function."
        ),
    )
    reward_component_weights: dict | str | None = field(
        default=None,
        metadata=_help(
            'Explicit {component: weight} (JSON string on the CLI), overriding reward_preset, e.g. {"vq": 1, "ta": 2}.'
        ),
    )
    hub_license: str | None = field(
        default=None,
        metadata=_help(
            "License of the pushed adapter (model card metadata), e.g. apache-2.0; required to push to the Hub."
        ),
    )
    # -- TRL fields whose defaults or meaning change --------------------------------------------
    num_generations: int | None = field(default=4, metadata=_help("Group size G. Paper: 4."))
    learning_rate: float | None = field(
        default=None, metadata=_help("Learning rate; None: algorithm's (1e-5).")
    )
    beta: float | None = field(
        default=None,
        metadata=_help(
            "KL coefficient: lambda_max of the adaptive schedule, or the constant one. SAGE-GRPO: 1e-5."
        ),
    )
    epsilon: float | None = field(default=None, metadata=_help("Ratio clip range. SAGE-GRPO: 1e-4."))
    epsilon_high: float | None = field(default=None, metadata=_help("Upper clip range; None uses epsilon."))
    scale_rewards: str | None = field(default=None, metadata=_help("group | batch | none. SAGE-GRPO: group."))
    logging_steps: float = field(default=1, metadata=_help("Log every X optimizer steps."))
    gradient_checkpointing: bool = field(
        default=False,
        metadata=_help("Recompute activations in backward (diffusers' enable_gradient_checkpointing)."),
    )
    save_strategy: str = field(
        default="no", metadata=_help("no | steps | epoch; checkpoints carry everything to resume.")
    )

    def __post_init__(self) -> None:
        self._resolve_precision_and_checkpointing()
        for name, reason in _UNSUPPORTED_TRL_OPTIONS.items():
            if getattr(self, name, False):
                raise ValueError(f"{name}=True is not supported by SageGRPOTrainer: {reason}.")
        if self.algorithm not in ALGORITHM_CONFIGS:
            raise ValueError(
                f"Unknown algorithm {self.algorithm!r}; choose one of {', '.join(sorted(ALGORITHM_CONFIGS))}."
            )
        self._fill_algorithm_defaults()
        self._parse_reward_weights()
        self._validate_sampling()
        super().__post_init__()
        self.algorithm_config()  # validates the algorithm fields with AlgorithmConfig's own rules

    def _resolve_precision_and_checkpointing(self) -> None:
        if self.bf16 is None:
            self.bf16 = torch.cuda.is_available() and not self.fp16 and not getattr(self, "use_cpu", False)
        if self.gradient_checkpointing or self.activation_checkpointing:
            self.diffusers_gradient_checkpointing = True
        # transformers would call gradient_checkpointing_enable(), which diffusers models do not have.
        self.gradient_checkpointing = False
        self.activation_checkpointing = False

    def _fill_algorithm_defaults(self) -> None:
        defaults = ALGORITHM_CONFIGS[self.algorithm]()
        for name in _ALGORITHM_DEFAULTED:
            if getattr(self, name) is None:
                setattr(self, name, getattr(defaults, _TRL_TO_ALGORITHM.get(name, name)))

    def _parse_reward_weights(self) -> None:
        if isinstance(self.reward_component_weights, str):
            try:
                self.reward_component_weights = json.loads(self.reward_component_weights)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f'reward_component_weights must be a JSON object like {{"vq": 0.5}}, got {self.reward_component_weights!r}.'
                ) from error
        if self.reward_preset is not None and self.reward_preset not in REWARD_PRESETS:
            raise ValueError(
                f"Unknown reward_preset {self.reward_preset!r}; choose one of {', '.join(REWARD_PRESETS)}."
            )

    def _validate_sampling(self) -> None:
        if self.rollout_batch_size is not None and self.rollout_batch_size < 1:
            raise ValueError(f"rollout_batch_size must be >= 1 or None, got {self.rollout_batch_size}.")
        for name in ("num_frames", "height", "width", "num_inference_steps", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.sde_window is not None and (
            len(self.sde_window) != 2
            or not 0 <= self.sde_window[0] < self.sde_window[1] <= self.num_inference_steps
        ):
            raise ValueError(
                f"sde_window must be [start, end] with 0 <= start < end <= num_inference_steps "
                f"({self.num_inference_steps}), got {self.sde_window}."
            )
        if self.torch_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"torch_dtype must be float32, bfloat16 or float16, got {self.torch_dtype!r}.")

    def algorithm_config(self) -> AlgorithmConfig:
        """The algorithm's config with this run's values (TRL names mapped to the algorithm's)."""
        config_class = ALGORITHM_CONFIGS[self.algorithm]
        values: dict[str, Any] = {}
        for config_field in fields(config_class):
            trl_name = next(
                (k for k, v in _TRL_TO_ALGORITHM.items() if v == config_field.name), config_field.name
            )
            if hasattr(self, trl_name) and trl_name not in ("seed",):
                values[config_field.name] = getattr(self, trl_name)
        values["kl_coef_max"] = self.beta
        values["seed"] = self.seed
        return config_class(**values)

    def reward_weights_for_composite(self) -> dict[str, float] | list[float] | str | None:
        """What `sage_env.rewards.CompositeReward` takes: explicit weights, TRL's list, the preset, or None."""
        if self.reward_component_weights is not None:
            return dict(self.reward_component_weights)
        if self.reward_weights is not None:
            return list(self.reward_weights)
        return self.reward_preset
