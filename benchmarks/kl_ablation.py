"""Table 2 / Fig. 8: held-out reward per component for SDE type x KL strategy under Settings A and B.

Short RL runs on the toy world through the library's own path (`benchmarks.toy_training`: ``agents.make`` +
``sage_env/Toy-v0``, settings of ``sage_trl/presets/toy.yaml``; only the SDE type, the KL strategy and the
reward weights change). Reported per configuration, mean ± std over seeds: the held-out VQ / MQ / TA heads,
the weighted total of the setting and the unweighted overall (deterministic sampling of the held-out prompts,
before and after), and, as in Fig. 8(b), the exploration level over training: the std of the rollout rewards
(the paper's "Std (exploration)") early and late. The SDE's own noise std is fixed by eta and the schedule, so
it does not move during training; the table shows it once.

A diagnostic, through the library's loss: after each dual-KL run, the gradient of the KL term at the adaptive
coefficient relative to the policy-gradient term, on the last rollout's pairs (`kl_gradient_share`).

Default grid (about 20 minutes on 2 shared cores; 10 optimizer steps of 16 videos per run):

* with the paper's KL coefficients (lambda_KL in [1e-7, 1e-5], anchor every 10 steps), 2 seeds:
  Setting B (the paper's main setting): sage x {none, fixed, stepwise, moving, dual} (Fig. 8) and
  flow_grpo x {none, fixed} (Table 2's baseline rows); Setting A: sage x {none, dual};
* with a strong KL term (lambda_max 2, anchor every 3 steps: the KL gradient of the order of the policy
  gradient), 1 seed: Setting B, sage x {fixed, stepwise, moving, dual} (``--no-strong`` skips them).

``--full`` runs every SDE type (sage, flow_grpo, dance_grpo, cps) x every KL strategy x both settings with the
paper's coefficients (hours).

Run: ``python -m benchmarks.kl_ablation [--quick | --full] [--seeds 2] [--updates 10] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from itertools import product
from pathlib import Path

import torch

from agents import KL_STRATEGIES, AlgorithmAgent, AlgorithmConfig
from benchmarks import reporting
from benchmarks.toy_training import (
    ToyRunResult,
    ToyRunSpec,
    aggregate_curves,
    final_mean_std,
    run_toy_training,
)
from sage_env.env import Trajectory
from sage_trl.arena.grid import KL_ANCHOR_UPDATE_STEPS, STRONG_KL_BETA

NAME = "kl_ablation"
SDE_KINDS = ("sage", "flow_grpo", "dance_grpo", "cps")
SETTINGS = ("setting_a", "setting_b")

PAPER_KL = (AlgorithmConfig.defaults["beta"], AlgorithmConfig.defaults["anchor_update_steps"])
"""(beta, anchor_update_steps) of the paper: lambda_KL in [1e-7, 1e-5], anchor refreshed every 10 steps."""
STRONG_KL = (STRONG_KL_BETA, KL_ANCHOR_UPDATE_STEPS)
"""A KL term of the same order as the policy term (see `kl_gradient_share`), with an anchor that moves within a
short run: what the strategies do when the regulariser actually acts (the arena's strong KL variants)."""

Config = tuple[str, str, str, tuple[float, int]]  # (reward preset, SDE type, KL strategy, (beta, anchor N))

DEFAULT_GRID: tuple[Config, ...] = (
    *(("setting_b", "sage", kl, PAPER_KL) for kl in KL_STRATEGIES),
    ("setting_b", "flow_grpo", "none", PAPER_KL),
    ("setting_b", "flow_grpo", "fixed", PAPER_KL),
    ("setting_a", "sage", "none", PAPER_KL),
    ("setting_a", "sage", "dual", PAPER_KL),
)
STRONG_GRID: tuple[Config, ...] = tuple(
    ("setting_b", "sage", kl, STRONG_KL) for kl in KL_STRATEGIES if kl != "none"
)
"""Run with one seed after the default grid (the "none" row of the default grid is its reference)."""
FULL_GRID: tuple[Config, ...] = tuple(
    (*config, PAPER_KL) for config in product(SETTINGS, SDE_KINDS, KL_STRATEGIES)
)


def _flat_gradient(agent: AlgorithmAgent) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in agent.parameters]
    )


