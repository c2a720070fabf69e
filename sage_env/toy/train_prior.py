"""Train the toy world's prior: flow matching of `ToyBackbone` on rendered videos of the training prompts.

Usage::

    python -m sage_env.toy.train_prior --output sage_env/toy/assets/prior --minutes 10

Recipe (docs/design.md, "The toy world", plus one change measured here): batches of 16 videos rendered from random
training prompts and seeds, rectified-flow targets ``v = noise - x0`` at ``x_t = (1 - sigma) x0 + sigma noise``,
AdamW at lr 5e-3. Noise levels: half from the shift-3 distribution ``sigma = 3u / (1 + 2u)``, half uniform in
``[0.7, 1]`` (`training_sigmas`; ``--high-noise-fraction``/``--high-noise-min``), because the direction of motion
is decided at high noise and shift 3 alone did not teach it in 30 minutes. ``--init FOLDER`` continues from a
saved model; the shipped prior was trained in four such runs, including two on high noise only
(``--high-noise-fraction 1``): its commands, training curve and timings are in
``sage_env/toy/assets/prior/README.md``.

Every ``--eval-every`` steps the model samples the held-out prompts with deterministic Euler steps
(`sage_env.env.sample_videos`) and the toy reward reads them: colour and direction accuracy, the three
heads and the overall score are printed and appended to ``<output>/train_log.jsonl``. Training stops after
``--max-steps`` steps or ``--minutes`` minutes, whichever comes first; with ``--snapshots DIR`` every evaluated
model is also saved, to choose the stopping point by the held-out metrics afterwards.

Given a seed the run is deterministic step by step (for a fixed number of CPU threads): the model's weights
after N steps do not depend on timing, only where a time limit stops the run does.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sage_env.backbones.base import PromptConditioning
from sage_env.backbones.toy import ToyBackbone
from sage_env.env import sample_videos
from sage_env.models import TOY_SAMPLING_DEFAULTS
from sage_env.rewards.toy import ToyReward, toy_overall_score
from sage_env.toy.world import (
    TOY_EVAL_PROMPTS,
    TOY_HEIGHT,
    TOY_NUM_FRAMES,
    TOY_TRAIN_PROMPTS,
    TOY_WIDTH,
    render_videos,
)

__all__ = ["PriorTrainingConfig", "evaluate_prior", "main", "train_prior"]

EVAL_SEED_OFFSET = 10_000
"""Held-out evaluation uses seeds ``EVAL_SEED_OFFSET + k``; training draws seeds below it."""


@dataclass
class PriorTrainingConfig:
    """Settings of `train_prior` (the command-line flags of the same names)."""

    output: Path
    minutes: float = 10.0
    max_steps: int | None = None
    seed: int = 0
    batch_size: int = 16
    learning_rate: float = 5e-3
    shift: float = 3.0
    high_noise_fraction: float = 0.5
    high_noise_min: float = 0.7
    init: Path | None = None
    eval_every: int = 250
    eval_seeds: int = 8
    sampling_steps: int = TOY_SAMPLING_DEFAULTS.num_steps
    snapshots: Path | None = None
    threads: int = 1

    def __post_init__(self) -> None:
        self.output = Path(self.output)
        self.snapshots = None if self.snapshots is None else Path(self.snapshots)
        self.init = None if self.init is None else Path(self.init)
        if not 0 <= self.high_noise_fraction <= 1:
            raise ValueError(f"high_noise_fraction must lie in [0, 1], got {self.high_noise_fraction!r}.")
        if not 0 <= self.high_noise_min < 1:
            raise ValueError(f"high_noise_min must lie in [0, 1), got {self.high_noise_min!r}.")
        positive = {"minutes": self.minutes, "batch_size": self.batch_size, "learning_rate": self.learning_rate,
                    "shift": self.shift, "eval_every": self.eval_every, "eval_seeds": self.eval_seeds,
                    "sampling_steps": self.sampling_steps, "threads": self.threads}  # fmt: skip
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 (or None for no step limit), got {self.max_steps}.")


def shifted_sigmas(count: int, shift: float, generator: torch.Generator) -> torch.Tensor:
    """Noise levels ``u ~ U(0, 1)`` mapped by the schedule's shift ``s u / (1 + (s - 1) u)``."""
    u = torch.rand(count, generator=generator)
    return shift * u / (1.0 + (shift - 1.0) * u)


