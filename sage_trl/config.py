"""`SageGRPOConfig`: TRL's `GRPOConfig` with the fields of RL for flow-matching video models (arXiv 2603.21872).

Every field is declared once, in a class body, and `SageGRPOConfig` composes the three places they live:

* TRL's `GRPOConfig` (and transformers' ``TrainingArguments``): the training loop, logging, saving, the Hub;
* `SageGRPOFields`, declared here: the model, the video and its sampling, memory switches, rewards, the run
  folder. Fields whose value is a property of the model (video size, steps, shift, frame rate) default to None
  and are filled from the model's own defaults (`sage_env.models`);
* `agents.config.AlgorithmConfig`: the algorithm's hyperparameters, None meaning "the chosen algorithm's default",
  so ``algorithm="flow_grpo"`` switches every default in one line and ``sage-train --eta 0.3`` reads the same help
  as ``agents.make(..., eta=0.3)``. An algorithm's own fields (DDPO's ``stat_buffer_size``) travel in
  ``algorithm_args``.

TRL's names keep their TRL meaning where it carries over (``num_generations``, ``num_iterations``, ``epsilon``,
``beta``, ``scale_rewards``, ``reward_weights``); GRPOConfig options that only make sense for text generation are
refused with an error naming them. Every field has a declared check (`sage_env.checks`; TRL's fields in
`sage_trl.config_checks`), applied in ``__post_init__``: the command line, a YAML file and Python meet the same
rule with the same error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from trl import GRPOConfig

from agents import ALGORITHMS, AlgorithmConfig, algorithm_spec
from sage_env.backbones import BACKBONES, TORCH_DTYPES
from sage_env.checks import Choice, Flag, Integer, ListOf, Real, Text, check_fields, hyperparameter
from sage_env.models import SamplingDefaults
from sage_env.plugins import PluginName
from sage_env.rewards import REWARD_PRESETS
from sage_trl import config_checks

__all__ = ["ALGORITHM_FIELDS", "TORCH_DTYPES", "SageGRPOConfig", "SageGRPOFields"]

_MODEL_FIELDS = {
    "num_frames": "num_frames",
    "height": "height",
    "width": "width",
    "num_inference_steps": "num_steps",
    "shift": "shift",
    "fps": "fps",
    "guidance_scale": "guidance_scale",
}
"""SageGRPOConfig field -> attribute of the backbone's `sage_env.models.SamplingDefaults`."""
_PRESET_EVALUATION_SCHEDULE = ("eval_strategy", "eval_steps", "eval_on_start")
"""A preset's evaluation schedule: it goes with the preset's held-out prompts (`SageGRPOConfig.from_preset`)."""
ALGORITHM_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(AlgorithmConfig))
"""The fields `SageGRPOConfig` takes from `agents.config.AlgorithmConfig`."""


@dataclass(frozen=True)
class _ComponentWeights(Real):
    """``reward_component_weights``: ``{component: weight}`` with finite weights (a negative one is a penalty)."""

    optional: bool = True

    def describe(self) -> str:
        return 'a mapping of reward components to finite weights, e.g. {"vq": 0.5, "ta": 1}'

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, dict) or not value or not all(isinstance(k, str) and k for k in value):
            self.fail(name, value)
        for component, weight in value.items():
            Real().check(f"{name}[{component!r}]", weight)


