"""Rollout overhead: the gymnasium vector env driven by an agent vs a hand-written diffusers-style loop.

Both produce the same rollout of the same backbone: same prompts, same per-video seeds (diffusers'
``randn_tensor`` with one generator per video, which the env also uses), the same schedule and the SAGE SDE
(Eq. 5-7) on the first steps, the Euler ODE after, every latent and log-probability kept for training, then
decoding and the toy reward. The library path is ``DenoisingVectorEnv`` + ``agents.make("sage_grpo").act``
(prompt-cache look-ups, input validation, observations and the recorded `Trajectory`); the reference path
calls the transformer directly and writes the SDE update inline, as the pipelines of FlowGRPO and DanceGRPO
do. The table reports the median of per-repeat time ratios (interleaved repeats, same process) and the
largest difference between the two paths' final latents, which shows they do the same work.

Configurations: the toy prior (tiny: overheads are most visible), a wider random-init toy transformer where
model compute dominates, and the library's `WanBackbone` on a tiny random diffusers ``WanPipeline`` (with a
VAE to decode).

Run: ``python -m benchmarks.rollout_overhead [--quick] [--repeats 7] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.utils.torch_utils import randn_tensor

import agents
from benchmarks import reporting, timing, workloads
from sage_env import sde
from sage_env.backbones import VideoBackbone
from sage_env.backbones.toy import NUM_TRAIN_TIMESTEPS, ToyBackbone, coordinate_channels
from sage_env.env import DenoisingVectorEnv
from sage_env.rewards.toy import ToyReward
from sage_env.toy.world import TOY_TRAIN_PROMPTS

NAME = "rollout_overhead"
TARGET_RATIO = 1.05
ETA = 0.7
SHIFT = 3.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class OverheadCase:
    """One configuration: which backbone, the video size and the batch."""

    label: str
    backbone: str
    num_frames: int
    height: int
    width: int
    num_prompts: int
    group_size: int
    num_steps: int
    sde_steps: int

    @property
    def num_videos(self) -> int:
        """Videos per rollout."""
        return self.num_prompts * self.group_size


CASES: tuple[OverheadCase, ...] = (
    OverheadCase("toy prior (143k params)", "prior", 8, 16, 16, 4, 4, 10, 5),
    OverheadCase("toy wide (CPU-heavy)", "wide", 8, 16, 16, 2, 4, 10, 5),
    OverheadCase("Wan pipeline, tiny, with VAE", "wan", 9, 64, 64, 2, 4, 10, 5),
)
QUICK_CASES: tuple[OverheadCase, ...] = (
    OverheadCase("toy prior (143k params)", "prior", 8, 16, 16, 1, 2, 3, 2),
    OverheadCase("Wan pipeline, tiny, with VAE", "wan", 5, 16, 16, 1, 2, 3, 2),
)


@dataclass
class OverheadResult:
    """Measurements of one case."""

    case: OverheadCase
    parameters: int
    tokens_per_video: int
    env_seconds: list[float]
    hand_seconds: list[float]
    model_seconds: list[float]
    max_latent_difference: float

    @property
    def ratio(self) -> float:
        """Median per-repeat ratio env+agent / hand-written loop."""
        return timing.paired_ratio(self.env_seconds, self.hand_seconds)

    @property
    def model_share(self) -> float:
        """Median share of the hand-written loop spent in transformer calls."""
        return timing.paired_ratio(self.model_seconds, self.hand_seconds)


# ----------------------------------------------------------------------------------------------
# The hand-written reference loop
# ----------------------------------------------------------------------------------------------


def raw_transformer_call(
    backbone: VideoBackbone, latent_shape: Sequence[int], batch_size: int, prompt_embeds: torch.Tensor
) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """``velocity(latents, sigma)``: a direct call of the backbone's transformer (no CFG), inputs prepared once."""
    transformer = backbone.transformer
    extra = None
    if isinstance(backbone, ToyBackbone):  # the toy model's fixed coordinate channels (see its docstring)
        extra = coordinate_channels(*latent_shape[1:]).expand(batch_size, -1, -1, -1, -1)

    def velocity(latents: torch.Tensor, sigma: float) -> torch.Tensor:
        hidden_states = latents if extra is None else torch.cat([latents, extra], dim=1)
        timestep = torch.full((batch_size,), sigma * NUM_TRAIN_TIMESTEPS)
        return transformer(
            hidden_states=hidden_states,
            timestep=timestep,
            encoder_hidden_states=prompt_embeds,
            return_dict=False,
        )[0].float()

    return velocity