def training_sigmas(
    count: int, shift: float, high_noise_fraction: float, high_noise_min: float, generator: torch.Generator
) -> torch.Tensor:
    """Training noise levels: each one from `shifted_sigmas` or, with probability ``high_noise_fraction``,
    uniform in ``[high_noise_min, 1]``.

    Why the extra high-noise draws: the direction of motion is decided in the first sampling steps, where the
    model's clean estimate is the prompt's mean video, and that mean differs between directions by only a few
    percent of a pixel's range. With shift 3 alone the prior learned colour, shape persistence and smooth
    motion but still ignored the direction word after 30 minutes (5,205 steps); continuing on ``sigma >= 0.7``
    only taught it direction within 600-1,400 steps (measured; see the prior's model card).
    """
    sigmas = shifted_sigmas(count, shift, generator)
    high = high_noise_min + (1.0 - high_noise_min) * torch.rand(count, generator=generator)
    use_high = torch.rand(count, generator=generator) < high_noise_fraction
    return torch.where(use_high, high, sigmas)


def flow_matching_loss(
    backbone: ToyBackbone,
    videos: torch.Tensor,
    conditioning: PromptConditioning,
    sigma: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """Rectified-flow loss ``|v_theta(x_t, sigma) - (noise - x0)|^2`` with ``x0`` the videos in [-1, 1]."""
    clean = videos.permute(0, 2, 1, 3, 4) * 2.0 - 1.0  # (B, F, 3, H, W) in [0, 1] -> latents (B, 3, F, H, W)
    level = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1.0 - level) * clean + level * noise
    velocity = backbone.predict_velocity(noisy, sigma, conditioning)
    return torch.nn.functional.mse_loss(velocity, noise - clean)


def _training_batch(
    conditioning: PromptConditioning, config: PriorTrainingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, PromptConditioning, torch.Tensor, torch.Tensor]:
    batch_size = config.batch_size
    rows = torch.randint(len(conditioning), (batch_size,), generator=generator)
    seeds = torch.randint(EVAL_SEED_OFFSET, (batch_size,), generator=generator).tolist()
    batch_conditioning = conditioning.select(rows)
    videos = render_videos(batch_conditioning.prompts, seeds)
    sigma = training_sigmas(
        batch_size, config.shift, config.high_noise_fraction, config.high_noise_min, generator
    )
    noise = torch.randn(batch_size, 3, TOY_NUM_FRAMES, TOY_HEIGHT, TOY_WIDTH, generator=generator)
    return videos, batch_conditioning, sigma, noise


def evaluate_prior(
    backbone: ToyBackbone,
    prompts: Sequence[str] = TOY_EVAL_PROMPTS,
    num_seeds: int = 8,
    *,
    sampling_steps: int = TOY_SAMPLING_DEFAULTS.num_steps,
    **sampling: object,
) -> dict[str, float]:
    """Sample ``num_seeds`` videos per prompt (deterministic Euler unless ``sampling`` says otherwise) and score them.

    Returns the mean colour / direction accuracy, the three heads and the overall toy score.
    """
    all_prompts = [prompt for prompt in prompts for _ in range(num_seeds)]
    seeds = [EVAL_SEED_OFFSET + k for _ in prompts for k in range(num_seeds)]
    schedule = replace(TOY_SAMPLING_DEFAULTS, num_steps=sampling_steps)
    videos = sample_videos(backbone, all_prompts, seeds, schedule, **sampling)
    details = ToyReward().evaluate(videos, all_prompts)
    return {
        "colour_accuracy": details.colour_correct.float().mean().item(),
        "direction_accuracy": details.direction_correct.float().mean().item(),
        "vq": details.vq.mean().item(),
        "mq": details.mq.mean().item(),
        "ta": details.ta.mean().item(),
        "overall": toy_overall_score(details).mean().item(),
    }


def _log(config: PriorTrainingConfig, record: dict[str, float]) -> None:
    print(
        f"step {record['step']:6d}  {record['minutes']:6.2f} min  loss {record['loss']:.4f}  "
        f"colour {record['colour_accuracy']:.2f}  direction {record['direction_accuracy']:.2f}  "
        f"vq {record['vq']:.3f}  mq {record['mq']:.3f}  ta {record['ta']:.3f}  overall {record['overall']:.3f}",
        flush=True,
    )
    with (config.output / "train_log.jsonl").open("a") as log_file:
        log_file.write(json.dumps(record) + "\n")


def _evaluate_and_log(
    backbone: ToyBackbone, config: PriorTrainingConfig, step: int, loss: float, started: float
) -> None:
    backbone.transformer.eval()
    metrics = evaluate_prior(backbone, num_seeds=config.eval_seeds, sampling_steps=config.sampling_steps)
    backbone.transformer.train()
    record = {"step": step, "minutes": (time.perf_counter() - started) / 60, "loss": loss, **metrics}
    _log(config, record)
    if config.snapshots is not None:
        backbone.save_pretrained(
            config.snapshots / f"step_{step:06d}", extra_metadata=_metadata(config, step)
        )


