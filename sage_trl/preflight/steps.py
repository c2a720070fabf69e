"""The trainer's steps, run through the library's own code: what the preflight traces and the benchmark measures.

`prepare_run` puts a backbone in the state `SageGRPOTrainer` puts it in (parameter dtype, LoRA through
`sage_trl.lora.add_lora` or full fine-tuning, accelerate's mixed-precision wrapper around the trained
transformer's forward, diffusers' gradient checkpointing, the VAE savers, the algorithm and its references
(`agents.PolicyGradientAlgorithm.build_references`: the moving anchor of dual KL), and the optimizer transformers
would build for the config). Each phase function then runs one piece of a training step:

* `encode_phase`: `VideoBackbone.encode_prompts`, the pipelines' own ``encode_prompt``;
* `rollout_phase`: one denoising step of the process's videos: `sage_env.env.BackbonePolicy` (CFG velocity,
  ``rollout_batch_size`` videos per forward) and `sage_env.sde.sde_step`;
* `decode_phase`: `VideoBackbone.decode` of the process's final latents;
* `training_phase`: one micro-step of the loss: `agents.PolicyGradientAlgorithm.training_batch` picks the (video,
  step) pairs of one training step, the first ``micro_batch_size`` of them go through
  `agents.PolicyGradientAlgorithm.loss` (moving-anchor forward, policy forward with CFG, dual KL, equalizer),
  then backward; gradients of earlier micro-steps are already accumulated, as in every micro-step but the first;
* `optimizer_phase`: gradient clipping, the optimizer step, ``zero_grad``.

The functions take real or fake tensors alike: `sage_trl.preflight.runner` runs them under fake tensors at full
size, `sage_trl.preflight.measure` (the tests, ``benchmarks/gpu_memory.py``) on real tensors to compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents import ALGORITHM_CLASSES, Algorithm, References
from sage_env import sde
from sage_env.backbones import PromptConditioning, VideoBackbone
from sage_env.env import BackbonePolicy, DenoisingVectorEnv, Trajectory
from sage_trl import training_setup
from sage_trl.experts import expert_groups

__all__ = [
    "TrainingRun",
    "allocate_rollout_buffer",
    "decode_phase",
    "encode_phase",
    "optimizer_phase",
    "precompute_prompts",
    "prepare_run",
    "rollout_phase",
    "rollout_rounds_per_optimizer_step",
    "round_prompts",
    "trained_pairs_per_step",
    "training_pairs",
    "training_phase",
    "training_trajectory",
]


def rollout_rounds_per_optimizer_step(config: Any) -> float:
    """Rollout rounds between two optimizer steps (TRL generates every ``steps_per_generation x num_iterations``
    training steps, an optimizer step comes every ``gradient_accumulation_steps``)."""
    return config.gradient_accumulation_steps / (config.steps_per_generation * config.num_iterations)


def _autocast_dtype(config: Any) -> torch.dtype | None:
    return torch.bfloat16 if config.bf16 else torch.float16 if config.fp16 else None


@dataclass
class TrainingRun:
    """Everything a trainer keeps alive between steps."""

    backbone: VideoBackbone
    config: Any  # the run's `sage_trl.SageGRPOConfig`
    algorithm: Algorithm
    references: References
    optimizer: torch.optim.Optimizer
    env: DenoisingVectorEnv
    max_grad_norm: float
    negative_prompt: str | None
    guidance_scale: float
    rollout_buffer: torch.Tensor | None = None

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]


def _wrap_mixed_precision(module: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """What ``accelerate.Accelerator.prepare_model`` does to the trained model with native mixed precision: its
    forward runs under autocast and returns float32 outputs (``convert_outputs_to_fp32``)."""
    from types import MethodType

    from accelerate.utils.operations import convert_outputs_to_fp32

    if dtype is None:
        return
    device_type = next(module.parameters()).device.type
    autocast_forward = torch.autocast(device_type=device_type, dtype=dtype)(module.forward.__func__)
    module.forward = MethodType(convert_outputs_to_fp32(autocast_forward), module)


def _optimizer(config: Any, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer transformers' Trainer builds for ``config`` (``Trainer.get_optimizer_cls_and_kwargs``)."""
    from transformers import Trainer

    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(config)
    return optimizer_class(parameters, **kwargs)


