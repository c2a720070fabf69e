"""The reward protocol and the weighted composite that turns named scores into one reward per video.

A reward function is any callable

    reward_fn(videos, prompts, *, fps) -> {name: (B,) tensor}  or  (B,) tensor / list of floats

with ``videos`` a float tensor ``(B, F, 3, H, W)`` in [0, 1] and ``prompts`` a sequence of B strings.
Plain Python functions are first-class: ``def brightness(videos, prompts, **kwargs): return
videos.mean(dim=(1, 2, 3, 4))`` is a reward named ``brightness``.

`CompositeReward` calls several such functions (as TRL combines ``reward_funcs`` with
``reward_weights``) and weights their named components into the scalar reward
``R = sum_c w_c * S_c`` (paper Eq. 33). A sample whose reward raises or is NaN/inf is marked invalid
and reported with its reason; its reward is NaN, never silently 0, and learners exclude it from its
group's advantage. A reward function that fails for every sample of a batch makes the whole batch invalid
(a transient failure, e.g. a reward server restarting, costs one batch); `RewardFailureMonitor` stops a run
whose rewards keep failing, naming the reward and its last exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from sage_env.plugins import GROUPS, PluginGroup

__all__ = [
    "REWARDS",
    "REWARD_PRESETS",
    "CompositeReward",
    "RewardFunction",
    "RewardOutput",
    "as_composite_reward",
    "check_videos",
    "load_reward",
    "resolve_reward_weights",
    "reward_name",
]

REWARD_PRESETS: dict[str, dict[str, float]] = {
    # Paper Table 2, Setting A: averaged rewards.
    "setting_a": {"vq": 1.0, "mq": 1.0, "ta": 1.0},
    # Paper Table 2, Setting B (the paper's best, our default): alignment-focused.
    "setting_b": {"vq": 0.5, "mq": 0.5, "ta": 1.0},
}
"""Component weights of the paper's two reward settings (VideoAlign's VQ / MQ / TA heads)."""


@runtime_checkable
class RewardFunction(Protocol):
    """``(videos (B, F, 3, H, W) in [0, 1], prompts, *, fps) -> {name: (B,) tensor}`` or a ``(B,)`` tensor."""

    def __call__(self, videos: torch.Tensor, prompts: Sequence[str], **kwargs: Any) -> Any: ...


@dataclass
class RewardOutput:
    """Scores of one batch of videos.

    Args:
        total: ``(B,)`` float32 weighted reward; NaN where the sample is invalid.
        components: ``{name: (B,) float32}`` every named score (weighted or reported only); NaN where a
            score could not be computed.
        valid: ``(B,)`` bool, False where a component with a nonzero weight failed (raised, NaN or inf).
        errors: one entry per sample: None when valid, else the reason.
        weights: the weight of each weighted component (one with weight 0 is listed but enters nothing).
        failed_calls: how many reward functions raised on the whole batch (each then retried per sample).
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    valid: torch.Tensor
    errors: list[str | None]
    weights: dict[str, float] = field(default_factory=dict)
    failed_calls: int = 0

    @property
    def num_invalid(self) -> int:
        """Number of invalid samples."""
        return int((~self.valid).sum())

    def state_dict(self) -> dict[str, Any]:
        """The scores as tensors, strings and numbers (saved without pickle by the trainer's checkpoints)."""
        return {
            "total": self.total,
            "components": dict(self.components),
            "valid": self.valid,
            "errors": list(self.errors),
            "weights": dict(self.weights),
            "failed_calls": self.failed_calls,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> RewardOutput:
        """The inverse of `state_dict`."""
        return cls(
            total=state["total"],
            components=dict(state["components"]),
            valid=state["valid"],
            errors=list(state["errors"]),
            weights={name: float(weight) for name, weight in state["weights"].items()},
            failed_calls=int(state["failed_calls"]),
        )

    @classmethod
    def concat(cls, parts: Sequence[RewardOutput]) -> RewardOutput:
        """The scores of several batches as one (the same components in each); failed calls add up. A batch on
        which the reward functions failed for every sample has no components (their names were never seen): its
        rows are NaN in every component of the others, as they are invalid."""
        if not parts:
            raise ValueError("Cannot concatenate an empty list of reward outputs.")
        scored = [part for part in parts if part.components]
        names = scored[0].components.keys() if scored else {}.keys()
        if any(part.components.keys() != names for part in scored):
            raise ValueError(
                "Reward outputs with different components cannot be concatenated: "
                f"{sorted({tuple(sorted(part.components)) for part in scored})}."
            )
        weights = {name: w for part in parts for name, w in part.weights.items()}
        return cls(
            total=torch.cat([part.total for part in parts]),
            components={name: torch.cat([_scores_of(part, name) for part in parts]) for name in names},
            valid=torch.cat([part.valid for part in parts]),
            errors=[error for part in parts for error in part.errors],
            weights=weights,
            failed_calls=sum(part.failed_calls for part in parts),
        )


def _scores_of(part: RewardOutput, name: str) -> torch.Tensor:
    """Component ``name`` of ``part``, NaN for a batch whose every reward call failed (no components)."""
    if part.components:
        return part.components[name]
    return torch.full_like(part.total, math.nan, dtype=torch.float32)


def check_videos(videos: torch.Tensor, num_prompts: int | None = None) -> None:
    """Raise ``ValueError`` unless ``videos`` is a float ``(B, F, 3, H, W)`` tensor in [0, 1].

    Non-finite pixels are let through on purpose: a diverged rollout must not stop training, its reward comes
    out NaN and `CompositeReward` marks that sample invalid.
    """
    if not isinstance(videos, torch.Tensor) or not videos.is_floating_point():
        kind = f"a {videos.dtype} tensor" if isinstance(videos, torch.Tensor) else type(videos).__name__
        raise ValueError(
            f"videos must be a float tensor (B, F, 3, H, W) in [0, 1], got {kind}; "
            "convert uint8 videos with v.float() / 255."
        )
    if videos.ndim != 5 or videos.shape[2] != 3:
        raise ValueError(
            f"videos must have layout (B, F, 3, H, W), got shape {tuple(videos.shape)}; "
            "permute channels-last or (B, 3, F, H, W) videos first."
        )
    if num_prompts is not None and videos.shape[0] != num_prompts:
        raise ValueError(
            f"Got {videos.shape[0]} videos but {num_prompts} prompts; pass one prompt per video."
        )
    if videos.numel() == 0:
        return
    # One pass over the pixels in the common (all finite) case; the masked copy only for diverged videos.
    low, high = torch.aminmax(videos)
    if not (torch.isfinite(low) and torch.isfinite(high)):
        finite = videos[torch.isfinite(videos)]
        if finite.numel() == 0:
            return
        low, high = finite.min(), finite.max()
    if low < -1e-3 or high > 1 + 1e-3:
        raise ValueError(
            f"video values must lie in [0, 1], got [{low:.3g}, {high:.3g}]; "
            "map [-1, 1] videos with (v + 1) / 2 and uint8 videos with v / 255."
        )


def reward_name(reward_fn: Callable) -> str:
    """The name a reward function's single score is reported under: its ``__name__``, else its class name."""
    return getattr(reward_fn, "__name__", None) or type(reward_fn).__name__


def _as_scores(
    raw: Any, reward_fn: Callable, batch_size: int
) -> tuple[dict[str, torch.Tensor], list[str | None]]:
    """Normalise one function's output to ``({name: (B,) float32 tensor}, per-sample failure)``; raise
    ``ValueError`` on bad shapes. A finite score beyond float32's range becomes NaN, its sample failing with that
    reason (it would otherwise turn into inf without a word)."""
    named = raw if isinstance(raw, Mapping) else {reward_name(reward_fn): raw}
    if not named:
        raise ValueError(f"Reward {reward_name(reward_fn)!r} returned no components; return at least one.")
    scores: dict[str, torch.Tensor] = {}
    failures: list[str | None] = [None] * batch_size
    for name, value in named.items():
        try:
            exact = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)
            exact = exact.detach().cpu().reshape(-1).to(torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"Reward {reward_name(reward_fn)!r} returned {type(value).__name__} for component {name!r}; "
                "return a (B,) tensor, array or list of floats."
            ) from error
        tensor = exact.to(torch.float32)
        if tensor.shape != (batch_size,):
            raise ValueError(
                f"Reward {reward_name(reward_fn)!r} returned {tuple(tensor.shape)} values for component "
                f"{name!r}; expected one score per video ({batch_size})."
            )
        overflow = torch.isfinite(exact) & ~torch.isfinite(tensor)
        for row in overflow.nonzero().flatten().tolist():
            failures[row] = failures[row] or (
                f"reward {reward_name(reward_fn)!r} returned {exact[row].item():g} for component {name!r}, beyond "
                f"float32's range (+-{torch.finfo(torch.float32).max:.3g}) in which rewards are trained; scale it"
            )
        scores[str(name)] = torch.where(overflow, torch.full_like(tensor, math.nan), tensor)
    return scores, failures


