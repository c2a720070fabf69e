"""Peak memory and step time of SAGE-GRPO's two phases on the real-size video transformers.

The transformers of HunyuanVideo 1.5 480p T2V (8.3B parameters) and Wan 2.1 T2V 1.3B are built from their
published diffusers ``transformer/config.json`` with random weights (nothing is downloaded) and wrapped in the
library's own backbones (`HunyuanVideo15Backbone`, `WanBackbone`) on a pipeline that holds only the
transformer, the scheduler and a tiny VAE the pipeline constructor insists on (never run). Velocities, CFG and
the loss are therefore exactly the trainer's:

* rollout: one denoising step of ``rollout_batch`` videos at the paper's latent shape (81 frames), without
  gradients, with CFG (`VideoBackbone.predict_velocity`: a conditional and an unconditional pass, as in
  ``SageGRPOTrainer._rollout``);
* training: one optimizer step on ``micro_batch_size`` (sample, timestep) pairs: the SAGE-GRPO loss of
  `agents` (moving-anchor forward without gradients, policy forward with CFG, Eq. 43 with the dual KL of
  Eq. 14), backward, gradient clipping and AdamW, measured in steady state (after a warm-up step has created
  the optimizer state). Rollouts are measured after training, so the optimizer state is resident as in a run.

Scenarios switch one saver at a time against ``lora`` (every saver of ``examples/configs`` on): gradient
checkpointing, bf16 (base weights bf16, LoRA weights fp32, bf16 autocast) vs fp32, the micro-batch size, the
rollout batch, and full fine-tuning (fp32 master weights with bf16 autocast) with the anchor on the accelerator
or offloaded to CPU (``reference_offload``).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (the caching allocator reserves somewhat more); on CPU
the tensors resident when the phase starts plus the peak of the CPU allocator's own accounting during the phase
(``torch.profiler`` with ``profile_memory``), which counts tensor storage only, not the Python process (it
agreed with the growth of the process's peak RSS, ``VmHWM``, to 2% on a Wan training step). bf16 runs autocast
the whole step (the trainer autocasts each forward call through accelerate; the peak is the same because the
autocast weight cache of a forward lives until its backward anyway).

Run::

    python -m benchmarks.gpu_memory                        # real size: needs a CUDA GPU
    python -m benchmarks.gpu_memory --scale 0.03125        # layers, width and latent shape shrunk: CPU, 1-2 min
    python -m benchmarks.gpu_memory --model wan2.1-1.3b --scenario lora full --output memory.md
    python -m benchmarks.gpu_memory --project              # full-size projection from a CPU grid (~30 min)

``--scale S`` multiplies the number of layers and attention heads (head size kept: the rotary embedding needs
it), the latent token count and the text token counts by about ``S`` (each latent axis by ``S ** (1/3)``), so
parameters and activation memory shrink roughly as ``S ** 3`` and the N^2 attention-mask term as ``S ** 2``.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agents import ALGORITHM_CLASSES, ALGORITHM_CONFIGS, PolicyGradientAlgorithm, References, TransitionBatch
from sage_env import sde
from sage_env.backbones import PromptConditioning, VideoBackbone

__all__ = [
    "DEFAULT_CPU_SCALE",
    "MODELS",
    "SCENARIOS",
    "ModelSpec",
    "PhaseResult",
    "Projection",
    "Scenario",
    "activation_features",
    "build_backbone",
    "fit_activation_model",
    "format_projections",
    "format_results",
    "main",
    "parameter_counts",
    "parameter_table",
    "project_full_size",
    "run_benchmark",
    "scaled_spec",
]

DEFAULT_CPU_SCALE = 0.03125
"""The scale suggested for CPU runs: both models, every scenario in 1-2 minutes on 2 cores."""

NUM_STEPS, SHIFT, ETA = 20, 5.0, 0.5  # the paper's schedule and exploration scale
TRAIN_STEP_INDEX = 5  # a mid-trajectory (sigma ~0.9) step: memory does not depend on which one


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A video transformer at the size of one published checkpoint, and the shapes it sees in a rollout.

    Args:
        name: short name used on the command line.
        checkpoint: the Hub id whose ``transformer/config.json`` `config` reproduces.
        config: the transformer's diffusers config (random weights are built from it).
        latent_shape: ``(C, F', H', W')`` of one video at `video` (what ``backbone.latent_shape`` returns).
        video: the video size, for the tables.
        text_tokens: conditioning length per text input (e.g. ``{"prompt_embeds": (1000, 3584)}``).
        guidance_scale: CFG scale of the rollouts and of the training forward.
        patch: the transformer's ``(t, h, w)`` patch size (scaled latent axes stay multiples of it).
        image_tokens: zero image-embedding tokens the pipeline appends (HunyuanVideo 1.5: 729).
        text_masks: whether the conditioning carries attention masks (``<name>_mask`` per text input).
    """

    name: str
    checkpoint: str
    config: dict[str, Any]
    latent_shape: tuple[int, int, int, int]
    video: str
    text_tokens: dict[str, tuple[int, int]]
    guidance_scale: float
    patch: tuple[int, int, int]
    image_tokens: int = 0
    text_masks: bool = False

    @property
    def latent_tokens(self) -> int:
        """Video tokens the transformer attends over (latent positions after patching)."""
        _, frames, height, width = self.latent_shape
        return (frames // self.patch[0]) * (height // self.patch[1]) * (width // self.patch[2])

    @property
    def attended_tokens(self) -> int:
        """Video plus text (and image) tokens: the sequence of HunyuanVideo 1.5's joint attention."""
        return self.latent_tokens + sum(length for length, _ in self.text_tokens.values()) + self.image_tokens

    @property
    def num_layers(self) -> int:
        """Transformer blocks."""
        return int(self.config["num_layers"])

    @property
    def width(self) -> int:
        """Hidden size: attention heads x head size."""
        return int(self.config["num_attention_heads"] * self.config["attention_head_dim"])


# HunyuanVideo 1.5 480p T2V: hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v, transformer/config.json
# (the HunyuanVideo15Transformer3DModel defaults with target_size 640 and task_type t2v). The pipeline pads
# the Qwen2.5-VL prompt to 1000 tokens and the ByT5 glyph prompt to 256, and always appends 729 (zero) image
# tokens, so every attention call sees 33390 + 1985 tokens at 81 x 480 x 848.
HUNYUAN_VIDEO_15 = ModelSpec(
    name="hunyuanvideo-1.5",
    checkpoint="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v",
    config={
        "in_channels": 65,
        "out_channels": 32,
        "num_attention_heads": 16,
        "attention_head_dim": 128,
        "num_layers": 54,
        "num_refiner_layers": 2,
        "mlp_ratio": 4.0,
        "patch_size": 1,
        "patch_size_t": 1,
        "qk_norm": "rms_norm",
        "text_embed_dim": 3584,
        "text_embed_2_dim": 1472,
        "image_embed_dim": 1152,
        "rope_theta": 256.0,
        "rope_axes_dim": (16, 56, 56),
        "target_size": 640,
        "task_type": "t2v",
        "use_meanflow": False,
    },
    latent_shape=(32, 21, 30, 53),
    video="81 x 480 x 848",
    text_tokens={"prompt_embeds": (1000, 3584), "prompt_embeds_2": (256, 1472)},
    guidance_scale=6.0,
    patch=(1, 1, 1),
    image_tokens=729,
    text_masks=True,
)

# Wan 2.1 T2V 1.3B: Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json. UMT5 prompts are padded to 512
# tokens; 81 x 480 x 832 gives 21 x 60 x 104 latents, 32760 tokens after the (1, 2, 2) patch.
WAN_21_1_3B = ModelSpec(
    name="wan2.1-1.3b",
    checkpoint="Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    config={
        "patch_size": (1, 2, 2),
        "num_attention_heads": 12,
        "attention_head_dim": 128,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": 8960,
        "num_layers": 30,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": None,
        "added_kv_proj_dim": None,
        "rope_max_seq_len": 1024,
    },
    latent_shape=(16, 21, 60, 104),
    video="81 x 480 x 832",
    text_tokens={"prompt_embeds": (512, 4096)},
    guidance_scale=5.0,
    patch=(1, 2, 2),
)

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (HUNYUAN_VIDEO_15, WAN_21_1_3B)}
"""The benchmarked models by command-line name."""