def _never_called_reward(videos: Any, prompts: Sequence[str], **kwargs: Any) -> torch.Tensor:
    """The environment's reward: a phase never ends an episode, so it is never called."""
    return torch.zeros(len(prompts))


def prepare_run(
    backbone: VideoBackbone,
    config: Any,
    lora_config: Any = None,
    *,
    precompute: Callable[[VideoBackbone], None] | None = None,
    steady_state: bool = True,
) -> TrainingRun:
    """Put ``backbone`` in the trainer's training state for ``config``, in `SageGRPOTrainer`'s order:
    ``precompute(backbone)`` (where the trainer precomputes prompt embeddings, before anything else), LoRA (or all
    weights trainable), the algorithm, accelerate's mixed-precision wrapper, the memory savers, the references and
    the optimizer. ``steady_state``: take one optimizer step with zero gradients, so that the optimizer state exists
    as in every step after the first.
    """
    from sage_trl.lora import add_lora

    if precompute is not None:
        precompute(backbone)
    if lora_config is not None:
        add_lora(backbone, lora_config)
    else:
        backbone.transformer.requires_grad_(True)
    algorithm_config = config.algorithm_config()
    algorithm = ALGORITHM_CLASSES[config.algorithm](algorithm_config, seed=config.seed)
    _wrap_mixed_precision(backbone.transformer, _autocast_dtype(config))
    training_setup.enable_memory_savers(backbone, config)
    backbone.transformer.train()
    trainable = [p for p in backbone.transformer.parameters() if p.requires_grad]
    run = TrainingRun(
        backbone=backbone,
        config=config,
        algorithm=algorithm,
        references=algorithm.build_references(backbone.transformer),
        optimizer=_optimizer(config, trainable),
        env=training_setup.training_env(backbone, _never_called_reward, config),
        max_grad_norm=config.max_grad_norm,
        negative_prompt=algorithm_config.negative_prompt,
        guidance_scale=algorithm_config.guidance_scale,
    )
    if steady_state:
        _allocate_gradients(run)
        optimizer_phase(run)
    return run


def _allocate_gradients(run: TrainingRun) -> None:
    """Gradients as after earlier micro-steps of an accumulation: zeros, made from ``empty_like`` so that a trace
    treats their values as unknown, like gradients from a backward pass (only their memory matters)."""
    for parameter in run.trainable:
        if parameter.grad is None:
            parameter.grad = torch.empty_like(parameter).zero_()


def round_prompts(config: Any) -> list[str]:
    """The prompts of one rollout round on one process: groups of ``num_generations`` repeats (TRL's sampler)."""
    group = config.num_generations
    return [f"prompt {index // group}" for index in range(training_setup.videos_per_round(config))]


def precompute_prompts(config: Any) -> list[str]:
    """One call of the trainer's prompt precomputation: ``prompt_encode_batch_size`` distinct prompts."""
    return [f"prompt {index}" for index in range(config.prompt_encode_batch_size)]


def encode_phase(
    backbone: VideoBackbone, prompts: Sequence[str], negative_prompt: str | None
) -> PromptConditioning:
    """Encode ``prompts`` (and the negative prompt) with the backbone's text encoders, as the trainer does."""
    return backbone.encode_prompts(list(prompts), negative_prompt)


def allocate_rollout_buffer(run: TrainingRun) -> torch.Tensor:
    """The latents the environment records for every video and step (``(N, T + 1, *latent_shape)`` float32),
    kept by TRL's generation buffer until the round's training steps are done (Gaussian, like the initial noise)."""
    steps = run.env.num_steps
    shape = (run.env.num_envs, steps + 1, *run.env.latent_shape)
    run.rollout_buffer = torch.randn(shape, device=run.backbone.device)
    return run.rollout_buffer