@dataclass
class SageGRPOFields(GRPOConfig):
    """The fields `SageGRPOConfig` declares itself (the algorithm's are `AlgorithmConfig`'s, the rest TRL's)."""

    # -- model ----------------------------------------------------------------------------------------
    model_name_or_path: str = hyperparameter(
        "toy",
        "The video model: a diffusers pipeline folder or Hub id (WanPipeline, HunyuanVideo15Pipeline), or 'toy' "
        "for the built-in toy world. Its own defaults (video size, steps, schedule, guidance) fill every "
        "field left unset.",
        Text(max_length=4096),
    )
    backbone: str | None = hyperparameter(
        None,
        "Force the backbone by name (a pipeline class name, an installed package's backbone, or 'module:Class') "
        "instead of reading model_index.json.",
        PluginName(BACKBONES, optional=True),
    )
    torch_dtype: str | None = hyperparameter(
        None,
        "Parameter dtype of the video model: float32 | bfloat16 | float16. None: bfloat16 base weights for "
        "LoRA with bf16, float32 otherwise (full fine-tuning keeps fp32 master weights).",
        Choice(tuple(TORCH_DTYPES), optional=True),
    )
    expert: str | None = hyperparameter(
        None,
        "Wan 2.2 A14B: the expert that trains: 'transformer' (high noise), 'transformer_2' (low noise) or 'both' "
        "(each training pair goes to the expert that produced its step, each expert with its own adapter, anchor "
        "and optimizer groups: sage_trl.experts). None: the backbone's default (the high-noise expert). 'both' "
        "costs a second adapter with its optimizer state and anchor (MBs with LoRA) and no extra compute; "
        "recommended 'both' when the reward depends on detail the low-noise steps draw. Not in the paper (its "
        "models have one transformer).",
        Choice(("transformer", "transformer_2", "both"), optional=True),
    )
    offload_idle_expert: bool = hyperparameter(
        False,
        "With expert 'both': keep the frozen weights of the expert that is not computing in host memory and swap "
        "them in when its steps come (sage_env.backbones.wan_experts). Saves one expert's weights on the device "
        "(A14B in bf16: 26.6 GiB) at two copies of them per rollout and per optimizer step over PCIe (the preflight "
        "counts them) and as much host RAM. Needs LoRA (the swapped weights must be frozen). Recommended for A14B "
        "on one 80 GB GPU; unneeded with FSDP over several GPUs. Not in the paper (a memory saver).",
        Flag(),
    )
    algorithm: str = hyperparameter(
        "sage_grpo",
        "The algorithm: a built-in (the README's algorithm table says when to choose each), an installed package's "
        "(entry-point group sage_grpo.algorithms) or 'module:Class'; an unknown name lists the known ones. "
        "Switches every algorithm default at once. Recommended: sage_grpo.",
        PluginName(ALGORITHMS),
    )
    algorithm_args: dict | str | None = hyperparameter(
        None,
        'The algorithm\'s own fields beyond the shared ones, e.g. {"stat_buffer_size": 8} for ddpo (a JSON string '
        "on the command line; sage-train also takes them as flags, --stat_buffer_size 8). None: their defaults.",
    )
    # -- video and sampling (None: the model's) ----------------------------------------------------------
    num_frames: int | None = hyperparameter(
        None,
        "Frames per video. Memory and compute grow linearly. None: the model's (81 for Wan and "
        "HunyuanVideo 1.5 as in the paper, 8 for the toy).",
        Integer(1, 10**4, optional=True),
    )
    height: int | None = hyperparameter(
        None, "Video height in pixels. None: the model's (480p).", Integer(1, 8192, optional=True)
    )
    width: int | None = hyperparameter(
        None, "Video width in pixels. None: the model's.", Integer(1, 8192, optional=True)
    )
    fps: float | None = hyperparameter(
        None,
        "Frame rate passed to the reward. None: the model's.",
        Real(0.0, 1000.0, low_open=True, optional=True),
    )
    num_inference_steps: int | None = hyperparameter(
        None,
        "Denoising steps per rollout; rollout compute scales with it. None: the model's (paper: 20).",
        Integer(1, 1000, optional=True),
    )
    shift: float | None = hyperparameter(
        None,
        "Time shift of the flow-matching schedule. None: the model's own schedule (the pipeline's scheduler "
        "for Wan and HunyuanVideo 1.5, 3 for the toy); a number: sage_env.sde.flow_match_sigmas(steps, shift).",
        Real(0.0, 1000.0, low_open=True, optional=True),
    )
    sde_window: list[int] | None = hyperparameter(
        None,
        "[start, end): only these steps use the SDE (and are trained); the others use the ODE. Fewer trained "
        "steps, less training compute. None: all steps (paper).",
        ListOf(Integer(0, 1000), min_length=2, max_length=2, optional=True, hint="e.g. [0, 5]"),
    )
    rollout_batch_size: int | None = hyperparameter(
        None,
        "Videos per transformer forward in rollouts (memory); None: the whole rollout batch at once.",
        Integer(1, 2**16, optional=True),
    )
    # -- memory savers (docs/training_on_gpus.md) -----------------------------------------------------------
    precompute_prompt_embeddings: bool = hyperparameter(
        False,
        "Encode every training prompt once before training, then move the text encoders off the accelerator.",
        Flag(),
    )
    prompt_encode_batch_size: int = hyperparameter(
        8,
        "Distinct prompts per text-encoder call when precompute_prompt_embeddings is on: bounds the encoders' "
        "activations, the one-time encode phase's memory above their weights. 8 keeps that phase below the "
        "training micro-step for HunyuanVideo 1.5 (Qwen2.5-VL keeps every hidden state, ~0.4 GiB per prompt; 64 made "
        "it the peak at 57 GiB). 1: the smallest phase (Wan 2.1 1.3B: 11.3 -> 10.7 GiB, traced; the 16 GB config) at "
        "one call per prompt, each also encoding the negative prompt (one pass over the prompt set at start, "
        "nothing per step). Not in the paper (a memory saver).",
        Integer(1, 2**16),
    )
    offload_text_encoders: bool = hyperparameter(
        True, "Keep text encoders off the accelerator between prompt encodings (no-op on CPU).", Flag()
    )
    vae_tiling: bool = hyperparameter(False, "Decode rollouts in spatial tiles (less memory).", Flag())
    vae_slicing: bool = hyperparameter(False, "Decode rollouts one video at a time (less memory).", Flag())
    reward_offload: bool = hyperparameter(
        False,
        "Move reward models off the accelerator between scoring calls (rewards with an offload()).",
        Flag(),
    )
    activation_offload: bool = hyperparameter(
        False,
        "Hold the block inputs gradient checkpointing keeps in host memory during the training micro-step, and "
        "copy each back when backward recomputes its block (sage_trl.activation_offload). Saves most of the "
        "micro-step's activations (HunyuanVideo 1.5 480p: 14 GiB of 38) at two PCIe copies of them per "
        "micro-step (measured: about a third more time per micro-step on an H200 machine) and as much host RAM per process. Needs "
        "gradient_checkpointing. Recommended when the training micro-step is the peak and does not fit; the "
        "update is unchanged. Not in the paper (a memory saver).",
        Flag(),
    )
    sequential_cfg: bool = hyperparameter(
        False,
        "Backpropagate the two classifier-free-guidance branches of the training forward one after the other: "
        "each branch is checkpointed as a whole, so only one branch's saved activations (with "
        "gradient_checkpointing, its block inputs) exist at a time (sage_env.backbones._diffusers."
        "branch_prediction). Saves about 40 percent of the training micro-step's activations (traced, HunyuanVideo 1.5 "
        "480p: 38.2 -> 30.8 GiB) at one more forward per "
        "branch (traced: 20 percent more FLOPs per training micro-step, 11 percent more per optimizer step). "
        "Same gradients. Recommended when the training micro-step is the peak and activation_offload is not "
        "enough; combines with it. Not in the paper (a memory saver).",
        Flag(),
    )
    diffusers_gradient_checkpointing: bool = hyperparameter(
        False,
        "Set from gradient_checkpointing: diffusers models use enable_gradient_checkpointing().",
        Flag(),
    )
    # -- rewards ------------------------------------------------------------------------------------------
    reward_preset: str | None = hyperparameter(
        None,
        "Component weights: setting_a (VQ/MQ/TA 1/1/1) | setting_b (0.5/0.5/1, the paper's best). None: "
        "Setting B for components named vq/mq/ta and 1.0 for every single-score reward function. Set at most one "
        "of reward_preset, reward_component_weights and reward_weights.",
        Choice(tuple(REWARD_PRESETS), optional=True),
    )
    reward_component_weights: dict | str | None = hyperparameter(
        None,
        'Explicit {component: weight} (a JSON string on the command line), e.g. {"vq": 1, "ta": 2}.',
        _ComponentWeights(),
    )
    # -- evaluation (docs/runs.md) ----------------------------------------------------------------------------
    eval_seeds: list[int] = hyperparameter(
        [0, 1],
        "Seeds of the held-out evaluation: every prompt of eval_dataset (sage-train: eval_prompts) is sampled "
        "deterministically once per seed, the same starting noise at every evaluation. More seeds, a tighter "
        "held-out mean at one more video per prompt per evaluation. Evaluation runs with eval_strategy / "
        "eval_steps and once before and after training in sage-train.",
        ListOf(Integer(0, 2**31 - 1), min_length=1, max_length=256),
    )
    gradient_norm_steps: int = hyperparameter(
        0,
        "Every this many optimizer steps (the first included), backpropagate each denoising step's loss on its own "
        "(over the step's first gradient-accumulation part) and log its gradient norm "
        "(diagnostics/step_<k>/grad_norm) and their spread, largest over smallest "
        "(diagnostics/grad_norm_spread): the paper's Fig. 4, live, and how far the temporal gradient equalizer "
        "(Eq. 9) flattens it. Costs one more forward and backward of that part's pairs on those steps; training is "
        "unchanged. 0: off (recommended for long runs; 10 on the toy). Not with FSDP or DeepSpeed.",
        Integer(0, 10**6),
    )
    stop_on_alarm: bool = hyperparameter(
        False,
        "Stop training when an alarm fires (the rules of sage_trl.alarms, listed in docs/runs.md, 'Alarms': reward "
        "hacking, a reward component rising alone, held-out videos getting worse, the importance ratio off 1, groups "
        "without signal, a KL spike): the model is saved and training_complete.json says stopped_on_alarm, so the "
        "run resumes from its last checkpoint. Without it alarms warn and are recorded (alarms.jsonl, summary.md, "
        "the model card). Not in the paper.",
        Flag(),
    )
    # -- run folder and Hub ---------------------------------------------------------------------------------
    overwrite_output_dir: bool = hyperparameter(
        False,
        "Delete the run an output_dir holds (only the files this library recorded writing there) and start over. "
        "Without it, starting into a folder that holds a run is an error; a folder this library did not create "
        "is never overwritten.",
        Flag(),
    )
    hub_license: str | None = hyperparameter(
        None,
        "License of the pushed model (model card metadata), e.g. apache-2.0; required to push.",
        Text(max_length=100, optional=True),
    )
    # -- TRL fields whose defaults change ---------------------------------------------------------------------
    num_generations: int | None = hyperparameter(4, "Group size G (videos per prompt). Paper: 4.")
    logging_steps: float = hyperparameter(1, "Log every X optimizer steps.")
    gradient_checkpointing: bool = hyperparameter(
        False, "Recompute activations in backward (diffusers' enable_gradient_checkpointing)."
    )
    save_strategy: str = hyperparameter("no", "no | steps | epoch; checkpoints resume exactly.")