def _as_weight(name: str, value: Any) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reward weight {name!r} must be a number, got {value!r}.") from None
    if not math.isfinite(weight):
        raise ValueError(f"reward weight {name!r} must be finite, got {weight}.")
    return weight


def resolve_reward_weights(
    reward_weights: Mapping[str, float] | Sequence[float] | str | None, reward_funcs: Sequence[Callable]
) -> dict[str, float] | list[float]:
    """Validate ``reward_weights``: a preset name, ``{component: weight}``, or one weight per function (TRL).

    ``None`` gives the paper's Setting B for components named ``vq``/``mq``/``ta`` plus 1.0 for every other
    function's own name (the name a single-score function's component gets).
    """
    if reward_weights is None:
        defaults = dict(REWARD_PRESETS["setting_b"])
        for reward_fn in reward_funcs:
            defaults.setdefault(reward_name(reward_fn), 1.0)
        return defaults
    if isinstance(reward_weights, str):
        if reward_weights not in REWARD_PRESETS:
            raise ValueError(
                f"Unknown reward preset {reward_weights!r}; choose one of {', '.join(REWARD_PRESETS)}."
            )
        return dict(REWARD_PRESETS[reward_weights])
    if isinstance(reward_weights, Mapping):
        return {str(name): _as_weight(str(name), value) for name, value in reward_weights.items()}
    weights = [_as_weight(f"#{index}", value) for index, value in enumerate(reward_weights)]
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"Got {len(weights)} reward_weights for {len(reward_funcs)} reward functions; pass one weight per "
            "function (TRL style) or a {component: weight} mapping."
        )
    return weights