def inline_sage_step(
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: float,
    sigma_next: float,
    generators: list[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SAGE SDE step written out (Eq. 5-7) with its per-video Gaussian log-probability."""
    variance = ETA**2 * (
        math.log1p(-min(sigma_next, sde.SAGE_SIGMA_MAX))
        - math.log1p(-min(sigma, sde.SAGE_SIGMA_MAX))
        - (sigma - sigma_next)
    )
    std = math.sqrt(max(variance, 0.0))
    mean = (
        latents
        - (sigma - sigma_next) * velocity
        - variance / (2.0 * sigma) * (latents + (1.0 - sigma) * velocity)
    )
    noise = randn_tensor(latents.shape, generator=generators, dtype=torch.float32)
    x_next = mean + std * noise
    log_prob = (
        (-((x_next - mean) ** 2) / (2.0 * variance)).mean(dim=(1, 2, 3, 4)) - math.log(std) - _HALF_LOG_2PI
    )
    return x_next, log_prob


def hand_written_rollout(
    backbone: VideoBackbone,
    case: OverheadCase,
    prompts: Sequence[str],
    seeds: Sequence[int],
    reward: ToyReward,
) -> torch.Tensor:
    """One rollout the diffusers way; returns the final latents (every latent and log-prob is kept too)."""
    sigmas = backbone.sigmas(case.num_steps, SHIFT).tolist()  # the schedule the environment uses
    shape = (len(prompts), *backbone.latent_shape(case.num_frames, case.height, case.width))
    embeds = backbone.encode_prompts(list(prompts)).tensors["prompt_embeds"]
    velocity_of = raw_transformer_call(backbone, shape[1:], len(prompts), embeds)
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    latents = randn_tensor(shape, generator=generators, dtype=torch.float32)
    all_latents, log_probs = [latents], []
    with torch.no_grad():
        for index in range(case.num_steps):
            sigma, sigma_next = sigmas[index], sigmas[index + 1]
            velocity = velocity_of(latents, sigma)
            if index < case.sde_steps:
                latents, log_prob = inline_sage_step(latents, velocity, sigma, sigma_next, generators)
            else:
                latents, log_prob = latents + (sigma_next - sigma) * velocity, torch.zeros(len(prompts))
            all_latents.append(latents)
            log_probs.append(log_prob)
        videos = backbone.decode(latents)
    reward(videos, list(prompts))
    return latents


def model_only(backbone: VideoBackbone, case: OverheadCase, prompts: Sequence[str]) -> None:
    """Only the transformer calls of a rollout (what no implementation can avoid)."""
    shape = (len(prompts), *backbone.latent_shape(case.num_frames, case.height, case.width))
    embeds = backbone.encode_prompts(list(prompts)).tensors["prompt_embeds"]
    velocity_of = raw_transformer_call(backbone, shape[1:], len(prompts), embeds)
    latents = torch.zeros(shape)
    with torch.no_grad():
        for sigma in backbone.sigmas(case.num_steps, SHIFT)[:-1].tolist():
            velocity_of(latents, sigma)


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------


def build_backbone(case: OverheadCase, seed: int) -> VideoBackbone:
    """The case's backbone (toy prior, a random-init toy size, or the tiny Wan pipeline)."""
    if case.backbone == "wan":
        return workloads.tiny_wan_backbone(seed)
    return workloads.toy_backbone(case.backbone, seed)


def measure_case(case: OverheadCase, repeats: int, warmup: int, seed: int) -> OverheadResult:
    """Time env+agent, the hand-written loop and the bare model calls, interleaved."""
    backbone = build_backbone(case, seed)
    reward = ToyReward()
    group_prompts = list(TOY_TRAIN_PROMPTS[: case.num_prompts])
    prompts = [p for p in group_prompts for _ in range(case.group_size)]
    seeds = [seed * 1000 + index for index in range(case.num_videos)]
    env = DenoisingVectorEnv(
        backbone, reward, TOY_TRAIN_PROMPTS, num_envs=case.num_videos, group_size=case.group_size,
        num_frames=case.num_frames, height=case.height, width=case.width, num_steps=case.num_steps,
        shift=SHIFT, sde="sage", eta=ETA, sde_window=(0, case.sde_steps), array_mode="torch",
    )  # fmt: skip
    agent = agents.make("sage_grpo", env=env, guidance_scale=1.0)  # no CFG, as the hand-written loop
    times = timing.interleaved_times(
        {
            "env": lambda: workloads.agent_rollout(env, agent, prompts=group_prompts, seeds=seeds),
            "hand": lambda: hand_written_rollout(backbone, case, prompts, seeds, reward),
            "model": lambda: model_only(backbone, case, prompts),
        },
        repeats,
        warmup,
    )
    env_latents = workloads.agent_rollout(env, agent, prompts=group_prompts, seeds=seeds).latents[:, -1]
    hand_latents = hand_written_rollout(backbone, case, prompts, seeds, reward)
    latent_shape = backbone.latent_shape(case.num_frames, case.height, case.width)
    return OverheadResult(
        case=case,
        parameters=workloads.count_parameters(backbone.transformer),
        tokens_per_video=_tokens(backbone, latent_shape),
        env_seconds=times["env"],
        hand_seconds=times["hand"],
        model_seconds=times["model"],
        max_latent_difference=float((env_latents - hand_latents).abs().max()),
    )


def _tokens(backbone: VideoBackbone, latent_shape: Sequence[int]) -> int:
    patch = backbone.transformer.config.patch_size
    _, frames, height, width = latent_shape
    return (frames // patch[0]) * (height // patch[1]) * (width // patch[2])


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def result_table(results: Sequence[OverheadResult]) -> str:
    """Markdown table of the measured ratios."""
    rows = []
    for result in results:
        case = result.case
        rows.append(
            [
                case.label,
                f"{result.parameters / 1e6:.2f} M",
                f"{case.num_videos} x {case.num_steps} ({case.sde_steps} SDE)",
                result.tokens_per_video,
                f"{timing.median(result.hand_seconds) * 1e3:.0f} ms",
                f"{result.model_share:.0%}",
                f"{result.ratio:.3f}",
                "yes" if result.ratio <= TARGET_RATIO else "no",
                f"{result.max_latent_difference:.1e}",
            ]
        )
    header = [
        "configuration", "transformer", "videos x steps", "tokens / video", "hand loop (median)",
        "model share of hand loop", "env+agent / hand loop", f"<= {TARGET_RATIO}", "max abs diff of final latents",
    ]  # fmt: skip
    return reporting.markdown_table(header, rows)


def plot_breakdown(results: Sequence[OverheadResult], path: Path) -> None:
    """Stacked bars: model time, the hand loop's own overhead, and the env+agent's extra, as shares."""
    figure, (axis,) = reporting.new_figure(size=(6.5, 3.6))
    labels = [r.case.label for r in results]
    model = [r.model_share for r in results]
    hand = [1.0 - r.model_share for r in results]
    extra = [r.ratio - 1.0 for r in results]
    axis.bar(labels, model, label="transformer calls")
    axis.bar(labels, hand, bottom=model, label="rest of the hand-written loop")
    axis.bar(labels, extra, bottom=[m + h for m, h in zip(model, hand)], label="env + agent extra")
    axis.axhline(TARGET_RATIO, color="black", linestyle="--", linewidth=1, label=f"target {TARGET_RATIO}")
    axis.set_ylabel("time / hand-written loop")
    axis.set_title("Rollout time, normalised to the hand-written loop")
    axis.tick_params(axis="x", labelsize=7)
    axis.legend(fontsize=7)
    reporting.save_figure(figure, path)


def report(context: reporting.BenchmarkContext, results: Sequence[OverheadResult], repeats: int) -> str:
    """The markdown section."""
    image = context.image_path("breakdown")
    plot_breakdown(results, image)
    worst = max(result.ratio for result in results)
    verdict = "meets" if worst <= TARGET_RATIO else "misses"
    return f"""## 1. Rollout overhead: env + agent vs a hand-written loop

{context.provenance()}

One rollout = reset, every denoising step (SAGE SDE on the first steps, Euler after), decoding and the toy
reward, with every latent and log-probability kept. "env+agent" is `DenoisingVectorEnv` stepped with
`agents.make("sage_grpo").act`; the hand-written loop calls the transformer directly and writes the SDE
update inline (diffusers' `randn_tensor` with one generator per video, as the env). Ratios are medians of
{repeats} interleaved repeats; the last column shows both paths produce the same videos.

{result_table(results)}

The worst ratio is {worst:.3f}: the library {verdict} the target of <= {TARGET_RATIO}. Where the model is tiny
(the toy prior) the fixed per-step costs are visible; where model compute dominates they vanish in the noise.

{context.image_link(image, "rollout time breakdown")}
"""


def main(argv: Sequence[str] | None = None) -> list[OverheadResult]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats per configuration")
    context = reporting.start_benchmark(NAME, parser, argv, default_threads=1)
    cases = QUICK_CASES if context.quick else CASES
    repeats = 1 if context.quick else context.arguments.repeats
    results = [
        measure_case(case, repeats, 0 if context.quick else 1, context.arguments.seed) for case in cases
    ]
    table = result_table(results)
    print(table)
    reporting.write_section(context.output, NAME, report(context, results, repeats))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