def rollout_phase(run: TrainingRun, step: int = 0) -> torch.Tensor:
    """Denoising step ``step`` of the process's videos: CFG velocity (`BackbonePolicy`) and the SDE step."""
    env = run.env
    latents = run.rollout_buffer[:, step]
    sigmas = env.sigmas.to(latents.device)
    size = env.num_envs
    observation = {
        "latents": latents,
        "sigma": sigmas[step].expand(size),
        "prompt": tuple(round_prompts(run.config)),
    }
    policy = BackbonePolicy(
        run.backbone,
        run.guidance_scale,
        run.negative_prompt,
        run.config.rollout_batch_size,
        share_identical_rows=False,  # fake tensors: nothing to compare; every row is the bound
    )
    run.backbone.transformer.eval()
    try:
        velocity = policy(observation)
        with torch.no_grad():
            out = sde.sde_step(
                env.step_sde_types[step],
                latents,
                velocity,
                sigmas[step].expand(size),
                sigmas[step + 1].expand(size),
                env.eta,
                log_prob_kind=env.log_prob_kind,
            )
    finally:
        run.backbone.transformer.train()
    return out.x_next


def decode_phase(run: TrainingRun) -> torch.Tensor:
    """`VideoBackbone.decode` of the final latents of every video of the round (the environment's last step)."""
    with torch.no_grad():
        return run.backbone.decode(run.rollout_buffer[:, -1])


def training_trajectory(run: TrainingRun) -> Trajectory:
    """The recorded trajectory of the videos of one training step (``per_device_train_batch_size`` of the round)."""
    env = run.env
    count = run.config.per_device_train_batch_size
    sigmas = env.sigmas
    stds = torch.stack(
        [
            sde.noise_std(kind, sigmas[t : t + 1], sigmas[t + 1 : t + 2], env.eta)[0]
            for t, kind in enumerate(env.step_sde_types)
        ]
    )
    return Trajectory(
        prompts=tuple(round_prompts(run.config)[:count]),
        group_index=torch.zeros(count, dtype=torch.long),
        seeds=torch.arange(count),
        sigmas=sigmas.expand(count, -1).to(run.backbone.device),
        latents=run.rollout_buffer[:count],
        log_probs=torch.zeros(count, env.num_steps, device=run.backbone.device),
        stds=stds.expand(count, -1).to(run.backbone.device),
        trainable=(stds > 0).expand(count, -1).to(run.backbone.device),
        sde_types=env.step_sde_types,
        eta=env.eta,
        log_prob_kind=env.log_prob_kind,
    )


def training_pairs(run: TrainingRun) -> Any:
    """The (video, step) pairs of one training step (`agents.Algorithm.training_batch`)."""
    trajectory = training_trajectory(run)
    count = len(trajectory)
    # Zero-mean, as group-normalised advantages are.
    advantages = torch.linspace(-1.0, 1.0, count, device=run.backbone.device)
    usable = torch.ones(count, dtype=torch.bool, device=run.backbone.device)
    return run.algorithm.training_batch(trajectory, advantages, usable, run.backbone, on_policy=True)


def training_phase(run: TrainingRun, pairs: Any, micro_batch_size: int) -> int:
    """One micro-step: the loss of the first ``micro_batch_size`` pairs of the first trained expert (the trainer's
    micro-batches run one expert each: `sage_trl.experts`), then backward with gradients of earlier micro-steps
    accumulated. Returns the number of pairs in the micro-batch."""
    own = next(rows for rows in expert_groups(pairs, run.backbone).values() if len(rows))
    chunk = next(own.chunks(micro_batch_size))
    _allocate_gradients(run)
    loss, _ = run.algorithm.loss(run.backbone, chunk, run.references)
    loss.backward()
    return len(chunk)


def optimizer_phase(run: TrainingRun) -> None:
    """Gradient clipping, the optimizer step and ``zero_grad(set_to_none=True)``, as transformers' Trainer."""
    torch.nn.utils.clip_grad_norm_(run.trainable, run.max_grad_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)


def trained_pairs_per_step(run: TrainingRun) -> int:
    """(video, step) pairs one training step of one process trains (``timestep_fraction`` of the SDE steps)."""
    fraction = run.algorithm.config.timestep_fraction
    stochastic = sum(sde.get_sde(kind).stochastic for kind in run.env.step_sde_types)
    return run.config.per_device_train_batch_size * math.ceil(fraction * stochastic)
