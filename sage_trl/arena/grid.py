"""The arena's grid: algorithms x tasks x seeds (and ablation variants), as cells with stable names and folders,
its profiles, and sharding (docs/arena.md)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.flow_grpo import FlowGRPOAgentConfig
from agents.registry import algorithm_spec
from sage_trl.arena.tasks import TASKS, task_named
from sage_trl.presets import PER_ALGORITHM, algorithm_values, load_preset, preset_for_model

__all__ = [
    "FLOW_GRPO_KL",
    "KL_ANCHOR_UPDATE_STEPS",
    "KL_SWEEP",
    "MATCHED_NOISE_ETA",
    "PROFILES",
    "STRONG_KL",
    "STRONG_KL_BETA",
    "VARIANTS",
    "ArenaGrid",
    "Cell",
    "Profile",
    "parse_shard",
    "published_settings",
]


STRONG_KL_BETA = 2.0
"""lambda_max of a KL term that matters on the toy's 40 steps (the paper's 1e-5 leaves the KL term negligible there;
its gradient is about 5e-6 of the policy gradient, so at 2 the two are of one size)."""

KL_ANCHOR_UPDATE_STEPS = 3
"""The moving anchor's refresh interval in the strong and swept KL variants: 13 refreshes in a 40-step run, where the
paper's 10 would give 4 (docs/benchmarks.md, section 8)."""


def _kl_coefficient(beta: str) -> tuple[str, ...]:
    """The KL term at lambda_max ``beta`` with the moving anchor refreshed every `KL_ANCHOR_UPDATE_STEPS` steps."""
    return ("--beta", beta, "--anchor_update_steps", str(KL_ANCHOR_UPDATE_STEPS))


STRONG_KL = _kl_coefficient(f"{STRONG_KL_BETA:g}")
"""The flags of a KL term that matters on the toy's 40 steps: lambda_max `STRONG_KL_BETA` (2), the anchor refreshed
every `KL_ANCHOR_UPDATE_STEPS` (3) steps. The toy preset's ``per_algorithm`` KL for ``sage_grpo`` is this one."""

KL_SWEEP = ("0.5", "0.1", "8", "32", "4", "16")
"""The moving anchor's coefficients around `STRONG_KL`'s 2 (variants ``kl_moving_<beta>``): on the hackable task
lambda_max 2 stops most of the reward's gaming (docs/arena.md). 0.5 and 0.1, between the paper's 1e-5 and 2, ask
whether a weaker term keeps that protection and learns more of what the reward gets right; 8 asks whether a stronger
one protects more or only learns less; 32 looks for where the dial turns over (8 was then the best measured); 4
lies between 2 and 8, where the dial turns over on the temporal task (8 scores below 2 there); 16 lies between 8 and
32, where it turns over on the hackable task. Each new coefficient comes last so that the variants before it keep their
places in the full grid's cell order (its shards)."""

MATCHED_NOISE_ETA = {"dance_grpo": "2.6", "cps": "0.47"}
"""The eta at which each SDE explores as much as SAGE's at the toy preset's 0.7 on the toy task's SDE steps (the
first 5 of 10): the mean per-step noise std is 0.58 for both (variants ``sde_<sde>_eta_<eta>``). At equal eta they
differ: 0.16 for dance_grpo and 0.77 for cps, against 0.58 for sage and 0.56 for flow_grpo, so at 0.7 the SDE types
compare their noise levels more than their forms (docs/arena.md, "The SDE on the hackable task"). dance_grpo's 2.6 lies
far above the published methods' 0.3-1.0: that is what its form needs to explore as much here."""


def _flags(values: Mapping[str, Any], names: Iterable[str]) -> tuple[str, ...]:
    """``--name value`` for each of ``names``, the values as ``sage-train`` parses them back."""
    return tuple(token for name in names for token in (f"--{name}", str(values[name])))


