"""`SageGRPOConfig`: TRL's `GRPOConfig` with the fields of RL for flow-matching video models (arXiv 2603.21872).

The class is assembled from two parts, so that no hyperparameter is declared twice:

* `SageGRPOFields`, declared here: the model, the video and its sampling, memory switches, rewards, the run
  folder. Fields whose value is a property of the model (video size, steps, shift, frame rate) default to None
  and are filled from the model's own defaults (`sage_env.models`).
* the algorithm fields, generated from `agents.config.AlgorithmConfig` (its help text, a default of None meaning
  "the chosen algorithm's default", resolved in ``__post_init__``), so ``algorithm="flow_grpo"`` switches every
  default in one line and ``sage-train --eta 0.3`` reads the same help as ``agents.make(..., eta=0.3)``.

TRL's names keep their TRL meaning where it carries over (``num_generations``, ``num_iterations``, ``epsilon``,
``beta``, ``scale_rewards``, ``reward_weights``); GRPOConfig options that only make sense for text generation are
refused with an error naming them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from trl import GRPOConfig

from agents import ALGORITHM_CONFIGS, AlgorithmConfig
from agents.config import AGENT_ONLY_FIELDS, trainer_fields
from sage_env.rewards import REWARD_PRESETS

__all__ = ["ALGORITHM_FIELDS", "SageGRPOConfig", "SageGRPOFields"]

_TEXT_GENERATION = (
    "a text-generation option of GRPOConfig; SageGRPOTrainer samples videos, whose randomness is the SDE noise "
    "(eta) and whose length is num_frames x num_inference_steps"
)
_REFUSED_HINTS = {
    "loss_type": "the loss is the algorithm's (Eq. 43, a mean over (video, step) pairs); choose it with `algorithm`",
    "use_vllm": "vLLM generates text, not videos",
    "use_transformers_paged": "paged text generation does not apply to video diffusion",
    "use_transformers_continuous_batching": "continuous text batching does not apply to video diffusion",
    "use_liger_kernel": "Liger kernels patch language-model heads",
    "sync_ref_model": "use kl_strategy='moving' (the paper's periodic anchor, Eq. 13) instead",
    "importance_sampling_level": "ratios are per (video, step) pair, there are no tokens",
    "top_entropy_quantile": "there are no token entropies in video diffusion",
    "entropy_coef": "there are no token entropies in video diffusion",
}
# GRPOConfig fields the trainer uses (everything else GRPOConfig adds to TrainingArguments is refused).
_USED_GRPO_FIELDS = {
    "num_generations",
    "num_generations_eval",
    "shuffle_dataset",
    "generation_batch_size",
    "steps_per_generation",
    "beta",
    "num_iterations",
    "epsilon",
    "epsilon_high",
    "reward_weights",
    "scale_rewards",
    "log_completions",
    "log_multimodal",
    "num_completions_to_print",
    "log_unique_prompts",
}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The values of ``torch_dtype`` and the dtypes they name."""
_MODEL_FIELDS = {
    "num_frames": "num_frames",
    "height": "height",
    "width": "width",
    "num_inference_steps": "num_steps",
    "shift": "shift",
    "fps": "fps",
    "guidance_scale": "guidance_scale",
}
"""SageGRPOConfig field -> attribute of the model's `sage_env.models.SamplingDefaults`."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class SageGRPOFields(GRPOConfig):
    """The fields `SageGRPOConfig` declares itself (the algorithm's are generated; see the module docstring)."""

    # -- model ----------------------------------------------------------------------------------------
    model_name_or_path: str = field(
        default="toy",
        metadata=_help(
            "The video model: a diffusers pipeline folder or Hub id (WanPipeline, HunyuanVideo15Pipeline), or 'toy' "
            "for the built-in toy world. Its own defaults (video size, steps, schedule, guidance) fill every "
            "field left unset."
        ),
    )
    backbone: str | None = field(
        default=None,
        metadata=_help("Force the backbone by pipeline class name instead of reading model_index.json."),
    )
    torch_dtype: str | None = field(
        default=None,
        metadata=_help(
            "Parameter dtype of the video model: float32 | bfloat16 | float16. None: bfloat16 base weights for "
            "LoRA with bf16, float32 otherwise (full fine-tuning keeps fp32 master weights)."
        ),
    )
    algorithm: str = field(
        default="sage_grpo",
        metadata=_help(
            "Registered algorithm (agents.list_agents()): sage_grpo | flow_grpo | dance_grpo | cps | ddpo | reinforce. "
            "Switches every algorithm default at once. Recommended: sage_grpo."
        ),
    )
    # -- video and sampling (None: the model's) ----------------------------------------------------------
    num_frames: int | None = field(
        default=None,
        metadata=_help(
            "Frames per video. Memory and compute grow linearly. None: the model's (81 for Wan and "
            "HunyuanVideo 1.5 as in the paper, 8 for the toy)."
        ),
    )
    height: int | None = field(
        default=None, metadata=_help("Video height in pixels. None: the model's (480p).")
    )
    width: int | None = field(default=None, metadata=_help("Video width in pixels. None: the model's."))
    fps: float | None = field(
        default=None, metadata=_help("Frame rate passed to the reward. None: the model's.")
    )
    num_inference_steps: int | None = field(
        default=None,
        metadata=_help(
            "Denoising steps per rollout; rollout compute scales with it. None: the model's (paper: 20)."
        ),
    )
    shift: float | None = field(
        default=None,
        metadata=_help(
            "Time shift of the flow-matching schedule. None: the model's own schedule (the pipeline's scheduler "
            "for Wan and HunyuanVideo 1.5, 3 for the toy); a number: sage_env.sde.flow_match_sigmas(steps, shift)."
        ),
    )
    sde_window: list[int] | None = field(
        default=None,
        metadata=_help(
            "[start, end): only these steps use the SDE (and are trained); the others use the ODE. Fewer trained "
            "steps, less training compute. None: all steps (paper)."
        ),
    )
    rollout_batch_size: int | None = field(
        default=None,
        metadata=_help(
            "Videos per transformer forward in rollouts (memory); None: the whole rollout batch at once."
        ),
    )
    # -- memory savers (docs/training_on_gpus.md) -----------------------------------------------------------
    precompute_prompt_embeddings: bool = field(
        default=False,
        metadata=_help(
            "Encode every training prompt once before training, then move the text encoders off the "
            "accelerator."
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
            "Move reward models off the accelerator between scoring calls (rewards with an offload())."
        ),
    )
    diffusers_gradient_checkpointing: bool = field(
        default=False,
        metadata=_help(
            "Set from gradient_checkpointing: diffusers models use enable_gradient_checkpointing()."
        ),
    )
    # -- rewards ------------------------------------------------------------------------------------------
    reward_preset: str | None = field(
        default=None,
        metadata=_help(
            "Component weights: setting_a (VQ/MQ/TA 1/1/1) | setting_b (0.5/0.5/1, the paper's best). None: "
            "Setting B for components named vq/mq/ta and 1.0 for every single-score reward function."
        ),
    )
    reward_component_weights: dict | str | None = field(
        default=None,
        metadata=_help(
            'Explicit {component: weight} (a JSON string on the command line), e.g. {"vq": 1, "ta": 2}.'
        ),
    )
    # -- run folder and Hub ---------------------------------------------------------------------------------
    overwrite_output_dir: bool = field(
        default=False,
        metadata=_help(
            "Delete the run an existing output_dir holds (its checkpoints, weights, metrics; nothing else) and "
            "start over. Without it, starting into a folder that holds a run is an error."
        ),
    )
    hub_license: str | None = field(
        default=None,
        metadata=_help(
            "License of the pushed model (model card metadata), e.g. apache-2.0; required to push."
        ),
    )
    # -- TRL fields whose defaults change ---------------------------------------------------------------------
    num_generations: int | None = field(
        default=4, metadata=_help("Group size G (videos per prompt). Paper: 4.")
    )
    logging_steps: float = field(default=1, metadata=_help("Log every X optimizer steps."))
    gradient_checkpointing: bool = field(
        default=False,
        metadata=_help("Recompute activations in backward (diffusers' enable_gradient_checkpointing)."),
    )
    save_strategy: str = field(
        default="no", metadata=_help("no | steps | epoch; checkpoints resume exactly.")
    )

    def __post_init__(self) -> None:
        self._refuse_text_generation_options()
        self._resolve_precision_and_checkpointing()
        if self.algorithm not in ALGORITHM_CONFIGS:
            raise ValueError(
                f"Unknown algorithm {self.algorithm!r}; choose one of {', '.join(sorted(ALGORITHM_CONFIGS))}."
            )
        self.resolve_model_defaults()
        self._fill_algorithm_defaults()
        self._parse_reward_weights()
        self._validate_run()
        self._validate_sampling()
        super().__post_init__()
        self.algorithm_config()  # validates the algorithm fields with AlgorithmConfig's own rules

    # -- resolution ---------------------------------------------------------------------------------------

    def _refuse_text_generation_options(self) -> None:
        """GRPOConfig options for text generation or LLM internals: an error when set, instead of being ignored."""
        refused = _grpo_own_fields() - _USED_GRPO_FIELDS
        for grpo_field in fields(GRPOConfig):
            if grpo_field.name not in refused and grpo_field.name not in _REFUSED_HINTS:
                continue
            value = getattr(self, grpo_field.name)
            if value != _default_of(grpo_field):
                reason = _REFUSED_HINTS.get(grpo_field.name, _TEXT_GENERATION)
                raise ValueError(
                    f"{grpo_field.name}={value!r} is not supported by SageGRPOTrainer: {reason}."
                )

    def _resolve_precision_and_checkpointing(self) -> None:
        if self.bf16 is None:
            self.bf16 = torch.cuda.is_available() and not self.fp16 and not getattr(self, "use_cpu", False)
        if self.gradient_checkpointing or self.activation_checkpointing:
            self.diffusers_gradient_checkpointing = True
        # transformers would call gradient_checkpointing_enable(), which diffusers models do not have.
        self.gradient_checkpointing = False
        self.activation_checkpointing = False

    def parameter_dtype(self, lora: bool) -> torch.dtype:
        """The dtype the model's weights are loaded in: ``torch_dtype`` when set; else bf16 for a LoRA run with
        ``bf16`` (the frozen base) and float32 otherwise. Full fine-tuning keeps fp32 master weights and computes
        under bf16 autocast: Adam updates of ~1e-5 relative size would round away in bf16 weights."""
        if self.torch_dtype:
            return TORCH_DTYPES[self.torch_dtype]
        return torch.bfloat16 if self.bf16 and lora else torch.float32

    def resolve_model_defaults(self, pipeline_class: str | None = None) -> None:
        """Fill the video and sampling fields left None from the model's own defaults (`sage_env.models`).

        ``pipeline_class`` is found from ``model_name_or_path`` without loading weights (the toy, a local
        folder's ``model_index.json``, a Hub cache); when it cannot be (a Hub id not downloaded yet) the fields
        stay None and the trainer calls this again with the loaded backbone's class.
        """
        from sage_env import models

        pipeline_class = pipeline_class or self.backbone or models.pipeline_class_of(self.model_name_or_path)
        if pipeline_class is None:
            return
        defaults = models.SAMPLING_DEFAULTS.get(pipeline_class, models.GENERIC_SAMPLING_DEFAULTS)
        for name, attribute in _MODEL_FIELDS.items():
            if getattr(self, name) is None and getattr(defaults, attribute, None) is not None:
                setattr(self, name, getattr(defaults, attribute))

    def _fill_algorithm_defaults(self) -> None:
        defaults = ALGORITHM_CONFIGS[self.algorithm]()
        for name in ALGORITHM_FIELDS:
            if getattr(self, name) is None and name not in _MODEL_FIELDS:  # a model field's None: the model's
                setattr(self, name, getattr(defaults, name))

    def _parse_reward_weights(self) -> None:
        if isinstance(self.reward_component_weights, str):
            try:
                self.reward_component_weights = json.loads(self.reward_component_weights)
            except json.JSONDecodeError as error:
                raise ValueError(
                    'reward_component_weights must be a JSON object like {"vq": 0.5}, got '
                    f"{self.reward_component_weights!r}."
                ) from error
        if self.reward_component_weights is not None and not isinstance(self.reward_component_weights, dict):
            raise ValueError('reward_component_weights must map components to weights, e.g. {"vq": 0.5}.')
        if self.reward_preset is not None and self.reward_preset not in REWARD_PRESETS:
            raise ValueError(
                f"Unknown reward_preset {self.reward_preset!r}; choose one of {', '.join(REWARD_PRESETS)}."
            )

    # -- validation (before anything is loaded) ---------------------------------------------------------------

    def _validate_run(self) -> None:
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(
                f"max_steps must be a positive number of optimizer steps (or -1 to train num_train_epochs), "
                f"got {self.max_steps}."
            )
        for name in ("per_device_train_batch_size", "num_generations", "gradient_accumulation_steps"):
            _check_positive_int(self, name)
        if self.save_strategy == "steps" and self.save_steps is not None and self.save_steps <= 0:
            raise ValueError(f"save_steps must be > 0 with save_strategy='steps', got {self.save_steps}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}.")
        if self.torch_dtype not in (None, *TORCH_DTYPES):
            raise ValueError(
                f"torch_dtype must be one of {', '.join(TORCH_DTYPES)}, got {self.torch_dtype!r}."
            )

    def _validate_sampling(self) -> None:
        for name in ("num_frames", "height", "width", "num_inference_steps"):
            if getattr(self, name) is not None:
                _check_positive_int(self, name)
        if self.rollout_batch_size is not None:
            _check_positive_int(self, "rollout_batch_size")
        for name in ("fps", "shift"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not _finite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite number > 0 (or None: the model's), got {value!r}.")
        self._validate_sde_window()

    def _validate_sde_window(self) -> None:
        window = self.sde_window
        if window is None:
            return
        steps = self.num_inference_steps
        if (
            not isinstance(window, (list, tuple))
            or len(window) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in window)
            or not 0 <= window[0] < window[1]
            or (steps is not None and window[1] > steps)
        ):
            raise ValueError(
                f"sde_window must be two integers [start, end] with 0 <= start < end <= num_inference_steps "
                f"({steps}), e.g. [0, {steps or 10}], got {window!r}."
            )

    # -- presets and derived views --------------------------------------------------------------------------------

    @classmethod
    def from_preset(cls, name_or_path: str, **overrides: Any) -> Any:
        """A config from a preset (`sage_trl.presets`: a shipped name such as ``"toy"``, or a YAML path) with
        ``overrides`` on top: the layering of ``sage-train --preset NAME --field value``. The preset's
        ``sage-train`` fields (reward, dataset, LoRA) are left out."""
        from sage_trl.presets import load_preset

        names = {f.name for f in fields(cls)}
        values = {key: value for key, value in load_preset(name_or_path).items() if key in names}
        return cls(**{**values, **overrides})

    def algorithm_config(self) -> AlgorithmConfig:
        """The algorithm's config with this run's values (and TRL's seed)."""
        config_class = ALGORITHM_CONFIGS[self.algorithm]
        values = {f.name: getattr(self, f.name) for f in fields(config_class) if f.name in ALGORITHM_FIELDS}
        return config_class(**values, seed=self.seed)

    def reward_weights_for_composite(self) -> dict[str, float] | list[float] | str | None:
        """What `sage_env.rewards.CompositeReward` takes: explicit weights, TRL's list, the preset, or None."""
        if self.reward_component_weights is not None:
            return dict(self.reward_component_weights)
        if self.reward_weights is not None:
            return list(self.reward_weights)
        return self.reward_preset


def _default_of(config_field: dataclasses.Field) -> Any:
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return config_field.default


def refused_fields() -> set[str]:
    """GRPOConfig's text-generation and LLM fields, which `SageGRPOConfig` refuses when set."""
    return (_grpo_own_fields() - _USED_GRPO_FIELDS) | set(_REFUSED_HINTS)


def _grpo_own_fields() -> set[str]:
    from transformers import TrainingArguments

    return {f.name for f in fields(GRPOConfig)} - {f.name for f in fields(TrainingArguments)}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_positive_int(config: Any, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _defaults_note(name: str) -> str:
    """``Default: the algorithm's (sage_grpo 0.5; flow_grpo, ddpo 0.7; ...)`` from the registered configs."""
    by_value: dict[str, list[str]] = {}
    for algorithm, config_class in ALGORITHM_CONFIGS.items():
        value = next(f for f in fields(config_class) if f.name == name).default
        by_value.setdefault(repr(value), []).append(algorithm)
    if len(by_value) == 1:
        return f"Default: {next(iter(by_value))} for every built-in algorithm."
    parts = "; ".join(f"{', '.join(names)} {value}" for value, names in by_value.items())
    return f"Default: the algorithm's ({parts})."


def _algorithm_field(algorithm_field: dataclasses.Field) -> tuple[str, Any, dataclasses.Field]:
    annotation = str(algorithm_field.type)
    if "None" not in annotation:
        annotation = f"{annotation} | None"
    help_text = f"{algorithm_field.metadata['help']} {_defaults_note(algorithm_field.name)}"
    return algorithm_field.name, annotation, field(default=None, metadata={"help": help_text})


ALGORITHM_FIELDS: tuple[str, ...] = tuple(f.name for f in trainer_fields())
"""The `SageGRPOConfig` fields generated from `agents.config.AlgorithmConfig` (all but `AGENT_ONLY_FIELDS`)."""

assert not set(ALGORITHM_FIELDS) & set(AGENT_ONLY_FIELDS)

SageGRPOConfig = dataclasses.make_dataclass(
    "SageGRPOConfig",
    [_algorithm_field(f) for f in trainer_fields()],
    bases=(SageGRPOFields,),
    namespace={
        "__module__": __name__,
        "__doc__": (
            "Configuration of `SageGRPOTrainer`: TRL's `GRPOConfig` plus the fields of RL for video diffusion.\n\n"
            "The algorithm fields are generated from `agents.config.AlgorithmConfig` (one declaration each; None "
            "takes the chosen algorithm's default); the model, video, memory and reward fields are "
            "`SageGRPOFields`'. ``num_generations`` is the group size G, ``per_device_train_batch_size`` the "
            "videos per process and step, ``beta`` the (maximum) KL coefficient. Defaults that differ from "
            "GRPOConfig: ``num_generations=4`` (paper), ``logging_steps=1``, ``bf16`` only with CUDA, "
            "``gradient_checkpointing`` through diffusers, ``save_strategy='no'``."
        ),
    },
)