@dataclass
class SageGRPOConfig(AlgorithmConfig, SageGRPOFields):
    """Configuration of `SageGRPOTrainer`: TRL's `GRPOConfig` plus the fields of RL for video diffusion.

    The algorithm fields are `agents.config.AlgorithmConfig`'s (one declaration each; None takes the chosen
    algorithm's default, or the model's for ``guidance_scale``); the model, video, memory and reward fields are
    `SageGRPOFields`'. ``num_generations`` is the group size G, ``per_device_train_batch_size`` the videos per
    process and step, ``beta`` the (maximum) KL coefficient. Defaults that differ from GRPOConfig:
    ``num_generations=4`` (paper), ``logging_steps=1``, ``bf16`` only with CUDA, ``gradient_checkpointing``
    through diffusers, ``save_strategy='no'``.
    """

    def __post_init__(self) -> None:
        own_checks = {f.name for f in fields(self) if "check" in f.metadata}
        config_checks.check_annotated_types(
            self, skip=own_checks | {"algorithm_args", "reward_component_weights"}
        )
        config_checks.refuse_text_generation_options(self)
        self._resolve_precision_and_checkpointing()
        self._parse_json_fields()
        check_fields(self, only=SageGRPOFields)  # the model and its paths, before they are looked up
        self.resolve_model_defaults()
        self.fill_algorithm_defaults()
        check_fields(self)
        config_checks.check_training_arguments(self)
        self._check_run_rules()
        self.check_algorithm_rules()
        self._check_reward_weights()
        self._check_precision_fits_the_machine()
        if self.ddp_find_unused_parameters is None:  # every parameter reaches the loss (sage_trl.distributed)
            self.ddp_find_unused_parameters = False
        GRPOConfig.__post_init__(self)

    def to_dict(self) -> dict[str, Any]:
        """transformers' ``TrainingArguments.to_dict`` (tokens masked, enums as values), not the algorithm's."""
        return SageGRPOFields.to_dict(self)

    # -- resolution ---------------------------------------------------------------------------------------

    def algorithm_defaults(self) -> Mapping[str, Any]:
        """The chosen algorithm's defaults (what None-valued algorithm fields take)."""
        return algorithm_spec(self.algorithm).config_class.defaults

    def check_algorithm_rules(self) -> None:
        """The chosen algorithm's rules between its fields and its own fields' checks: its config class, built from
        this run's values, checks them (a plug-in's rules may call ``super()``, so they run on that class), and the
        rollouts it needs: the group size (``num_generations``) and, where this config fixes them, the stochastic
        steps (``sde_window``, else all ``num_inference_steps``)."""
        steps = self.num_inference_steps
        window = self.sde_window or ([0, steps] if steps is not None else None)
        self.algorithm_config().check_rollouts(self.num_generations, window)

    def _resolve_precision_and_checkpointing(self) -> None:
        if self.bf16 is None:
            self.bf16 = torch.cuda.is_available() and not self.fp16 and not getattr(self, "use_cpu", False)
        if self.gradient_checkpointing or self.activation_checkpointing:
            self.diffusers_gradient_checkpointing = True
        # transformers would call gradient_checkpointing_enable(), which diffusers models do not have.
        self.gradient_checkpointing = False
        self.activation_checkpointing = False
        if self.offload_idle_expert and self.expert != "both":
            raise ValueError(
                "offload_idle_expert swaps the idle one of two trained Wan 2.2 experts: set expert: both, or drop "
                "offload_idle_expert."
            )
        if self.activation_offload and not self.diffusers_gradient_checkpointing:
            raise ValueError(
                "activation_offload holds the block inputs that gradient checkpointing keeps on the host, so it "
                "needs gradient_checkpointing: set gradient_checkpointing: true, or drop activation_offload."
            )

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
        from sage_env.backbones import backbone_class
        from sage_env.models import pipeline_class_of

        pipeline_class = pipeline_class or self.backbone or pipeline_class_of(self.model_name_or_path)
        if pipeline_class is None:
            return
        filled = self.sampling().filled_from(backbone_class(pipeline_class).sampling_defaults)
        for name, attribute in _MODEL_FIELDS.items():
            setattr(self, name, getattr(filled, attribute))

    def sampling(self) -> SamplingDefaults:
        """The run's video size, steps, shift, guidance and frame rate as one bundle (None where the model's default
        applies): what the environment, the evaluation and the preflight sample with."""
        return SamplingDefaults(
            **{attribute: getattr(self, name) for name, attribute in _MODEL_FIELDS.items()}
        )

    def _parse_json_fields(self) -> None:
        """``reward_component_weights`` and ``algorithm_args`` arrive as JSON strings from the command line."""
        for name in ("reward_component_weights", "algorithm_args"):
            value = getattr(self, name)
            if not isinstance(value, str):
                continue
            try:
                setattr(self, name, json.loads(value))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f'{name} must be a JSON object like {{"key": 0.5}}, got {value!r}.'
                ) from error
        if self.algorithm_args is not None and not isinstance(self.algorithm_args, dict):
            raise ValueError(f"algorithm_args must map field names to values, got {self.algorithm_args!r}.")

    # -- rules between fields (before anything is loaded) ---------------------------------------------------------

    def _check_run_rules(self) -> None:
        if self.max_steps == 0:
            raise ValueError(
                "max_steps must be a positive number of optimizer steps (or -1 to train num_train_epochs), got 0."
            )
        window, steps = self.sde_window, self.num_inference_steps
        if window is not None and (window[0] >= window[1] or (steps is not None and window[1] > steps)):
            raise ValueError(
                f"sde_window must be two integers [start, end] with 0 <= start < end <= num_inference_steps "
                f"({steps}), e.g. [0, {steps or 10}], got {window!r}."
            )

    def _check_precision_fits_the_machine(self) -> None:
        """bf16 or fp16 training needs a GPU unless the run is explicitly on the CPU (transformers' own error says
        neither what asked for it nor the ways on)."""
        from transformers.utils import is_torch_bf16_gpu_available

        half = "bf16" if self.bf16 else "fp16" if self.fp16 else None
        accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
        supported = (
            is_torch_bf16_gpu_available()
            if half == "bf16"
            else accelerator or torch.backends.mps.is_available()
        )
        if half and not self.use_cpu and not supported:
            raise ValueError(
                f"{half} is on (in the config or its flags), but this machine has no GPU that computes in it. To see "
                "what the config "
                "needs on a GPU, run it with --preflight (it plans on any CPU); to train here anyway, pass "
                f"--use_cpu true (slow), or --{half} false."
            )

    def _check_reward_weights(self) -> None:
        given = [
            name
            for name in ("reward_component_weights", "reward_weights", "reward_preset")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"{' and '.join(given)} are both set, and only one decides the weights: keep one of them."
            )
        weights = self.reward_component_weights or {}
        values = list(weights.values()) if isinstance(weights, dict) else []
        values += list(self.reward_weights or [])
        if values and not any(
            value != 0 for value in values if isinstance(value, (int, float)) and math.isfinite(value)
        ):
            raise ValueError(
                f"{given[0]} gives every reward weight 0: the total reward would be 0 for every video and nothing "
                "would be learned. Give at least one component a positive weight."
            )

    # -- presets and derived views --------------------------------------------------------------------------------

    @classmethod
    def from_preset(cls, name_or_path: str, **overrides: Any) -> Any:
        """A config from a preset (`sage_trl.presets`: a shipped name such as ``"toy"``, or a YAML path) with
        ``overrides`` on top: the layering of ``sage-train --preset NAME --field value``, the preset's ``per_algorithm``
        values for the chosen algorithm included (`sage_trl.presets.values_for`). The preset's ``sage-train`` fields
        (reward, dataset, LoRA) are left out, and with them its evaluation schedule (``eval_strategy``,
        ``eval_steps``, ``eval_on_start``), which evaluates its held-out prompts (``eval_prompts``, a ``sage-train``
        field): pass them as the trainer's ``eval_dataset`` with your own schedule."""
        from sage_trl.presets import load_preset, values_for

        preset = load_preset(name_or_path)
        algorithm = overrides.get("algorithm") or preset.get("algorithm") or cls.algorithm
        names = {f.name for f in fields(cls)} - set(_PRESET_EVALUATION_SCHEDULE)
        values = {key: value for key, value in values_for(preset, algorithm).items() if key in names}
        return cls(**{**values, **overrides})

    def algorithm_config(self) -> AlgorithmConfig:
        """The algorithm's config with this run's values: the shared fields and ``algorithm_args``."""
        config_class = algorithm_spec(self.algorithm).config_class
        own = {f.name for f in config_class.own_fields()}
        extra = dict(self.algorithm_args or {})
        unknown = set(extra) - own
        if unknown:
            hint = (
                f"its own fields are {', '.join(sorted(own))}" if own else "it declares no fields of its own"
            )
            raise ValueError(
                f"algorithm_args names {sorted(unknown)}, which algorithm {self.algorithm!r} does not declare ({hint}); "
                "shared fields such as eta are set directly."
            )
        return config_class(**{name: getattr(self, name) for name in ALGORITHM_FIELDS}, **extra)

    def reward_weights_for_composite(self) -> dict[str, float] | list[float] | str | None:
        """What `sage_env.rewards.CompositeReward` takes: explicit weights, TRL's list, the preset, or None."""
        if self.reward_component_weights is not None:
            return dict(self.reward_component_weights)
        if self.reward_weights is not None:
            return list(self.reward_weights)
        return self.reward_preset


def refused_fields() -> set[str]:
    """GRPOConfig's text-generation and LLM fields, which `SageGRPOConfig` refuses when set."""
    return config_checks.refused_fields()
