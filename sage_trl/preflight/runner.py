"""Trace one training config at full size: build it under fake tensors, run the trainer's phases, measure each.

The order follows `SageGRPOTrainer`: the pipeline is loaded on the device (every component), LoRA and the
savers are applied, prompts are precomputed if asked (before the anchor and the optimizer state exist), then the
moving anchor and the optimizer; then a rollout round (prompt encoding unless precomputed, one denoising step,
the decode) and a training step (one micro-step, the optimizer step). What lives on the host follows the
config: offloaded text encoders after encoding, the prompt cache, VideoAlign between scoring calls with
``reward_offload``, a full fine-tuning anchor with ``reference_offload``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

from sage_env.backbones import VideoBackbone, backbone_class
from sage_trl import activation_offload
from sage_trl.preflight import sequence, steps
from sage_trl.preflight.models import (
    ModelConfigs,
    build_pipeline,
    resolve_model_configs,
    resolve_transformers_config,
)
from sage_trl.preflight.plan import MemoryKind, PhasePlan, PreflightPlan
from sage_trl.preflight.replay import replay_calls
from sage_trl.preflight.tracing import MemoryMeter, trace_session
from sage_trl.training_setup import expert_options, videos_per_round

__all__ = ["VIDEOALIGN_BASE_MODEL", "backbone_for", "build_reward_models", "trace_plan"]

VIDEOALIGN_BASE_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
"""VideoAlign's base model, used when the reward's checkpoint folder is not at hand to read it from."""


class _TraceRecorder:
    """`sequence.PhaseRecorder` over the memory meter: phases become `PhasePlan` entries."""

    def __init__(self, meter: MemoryMeter) -> None:
        self.meter, self.phases = meter, []
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(
        self, name: str, runs: float, *, transformer: bool, gradients: int = 0, note: str = ""
    ) -> Iterator[None]:
        start = time.perf_counter()
        with self.meter.phase(name):
            yield
        memory = self.meter.phases[-1]
        self.phases.append(
            PhasePlan(
                name, memory.start_bytes, memory.peak_bytes, memory.flops, runs, transformer, gradients, note,
                memory.total_peak_bytes - memory.total_start_bytes,
            )
        )
        self.seconds[name] = time.perf_counter() - start

    def live(self) -> set[int]:
        return self.meter.live_storages()

    def to_host_since(self, marker: set[int]) -> None:
        self.meter.set_host_storages(self.meter.live_storages() - marker)

    def to_host(self, tensors: Sequence[torch.Tensor], host: bool = True) -> None:
        # A fake tensor's .to("cpu") is the same tensor: where it lives is the meter's bookkeeping.
        self.meter.set_host(tensors, host)

    def replay_calls(self, owner: Any, name: str) -> AbstractContextManager[None]:
        return replay_calls(self.meter, owner, name)


def backbone_for(configs: ModelConfigs, pipeline: Any, config: Any = None) -> VideoBackbone:
    """The library's backbone for the pipeline class of ``configs`` (`sage_env.backbones.backbone_class`), with the
    training ``config``'s expert options (`training_setup.expert_options`)."""
    options = expert_options(config) if config is not None else {}
    return backbone_class(configs.pipeline_class)(pipeline, **options)


def _videoalign_base(folder: str) -> str:
    from sage_env.rewards.videoalign import VideoAlignSettings, find_videoalign_checkpoint

    if not (Path(folder) / "model_config.json").is_file():
        return VIDEOALIGN_BASE_MODEL
    settings = VideoAlignSettings.from_model_config(find_videoalign_checkpoint(folder).model_config)
    return settings.base_model or VIDEOALIGN_BASE_MODEL


def build_reward_models(rewards: Sequence[str]) -> list[torch.nn.Module]:
    """The models of the reward specs (``videoalign:<folder>``: VideoAlign on Qwen2-VL) in VideoAlign's dtype."""
    from transformers import Qwen2VLConfig

    from sage_env.rewards.videoalign import DEFAULT_DTYPE, VideoAlignModel

    models = []
    for spec in rewards:
        if spec.startswith("videoalign:"):
            config = Qwen2VLConfig(**resolve_transformers_config(_videoalign_base(spec.split(":", 1)[1])))
            previous = torch.get_default_dtype()
            torch.set_default_dtype(DEFAULT_DTYPE)
            try:
                models.append(VideoAlignModel(config, output_dim=3).requires_grad_(False))
            finally:
                torch.set_default_dtype(previous)
    return models