def _scaled_count(value: int, factor: float, multiple: int = 1) -> int:
    return max(multiple, round(value * factor / multiple) * multiple)


def scaled_spec(
    spec: ModelSpec, scale: float, num_layers: int | None = None, num_heads: int | None = None
) -> ModelSpec:
    """`spec` with layers, heads and token counts multiplied by about ``scale``.

    The head size stays (the rotary embedding splits it per axis); Wan's feed-forward width follows the number
    of heads; each latent axis shrinks by ``scale ** (1/3)`` (kept a multiple of the patch), so the video token
    count shrinks by about ``scale``; text and image token counts shrink by ``scale``. ``num_layers`` and
    ``num_heads`` override the scaled depth and width: `project_full_size` measures two of each at one scale to
    separate per-layer from fixed memory and width-proportional from width-independent memory.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"scale must lie in (0, 1], got {scale}.")
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    config = dict(spec.config)
    heads = num_heads or _scaled_count(config["num_attention_heads"], scale)
    if "ffn_dim" in config:
        config["ffn_dim"] = round(config["ffn_dim"] * heads / config["num_attention_heads"])
    config["num_attention_heads"] = heads
    config["num_layers"] = num_layers or _scaled_count(config["num_layers"], scale)
    if scale == 1:
        return replace(spec, config=config)
    axis = scale ** (1 / 3)
    channels, frames, height, width = spec.latent_shape
    latent_shape = (
        channels,
        _scaled_count(frames, axis, spec.patch[0]),
        _scaled_count(height, axis, spec.patch[1]),
        _scaled_count(width, axis, spec.patch[2]),
    )
    text = {name: (_scaled_count(length, scale), dim) for name, (length, dim) in spec.text_tokens.items()}
    image = _scaled_count(spec.image_tokens, scale) if spec.image_tokens else 0
    return replace(
        spec,
        config=config,
        latent_shape=latent_shape,
        text_tokens=text,
        image_tokens=image,
        video=f"{spec.video} scaled x{scale:g}",
    )


def _transformer_class(spec: ModelSpec) -> type[torch.nn.Module]:
    from diffusers import HunyuanVideo15Transformer3DModel, WanTransformer3DModel

    return HunyuanVideo15Transformer3DModel if spec.name == HUNYUAN_VIDEO_15.name else WanTransformer3DModel


def _backbone_class(spec: ModelSpec) -> type[VideoBackbone]:
    from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
    from sage_env.backbones.wan import WanBackbone

    return HunyuanVideo15Backbone if spec.name == HUNYUAN_VIDEO_15.name else WanBackbone


def _hunyuan_pipeline(spec: ModelSpec, transformer: torch.nn.Module) -> Any:
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance

    # The pipeline reads the latent channels and compression ratios from its VAE; this one is never run.
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=spec.latent_shape[0],
        block_out_channels=(8, 8, 8, 8, 8),
        layers_per_block=1,
        spatial_compression_ratio=16,
        temporal_compression_ratio=4,
        downsample_match_channel=False,
        upsample_match_channel=False,
    )
    pipeline = HunyuanVideo15Pipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
        text_encoder_2=None,
        tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=spec.guidance_scale),
    )
    pipeline.vision_num_semantic_tokens = spec.image_tokens  # 729 at full size
    return pipeline


def _wan_pipeline(spec: ModelSpec, transformer: torch.nn.Module) -> Any:
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    vae = AutoencoderKLWan(  # read for its z_dim and compression ratios only
        base_dim=3,
        z_dim=spec.latent_shape[0],
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
        transformer=transformer,
    )


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly in ``dtype`` (no fp32 copy of an 8B model on the way)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_backbone(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype, *, dense_attention_mask: bool = False
) -> VideoBackbone:
    """The library's backbone around a random-weight transformer of `spec`, created on ``device`` in ``dtype``.

    ``dense_attention_mask``: HunyuanVideo 1.5 with diffusers' own attention processor (a dense ``(B, N, N)``
    mask) instead of the backbone's default key-padding mask; ignored for Wan.
    """
    hunyuan = spec.name == HUNYUAN_VIDEO_15.name
    make_pipeline = _hunyuan_pipeline if hunyuan else _wan_pipeline
    with torch.device(device), _default_dtype(dtype):
        pipeline = make_pipeline(spec, _transformer_class(spec)(**spec.config))
    pipeline.set_progress_bar_config(disable=True)
    if hunyuan:
        return _backbone_class(spec)(pipeline, key_padding_attention=not dense_attention_mask)
    return _backbone_class(spec)(pipeline)


# ----------------------------------------------------------------------------------------------
# Parameter counts at full size (meta device: nothing is allocated)
# ----------------------------------------------------------------------------------------------


def _matches_lora_target(name: str, targets: Sequence[str]) -> bool:
    # peft's rule for a list of names: the module name equals a target or ends with "." + target.
    return any(name == target or name.endswith(f".{target}") for target in targets)


def parameter_counts(spec: ModelSpec, lora_rank: int) -> dict[str, int]:
    """``{"total", "lora"}`` parameters of `spec`'s transformer and of a rank-``lora_rank`` adapter on the
    backbone's default LoRA targets, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        transformer = _transformer_class(spec)(**spec.config)
    targets = _backbone_class(spec).default_lora_target_modules
    lora = sum(
        lora_rank * (module.in_features + module.out_features)
        for name, module in transformer.named_modules()
        if isinstance(module, torch.nn.Linear) and _matches_lora_target(name, targets)
    )
    return {"total": sum(p.numel() for p in transformer.parameters()), "lora": lora}


