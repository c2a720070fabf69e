"""Off-manifold drift (Fig. 2): how far rollouts of each SDE type land from the toy world's clean videos.

The toy world's clean-video manifold is known exactly: every video `sage_env.toy.world.render_video` can draw
(32 prompts x every start position of the object). Rollouts of the toy prior with each SDE type at the same eta
(`DenoisingVectorEnv` driven by an agent's ``act``, the RL setting: SDE on the first 5 of 10 steps, the ODE
after) start from the same noise; the ODE (eta = 0) is the reference. For every final video the script
measures

* the RMS pixel distance to the nearest clean render of its own prompt ("to own prompt") and of any prompt
  ("to manifold");
* the toy reward heads (VQ: clean background, crisp object, on-palette colours; MQ; TA);

and, along the trajectory, the distance of the denoiser's clean estimate ``x0_hat = x_t - sigma_t v`` to the
nearest clean render of the prompt (how far the SDE's noise pushes intermediate states). As an analytic
counterpart it reuses `benchmarks.sde_marginals`: the error of the final variance on Gaussian data sampled
with the exact velocity (0 = the SDE preserves the marginals).

Run: ``python -m benchmarks.off_manifold_drift [--quick] [--etas 0.3 0.7 1.0] [--seeds 4] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

import agents
from benchmarks import reporting, workloads
from benchmarks.sde_marginals import marginal_error_table
from sage_env.backbones import VideoBackbone
from sage_env.env import BackbonePolicy, Trajectory
from sage_env.models import TOY_SAMPLING_DEFAULTS
from sage_env.rewards.toy import ToyReward
from sage_env.toy.env import make_toy_vector_env
from sage_env.toy.gold import clean_renders, distance_to_world, rms_distances
from sage_env.toy.world import TOY_HEIGHT, TOY_NUM_FRAMES, TOY_PROMPTS, TOY_TRAIN_PROMPTS, TOY_WIDTH

NAME = "off_manifold_drift"
SDE_KINDS = ("sage", "flow_grpo", "dance_grpo", "cps")


# ----------------------------------------------------------------------------------------------
# The clean-video manifold
# ----------------------------------------------------------------------------------------------


@dataclass
class CleanManifold:
    """Every clean video of the toy world, flattened, with the prompt each one renders."""

    videos: torch.Tensor  # (M, F*3*H*W)
    prompts: list[str]

    @classmethod
    def build(cls) -> CleanManifold:
        """Every prompt at every start position the world draws (`sage_env.toy.gold.clean_renders`)."""
        size = (TOY_NUM_FRAMES, TOY_HEIGHT, TOY_WIDTH)
        renders = [clean_renders(prompt, *size) for prompt in TOY_PROMPTS]
        prompts = [prompt for prompt, own in zip(TOY_PROMPTS, renders) for _ in range(len(own))]
        return cls(torch.cat(renders).flatten(1), prompts)

    def distances(self, videos: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """RMS pixel distance of each video to the nearest clean render of its prompt (the gold score,
        `sage_env.toy.gold.distance_to_world`), and of any prompt."""
        flat = videos.detach().float().cpu().flatten(1)
        to_any = rms_distances(flat, self.videos).min(dim=1).values
        return distance_to_world(videos, list(prompts)), to_any


# ----------------------------------------------------------------------------------------------
# Rollouts
# ----------------------------------------------------------------------------------------------


@dataclass
class DriftResult:
    """Per-video measurements of one (SDE type, eta) configuration."""

    sde_type: str
    eta: float
    to_own: torch.Tensor
    to_manifold: torch.Tensor
    heads: dict[str, torch.Tensor]
    estimate_distance: torch.Tensor  # (T,) mean distance of x0_hat to the nearest own render, per step
    injected_variance: float


def rollout(
    backbone: VideoBackbone, sde_type: str, eta: float, prompts: Sequence[str], seeds: Sequence[int]
) -> Trajectory:
    """One batch of toy-world rollouts with ``sde_type`` (the ODE for eta = 0)."""
    env = make_toy_vector_env(
        num_envs=len(seeds) * len(prompts), group_size=len(seeds), backbone=backbone,
        sde=sde_type if eta > 0 else "ode", eta=eta,
    )  # fmt: skip
    # The ODE reference (eta 0) has no algorithm to train: the backbone acts alone, as the agent would.
    agent = agents.make("sage_grpo", policy=backbone, sde=sde_type, eta=eta) if eta > 0 else None
    agent = agent or SimpleNamespace(act=BackbonePolicy(backbone, guidance_scale=1.0))
    all_seeds = [seed for _ in prompts for seed in seeds]
    return workloads.agent_rollout(env, agent, prompts=prompts, seeds=all_seeds)


def estimate_distances(
    backbone: VideoBackbone, trajectory: Trajectory, manifold: CleanManifold
) -> torch.Tensor:
    """Mean distance, per step, of the clean estimate ``x0_hat = x_t - sigma_t v`` to the prompt's renders."""
    conditioning = backbone.encode_prompts(list(trajectory.prompts))
    distances = []
    with torch.no_grad():
        for step in range(trajectory.num_steps):
            latents, sigma = trajectory.latents[:, step], trajectory.sigmas[:, step]
            velocity = backbone.predict_velocity(latents, sigma, conditioning, 1.0)
            estimate = latents - sigma.view(-1, 1, 1, 1, 1) * velocity
            to_own, _ = manifold.distances(backbone.decode(estimate), trajectory.prompts)
            distances.append(float(to_own.mean()))
    return torch.tensor(distances)