FLOW_GRPO_KL = _flags(FlowGRPOAgentConfig.defaults, ("kl_strategy", "kl_coef_schedule", "beta"))
"""Flow-GRPO's KL term as flags (a fixed KL to the initial model at a constant beta 0.04, `agents.flow_grpo`), for the
variants ``kl_flow_grpo`` and ``kl_flow_grpo_no_equalizer``: on the few-step task Flow-GRPO beat ``sage_grpo`` and
its edge was not its SDE, which left its KL term and its missing equalizer; these variants separate the two
(docs/arena.md, "Flow-GRPO's KL and equalizer on the few-step task", and on the temporal task, where Flow-GRPO scored
below ``sage_grpo``, "Flow-GRPO's KL and equalizer on the temporal task")."""

_NO_EQUALIZER = ("--equalizer", "false")

VARIANTS: dict[str, tuple[str, ...]] = {
    "sde_flow_grpo": ("--sde", "flow_grpo"),
    "sde_dance_grpo": ("--sde", "dance_grpo"),
    "sde_cps": ("--sde", "cps"),
    **{f"sde_{sde}_eta_{eta}": ("--sde", sde, "--eta", eta) for sde, eta in MATCHED_NOISE_ETA.items()},
    "eta_0.55": ("--eta", "0.55"),
    "no_equalizer": _NO_EQUALIZER,
    **{f"kl_{kind}": ("--kl_strategy", kind) for kind in ("none", "fixed", "moving", "stepwise")},
    **{f"kl_{kind}_strong": ("--kl_strategy", kind, *STRONG_KL) for kind in ("fixed", "moving", "stepwise", "dual")},
    **{f"kl_moving_{beta}": ("--kl_strategy", "moving", *_kl_coefficient(beta)) for beta in KL_SWEEP},
    "kl_flow_grpo": FLOW_GRPO_KL,
    "kl_flow_grpo_no_equalizer": (*FLOW_GRPO_KL, *_NO_EQUALIZER),
}
"""The paper's ablations of ``sage_grpo`` (a cell ``sage_grpo+<variant>`` adds these flags): the SDE type (Sec. 3), at
the toy preset's eta and at the eta where dance_grpo and cps explore as much as SAGE on the toy task
(`MATCHED_NOISE_ETA`); SAGE's exploration scale at 0.55, where its mean noise std over the few-step task's SDE steps
(0.748) meets flow_grpo's and cps' at the toy preset's 0.7 (0.757 and 0.735), so that the SDE types compare at equal
exploration there (0.55 is near SAGE's official 0.5); the temporal gradient equalizer off (Sec. 4.2); the KL strategies
other than its dual KL (Sec. 3.2.2, Table 2) at the paper's coefficients, each at a coefficient where the KL term
matters (`STRONG_KL`), and the moving anchor at coefficients around the strong one (`KL_SWEEP`); Flow-GRPO's KL term in
place of the dual KL, with the equalizer on and off (`FLOW_GRPO_KL`)."""


@functools.cache
def published_settings(algorithm: str) -> tuple[str, ...]:
    """The flags that set back what the toy preset tunes for ``algorithm`` (its ``per_algorithm`` section,
    `sage_trl.presets.PER_ALGORITHM`) to the algorithm's own defaults. The arena compares each algorithm at its
    published settings: ``sage_grpo`` at the paper's KL coefficients, where the preset's demo run uses a stronger KL
    (the `STRONG_KL` of the ``kl_dual_strong`` variant); the published results in docs/arena.md were made so."""
    tuned = algorithm_values(load_preset(preset_for_model("toy")), algorithm)
    if not tuned:
        return ()
    defaults = algorithm_spec(algorithm).config_class.defaults
    missing = sorted(set(tuned) - set(defaults))
    if missing:
        raise ValueError(
            f"the toy preset's {PER_ALGORITHM} sets {missing} for {algorithm!r}, which have no algorithm default to "
            "restore in the arena: tune only fields of agents.AlgorithmConfig there."
        )
    return _flags(defaults, sorted(tuned))