def parameter_table(specs: Sequence[ModelSpec], lora_rank: int) -> str:
    """Markdown: parameter counts and the memory they imply (weights, trainable state, anchor), in GiB.

    Trainable state per parameter: LoRA and full fine-tuning with fp32 master weights both keep the fp32
    parameter, its fp32 gradient and AdamW's two fp32 moments (16 bytes); the moving anchor is a 4-byte copy of
    every trainable parameter (``agents.references.ParameterSnapshot``).
    """
    lines = [
        f"| model | parameters | LoRA r={lora_rank} parameters | base weights bf16 | LoRA state + anchor | "
        "full FT state (fp32 weights, grads, AdamW) | full FT anchor |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec in specs:
        counts = parameter_counts(spec, lora_rank)
        total, lora = counts["total"], counts["lora"]
        lines.append(
            f"| {spec.name} | {total / 1e9:.2f} B | {lora / 1e6:.1f} M | {_gib(2 * total)} | "
            f"{_gib(20 * lora)} | {_gib(16 * total)} | {_gib(4 * total)} |"
        )
    return "\n".join(lines)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------------------------
# Scenarios
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One combination of savers; `phases` are the phases it changes (the others equal ``lora``'s)."""

    name: str
    description: str
    lora: bool = True
    bf16: bool = True
    gradient_checkpointing: bool = True
    micro_batch_size: int = 1
    rollout_batch: int = 1
    reference_offload: bool = False
    dense_attention_mask: bool = False
    phases: tuple[str, ...] = ("rollout", "train")


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario("lora", "LoRA with every saver on (the example configs): the baseline of the ratios"),
        Scenario(
            "lora-no-ckpt", "gradient checkpointing off", gradient_checkpointing=False, phases=("train",)
        ),
        Scenario("lora-fp32", "bf16 off: fp32 weights, no autocast", bf16=False),
        Scenario(
            "lora-micro-batch-2",
            "two (sample, step) pairs per forward",
            micro_batch_size=2,
            phases=("train",),
        ),
        Scenario(
            "lora-rollout-4",
            "four videos per rollout forward (one group)",
            rollout_batch=4,
            phases=("rollout",),
        ),
        Scenario(
            "lora-dense-mask",
            "HunyuanVideo 1.5 with diffusers' dense (B, N, N) attention mask (key_padding_attention=False); "
            "the same as lora for Wan",
            dense_attention_mask=True,
        ),
        Scenario(
            "full", "full fine-tuning: fp32 master weights, bf16 autocast, anchor on the device", lora=False
        ),
        Scenario(
            "full-reference-offload",
            "full fine-tuning, anchor kept on CPU (reference_offload)",
            lora=False,
            reference_offload=True,
        ),
    )
}
"""The measured scenarios by name; each switches one saver relative to ``lora``."""