def measure(
    backbone: VideoBackbone,
    manifold: CleanManifold,
    sde_type: str,
    eta: float,
    prompts: Sequence[str],
    seeds: Sequence[int],
) -> DriftResult:
    """Roll out one configuration and measure its drift."""
    trajectory = rollout(backbone, sde_type, eta, prompts, seeds)
    to_own, to_manifold = manifold.distances(trajectory.videos, trajectory.prompts)
    details = ToyReward().evaluate(trajectory.videos, list(trajectory.prompts))
    heads = {
        name: getattr(details, name)
        for name in ("vq", "mq", "ta", "clean_background", "crisp_object", "on_palette")
    }
    stochastic = trajectory.trainable[0]
    return DriftResult(
        sde_type=sde_type if eta > 0 else "ode",
        eta=eta,
        to_own=to_own,
        to_manifold=to_manifold,
        heads=heads,
        estimate_distance=estimate_distances(backbone, trajectory, manifold),
        injected_variance=float((trajectory.stds[0][stochastic] ** 2).sum()),
    )


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def _mean_std(values: torch.Tensor) -> str:
    return reporting.format_mean_std(values.tolist())


def gaussian_variance_errors(etas: Sequence[float], num_steps: int) -> dict[tuple[str, float], float]:
    """``{(sde, eta): relative final-variance error}`` on Gaussian data (`benchmarks.sde_marginals`)."""
    errors = {}
    for eta in etas:
        for row in marginal_error_table([num_steps], eta):
            errors[(row["sde"], eta)] = row["var_rel_err"]
    return errors