@dataclass
class _FunctionScores:
    """What one reward function gave for a batch: its components, per sample why it failed (or None), and
    whether the batch call raised (counted in `RewardOutput.failed_calls`)."""

    scores: dict[str, torch.Tensor]
    failures: list[str | None]
    batch_failed: bool = False


class CompositeReward:
    """Weighted sum of named reward components from one or more reward functions (paper Eq. 33).

    Args:
        reward_funcs: a reward function or a list of them (see the module docstring for the protocol); a name of
            `REWARDS` (``"toy"``, an installed package's reward, ``"package.module:function"``) stands for its reward.
        reward_weights: how components enter the total reward:

            * ``None`` (default): the paper's Setting B for components named ``vq``/``mq``/``ta``
              (0.5 / 0.5 / 1.0) and 1.0 for every single-output function (keyed by its ``__name__``);
              components without a weight are reported only;
            * ``"setting_a"`` / ``"setting_b"``: the paper's presets (every named component must be produced);
            * ``{component: weight}``: explicit weights; components without a weight are reported only;
            * ``[w_1, ..., w_n]``: TRL style, one weight per function; every function must then return a
              single score (a tensor, or a mapping with one entry).

    A component with weight 0 is reported but neither enters the total nor can invalidate a sample. Calling
    the composite returns a `RewardOutput`.
    """

    def __init__(
        self,
        reward_funcs: Callable | str | Sequence[Callable | str],
        reward_weights: Mapping[str, float] | Sequence[float] | str | None = None,
    ) -> None:
        funcs = (
            [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
        )
        funcs = [load_reward(f) if isinstance(f, str) else f for f in funcs]  # a name: `REWARDS`
        if not funcs or not all(callable(f) for f in funcs):
            raise ValueError("reward_funcs must be a callable or a non-empty list of callables.")
        names = [reward_name(f) for f in funcs]
        if len(set(names)) != len(names):
            raise ValueError(f"Reward functions need distinct names, got {names}; set __name__ on each.")
        self.reward_funcs = funcs
        self.reward_weights = resolve_reward_weights(reward_weights, funcs)
        self._weights_are_explicit = reward_weights is not None

    # -- scoring ---------------------------------------------------------------------------------

    def __call__(self, videos: torch.Tensor, prompts: Sequence[str], *, fps: float = 16.0) -> RewardOutput:
        """Score ``videos`` ``(B, F, 3, H, W)`` in [0, 1] for ``prompts`` at frame rate ``fps``; see `RewardOutput`."""
        check_videos(videos, len(prompts))
        results = [self._call_robustly(f, videos, list(prompts), fps) for f in self.reward_funcs]
        components: dict[str, torch.Tensor] = {}
        for result in results:
            overlap = sorted(components.keys() & result.scores.keys())
            if overlap:
                raise ValueError(f"Two reward functions produced the component(s) {overlap}; rename one.")
            components.update(result.scores)
        weights = self._component_weights(results)
        active = {name: weight for name, weight in weights.items() if weight != 0}
        reasons = [_invalid_reason(row, components, active, results) for row in range(videos.shape[0])]
        valid = torch.tensor([reason is None for reason in reasons], dtype=torch.bool)
        total = sum((weight * components[name] for name, weight in active.items()), torch.zeros(len(reasons)))
        total = torch.where(valid, total, torch.full_like(total, math.nan))
        return RewardOutput(
            total=total,
            components=components,
            valid=valid,
            errors=reasons,
            weights=weights,
            failed_calls=sum(result.batch_failed for result in results),
        )

    def _call_robustly(
        self, reward_fn: Callable, videos: torch.Tensor, prompts: list[str], fps: float
    ) -> _FunctionScores:
        """Call on the batch; if that raises, sample by sample, keeping each failing sample's reason.

        Only exceptions raised *by the reward function* are caught: outputs of the wrong shape raise at once,
        they are a bug in the function, not a bad sample.
        """
        batch_size = videos.shape[0]
        try:
            raw = reward_fn(videos, prompts, fps=fps)
        except Exception as error:
            if batch_size == 1:
                return _FunctionScores({}, [_failure(reward_fn, error)], batch_failed=True)
            return self._call_per_sample(reward_fn, videos, prompts, fps)
        return _FunctionScores(*_as_scores(raw, reward_fn, batch_size))

    @staticmethod
    def _call_per_sample(
        reward_fn: Callable, videos: torch.Tensor, prompts: list[str], fps: float
    ) -> _FunctionScores:
        rows: list[dict[str, torch.Tensor] | None] = []
        failures: list[str | None] = []
        for index in range(videos.shape[0]):
            try:
                raw = reward_fn(videos[index : index + 1], prompts[index : index + 1], fps=fps)
            except Exception as error:
                rows.append(None)
                failures.append(_failure(reward_fn, error))
                continue
            scores, failure = _as_scores(raw, reward_fn, 1)
            rows.append(scores)
            failures.append(failure[0])
        succeeded = [row for row in rows if row is not None]
        if not succeeded:  # every sample failed on its own too: no scores, every sample invalid
            return _FunctionScores({}, failures, batch_failed=True)
        names = list(succeeded[0])
        if any(list(row) != names for row in succeeded):
            raise ValueError(
                f"Reward {reward_name(reward_fn)!r} returned different component names for different samples."
            )
        nan = torch.tensor([math.nan])
        scores = {key: torch.cat([row[key] if row is not None else nan for row in rows]) for key in names}
        return _FunctionScores(scores, failures, batch_failed=True)

    def _component_weights(self, results: list[_FunctionScores]) -> dict[str, float]:
        if isinstance(self.reward_weights, list):
            return self._per_function_weights(results)
        produced = {name for result in results for name in result.scores}
        # A function that failed on every sample produced no names: its weights cannot be checked this time.
        complete = all(result.scores for result in results)
        missing = sorted(set(self.reward_weights) - produced)
        if self._weights_are_explicit and missing and complete:
            raise ValueError(
                f"reward_weights names {missing} but the reward functions produced only {sorted(produced)}; "
                "fix the names or drop those weights."
            )
        weights = {name: w for name, w in self.reward_weights.items() if name in produced}
        if not weights and complete:
            raise ValueError(
                f"None of the reward components {sorted(produced)} has a weight in reward_weights "
                f"{self.reward_weights}; name at least one of them."
            )
        return weights

    def _per_function_weights(self, results: list[_FunctionScores]) -> dict[str, float]:
        weights = {}
        for reward_fn, result, weight in zip(self.reward_funcs, results, self.reward_weights):
            if not result.scores:
                continue  # failed on every sample: its samples are invalid anyway
            if len(result.scores) != 1:
                raise ValueError(
                    f"Reward {reward_name(reward_fn)!r} returns several components {sorted(result.scores)}; "
                    "give reward_weights as a {component: weight} mapping instead of a list."
                )
            weights[next(iter(result.scores))] = weight
        return weights


def _failure(reward_fn: Callable, error: Exception) -> str:
    return f"reward {reward_name(reward_fn)!r} raised {type(error).__name__}: {error}"


def _invalid_reason(
    row: int, components: dict[str, torch.Tensor], weights: dict[str, float], results: list[_FunctionScores]
) -> str | None:
    """Why sample ``row`` is invalid (a reward function failed on it, or a weighted component is NaN/inf), or
    None when it is valid. A function's failure on a sample only counts when it feeds the total: when it has a
    weighted component, or produced no components at all (its weights cannot be known)."""
    reasons: list[str] = []
    for result in results:
        feeds_total = not result.scores or any(name in weights for name in result.scores)
        failure = result.failures[row]
        if failure is not None and feeds_total and failure not in reasons:
            reasons.append(failure)
    for name in weights:
        value = components[name][row].item()
        owner = next(result for result in results if name in result.scores)
        if not math.isfinite(value) and owner.failures[row] is None:  # a raise is already the reason
            reasons.append(f"component {name!r} is {value}")
    return "; ".join(reasons) if reasons else None


def as_composite_reward(reward: Callable | Sequence[Callable] | CompositeReward) -> CompositeReward:
    """Wrap a reward function (or list of them) in a `CompositeReward` with default weights."""
    return reward if isinstance(reward, CompositeReward) else CompositeReward(reward)


def _as_reward_factory(loaded: Any, name: str) -> Callable[[], Callable]:
    """What a ``sage_grpo.rewards`` entry point loads (a reward class, built with no arguments, or a reward
    function), as a factory of reward functions: a class gives a fresh instance per use."""
    if isinstance(loaded, type):
        return loaded
    if callable(loaded):
        return lambda: loaded
    raise TypeError(f"a reward entry point must load a reward class or function, got {type(loaded).__name__}")


REWARDS = PluginGroup("reward", GROUPS["rewards"], _as_reward_factory)
"""Every reward by name: the built-ins (``toy``, ``toy_hackable``), an installed package's (entry-point group
``sage_grpo.rewards``), or ``"package.module:function"``."""


def load_reward(name: str) -> Callable:
    """The reward function ``name`` names (see `REWARDS`); a class is instantiated with no arguments."""
    return REWARDS.load(name)()