@dataclass
class PhaseResult:
    """One measured phase: bytes resident when it started, its peak, and its duration (None: out of memory)."""

    model: str
    scenario: str
    phase: str
    resident_bytes: int | None
    peak_bytes: int | None
    seconds: float | None


# ----------------------------------------------------------------------------------------------
# One scenario: build, warm up, measure
# ----------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """What a scenario keeps alive between its phases."""

    backbone: VideoBackbone
    algorithm: PolicyGradientAlgorithm
    references: References
    optimizer: torch.optim.Optimizer
    conditioning: PromptConditioning
    autocast: Callable[[], AbstractContextManager]
    extra: list[torch.Tensor] = field(default_factory=list)


def _conditioning(spec: ModelSpec, batch_size: int, device: torch.device) -> PromptConditioning:
    """Random prompt embeddings shaped like the backbone's `encode_prompts` output (masks: a 100-token prompt)."""
    tensors: dict[str, torch.Tensor] = {}
    for prefix in ("", "negative_"):
        for name, (length, dim) in spec.text_tokens.items():
            tensors[prefix + name] = torch.randn(batch_size, length, dim, device=device)
            if spec.text_masks:
                mask = torch.zeros(batch_size, length, dtype=torch.long, device=device)
                # Qwen prompts: ~100 valid tokens; ByT5: all zero unless the prompt quotes text (as the pipeline).
                mask[:, : min(100, length)] = int(name == "prompt_embeds")
                tensors[f"{prefix}{name.replace('embeds', 'embeds_mask')}"] = mask
    return PromptConditioning([f"prompt {index}" for index in range(batch_size)], tensors)


def _prepare_run(spec: ModelSpec, scenario: Scenario, device: torch.device, lora_rank: int) -> _Run:
    from peft import LoraConfig

    from sage_trl.lora import add_lora

    # LoRA keeps a bf16 base (fp32 adapter); full fine-tuning keeps fp32 master weights and autocasts.
    dtype = torch.bfloat16 if scenario.bf16 and scenario.lora else torch.float32
    backbone = build_backbone(spec, device, dtype, dense_attention_mask=scenario.dense_attention_mask)
    if scenario.lora:
        add_lora(backbone, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, init_lora_weights="gaussian"))
    else:
        backbone.transformer.requires_grad_(True)
    if scenario.gradient_checkpointing:
        backbone.transformer.enable_gradient_checkpointing()
    backbone.transformer.train()
    config = ALGORITHM_CONFIGS["sage_grpo"](
        guidance_scale=spec.guidance_scale,
        reference_offload=scenario.reference_offload,
        micro_batch_size=scenario.micro_batch_size,
    )
    algorithm = ALGORITHM_CLASSES["sage_grpo"](config)
    parameters = [p for p in backbone.transformer.parameters() if p.requires_grad]
    use_cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(parameters, lr=1e-5, fused=use_cuda)
    batch_size = max(scenario.micro_batch_size, scenario.rollout_batch)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if scenario.bf16 else nullcontext
    return _Run(
        backbone=backbone,
        algorithm=algorithm,
        references=algorithm.build_references(backbone.transformer),
        optimizer=optimizer,
        conditioning=_conditioning(spec, batch_size, device),
        autocast=autocast,
    )