def kl_gradient_share(agent: AlgorithmAgent, trajectory: Trajectory) -> dict[str, float]:
    """``|lambda_KL * grad L_KL| / |grad L_policy|`` on the pairs of ``trajectory`` with the current policy.

    Evaluated with the library's loss twice, at KL coefficient 0 (policy term only) and 1 (policy + KL term):
    the difference is the KL term's gradient at coefficient 1.
    """
    algorithm = agent.algorithm
    advantages, usable = algorithm.advantages(trajectory)
    batch = algorithm.training_batch(trajectory, advantages, usable, agent.policy)
    if len(batch) == 0:
        return {"kl_gradient_share": math.nan, "kl_coef": algorithm.kl_controller.coef}
    coefficient = algorithm.kl_controller.coef
    gradients = []
    for trial in (0.0, 1.0):
        algorithm.kl_controller.coef = trial
        agent.optimizer.zero_grad(set_to_none=True)
        for chunk in batch.chunks(agent.config.micro_batch_size):
            loss, _ = algorithm.loss(agent.policy, chunk, agent.references)
            (loss * len(chunk) / len(batch)).backward()
        gradients.append(_flat_gradient(agent).clone())
    algorithm.kl_controller.coef = coefficient
    agent.optimizer.zero_grad(set_to_none=True)
    policy, kl = gradients[0], gradients[1] - gradients[0]
    return {
        "kl_gradient_share": float(coefficient * kl.norm() / policy.norm()),
        "kl_coef": coefficient,
        "kl_coef_for_parity": float(policy.norm() / kl.norm()) if kl.norm() > 0 else math.inf,
    }


def run_grid(
    grid: Sequence[Config], seeds: Sequence[int], base: ToyRunSpec
) -> dict[Config, list[ToyRunResult]]:
    """Every configuration of ``grid`` over every seed."""
    results: dict[Config, list[ToyRunResult]] = {}
    for preset, kind, strategy, (coef_max, anchor_steps) in grid:
        runs = []
        for seed in seeds:
            spec = replace(
                base, reward_preset=preset, sde=kind, kl_strategy=strategy, seed=seed, beta=coef_max,
                anchor_update_steps=anchor_steps,
            )  # fmt: skip
            inspect = kl_gradient_share if strategy != "none" else None
            runs.append(run_toy_training(spec, inspect=inspect))
            print(
                f"{spec.label(('reward_preset', 'sde', 'kl_strategy', 'seed'))}: {runs[-1].seconds:.0f} s",
                flush=True,
            )
        results[(preset, kind, strategy, (coef_max, anchor_steps))] = runs
    return results


