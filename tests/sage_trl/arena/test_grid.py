"""The arena's grid, shards, tasks and command-line checks (sage_trl.arena.grid, tasks, cli), without running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents import list_agents
from sage_trl.arena import PROFILES, TASKS, VARIANTS, ArenaGrid
from sage_trl.arena.cell import RESULT_FILE, RUN_FOLDER
from sage_trl.arena.cli import GRID_FILE, arena_main
from sage_trl.arena.grid import KL_SWEEP, MATCHED_NOISE_ETA, Cell, parse_shard, published_settings
from sage_trl.arena.runner import merge_cells
from sage_trl.run_folder.layout import RUN_CONFIG_FILE


def grid(**values) -> ArenaGrid:
    return ArenaGrid(**{"algorithms": ["sage_grpo", "flow_grpo"], "tasks": ["toy", "hackable"], "seeds": [0, 1, 2],
                        **values})  # fmt: skip


def resolved(cell: Cell):
    """The ``sage-train`` script arguments and config that ``cell``'s flags resolve to (nothing runs)."""
    from sage_trl.cli.parsing import parse_train_arguments

    return parse_train_arguments(cell.flags())


def test_shards_split_the_cells_once_each_with_every_task() -> None:
    full = grid(variants=["no_equalizer"])
    cells = full.cells()
    assert len(cells) == 2 * 3 * 3 and len(set(cells)) == len(cells)
    shards = [full.shard(k, 4) for k in range(1, 5)]
    assert sorted(c.folder for s in shards for c in s) == sorted(c.folder for c in cells)
    assert all({c.task for c in s} == {"toy", "hackable"} for s in shards)


def test_a_cell_is_its_tasks_and_variants_flags() -> None:
    cell = next(c for c in grid(variants=["sde_cps"]).cells() if c.variant == "sde_cps" and c.task == "hackable")
    assert cell.label == "sage_grpo+sde_cps"
    assert cell.folder == Path("cells/hackable/sage_grpo+sde_cps/seed-0")
    flags = cell.flags(("--max_steps", "2"))
    assert flags[:4] == ["--algorithm", "sage_grpo", "--seed", "0"]
    assert " ".join([*TASKS["hackable"].flags, *VARIANTS["sde_cps"], "--max_steps", "2"]) in " ".join(flags)


@pytest.mark.parametrize(
    ("label", "beta", "anchor_update_steps"),
    [("sage_grpo", 1e-5, 10), ("sage_grpo+kl_dual_strong", 2.0, 3), ("flow_grpo", 0.04, 10)],
)
def test_each_algorithm_runs_at_its_published_settings_not_the_presets_tuning(
    label: str, beta: float, anchor_update_steps: int
) -> None:
    """The toy preset tunes sage_grpo's KL for the demo run (its per_algorithm section); an arena cell sets it back to
    the algorithm's own defaults (the paper's, on which docs/arena.md's results were made), and a variant's flags
    still win."""
    from agents.registry import algorithm_spec
    from sage_trl import cli

    algorithm, _, variant = label.partition("+")
    _, config = resolved(Cell(algorithm, "toy", 0, variant or None))
    assert (config.beta, config.anchor_update_steps) == (beta, anchor_update_steps)
    if variant:  # docs/arena.md: kl_dual_strong is what sage-train runs on the toy by default
        _, demo = cli.parse_train_arguments([])
        assert (demo.kl_strategy, demo.beta, demo.anchor_update_steps) == (
            config.kl_strategy, config.beta, config.anchor_update_steps
        )  # fmt: skip
        return
    defaults = algorithm_spec(algorithm).config_class.defaults
    assert (config.beta, config.anchor_update_steps) == (defaults["beta"], defaults["anchor_update_steps"])
    _, demo = cli.parse_train_arguments(["--algorithm", algorithm])
    assert (demo.beta != config.beta) == (algorithm == "sage_grpo")  # the preset's tuning is what the pin undoes


@pytest.mark.parametrize("beta", KL_SWEEP)
def test_the_kl_sweep_runs_the_strong_moving_anchor_at_another_coefficient_above_the_papers(beta: str) -> None:
    """``kl_moving_<beta>`` differs from ``kl_moving_strong`` in lambda_max only, which is above the paper's (the
    baseline's) and not the strong one (docs/arena.md, "The KL coefficient on the hackable task")."""
    def kl_of(variant: str | None) -> tuple[str, float, int]:
        _, config = resolved(Cell("sage_grpo", "hackable", 0, variant))
        return config.kl_strategy, config.beta, config.anchor_update_steps

    (strategy, swept, anchor), (_, papers, _) = kl_of(f"kl_moving_{beta}"), kl_of(None)
    strong = kl_of("kl_moving_strong")
    assert (strategy, swept, anchor) == (strong[0], float(beta), strong[2])
    assert papers < swept != strong[1]