def _transition_batch(spec: ModelSpec, run: _Run, size: int, device: torch.device) -> TransitionBatch:
    """``size`` (sample, step) pairs at step `TRAIN_STEP_INDEX`, with a stored SDE transition to score."""
    sigmas = sde.flow_match_sigmas(NUM_STEPS, SHIFT).to(device)
    sigma = sigmas[TRAIN_STEP_INDEX].expand(size)
    sigma_next = sigmas[TRAIN_STEP_INDEX + 1].expand(size)
    latents = torch.randn(size, *spec.latent_shape, device=device)
    stored = sde.sde_step("sage", latents, torch.randn_like(latents), sigma, sigma_next, ETA)
    return TransitionBatch(
        latents=latents,
        next_latents=stored.x_next,
        sigma=sigma,
        sigma_next=sigma_next,
        old_log_prob=stored.log_prob.detach(),
        advantages=torch.linspace(-1, 1, size, device=device),
        weights=torch.ones(size, device=device),
        sample_index=torch.arange(size, device=device),
        step_index=torch.full((size,), TRAIN_STEP_INDEX, device=device),
        conditioning=run.conditioning.select(torch.arange(size)),
        sde_type="sage",
        eta=ETA,
        log_prob_kind="gaussian",
        on_policy=True,
    )


def _train_step(run: _Run, batch: TransitionBatch) -> None:
    """The trainer's step on one micro-batch: Eq. 43 with dual KL, backward, clipping, AdamW."""
    with run.autocast():
        loss, _ = run.algorithm.loss(run.backbone, batch, run.references)
    loss.backward()
    parameters = [p for group in run.optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)


def _rollout_step(spec: ModelSpec, run: _Run, size: int, device: torch.device) -> None:
    """One denoising step of ``size`` videos: CFG velocity without gradients, then the SAGE SDE step."""
    sigmas = sde.flow_match_sigmas(NUM_STEPS, SHIFT).to(device)
    latents = torch.randn(size, *spec.latent_shape, device=device)
    conditioning = run.conditioning.select(torch.arange(size))
    with torch.no_grad(), run.autocast():
        velocity = run.backbone.predict_velocity(
            latents, sigmas[0].expand(size), conditioning, spec.guidance_scale
        )
        sde.sde_step("sage", latents, velocity, sigmas[0].expand(size), sigmas[1].expand(size), ETA)


# ----------------------------------------------------------------------------------------------
# Memory meters
# ----------------------------------------------------------------------------------------------


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared storages counted once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _resident_tensors(run: _Run) -> list[torch.Tensor]:
    """Tensors alive between steps on the measured device: weights, optimizer state, anchor, inputs."""
    module = run.backbone.transformer
    tensors = [*module.parameters(), *module.buffers(), *run.conditioning.tensors.values(), *run.extra]
    for state in run.optimizer.state.values():
        tensors += [value for value in state.values() if isinstance(value, torch.Tensor)]
    if run.references.anchor is not None:
        tensors += list(run.references.anchor.values.values())
    return [tensor for tensor in tensors if tensor.device.type == run.backbone.device.type]


def _measure_cuda(work: Callable[[], None], run: _Run) -> tuple[int, int, float]:
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    work()
    torch.cuda.synchronize()
    return resident, torch.cuda.max_memory_allocated(), time.perf_counter() - start


def _profiled_peak(work: Callable[[], None]) -> tuple[int, float]:
    """Peak of the CPU allocator's running total during ``work`` (allocations minus frees, in order), and the
    seconds ``work`` took (with the profiler's bookkeeping, a few percent at these sizes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        start = time.perf_counter()
        work()
        seconds = time.perf_counter() - start
    events = [event for event in profiler.profiler.kineto_results.events() if event.name() == "[memory]"]
    running = peak = 0
    for event in sorted(events, key=lambda event: event.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak, seconds


def _measure_cpu(work: Callable[[], None], run: _Run) -> tuple[int, int, float]:
    resident = _storage_bytes(_resident_tensors(run))
    peak, seconds = _profiled_peak(work)
    return resident, resident + peak, seconds


def _measure(work: Callable[[], None], run: _Run, device: torch.device) -> tuple[int, int, float]:
    return _measure_cuda(work, run) if device.type == "cuda" else _measure_cpu(work, run)


# ----------------------------------------------------------------------------------------------
# Running scenarios
# ----------------------------------------------------------------------------------------------


def _run_scenario(
    spec: ModelSpec, scenario: Scenario, device: torch.device, lora_rank: int, results: list[PhaseResult]
) -> None:
    """Append the scenario's measured phases to ``results`` (one by one, so an out-of-memory keeps the others)."""
    run = _prepare_run(spec, scenario, device, lora_rank)
    batch = _transition_batch(spec, run, scenario.micro_batch_size, device)
    run.extra = [batch.latents, batch.next_latents, batch.old_log_prob]
    _train_step(run, batch)  # warm-up: creates AdamW's state (steady state is what a run sees)
    phases = {
        "train": lambda: _train_step(run, batch),
        "rollout": lambda: _rollout_step(spec, run, scenario.rollout_batch, device),
    }
    for phase in ("train", "rollout"):
        if phase in scenario.phases:
            measured = _measure(phases[phase], run, device)
            results.append(PhaseResult(spec.name, scenario.name, phase, *measured))