def _third(runs: Sequence[ToyRunResult], key: str, last: bool) -> str:
    values = []
    for run in runs:
        curve = run.curves[key]
        size = max(len(curve) // 3, 1)
        part = curve[-size:] if last else curve[:size]
        values.append(sum(part) / len(part))
    return reporting.format_mean_std(values)


def result_table(results: dict[Config, list[ToyRunResult]]) -> str:
    """Held-out scores after training and the exploration level, per configuration."""
    rows = []
    for (preset, kind, strategy, (coef_max, anchor_steps)), runs in results.items():
        rows.append(
            [
                preset.replace("setting_", "").upper(),
                kind,
                strategy,
                f"{coef_max:g} / {anchor_steps}",
                len(runs),
                final_mean_std(runs, "total"),
                final_mean_std(runs, "overall"),
                final_mean_std(runs, "vq"),
                final_mean_std(runs, "mq"),
                final_mean_std(runs, "ta"),
                final_mean_std(runs, "world_distance"),
                final_mean_std(runs, "object_area_ratio"),
                _third(runs, "reward/total_std", last=False),
                _third(runs, "reward/total_std", last=True),
            ]
        )
    header = ["setting", "SDE", "KL", "lambda_max / anchor N", "seeds", "held-out total", "held-out overall", "VQ", "MQ", "TA",
              "distance to world", "object area / world's", "reward std, first third", "reward std, last third"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def baseline_rows(results: dict[Config, list[ToyRunResult]]) -> str:
    """The prior's held-out scores (before training), once per setting, and the SDE noise std per type."""
    rows, seen = [], set()
    for (preset, kind, _, _), runs in results.items():
        if (preset, kind) in seen:
            continue
        seen.add((preset, kind))
        rows.append(
            [
                preset.replace("setting_", "").upper(),
                kind,
                final_mean_std(runs, "total", "before"),
                final_mean_std(runs, "overall", "before"),
                final_mean_std(runs, "vq", "before"),
                final_mean_std(runs, "mq", "before"),
                final_mean_std(runs, "ta", "before"),
                final_mean_std(runs, "world_distance", "before"),
                final_mean_std(runs, "object_area_ratio", "before"),
                f"{runs[0].curves['rollout/exploration_std'][0]:.4f}",
            ]
        )
    header = ["setting", "SDE", "total", "overall", "VQ", "MQ", "TA", "distance to world", "object area / world's",
              "SDE noise std (mean over SDE steps)"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def kl_share_line(results: dict[Config, list[ToyRunResult]]) -> str:
    """The KL gradient diagnostic, per KL strength, over every run that had a KL term."""
    lines = []
    for strength in dict.fromkeys(config[3] for config in results):
        shares, parity = [], []
        for config, runs in results.items():
            for run in runs if config[3] == strength else []:
                if math.isfinite(run.inspection.get("kl_gradient_share", math.nan)):
                    shares.append(run.inspection["kl_gradient_share"])
                    parity.append(run.inspection["kl_coef_for_parity"])
        if shares:
            shares.sort()
            parity.sort()
            lines.append(
                f"- lambda_max {strength[0]:g}: over {len(shares)} runs with a KL term, the KL gradient (at the "
                f"final coefficient) is {shares[len(shares) // 2]:.1e} of the policy gradient (median; max "
                f"{shares[-1]:.1e}); the two would be equal at a coefficient of ~{parity[len(parity) // 2]:.2g}."
            )
    if not lines:
        return "No run with a KL term produced a usable batch for the KL-gradient diagnostic."
    header = (
        "KL-gradient diagnostic (after training, on the last rollout's pairs, through the library's loss):"
    )
    return "\n".join([header, "", *lines])


def plot_curves(results: dict[Config, list[ToyRunResult]], path: Path) -> None:
    """Fig. 8: mean reward and reward std over training for each configuration of Setting B's sage runs."""
    figure, axes = reporting.new_figure(columns=2, size=(5.0, 3.4))
    for (preset, kind, strategy, kl), runs in results.items():
        if (preset, kind) != ("setting_b", "sage"):
            continue
        label = strategy if kl == PAPER_KL or strategy == "none" else f"{strategy}, strong"
        for axis, key in zip(axes, ("reward/total", "reward/total_std")):
            mean, std = aggregate_curves(runs, key)
            steps = range(1, len(mean) + 1)
            axis.plot(steps, mean, marker="." if kl == PAPER_KL else "x", label=label)
            axis.fill_between(steps, mean - std, mean + std, alpha=0.15)
    axes[0].set_title("(a) mean training reward, sage, Setting B")
    axes[1].set_title("(b) reward std (exploration)")
    for axis in axes:
        axis.set_xlabel("optimizer step")
    axes[0].legend(fontsize=7)
    reporting.save_figure(figure, path)


def report(context: reporting.BenchmarkContext, results: dict, base: ToyRunSpec, seeds: Sequence[int]) -> str:
    """The markdown section."""
    image = context.image_path("curves")
    plot_curves(results, image)
    grid = "every SDE type x every KL strategy x both settings" if context.arguments.full else (
        "with the paper's KL coefficients, Setting B: sage x all five KL strategies, flow_grpo x {none, fixed}; "
        "Setting A: sage x {none, dual}"
    )  # fmt: skip
    if not context.arguments.no_strong and not context.quick:
        grid += (
            f"; with a strong KL term (lambda_max {STRONG_KL[0]:g}, anchor every {STRONG_KL[1]} steps), one seed: "
            "Setting B, sage x {fixed, stepwise, moving, dual}"
        )
    return f"""## 8. Table 2 / Fig. 8: SDE type x KL strategy under Settings A and B

{context.provenance()}

Grid: {grid}. Seeds {list(seeds)}, {base.num_updates} optimizer steps of {base.num_prompts} prompts x G =
{base.group_size}, eta {base.eta} (SDE on the first 5 of 10 steps), LoRA r8, lr {base.learning_rate}, adaptive KL
coefficient (App. A.6) from 1e-7 up to lambda_max with a {base.kl_warmup_steps}-step warm-up.
Held-out: deterministic sampling of {base.eval_prompts} held-out prompts x {len(base.eval_seeds)} seeds; "total"
is weighted by the run's setting, "overall" is the plain mean of VQ/MQ/TA (comparable across settings); beside
them the gold score the reward cannot fool: RMS pixel distance to the nearest of the toy world's own videos of the
prompt (lower is better) and the object's area over the world's (1 is the world).

The prior before training:

{baseline_rows(results)}

After training (mean ± std over seeds):

{result_table(results)}

{kl_share_line(results)}

{context.image_link(image, "KL strategy ablation curves")}
"""


def main(argv: Sequence[str] | None = None) -> dict[Config, list[ToyRunResult]]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--full", action="store_true", help="every SDE type x KL strategy x setting")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per configuration")
    parser.add_argument("--updates", type=int, default=10, help="optimizer steps per run")
    parser.add_argument("--no-strong", action="store_true", help="skip the strong-KL runs")
    context = reporting.start_benchmark(NAME, parser, argv)
    args = context.arguments
    if context.quick:
        base = ToyRunSpec(num_updates=1, num_prompts=1, group_size=2, eval_seeds=(0,), eval_prompts=1)
        results = run_grid((("setting_b", "sage", "dual", PAPER_KL),), [args.seed], base)
        seeds = [args.seed]
    else:
        base = ToyRunSpec(num_updates=args.updates)
        seeds = [args.seed + index for index in range(args.seeds)]
        results = run_grid(FULL_GRID if args.full else DEFAULT_GRID, seeds, base)
        if not args.no_strong:
            results.update(run_grid(STRONG_GRID, seeds[:1], base))
    print(result_table(results))
    print(kl_share_line(results))
    reporting.write_section(context.output, NAME, report(context, results, base, seeds))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
