"""Fig. 3 / Sec. 4.5.1: reward curves with and without the temporal gradient equalizer, for each SDE type.

Short RL runs on the toy world through the library's own path (`benchmarks.toy_training`: ``agents.make``
+ ``sage_env/Toy-v0``, settings of ``sage_trl/presets/toy.yaml``), the same SAGE-GRPO algorithm for every
SDE type with only the SDE (and the equalizer switch) changed, several seeds each. The table reports the
training reward (SDE rollouts) averaged over the last third of the updates and the held-out reward of the
deterministic sampler before and after training (mean ± std over seeds); the plot shows the curves.

Default: every SDE type (sage, flow_grpo, dance_grpo, cps) x equalizer on/off x 2 seeds x 12 updates of 16
videos (about 20 minutes on 2 shared cores); ``--seeds`` and ``--updates`` widen it.

Run: ``python -m benchmarks.equalizer_ablation [--quick] [--seeds 2] [--updates 12] [--output docs/benchmarks.md]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks import reporting
from benchmarks.toy_training import (
    ToyRunResult,
    ToyRunSpec,
    aggregate_curves,
    final_mean_std,
    run_toy_training,
)

NAME = "equalizer_ablation"
SDE_KINDS = ("sage", "flow_grpo", "dance_grpo", "cps")


def run_grid(
    kinds: Sequence[str], seeds: Sequence[int], base: ToyRunSpec
) -> dict[tuple[str, bool], list[ToyRunResult]]:
    """Every (SDE type, equalizer) pair over every seed."""
    results: dict[tuple[str, bool], list[ToyRunResult]] = {}
    for kind in kinds:
        for equalizer in (True, False):
            runs = []
            for seed in seeds:
                spec = replace(base, sde=kind, equalizer=equalizer, seed=seed)
                runs.append(run_toy_training(spec))
                print(f"{spec.label(('sde', 'equalizer', 'seed'))}: {runs[-1].seconds:.0f} s", flush=True)
            results[(kind, equalizer)] = runs
    return results


def late_reward(runs: Sequence[ToyRunResult], key: str = "reward/total") -> str:
    """``mean ± std`` over runs of the curve's mean over its last third."""
    values = []
    for run in runs:
        curve = run.curves[key]
        tail = curve[-max(len(curve) // 3, 1) :]
        values.append(sum(tail) / len(tail))
    return reporting.format_mean_std(values)


def result_table(results: dict[tuple[str, bool], list[ToyRunResult]]) -> str:
    """Per (SDE, equalizer): late training reward and held-out scores."""
    rows = []
    for (kind, equalizer), runs in results.items():
        rows.append(
            [
                kind,
                "on" if equalizer else "off",
                len(runs),
                late_reward(runs),
                final_mean_std(runs, "overall", "before"),
                final_mean_std(runs, "overall"),
                final_mean_std(runs, "mq"),
                final_mean_std(runs, "ta"),
                final_mean_std(runs, "world_distance", "before"),
                final_mean_std(runs, "world_distance"),
                final_mean_std(runs, "object_area_ratio"),
                late_reward(runs, "grad_norm"),
            ]
        )
    header = ["SDE", "equalizer", "seeds", "training reward, last third", "held-out overall before",
              "held-out overall after", "held-out MQ after", "held-out TA after", "distance to world before",
              "distance to world after", "object area / world's after", "grad norm, last third"]  # fmt: skip
    return reporting.markdown_table(header, rows)


def plot_curves(results: dict[tuple[str, bool], list[ToyRunResult]], path: Path) -> None:
    """One panel per SDE type: mean ± std training reward with and without the equalizer."""
    kinds = list(dict.fromkeys(kind for kind, _ in results))
    figure, axes = reporting.new_figure(columns=len(kinds), size=(4.0, 3.2))
    for axis, kind in zip(axes, kinds):
        for equalizer in (True, False):
            mean, std = aggregate_curves(results[(kind, equalizer)], "reward/total")
            steps = range(1, len(mean) + 1)
            axis.plot(steps, mean, marker=".", label=f"equalizer {'on' if equalizer else 'off'}")
            axis.fill_between(steps, mean - std, mean + std, alpha=0.2)
        axis.set_title(kind)
        axis.set_xlabel("optimizer step")
    axes[0].set_ylabel("training reward (Setting B)")
    axes[0].legend(fontsize=7)
    reporting.save_figure(figure, path)


def comparison_lines(results: dict[tuple[str, bool], list[ToyRunResult]]) -> list[str]:
    """Per SDE type: does the equalizer raise the late training reward and the held-out reward?"""
    lines = []
    kinds = list(dict.fromkeys(kind for kind, _ in results))
    for kind in kinds:
        on, off = results[(kind, True)], results[(kind, False)]
        late_on, late_off = _late_mean(on), _late_mean(off)
        held_on = sum(r.after["overall"] for r in on) / len(on)
        held_off = sum(r.after["overall"] for r in off) / len(off)
        distance_on = sum(r.after["world_distance"] for r in on) / len(on)
        distance_off = sum(r.after["world_distance"] for r in off) / len(off)
        lines.append(
            f"- {kind}: late training reward {late_on:.3f} (on) vs {late_off:.3f} (off), held-out overall "
            f"{held_on:.3f} vs {held_off:.3f}, distance to the world's videos {distance_on:.4f} vs {distance_off:.4f}."
        )
    return lines


def _late_mean(runs: Sequence[ToyRunResult]) -> float:
    values = []
    for run in runs:
        curve = run.curves["reward/total"]
        tail = curve[-max(len(curve) // 3, 1) :]
        values.append(sum(tail) / len(tail))
    return sum(values) / len(values)


def report(context: reporting.BenchmarkContext, results: dict, base: ToyRunSpec, seeds: Sequence[int]) -> str:
    """The markdown section."""
    image = context.image_path("curves")
    plot_curves(results, image)
    comparisons = "\n".join(comparison_lines(results))
    return f"""## 7. Fig. 3 / Sec. 4.5.1: reward curves with and without the temporal gradient equalizer

{context.provenance()}

`agents.make("sage_grpo")` on the toy prior with LoRA r8, only `sde` and `equalizer` changed: eta {base.eta} for
every SDE type (SDE on the first 5 of 10 steps), {base.num_prompts} prompts x G = {base.group_size} per rollout,
{base.num_updates} optimizer steps, lr {base.learning_rate}, dual KL with the adaptive coefficient, reward Setting
{base.reward_preset[-1].upper()}; seeds {list(seeds)}. Training reward = mean reward of the update's SDE
rollouts; held-out = deterministic sampling of {base.eval_prompts} held-out prompts x {len(base.eval_seeds)} seeds
("overall" = mean of the VQ/MQ/TA heads). The gold score the reward cannot fool: RMS pixel distance to the nearest
of the toy world's own videos of the prompt (lower is better) and the object's area over the world's (1 is the
world; `sage_trl.evaluation.world_measures`).

{result_table(results)}

{comparisons}

Two seeds per row: a difference between "on" and "off" within the rows' ± spreads is not an effect of the
equalizer but seed noise. The distance to the world's videos is the score the reward cannot fool.

{context.image_link(image, "training reward with and without the equalizer")}
"""


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, bool], list[ToyRunResult]]:
    """Run the benchmark (see the module docstring), print its tables, write its section; return results."""
    parser = reporting.benchmark_parser(__doc__)
    parser.add_argument("--seeds", type=int, default=2, help="seeds per configuration")
    parser.add_argument("--updates", type=int, default=12, help="optimizer steps per run")
    parser.add_argument(
        "--sde", nargs="+", default=list(SDE_KINDS), choices=SDE_KINDS, help="SDE types to run"
    )
    context = reporting.start_benchmark(NAME, parser, argv)
    args = context.arguments
    if context.quick:
        base = ToyRunSpec(num_updates=1, num_prompts=1, group_size=2, eval_seeds=(0,), eval_prompts=1)
        kinds, seeds = ("sage",), [args.seed]
    else:
        base = ToyRunSpec(num_updates=args.updates)
        kinds, seeds = tuple(args.sde), [args.seed + index for index in range(args.seeds)]
    results = run_grid(kinds, seeds, base)
    print(result_table(results))
    reporting.write_section(context.output, NAME, report(context, results, base, seeds))
    print(f"\nSection '{NAME}' written to {context.output}")
    return results


if __name__ == "__main__":
    main()
