"""Per-step noise std of every SDE type under the three regimes of the paper's App. A.2 (Fig. 9).

* (a) both use FlowGRPO's sigma handling at the first step: the first step runs from sigma_max (the
  second sigma) instead of 1, so sage's integral collapses to ~0 there;
* (b) both clamp sigma so that ``1 - sigma >= 3e-3``: FlowGRPO's ``sigma / (1 - sigma)`` explodes at the
  first step while sage stays ~1 (eta = 1);
* (c) each method's own default: sage clamps inside its log, FlowGRPO puts the next sigma into its
  denominator at sigma = 1 (first-step std = eta).

Run: ``python -m benchmarks.sde_noise_std [--steps 20] [--shift 5] [--eta 0.5] [--plot docs/img/sde_std.png]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sage_env.sde import SAGE_SIGMA_MAX, SDE_TYPES, flow_match_sigmas, noise_std

REGIMES = ("a", "b", "c")


def regime_sigmas(regime: str, sigmas: torch.Tensor, sde_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (sigma, sigma_next) pairs a method sees under one regime of App. A.2."""
    sigma, sigma_next = sigmas[:-1].clone(), sigmas[1:].clone()
    if regime == "a" and sde_type == "sage":
        sigma[0] = sigmas[1]  # FlowGRPO's schedule: the first step starts from sigma_max = sigmas[1]
    if regime == "b":
        sigma, sigma_next = sigma.clamp(max=SAGE_SIGMA_MAX), sigma_next.clamp(max=SAGE_SIGMA_MAX)
    return sigma, sigma_next


def std_table(num_steps: int, shift: float, eta: float) -> dict[str, dict[str, torch.Tensor]]:
    """``{regime: {sde_type: per-step std (num_steps,)}}``."""
    sigmas = flow_match_sigmas(num_steps, shift)
    return {
        regime: {
            sde_type: noise_std(sde_type, *regime_sigmas(regime, sigmas, sde_type), eta)
            for sde_type in SDE_TYPES
        }
        for regime in REGIMES
    }


def format_table(table: dict[str, dict[str, torch.Tensor]], sigmas: torch.Tensor) -> str:
    """Markdown tables, one per regime, with the sage / flow_grpo ratio per step."""
    lines = []
    for regime, per_type in table.items():
        lines.append(f"\nRegime ({regime})\n")
        lines.append("| step | sigma | " + " | ".join(SDE_TYPES) + " | sage / flow_grpo |")
        lines.append("|---" * (len(SDE_TYPES) + 3) + "|")
        for step in range(len(sigmas) - 1):
            values = [per_type[t][step].item() for t in SDE_TYPES]
            flow = per_type["flow_grpo"][step].item()
            ratio = per_type["sage"][step].item() / flow if flow > 0 else float("nan")
            cells = " | ".join(f"{v:.4f}" for v in values)
            lines.append(f"| {step} | {sigmas[step].item():.4f} | {cells} | {ratio:.3f} |")
    return "\n".join(lines)


def plot_table(table: dict[str, dict[str, torch.Tensor]], path: Path) -> None:
    """Write one panel per regime (std vs step) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(table), figsize=(5 * len(table), 3.6), sharey=False)
    for axis, (regime, per_type) in zip(axes, table.items()):
        for sde_type in SDE_TYPES:
            axis.plot(per_type[sde_type].numpy(), marker=".", label=sde_type)
        axis.set_title(f"Regime ({regime})")
        axis.set_xlabel("step")
        axis.set_ylabel("noise std")
    axes[0].legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shift", type=float, default=5.0)
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG with one panel per regime")
    args = parser.parse_args(argv)
    table = std_table(args.steps, args.shift, args.eta)
    print(f"Per-step noise std, {args.steps} steps, shift {args.shift}, eta {args.eta}")
    print(format_table(table, flow_match_sigmas(args.steps, args.shift)))
    if args.plot is not None:
        plot_table(table, args.plot)
        print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