def _tensors(modules: Sequence[torch.nn.Module | None]) -> list[torch.Tensor]:
    return [t for m in modules if m is not None for t in (*m.parameters(), *m.buffers())]


def _largest_block(transformer: torch.nn.Module) -> int:
    """Bytes of the transformer's largest block (``_no_split_modules``: the unit FSDP2 shards and gathers)."""
    names = set(getattr(transformer, "_no_split_modules", None) or [])
    blocks = [m for m in transformer.modules() if type(m).__name__ in names]
    return max((sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks), default=0)


def _resident(
    meter: MemoryMeter, run: steps.TrainingRun, pipeline: Any, rewards: list[torch.nn.Module]
) -> list[MemoryKind]:
    """Resident state by kind, each counted once (a later kind leaves out what an earlier one holds), on the
    device or on the host as the traced sequence left it."""
    transformer, anchor = run.backbone.transformer, run.references.anchor
    optimizer_state = [
        v for s in run.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    frozen = [t for t in _tensors([transformer]) if not t.requires_grad]
    groups: list[tuple[str, list[torch.Tensor]]] = [
        ("transformer weights", [t for t in frozen if not meter.on_host([t])]),
        ("idle expert (swapped to the host)", [t for t in frozen if meter.on_host([t])]),
        ("trainable parameters", run.trainable),
        ("optimizer state", optimizer_state),
        ("moving anchor", list(anchor.values.values()) if anchor is not None else []),
        ("second expert (frozen)", _tensors([getattr(pipeline, "transformer_2", None)])),
        ("VAE", _tensors([pipeline.vae])),
        ("text encoders", sequence.text_encoder_tensors(run.backbone)),
        ("reward model", _tensors(rewards)),
        ("rollout buffer", [run.rollout_buffer]),
    ]
    kinds, seen = [], set()
    for name, tensors in groups:
        fresh = [t for t in tensors if id(t.untyped_storage()) not in seen]
        seen |= {id(t.untyped_storage()) for t in tensors}
        if fresh:
            kinds.append(MemoryKind(name, meter.storage_bytes(fresh), not meter.on_host(fresh)))
    return kinds


def _setting(config: Any, lora_config: Any) -> str:
    lora = f"LoRA r{lora_config.r}" if lora_config is not None else "full fine-tuning"
    dtype = str(config.parameter_dtype(lora_config is not None)).removeprefix("torch.")
    checkpointing = (
        "gradient checkpointing" if config.diffusers_gradient_checkpointing else "no checkpointing"
    )
    guidance = "the model's CFG" if config.guidance_scale is None else f"CFG {config.guidance_scale:g}"
    return (
        f"{lora}, {dtype} weights, {checkpointing}, {config.num_frames} x {config.height} x {config.width}, "
        f"{videos_per_round(config)} videos per round, {guidance}, micro-batch {config.micro_batch_size}"
    )


def trace_plan(
    config: Any,
    lora_config: Any = None,
    *,
    rewards: Sequence[str] = (),
    model_configs: ModelConfigs | None = None,
) -> PreflightPlan:
    """Trace ``config`` at full size on one process (see the module docstring); the plan has no GPU or budget yet."""
    start = time.perf_counter()
    configs = model_configs or resolve_model_configs(config.model_name_or_path)
    with trace_session() as meter, activation_offload.host_copies_marked(meter.host_allocations):
        recorder = _TraceRecorder(meter)
        pipeline = build_pipeline(configs, config.parameter_dtype(lora_config is not None))
        backbone = backbone_for(configs, pipeline, config)
        if len(backbone.trained_experts) > 1:  # both Wan 2.2 experts: the trace follows the idle one's swaps
            backbone.transformer.swap_observer = recorder.to_host
        reward_models = build_reward_models(rewards)
        meter.set_host(_tensors(reward_models), config.reward_offload)
        run = sequence.prepare_and_encode(recorder, backbone, config, copy.deepcopy(lora_config))
        steps.allocate_rollout_buffer(run)
        kinds = _resident(meter, run, pipeline, reward_models)
        sequence.run_training_step(recorder, run)
        block = _largest_block(backbone.transformer)
    swaps, swap_bytes = sequence.expert_swaps(run)
    plan = PreflightPlan(
        model=configs.name,
        config_source=configs.source,
        setting=_setting(config, lora_config),
        kinds=kinds,
        phases=recorder.phases,
        largest_block_bytes=block,
        lora=lora_config is not None,
        expert_swaps=swaps,
        expert_swap_bytes=swap_bytes,
    )
    plan.trace_seconds = time.perf_counter() - start
    plan.phase_seconds = recorder.seconds
    return plan
