"""The sequence of one training step, phase by phase, for a recorder that measures each phase.

`prepare_and_encode` and `run_training_step` call the phases of `sage_trl.preflight.steps` in `SageGRPOTrainer`'s
order. A `PhaseRecorder` measures each phase and follows what the library moves to the host: the trace's recorder
(`sage_trl.preflight.runner`) keeps that bookkeeping for fake tensors, whose ``.to("cpu")`` moves nothing; the
measuring recorder (`sage_trl.preflight.measure`) has nothing to do, the moves being real.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Protocol

import torch

from sage_env.backbones import VideoBackbone
from sage_trl import training_setup
from sage_trl.preflight.steps import (
    TrainingRun,
    allocate_rollout_buffer,
    decode_phase,
    encode_phase,
    optimizer_phase,
    precompute_prompts,
    prepare_run,
    rollout_phase,
    rollout_rounds_per_optimizer_step,
    round_prompts,
    trained_pairs_per_step,
    training_pairs,
    training_phase,
)

__all__ = ["PhaseRecorder", "prepare_and_encode", "run_training_step", "text_encoder_tensors"]


class PhaseRecorder(Protocol):
    """What runs the phases: measures each one (traced or real) and follows what moves to the host."""

    def phase(
        self, name: str, runs: float, *, transformer: bool, gradients: int = 0, note: str = ""
    ) -> AbstractContextManager[None]:
        """Measure the block as the phase ``name`` (run ``runs`` times per optimizer step)."""

    def live(self) -> Any:
        """A marker of what is alive now (for `to_host_since`)."""

    def to_host_since(self, marker: Any) -> None:
        """What was allocated since ``marker`` and is still alive lives on the host (a CPU cache)."""

    def to_host(self, tensors: Sequence[torch.Tensor], host: bool = True) -> None:
        """``tensors`` were moved to the host (or back) by the library."""

    def replay_calls(self, owner: Any, name: str) -> AbstractContextManager[None]:
        """Calls of ``owner.<name>`` in the block depend on their arguments' metadata only: a trace may replay
        repeats (`sage_trl.preflight.replay.replay_calls`); a real run runs them all."""


def _tensors_of(modules: Sequence[torch.nn.Module | None]) -> list[torch.Tensor]:
    return [t for m in modules if m is not None for t in (*m.parameters(), *m.buffers())]


def text_encoder_tensors(backbone: VideoBackbone) -> list[torch.Tensor]:
    """Weights of the backbone's text encoders."""
    return _tensors_of(training_setup.text_encoders(backbone))


def _encode(
    recorder: PhaseRecorder,
    backbone: VideoBackbone,
    prompts: list[str],
    negative: str | None,
    runs: float,
    offload: bool,
) -> None:
    """Encode, keep the prompt cache on the host (as `VideoBackbone.encode_prompts` does), then offload the text
    encoders if the trainer would."""
    marker = recorder.live()
    distinct = len(set(prompts))
    note = f"{distinct} prompt{'s' if distinct > 1 else ''} + the negative"
    with recorder.phase("encode prompts", runs, transformer=False, note=note):
        encode_phase(backbone, prompts, negative)
    recorder.to_host_since(marker)
    if offload:
        backbone.offload_text_encoders()
        recorder.to_host(text_encoder_tensors(backbone))


def _precompute(recorder: PhaseRecorder, backbone: VideoBackbone, config: Any, negative: str | None) -> None:
    """`training_setup.precompute_prompt_embeddings`, one chunk of it: the text encoders alone on the run's
    ``device`` while the transformer and VAE wait on the host (`training_setup.text_encoders_alone_on`)."""
    with training_setup.text_encoders_alone_on(backbone, config.device) as parked:
        recorder.to_host(_tensors_of(parked))
        recorder.to_host(text_encoder_tensors(backbone), host=False)
        _encode(recorder, backbone, precompute_prompts(config), negative, 0, offload=False)
    recorder.to_host(text_encoder_tensors(backbone))
    recorder.to_host(_tensors_of(parked), host=False)


def prepare_and_encode(
    recorder: PhaseRecorder, backbone: VideoBackbone, config: Any, lora_config: Any
) -> TrainingRun:
    """`prepare_run` with the prompt encoding where the trainer does it: precomputed before anything else (the
    transformer waiting on the host), or at the first rollout; text encoders offloaded as the config says."""
    negative = config.algorithm_config().negative_prompt
    precomputing = config.precompute_prompt_embeddings

    def precompute(model: VideoBackbone) -> None:
        _precompute(recorder, model, config, negative)

    run = prepare_run(backbone, config, lora_config, precompute=precompute if precomputing else None)
    anchor = run.references.anchor
    if anchor is not None and anchor.offload:
        recorder.to_host(list(anchor.values.values()))
    if not precomputing:
        runs = rollout_rounds_per_optimizer_step(config)
        _encode(
            recorder,
            backbone,
            round_prompts(config),
            negative,
            runs,
            offload=config.offload_text_encoders,
        )
    return run


@contextmanager
def _vae_replay(recorder: PhaseRecorder, run: TrainingRun) -> Iterator[None]:
    """The VAE's per-video decode and its decoder's forward repeat with the same shapes (videos, tiles, frames)."""
    vae = run.backbone.vae
    with ExitStack() as stack:
        for owner, name in ((vae, "_decode"), (getattr(vae, "decoder", None), "forward")):
            if owner is not None and hasattr(owner, name):
                stack.enter_context(recorder.replay_calls(owner, name))
        yield


def expert_swaps(run: TrainingRun) -> tuple[int, int]:
    """``(swaps per optimizer step, bytes one swap moves each way)`` of the idle expert (``offload_idle_expert``;
    ``(0, 0)`` otherwise): each rollout round swaps to the high-noise expert and later to the low-noise one, and so
    does each accumulation step's training (`sage_trl.experts` groups its micro-batches by expert)."""
    transformer = run.backbone.transformer
    if not getattr(transformer, "offload_idle", False):
        return 0, 0
    config = run.config
    swaps = 2 * math.ceil(rollout_rounds_per_optimizer_step(config)) + 2 * config.gradient_accumulation_steps
    return swaps, max(transformer.frozen_bytes(name) for name in run.backbone.expert_names)


def run_training_step(recorder: PhaseRecorder, run: TrainingRun) -> None:
    """A rollout round (one denoising step, the decode) and a training step (a micro-step, the optimizer step)."""
    config = run.config
    rounds, videos = rollout_rounds_per_optimizer_step(config), run.env.num_envs
    if run.rollout_buffer is None:
        allocate_rollout_buffer(run)
    note = f"1 of {config.num_inference_steps} denoising steps of {videos} videos"
    with recorder.phase("rollout step", config.num_inference_steps * rounds, transformer=True, note=note):
        rollout_phase(run)
    with (
        recorder.phase("decode", rounds, transformer=False, note=f"{videos} videos"),
        _vae_replay(recorder, run),
    ):
        decode_phase(run)
    # .grad has the parameters' shapes and dtypes.
    gradients = sum(p.numel() * p.element_size() for p in run.trainable)
    micro = run.algorithm.config.micro_batch_size
    micro_steps = config.gradient_accumulation_steps * -(-trained_pairs_per_step(run) // micro)
    note = f"{micro} (video, step) pair(s)"
    with recorder.phase("training micro-step", micro_steps, transformer=True, gradients=gradients, note=note):
        training_phase(run, training_pairs(run), micro)
    with recorder.phase(
        "optimizer step", 1, transformer=False, gradients=gradients, note="clip, AdamW, zero_grad"
    ):
        optimizer_phase(run)