@dataclass(frozen=True)
class Cell:
    """One run of the grid: ``algorithm`` (a registered name, the built-ins' or a plug-in's) with an optional
    ablation ``variant`` of `VARIANTS`, on ``task``, with ``seed``."""

    algorithm: str
    task: str
    seed: int
    variant: str | None = None

    @property
    def label(self) -> str:
        """``algorithm`` or ``algorithm+variant``: the row of the report."""
        return self.algorithm if self.variant is None else f"{self.algorithm}+{self.variant}"

    @property
    def folder(self) -> Path:
        """The cell's folder under the arena's output folder: ``cells/<task>/<label>/seed-<seed>``."""
        return Path("cells") / self.task / self.label / f"seed-{self.seed}"

    def flags(self, extra: tuple[str, ...] = ()) -> list[str]:
        """The ``sage-train`` arguments of the cell (the output folder aside): the algorithm at its published settings
        (`published_settings`), then the task's and the variant's flags."""
        variant = VARIANTS[self.variant] if self.variant is not None else ()
        return [
            "--algorithm", self.algorithm, "--seed", str(self.seed), *published_settings(self.algorithm),
            *task_named(self.task).flags, *variant, *extra,
        ]  # fmt: skip


@dataclass(frozen=True)
class Profile:
    """A named grid: its algorithms (None: every registered one), tasks, seeds, ablation variants, and the flags
    every cell adds (a shorter run for the quick profile)."""

    algorithms: tuple[str, ...] | None
    tasks: tuple[str, ...]
    seeds: int
    variants: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    about: str = ""


PROFILES: dict[str, Profile] = {
    "quick": Profile(
        None, ("toy", "hackable"), 1,
        flags=("--max_steps", "8", "--num_eval_prompts", "4", "--eval_seeds", "0", "--eval_steps", "4"),
        about="every algorithm on two tasks, 8 optimizer steps each: a smoke of the whole arena in minutes",
    ),
    "full": Profile(
        None, tuple(TASKS), 100, variants=tuple(VARIANTS),
        about="every algorithm on every task with the paper's ablations, the toy preset's full 40-step runs",
    ),
}  # fmt: skip
"""The grids ``sage-arena --profile`` names. The full profile's 100 seeds are chosen for power: the toy task's
``sage_grpo`` cell (at the paper's KL, as the arena runs it) changes the held-out total with a per-seed standard
deviation of 0.0245 (10 seeds), so 100 seeds per algorithm detect a difference of 0.0097 at 80% power
(`stats.detectable_difference`; docs/arena.md, "Power of the full profile"). The report states the difference the
grid's own spread gives."""


@dataclass
class ArenaGrid:
    """The cells of one arena, in a fixed order (shards and the report follow it), and the flags every cell adds."""

    algorithms: list[str]
    tasks: list[str]
    seeds: list[int]
    variants: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for task in self.tasks:
            task_named(task)
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"Unknown variants {unknown} (--variants); the variants are {', '.join(VARIANTS)}.")
        if self.variants and "sage_grpo" not in self.algorithms:
            raise ValueError("--variants are ablations of sage_grpo: add sage_grpo to --algorithms.")
        if not self.algorithms or not self.tasks or not self.seeds:
            raise ValueError("An arena needs at least one algorithm, one task and one seed.")

    def rows(self) -> list[tuple[str, str | None]]:
        """The report's rows as (algorithm, variant): the algorithms, then sage_grpo's variants."""
        return [(a, None) for a in self.algorithms] + [("sage_grpo", v) for v in self.variants]

    def labels(self) -> list[str]:
        """The rows' labels (`Cell.label`): what ``--baseline`` may name."""
        return [Cell(a, self.tasks[0], self.seeds[0], v).label for a, v in self.rows()]

    def cells(self) -> list[Cell]:
        """Every cell: task, then algorithm (variants after sage_grpo), then seed."""
        return [Cell(a, t, s, v) for t in self.tasks for a, v in self.rows() for s in self.seeds]

    def shard(self, index: int, count: int) -> list[Cell]:
        """Shard ``index`` of ``count`` (1-based): every ``count``-th cell, so each shard gets every task."""
        return self.cells()[index - 1 :: count]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ArenaGrid:
        values: dict[str, Any] = json.loads(text)
        return cls(**values)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with ``1 <= K <= N``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes K/N (shard K of N, from 1), got {text!r}.") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard K/N needs 1 <= K <= N, got {text!r}.")
    return index, count