def test_the_grid_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="Unknown arena task 'video'"):
        grid(tasks=["video"])
    with pytest.raises(ValueError, match="add sage_grpo"):
        grid(algorithms=["flow_grpo"], variants=["no_equalizer"])
    with pytest.raises(ValueError, match="Unknown variants"):
        grid(variants=["bigger"])
    for text in ("3", "0/2", "3/2", "a/b"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(text)
    assert parse_shard("2/5") == (2, 5)


def test_every_profile_is_a_valid_grid() -> None:
    for profile in PROFILES.values():
        ArenaGrid(["sage_grpo"], list(profile.tasks), list(range(profile.seeds)), list(profile.variants))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_algorithm_resolves_on_every_task(task: str) -> None:
    """Every algorithm's cell passes its config's rules on each task before anything runs (BranchGRPO's splits once
    fell outside the few-step task's 2-step SDE window and failed at the first rollout)."""
    for algorithm in list_agents():
        _, config = resolved(Cell(algorithm, task, 0))
        assert config.algorithm == algorithm


def test_the_command_refuses_bad_options_before_running(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    output = ["--output_dir", str(tmp_path / "arena")]
    assert arena_main(["--algorithms", "sage_grpo,nope", *output]) == 2
    assert "--algorithms: ['nope'] are not registered" in capsys.readouterr().err
    assert arena_main(["--algorithms", "flow_grpo", *output]) == 2
    assert "--baseline sage_grpo is not a row of the grid (flow_grpo)" in capsys.readouterr().err
    assert arena_main(["--seeds", "three", *output]) == 2
    assert "--seeds takes a count N or comma-separated seeds" in capsys.readouterr().err
    assert arena_main(["--workers", "0", *output]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "arena").exists()  # nothing written for a refused command
    assert arena_main(["--algorithms", "sage_grpo", "--seeds", "1", "--report_only", *output]) == 0
    assert (tmp_path / "arena" / GRID_FILE).is_file()
    assert arena_main(["--algorithms", "sage_grpo", "--seeds", "2", "--report_only", *output]) == 2
    assert "holds an arena of another grid" in capsys.readouterr().err


MERGE_OPTIONS = ["--algorithms", "sage_grpo", "--tasks", "toy", "--seeds", "1"]
MERGED_CELL = Cell("sage_grpo", "toy", 0)


def finished_cell(folder: Path, score: float, flags: list[str]) -> None:
    (folder / MERGED_CELL.folder).mkdir(parents=True)
    result = {"score": score, "gold": 0.0, "flops": {"total": 1.0}, "flags": flags}
    (folder / MERGED_CELL.folder / RESULT_FILE).write_text(json.dumps(result))


def test_merging_refuses_a_cell_whose_numbers_differ_between_shards(tmp_path: Path, capsys) -> None:
    flags = MERGED_CELL.flags(PROFILES["quick"].flags)
    for folder, score in (("merged", 0.1), ("shard", 0.2)):  # the same cell, finished with different numbers
        finished_cell(tmp_path / folder, score, flags)
    code = arena_main([*MERGE_OPTIONS, "--output_dir", str(tmp_path / "merged"), "--merge", str(tmp_path / "shard")])
    assert code == 2 and "differs between" in capsys.readouterr().err
    assert json.loads((tmp_path / "merged" / MERGED_CELL.folder / RESULT_FILE).read_text())["score"] == 0.1


def test_merging_refuses_a_cell_run_with_other_flags(tmp_path: Path, capsys) -> None:
    """A shard of another profile (or other flags after --) held cells of the same names with other runs behind
    them; the merge copied them in silently."""
    finished_cell(tmp_path / "shard", 0.2, MERGED_CELL.flags(PROFILES["full"].flags))  # a 40-step cell
    code = arena_main([*MERGE_OPTIONS, "--output_dir", str(tmp_path / "merged"), "--merge", str(tmp_path / "shard")])
    error = capsys.readouterr().err
    assert code == 2 and "not as this grid's" in error and "--max_steps 8" in error
    assert not (tmp_path / "merged" / MERGED_CELL.folder).exists()


def recorded_settings(folder: Path, flags: list[str], ran_in: Path | None = None) -> None:
    """The cell's run_config.yaml as sage-train writes it for ``flags`` (sage_trl.cli.train.run_config_text), run in
    the cell's folder or, for a cell moved since, in ``ran_in``."""
    from sage_trl.cli.parsing import parse_train_arguments
    from sage_trl.cli.train import run_config_text

    run_dir = folder / MERGED_CELL.folder / RUN_FOLDER
    run_dir.mkdir(parents=True)
    settings = parse_train_arguments([*flags, "--output_dir", str(ran_in or run_dir)])
    (run_dir / RUN_CONFIG_FILE).write_text(run_config_text(*settings))


def test_merging_takes_a_cell_recorded_with_other_flags_of_the_same_settings(tmp_path: Path) -> None:
    """A cell finished before `published_settings` restated sage_grpo's KL defaults on every cell recorded its flags
    without them; its settings are the grid's, so the merge takes it (it refused it when flags had to match)."""
    flags = MERGED_CELL.flags(PROFILES["quick"].flags)
    older = [flag for flag in flags if flag not in published_settings("sage_grpo")]
    assert older != flags
    finished_cell(tmp_path / "shard", 0.2, older)
    recorded_settings(tmp_path / "shard", flags)
    assert merge_cells(tmp_path / "merged", [tmp_path / "shard"], [MERGED_CELL], PROFILES["quick"].flags) == 1
    assert json.loads((tmp_path / "merged" / MERGED_CELL.folder / RESULT_FILE).read_text())["score"] == 0.2


def test_merging_takes_a_cell_moved_from_the_folder_it_ran_in(tmp_path: Path) -> None:
    """A cell's run_config.yaml records where it ran. A shard's folder copied off a cluster node, or a cell merged
    into a second grid, lies elsewhere now; its settings are still the grid's (the merge refused it for its
    output_dir)."""
    flags = MERGED_CELL.flags(PROFILES["quick"].flags)
    older = [flag for flag in flags if flag not in published_settings("sage_grpo")]
    finished_cell(tmp_path / "shard", 0.2, older)
    recorded_settings(tmp_path / "shard", flags, ran_in=tmp_path / "node-3" / "shard" / MERGED_CELL.folder / "run")
    assert merge_cells(tmp_path / "merged", [tmp_path / "shard"], [MERGED_CELL], PROFILES["quick"].flags) == 1
    once_more = merge_cells(tmp_path / "second", [tmp_path / "merged"], [MERGED_CELL], PROFILES["quick"].flags)
    assert once_more == 1  # and merged again, from the folder it was merged into


def test_merging_names_the_settings_a_cell_ran_with_otherwise(tmp_path: Path, capsys) -> None:
    flags = MERGED_CELL.flags(PROFILES["quick"].flags)
    finished_cell(tmp_path / "shard", 0.2, flags[:-2])
    recorded_settings(tmp_path / "shard", [*flags, "--beta", "0.5", "--learning_rate", "0.001"])
    code = arena_main([*MERGE_OPTIONS, "--output_dir", str(tmp_path / "merged"), "--merge", str(tmp_path / "shard")])
    error = capsys.readouterr().err
    assert code == 2 and "its settings differ (beta, learning_rate)" in error
    assert not (tmp_path / "merged" / MERGED_CELL.folder).exists()


def mean_noise_std(cell: Cell) -> float:
    """The mean per-step noise std over the SDE steps of the run ``cell`` makes, from the settings ``sage-train``
    resolves its flags to (schedule, window, SDE and eta): what the run logs as ``rollout/exploration_std``."""
    from sage_env.sde import flow_match_sigmas, noise_std

    _, config = resolved(cell)
    first, last = config.sde_window
    sigmas = flow_match_sigmas(config.num_inference_steps, config.shift)
    return float(noise_std(config.sde, sigmas[first:last], sigmas[first + 1 : last + 1], config.eta).mean())


def test_the_eta_variant_matches_sage_exploration_to_flow_grpo_and_cps_on_the_few_step_task() -> None:
    """``eta_0.55``'s promise (VARIANTS' docstring): on the few-step task's SDE steps, SAGE's mean noise std at 0.55
    lies between cps' and flow_grpo's at the toy preset's eta, within 2% of each (at 0.7 it is 26% above)."""
    matched = mean_noise_std(Cell("sage_grpo", "few_step", 0, "eta_0.55"))
    others = [mean_noise_std(Cell("sage_grpo", "few_step", 0, f"sde_{sde}")) for sde in ("cps", "flow_grpo")]
    assert others[0] < matched < others[1]
    assert all(abs(matched / other - 1) < 0.02 for other in others)
    assert mean_noise_std(Cell("sage_grpo", "few_step", 0)) / others[1] > 1.2


def test_the_flow_grpo_kl_variants_differ_from_flow_grpo_in_its_sde_and_the_equalizer_only() -> None:
    """`FLOW_GRPO_KL`'s promise: ``sage_grpo+kl_flow_grpo_no_equalizer`` trains as ``flow_grpo`` does but for the SDE,
    and ``sage_grpo+kl_flow_grpo`` adds the equalizer back, so the pair separates Flow-GRPO's KL from its missing
    equalizer (docs/arena.md)."""
    from dataclasses import asdict

    def settings(cell: Cell) -> dict:
        arguments, config = resolved(cell)
        return {**asdict(arguments), **asdict(config)}

    flow_grpo = settings(Cell("flow_grpo", "few_step", 0))
    without = settings(Cell("sage_grpo", "few_step", 0, "kl_flow_grpo_no_equalizer"))
    with_equalizer = settings(Cell("sage_grpo", "few_step", 0, "kl_flow_grpo"))
    assert {k for k in flow_grpo if flow_grpo[k] != without[k]} == {"algorithm", "sde"}
    assert {k for k in without if without[k] != with_equalizer[k]} == {"equalizer"}
    assert (without["kl_strategy"], without["beta"], without["equalizer"]) == ("fixed", 0.04, False)


def test_the_docs_state_the_full_profiles_cell_count() -> None:
    """docs/arena.md's cost of the full profile counts its cells: every built-in algorithm (this package's entry
    points) and every variant, on every task, over its seeds, at 6 minutes a cell; a new variant or algorithm must
    update it."""
    from importlib.metadata import distribution

    from sage_env.plugins import GROUPS

    built_in = [e.name for e in distribution("sage-grpo").entry_points if e.group == GROUPS["algorithms"]]
    full = PROFILES["full"]
    count = len(ArenaGrid(built_in, list(full.tasks), list(range(full.seeds)), list(full.variants)).cells())
    six_minute_cells = f"Its {count:,} cells need about {count * 6 // 60:,} CPU-hours"
    assert six_minute_cells in (Path(__file__).parents[3] / "docs" / "arena.md").read_text()


@pytest.mark.parametrize("task", ["toy", "hackable"])
def test_the_matched_noise_variants_explore_as_much_as_sage_on_the_toy_schedule(task: str) -> None:
    """`MATCHED_NOISE_ETA`'s promise: on the toy schedule (the toy and hackable tasks' SDE steps) dance_grpo at 2.6
    and cps at 0.47 have SAGE's mean noise std at the toy preset's eta within 1%; at that eta they are 73% below
    and 33% above it."""
    sage = mean_noise_std(Cell("sage_grpo", task, 0))
    for sde, eta in MATCHED_NOISE_ETA.items():
        variant = f"sde_{sde}_eta_{eta}"
        assert VARIANTS[variant][:2] == ("--sde", sde)
        assert abs(mean_noise_std(Cell("sage_grpo", task, 0, variant)) / sage - 1) < 0.01
        assert abs(mean_noise_std(Cell("sage_grpo", task, 0, f"sde_{sde}")) / sage - 1) > 0.3


def test_the_baseline_may_be_a_variants_row(tmp_path: Path, capsys) -> None:
    """``--baseline sage_grpo+eta_0.55``: the report reads every row against that variant (P(better) of the
    algorithm's row computed against it), and a label that is not a row is refused before anything runs."""
    options = [*MERGE_OPTIONS, "--seeds", "2", "--variants", "eta_0.55", "--output_dir", str(tmp_path / "arena")]
    flags = list(PROFILES["quick"].flags)
    for cell in ArenaGrid(["sage_grpo"], ["toy"], [0, 1], ["eta_0.55"]).cells():
        folder = tmp_path / "arena" / cell.folder
        folder.mkdir(parents=True)
        score = 0.1 * cell.seed + (0.5 if cell.variant else 0.0)  # the variant's runs beat every baseline run
        result = {"cell": {"algorithm": cell.algorithm, "task": cell.task, "seed": cell.seed, "variant": cell.variant},
                  "score": score, "gold": 0.0, "flops": {"train": 1.0, "total": 1.0}, "wall_seconds": 1.0,
                  "curve": [{"step": 0, "flops": 0.0, "score": 0.0, "gold": 0.0}], "flags": cell.flags(tuple(flags))}
        (folder / RESULT_FILE).write_text(json.dumps(result))
    assert arena_main([*options, "--baseline", "sage_grpo+flow", "--report_only"]) == 2
    assert "--baseline sage_grpo+flow is not a row of the grid (sage_grpo, sage_grpo+eta_0.55)" in capsys.readouterr().err
    assert arena_main([*options, "--baseline", "sage_grpo+eta_0.55", "--report_only"]) == 0
    report = (tmp_path / "arena" / "report.md").read_text()
    assert "P(better than sage_grpo+eta_0.55)" in report
    assert "| `sage_grpo` | 2 |" in report and "| 0.00 [0.00, 0.00] |" in report
    # and by seed: 0.5 below the variant in both seeds
    assert "By seed against `sage_grpo+eta_0.55`" in report
    assert "| `sage_grpo` | 2 | -0.5000 [-0.5000, -0.5000] | 0 of 2 |" in report