def result_table(results: Sequence[DriftResult], gaussian: dict[tuple[str, float], float]) -> str:
    """Per configuration: distances, reward heads and the analytic marginal error."""
    rows = []
    for result in results:
        rows.append(
            [
                result.sde_type,
                result.eta,
                f"{result.injected_variance:.3f}",
                _mean_std(result.to_own),
                _mean_std(result.to_manifold),
                _mean_std(result.heads["vq"]),
                _mean_std(result.heads["clean_background"]),
                _mean_std(result.heads["mq"]),
                _mean_std(result.heads["ta"]),
                f"{gaussian.get((result.sde_type, result.eta), float('nan')):.3f}",
            ]
        )
    header = ["SDE", "eta", "injected variance (sum std^2)", "distance to own prompt", "distance to manifold",
              "VQ", "clean background", "MQ", "TA", "Gaussian-data variance error"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def ranking_lines(results: Sequence[DriftResult]) -> list[str]:
    """Per eta: the SDE types ordered by mean distance to the manifold, and where sage stands."""
    lines = []
    for eta in sorted({r.eta for r in results if r.eta > 0}):
        ranked = sorted((r for r in results if r.eta == eta), key=lambda r: float(r.to_manifold.mean()))
        order = " < ".join(f"{r.sde_type} ({float(r.to_manifold.mean()):.4f})" for r in ranked)
        sage = next((r for r in ranked if r.sde_type == "sage"), None)
        flow = next((r for r in ranked if r.sde_type == "flow_grpo"), None)
        verdict = ""
        if sage is not None and flow is not None:
            closer = float(sage.to_manifold.mean()) < float(flow.to_manifold.mean())
            verdict = f" sage lands {'closer to' if closer else 'farther from'} the manifold than flow_grpo."
        lines.append(f"- eta {eta}: {order}.{verdict}")
    return lines


def plot_drift(results: Sequence[DriftResult], path: Path) -> None:
    """Per eta: distance of x0_hat to the prompt's clean renders along the trajectory, one line per SDE type."""
    etas = sorted({r.eta for r in results if r.eta > 0})
    reference = next((r for r in results if r.eta == 0), None)
    figure, axes = reporting.new_figure(columns=len(etas), size=(4.0, 3.4))
    for axis, eta in zip(axes, etas):
        if reference is not None:
            axis.plot(reference.estimate_distance, "k--", label="ode")
        for result in (r for r in results if r.eta == eta):
            axis.plot(result.estimate_distance, marker=".", label=result.sde_type)
        axis.set_title(f"eta {eta}")
        axis.set_xlabel("denoising step")
    axes[0].set_ylabel("RMS distance of x0_hat to own clean renders")
    axes[0].legend(fontsize=7)
    reporting.save_figure(figure, path)


def report(
    context: reporting.BenchmarkContext, results: Sequence[DriftResult], gaussian: dict, videos: int
) -> str:
    """The markdown section."""
    image = context.image_path("x0_distance")
    plot_drift(results, image)
    rankings = "\n".join(ranking_lines(results))
    return f"""## 9. Off-manifold drift (Fig. 2): distance of rollouts to the toy world's clean videos

{context.provenance()}

{videos} rollouts of the toy prior per configuration (the same prompts and seeds, so the same initial noise),
SDE on the first 5 of 10 steps and the ODE after, as in RL. Distances are RMS over pixels in [0, 1] to the
nearest clean render (all start positions; own prompt or any of the 32 prompts), mean ± std over videos.
"Gaussian-data variance error" is `benchmarks.sde_marginals` at the same eta, 10 uniform steps: the relative
error of the final variance when sampling N(1.5, 0.5^2) data with the exact velocity.

{result_table(results, gaussian)}

Ordered by distance to the manifold:

{rankings}

{context.image_link(image, "distance of the clean estimate along the trajectory")}
"""


def main(argv: Sequence[str] | None = None) -> list[DriftResult]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--etas", type=float, nargs="+", default=[0.3, 0.7, 1.0], help="exploration scales")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per prompt")
    parser.add_argument("--prompts", type=int, default=8, help="training prompts rolled out")
    context = reporting.start_benchmark(NAME, parser, argv, default_threads=1)
    args = context.arguments
    etas, kinds = (args.etas, SDE_KINDS) if not context.quick else ([0.7], SDE_KINDS[:2])
    num_prompts, num_seeds = (2, 1) if context.quick else (args.prompts, args.seeds)
    prompts = list(TOY_TRAIN_PROMPTS[:num_prompts])
    seeds = [args.seed * 1000 + index for index in range(num_seeds)]
    backbone = workloads.toy_backbone("prior")
    manifold = CleanManifold.build()
    results = [measure(backbone, manifold, "sage", 0.0, prompts, seeds)]
    results += [measure(backbone, manifold, kind, eta, prompts, seeds) for eta in etas for kind in kinds]
    gaussian = gaussian_variance_errors([0.0, *etas], TOY_SAMPLING_DEFAULTS.num_steps)
    print(result_table(results, gaussian))
    print("\n".join(ranking_lines(results)))
    reporting.write_section(
        context.output, NAME, report(context, results, gaussian, len(prompts) * len(seeds))
    )
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