def _metadata(config: PriorTrainingConfig, step: int) -> dict[str, object]:
    return {
        "num_frames": TOY_NUM_FRAMES,
        "height": TOY_HEIGHT,
        "width": TOY_WIDTH,
        "training": {"steps": step, "seed": config.seed, "batch_size": config.batch_size,
                     "learning_rate": config.learning_rate, "shift": config.shift, "threads": config.threads,
                     "high_noise_fraction": config.high_noise_fraction, "high_noise_min": config.high_noise_min,
                     "init": None if config.init is None else str(config.init)},
    }  # fmt: skip


def train_prior(config: PriorTrainingConfig) -> ToyBackbone:
    """Train from scratch as configured, save the model to ``config.output`` and return it."""
    config.output.mkdir(parents=True, exist_ok=True)
    (config.output / "train_log.jsonl").write_text("")
    backbone = (
        ToyBackbone.from_scratch(config.seed)
        if config.init is None
        else ToyBackbone.from_pretrained(config.init)
    )
    backbone.transformer.train()
    optimizer = torch.optim.AdamW(backbone.transformer.parameters(), lr=config.learning_rate)
    generator = torch.Generator().manual_seed(config.seed)
    conditioning = backbone.encode_prompts(list(TOY_TRAIN_PROMPTS))
    started, step, smoothed_loss = time.perf_counter(), 0, float("nan")
    while not _should_stop(config, step, started):
        videos, batch_conditioning, sigma, noise = _training_batch(conditioning, config, generator)
        loss = flow_matching_loss(backbone, videos, batch_conditioning, sigma, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        smoothed_loss = loss.item() if step == 1 else 0.98 * smoothed_loss + 0.02 * loss.item()
        if step % config.eval_every == 0:
            _evaluate_and_log(backbone, config, step, smoothed_loss, started)
    if step % config.eval_every != 0:
        _evaluate_and_log(backbone, config, step, smoothed_loss, started)
    backbone.transformer.eval()
    backbone.save_pretrained(config.output, extra_metadata=_metadata(config, step))
    return backbone


def _should_stop(config: PriorTrainingConfig, step: int, started: float) -> bool:
    if config.max_steps is not None and step >= config.max_steps:
        return True
    return time.perf_counter() - started >= config.minutes * 60


def _parse_arguments(argv: Sequence[str] | None) -> PriorTrainingConfig:
    parser = argparse.ArgumentParser(
        prog="python -m sage_env.toy.train_prior", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--output", type=Path, required=True, help="Folder to write the trained model to.")
    parser.add_argument("--minutes", type=float, default=10.0, help="Wall-clock budget in minutes.")
    parser.add_argument("--max-steps", type=int, default=None, help="Stop after this many optimizer steps.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the initialisation and the data.")
    parser.add_argument("--batch-size", type=int, default=16, help="Videos per optimizer step.")
    parser.add_argument("--learning-rate", type=float, default=5e-3, help="AdamW learning rate.")
    parser.add_argument("--shift", type=float, default=3.0, help="Time shift of the training noise levels.")
    parser.add_argument(
        "--high-noise-fraction",
        type=float,
        default=0.5,
        help="Share of noise levels drawn from [high-noise-min, 1].",
    )
    parser.add_argument(
        "--high-noise-min", type=float, default=0.7, help="Lower end of the high-noise draws."
    )
    parser.add_argument(
        "--init", type=Path, default=None, help="Continue from this saved model instead of scratch."
    )
    parser.add_argument("--eval-every", type=int, default=250, help="Evaluate every this many steps.")
    parser.add_argument("--eval-seeds", type=int, default=8, help="Seeds per held-out prompt in evaluations.")
    parser.add_argument(
        "--sampling-steps",
        type=int,
        default=TOY_SAMPLING_DEFAULTS.num_steps,
        help="Euler steps in evaluations.",
    )
    parser.add_argument("--snapshots", type=Path, default=None, help="Also save every evaluated model here.")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (1 is fastest on a shared machine; fixes determinism).",
    )
    arguments = parser.parse_args(argv)
    return PriorTrainingConfig(**vars(arguments))


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    config = _parse_arguments(argv)
    # One thread is several times faster than two on a machine whose cores other processes share (no
    # OpenMP spinning), and a fixed thread count keeps the run bit-reproducible.
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        print(f"Training the toy prior: {config}", flush=True)
        train_prior(config)
        print(f"Saved the prior to {config.output}", flush=True)
    finally:
        torch.set_num_threads(previous_threads)


if __name__ == "__main__":
    main()