def _record_out_of_memory(spec: ModelSpec, scenario: Scenario, results: list[PhaseResult]) -> None:
    done = {r.phase for r in results if r.model == spec.name and r.scenario == scenario.name}
    for phase in scenario.phases:
        if phase not in done:
            results.append(PhaseResult(spec.name, scenario.name, phase, None, None, None))


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_benchmark(
    specs: Sequence[ModelSpec],
    scenarios: Sequence[Scenario],
    device: torch.device,
    lora_rank: int = 64,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[PhaseResult]:
    """Measure every scenario on every model; an out-of-memory scenario is recorded with ``None`` values."""
    results: list[PhaseResult] = []
    for spec in specs:
        for scenario in scenarios:
            if progress is not None:
                progress(f"{spec.name}: {scenario.name}")
            torch.manual_seed(seed)
            try:
                _run_scenario(spec, scenario, device, lora_rank, results)
            except torch.OutOfMemoryError:
                _record_out_of_memory(spec, scenario, results)
            _release_memory(device)
    return results


# ----------------------------------------------------------------------------------------------
# Projection to full size from scaled-down measurements (the docs' tables until a GPU is at hand)
# ----------------------------------------------------------------------------------------------

PROJECTED_SCENARIOS = (
    "lora",
    "lora-no-ckpt",
    "lora-fp32",
    "lora-micro-batch-2",
    "lora-rollout-4",
    "lora-dense-mask",
)
"""Scenarios whose activation memory the projection measures; full fine-tuning adds parameter-sized terms."""

PROJECTION_LORA_RANK = 4
"""Adapter rank of the projection runs: small, so adapter memory does not blur the activation fit."""


@dataclass
class Projection:
    """Projected full-size memory of one phase: resident tensors plus the activations fitted at small sizes."""

    model: str
    setting: str
    phase: str
    resident_bytes: float
    activation_bytes: float
    fit_residual: float

    @property
    def peak_bytes(self) -> float:
        """Resident plus activation bytes."""
        return self.resident_bytes + self.activation_bytes


def activation_features(spec: ModelSpec, phase: str = "train", dense_mask: bool = False) -> list[float]:
    """What activation memory is linear in: video tokens T times (1, heads), and, when a model with text masks
    runs diffusers' dense attention mask (``dense_mask``: HunyuanVideo 1.5 with ``key_padding_attention=False``
    materialises an N x N mask over its N attended tokens), N^2. A training step also keeps something per layer
    (checkpointed block inputs, or every activation without checkpointing): T x (layers, layers x heads) and
    N^2 x layers. A rollout forward frees each layer's activations before the next layer, so it gets no
    per-layer terms (fitting them from 1-2 layers would extrapolate noise to 54)."""
    if phase not in ("rollout", "train"):
        raise ValueError(f"phase must be 'rollout' or 'train', got {phase!r}.")
    tokens, layers = spec.latent_tokens, spec.num_layers
    heads = spec.config["num_attention_heads"]
    per_layer = phase == "train"
    features = [tokens, tokens * heads] + ([tokens * layers, tokens * layers * heads] if per_layer else [])
    if spec.text_masks and dense_mask:
        features += [spec.attended_tokens**2] + ([spec.attended_tokens**2 * layers] if per_layer else [])
    return [float(feature) for feature in features]


def fit_activation_model(
    samples: Sequence[tuple[ModelSpec, float]], phase: str = "train", dense_mask: bool = False
) -> tuple[torch.Tensor, float]:
    """Least-squares coefficients of `activation_features` for ``(spec, activation bytes)`` samples of one phase,
    and the largest residual relative to its sample (how well the linear model explains the measurements)."""
    features = torch.tensor(
        [activation_features(spec, phase, dense_mask) for spec, _ in samples], dtype=torch.float64
    )
    targets = torch.tensor([value for _, value in samples], dtype=torch.float64)
    if features.shape[0] < features.shape[1]:
        raise ValueError(f"Need at least {features.shape[1]} samples to fit, got {features.shape[0]}.")
    coefficients = torch.linalg.lstsq(features, targets[:, None]).solution[:, 0]
    residual = ((features @ coefficients - targets).abs() / targets.abs().clamp_min(1.0)).max()
    return coefficients, float(residual)


def _activation_bytes(result: PhaseResult, spec: ModelSpec) -> float:
    """Peak minus resident, less a training step's adapter gradients (they scale with parameters, not tokens)."""
    gradients = 4 * parameter_counts(spec, PROJECTION_LORA_RANK)["lora"] if result.phase == "train" else 0
    return float(result.peak_bytes - result.resident_bytes - gradients)


def _measure_grid(
    spec: ModelSpec, scale: float, device: torch.device, progress: Callable[[str], None] | None
) -> dict[tuple[str, str], list[tuple[ModelSpec, float]]]:
    """Activation bytes of every projected scenario at 2 scales x 2 depths x 2 widths around ``scale``."""
    samples: dict[tuple[str, str], list[tuple[ModelSpec, float]]] = {}
    scenarios = [SCENARIOS[name] for name in PROJECTED_SCENARIOS]
    for grid_scale in (scale, scale / 2):
        for layers in (1, 2):
            for heads in (1, 2):
                small = scaled_spec(spec, grid_scale, layers, heads)
                for result in run_benchmark(
                    [small], scenarios, device, PROJECTION_LORA_RANK, progress=progress
                ):
                    samples.setdefault((result.scenario, result.phase), []).append(
                        (small, _activation_bytes(result, small))
                    )
    return samples


def _mask_padding_bytes(spec: ModelSpec, batch: int, dense_mask: bool) -> float:
    """CUDA only: the memory-efficient attention kernel copies a dense boolean mask converted to a bf16 bias into
    a last dimension padded to a multiple of 16, for each of the ``batch`` videos of one attention call (a
    key-padding mask's copy is N entries per video: negligible)."""
    if not (spec.text_masks and dense_mask):
        return 0.0
    attended = spec.attended_tokens
    return 2.0 * batch * attended * (-(-attended // 16) * 16)


def _projected_setting(
    spec: ModelSpec,
    setting: str,
    phase: str,
    activations: dict[tuple[str, str], tuple[float, float]],
    lora_rank: int,
) -> Projection:
    """Resident bytes from the parameter counts plus fitted activations; full fine-tuning adds fp32 gradients
    (4 bytes/parameter) and autocast's bf16 copy of the fp32 weights (2 bytes/parameter) to LoRA's activations."""
    counts = parameter_counts(spec, lora_rank)
    total, lora = counts["total"], counts["lora"]
    scenario = SCENARIOS[setting]
    source = (setting, phase) if scenario.lora else ("lora", phase)
    activation, residual = activations[source]
    batch = scenario.micro_batch_size if phase == "train" else scenario.rollout_batch
    activation += _mask_padding_bytes(spec, batch, scenario.dense_attention_mask)
    if scenario.lora:
        # bf16 or fp32 base; the adapter's fp32 weights, AdamW moments and anchor: 16 bytes per parameter.
        resident = (2 if scenario.bf16 else 4) * total + 16 * lora
        activation += 4 * lora if phase == "train" else 0
    else:
        # fp32 weights and AdamW moments, plus the fp32 anchor unless it is offloaded.
        resident = (12 if scenario.reference_offload else 16) * total
        activation += 2 * total + (4 * total if phase == "train" else 0)
    return Projection(spec.name, setting, phase, float(resident), activation, residual)


def project_full_size(
    spec: ModelSpec,
    scale: float,
    device: torch.device,
    lora_rank: int = 32,
    progress: Callable[[str], None] | None = None,
) -> list[Projection]:
    """Projected full-size peak memory of every scenario and phase of `spec` from a grid of scaled-down runs
    (see `activation_features`); labelled projections, not measurements, in docs/training_on_gpus.md."""
    fitted: dict[tuple[str, str], tuple[float, float]] = {}
    for key, samples in _measure_grid(spec, scale, device, progress).items():
        dense_mask = SCENARIOS[key[0]].dense_attention_mask
        coefficients, residual = fit_activation_model(samples, phase=key[1], dense_mask=dense_mask)
        full_features = torch.tensor(activation_features(spec, key[1], dense_mask), dtype=torch.float64)
        fitted[key] = (float(full_features @ coefficients), residual)
    return [
        _projected_setting(spec, scenario.name, phase, fitted, lora_rank)
        for scenario in SCENARIOS.values()
        for phase in ("rollout", "train")
        if phase in scenario.phases
    ]


def format_projections(projections: Sequence[Projection]) -> str:
    """Markdown table of projected full-size memory in GiB."""
    lines = [
        "| model | scenario | phase | resident GiB | activations GiB | peak GiB | fit residual |",
        "|---|---|---|---|---|---|---|",
    ]
    for item in projections:
        lines.append(
            f"| {item.model} | {item.setting} | {item.phase} | {item.resident_bytes / 2**30:.1f} | "
            f"{item.activation_bytes / 2**30:.1f} | {item.peak_bytes / 2**30:.1f} | {item.fit_residual:.1%} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def _baseline(results: Sequence[PhaseResult], result: PhaseResult) -> PhaseResult | None:
    return next(
        (r for r in results if r.model == result.model and r.phase == result.phase and r.scenario == "lora"),
        None,
    )


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or reference is None or reference == 0:
        return "-"
    return f"{value / reference:.2f}"


def _mib(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "OOM"
    return f"{num_bytes / 2**20:,.1f}"


def format_results(results: Sequence[PhaseResult]) -> str:
    """Markdown table of the results, with peak memory and time relative to the ``lora`` scenario."""
    lines = [
        "| model | scenario | phase | resident MiB | peak MiB | peak / lora | time s | time / lora |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        baseline = _baseline(results, result)
        seconds = "-" if result.seconds is None else f"{result.seconds:.3f}"
        lines.append(
            f"| {result.model} | {result.scenario} | {result.phase} | {_mib(result.resident_bytes)} | "
            f"{_mib(result.peak_bytes)} | {_ratio(result.peak_bytes, baseline and baseline.peak_bytes)} | "
            f"{seconds} | {_ratio(result.seconds, baseline and baseline.seconds)} |"
        )
    return "\n".join(lines)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _report(
    specs: Sequence[ModelSpec], results: Sequence[PhaseResult], device: torch.device, args: Any
) -> str:
    shapes = "\n".join(
        f"- {spec.name}: {spec.video}, latents {spec.latent_shape}, {spec.latent_tokens} video tokens, "
        f"{spec.num_layers} layers x width {spec.width}"
        for spec in specs
    )
    scale = "full size" if args.scale is None else f"scale {args.scale:g}"
    return (
        f"# GPU memory benchmark ({scale}, {_device_name(device)}, torch {torch.__version__})\n\n"
        f"{shapes}\n\nLoRA rank {args.lora_rank} on the backbones' default targets; CFG in both phases.\n\n"
        f"{format_results(results)}\n\n## Full-size parameter counts\n\n"
        f"{parameter_table(list(MODELS.values()), args.lora_rank)}\n"
    )


def _projection_report(projections: Sequence[Projection], device: torch.device, args: Any) -> str:
    return (
        f"# Projected full-size memory (NOT measured: fitted on {_device_name(device)} at scales "
        f"{args.scale:g} and {args.scale / 2:g}, torch {torch.__version__})\n\n"
        f"LoRA rank {args.lora_rank}; peaks are what torch.cuda.max_memory_allocated would report, without the CUDA "
        "context and allocator slack.\n\n"
        f"{format_projections(projections)}\n\n## Full-size parameter counts\n\n"
        f"{parameter_table(list(MODELS.values()), args.lora_rank)}\n"
    )


def _parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--scenario", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help=f"Shrink layers, width and shapes (required on CPU; {DEFAULT_CPU_SCALE} runs in 1-2 min).",
    )
    parser.add_argument("--layers", type=int, default=None, help="Override the (scaled) number of layers.")
    parser.add_argument(
        "--project",
        action="store_true",
        help="Project full-size memory from a grid of scaled-down runs around --scale (~30 min on CPU).",
    )
    parser.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available).")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None, help="Also write the report (markdown) here.")
    return parser.parse_args(argv)


def _resolve_device(args: argparse.Namespace) -> torch.device:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.project and args.scale is None:
        args.scale = DEFAULT_CPU_SCALE
    if device.type != "cuda" and args.scale is None:
        raise ValueError(
            "The full-size benchmark builds an 8.3B-parameter transformer and needs a CUDA GPU; on "
            f"{device.type} pass --scale (e.g. --scale {DEFAULT_CPU_SCALE}) to run a scaled-down version, or "
            "--project to project full-size memory from scaled-down runs."
        )
    if args.lora_rank < 1:
        raise ValueError(f"--lora-rank must be >= 1, got {args.lora_rank}.")
    return device


def main(argv: Sequence[str] | None = None) -> list[PhaseResult] | list[Projection]:
    """Command-line entry point; returns the measurements (or the projections with ``--project``)."""
    args = _parse_arguments(argv)
    device = _resolve_device(args)
    progress = lambda text: print(f"... {text}", flush=True)  # noqa: E731
    if args.project:
        outcome: list[Any] = [
            item
            for name in args.model
            for item in project_full_size(MODELS[name], args.scale, device, args.lora_rank, progress)
        ]
        report = _projection_report(outcome, device, args)
    else:
        specs = [scaled_spec(MODELS[name], args.scale or 1.0, args.layers) for name in args.model]
        scenarios = [SCENARIOS[name] for name in args.scenario]
        outcome = run_benchmark(specs, scenarios, device, args.lora_rank, args.seed, progress)
        report = _report(specs, outcome, device, args)
    print(report)
    if args.output is not None:
        args.output.write_text(report)
    return outcome


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
