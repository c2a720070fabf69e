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
group's advantage. When a reward function fails for every sample of the batch the original error is
raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "REWARD_PRESETS",
    "CompositeReward",
    "RewardFunction",
    "RewardOutput",
    "as_composite_reward",
    "check_videos",
    "resolve_reward_weights",
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
        valid: ``(B,)`` bool, False where any weighted component failed (raised, NaN or inf).
        errors: one entry per sample: None when valid, else the reason.
        weights: the weight of each component that enters ``total``.
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor]
    valid: torch.Tensor
    errors: list[str | None]
    weights: dict[str, float] = field(default_factory=dict)

    @property
    def num_invalid(self) -> int:
        """Number of invalid samples."""
        return int((~self.valid).sum())


def check_videos(videos: torch.Tensor, num_prompts: int | None = None) -> None:
    """Raise ``ValueError`` unless ``videos`` is a finite float ``(B, F, 3, H, W)`` tensor in [0, 1]."""
    if not isinstance(videos, torch.Tensor) or not videos.is_floating_point():
        raise ValueError(
            f"videos must be a float tensor (B, F, 3, H, W) in [0, 1], got {type(videos).__name__}."
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
    if videos.numel() and (videos.min() < -1e-3 or videos.max() > 1 + 1e-3):
        raise ValueError(
            f"video values must lie in [0, 1], got [{videos.min():.3g}, {videos.max():.3g}]; "
            "map [-1, 1] videos with (v + 1) / 2 and uint8 videos with v / 255."
        )


def _function_name(reward_fn: Callable) -> str:
    return getattr(reward_fn, "__name__", None) or type(reward_fn).__name__


def _as_scores(raw: Any, reward_fn: Callable, batch_size: int) -> dict[str, torch.Tensor]:
    """Normalise one function's output to ``{name: (B,) float32 tensor}``."""
    named = raw if isinstance(raw, Mapping) else {_function_name(reward_fn): raw}
    scores = {}
    for name, value in named.items():
        tensor = torch.as_tensor(value, dtype=torch.float32).detach().cpu().reshape(-1)
        if tensor.shape != (batch_size,):
            raise ValueError(
                f"Reward {_function_name(reward_fn)!r} returned {tuple(tensor.shape)} values for component "
                f"{name!r}; expected one score per video ({batch_size})."
            )
        scores[str(name)] = tensor
    return scores


def resolve_reward_weights(
    reward_weights: Mapping[str, float] | Sequence[float] | str | None, reward_funcs: Sequence[Callable]
) -> dict[str, float] | list[float]:
    """Validate ``reward_weights``: a preset name, ``{component: weight}``, or one weight per function (TRL)."""
    if reward_weights is None:
        defaults = dict(REWARD_PRESETS["setting_b"])
        defaults.update({_function_name(f): 1.0 for f in reward_funcs})
        return defaults
    if isinstance(reward_weights, str):
        if reward_weights not in REWARD_PRESETS:
            raise ValueError(
                f"Unknown reward preset {reward_weights!r}; choose one of {', '.join(REWARD_PRESETS)}."
            )
        return dict(REWARD_PRESETS[reward_weights])
    if isinstance(reward_weights, Mapping):
        weights = {str(k): float(v) for k, v in reward_weights.items()}
    else:
        weights = [float(v) for v in reward_weights]
        if len(weights) != len(reward_funcs):
            raise ValueError(
                f"Got {len(weights)} reward_weights for {len(reward_funcs)} reward functions; pass one weight per "
                "function (TRL style) or a {component: weight} mapping."
            )
    values = weights.values() if isinstance(weights, dict) else weights
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"reward_weights must be finite numbers, got {reward_weights!r}.")
    return weights


class CompositeReward:
    """Weighted sum of named reward components from one or more reward functions (paper Eq. 33).

    Args:
        reward_funcs: a reward function or a list of them (see the module docstring for the protocol).
        reward_weights: how components enter the total reward:

            * ``None`` (default): the paper's Setting B for components named ``vq``/``mq``/``ta``
              (0.5 / 0.5 / 1.0) and 1.0 for every single-output function (keyed by its ``__name__``);
            * ``"setting_a"`` / ``"setting_b"``: the paper's presets;
            * ``{component: weight}``: explicit weights; components without a weight are reported only;
            * ``[w_1, ..., w_n]``: TRL style, one weight per function; every function must then return a
              single score (a tensor, not a mapping).

    Calling the composite returns a `RewardOutput`.
    """

    def __init__(
        self,
        reward_funcs: Callable | Sequence[Callable],
        reward_weights: Mapping[str, float] | Sequence[float] | str | None = None,
    ) -> None:
        funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
        if not funcs or not all(callable(f) for f in funcs):
            raise ValueError("reward_funcs must be a callable or a non-empty list of callables.")
        names = [_function_name(f) for f in funcs]
        if len(set(names)) != len(names):
            raise ValueError(f"Reward functions need distinct names, got {names}; set __name__ on each.")
        self.reward_funcs = funcs
        self.reward_weights = resolve_reward_weights(reward_weights, funcs)
        self._weights_are_explicit = reward_weights is not None

    # -- scoring ---------------------------------------------------------------------------------

    def __call__(self, videos: torch.Tensor, prompts: Sequence[str], *, fps: float = 16.0) -> RewardOutput:
        """Score ``videos`` for ``prompts``; see `RewardOutput`."""
        check_videos(videos, len(prompts))
        batch_size = videos.shape[0]
        components: dict[str, torch.Tensor] = {}
        errors: list[list[str]] = [[] for _ in range(batch_size)]
        function_totals = []
        for reward_fn in self.reward_funcs:
            scores = self._call_robustly(reward_fn, videos, prompts, fps, errors)
            overlap = components.keys() & scores.keys()
            if overlap:
                raise ValueError(
                    f"Two reward functions produced the component(s) {sorted(overlap)}; rename one."
                )
            components.update(scores)
            function_totals.append(scores)
        weights = self._component_weights(function_totals)
        total = sum(weight * components[name] for name, weight in weights.items())
        for name in weights:
            for row in torch.nonzero(~torch.isfinite(components[name])).flatten().tolist():
                if not errors[row]:
                    errors[row].append(f"component {name!r} is {components[name][row].item()}")
        valid = torch.tensor([not e for e in errors], dtype=torch.bool)
        total = torch.where(valid, total, torch.full_like(total, math.nan))
        reasons = ["; ".join(e) if e else None for e in errors]
        return RewardOutput(total=total, components=components, valid=valid, errors=reasons, weights=weights)

    def _call_robustly(
        self,
        reward_fn: Callable,
        videos: torch.Tensor,
        prompts: Sequence[str],
        fps: float,
        errors: list[list[str]],
    ) -> dict[str, torch.Tensor]:
        """Call on the batch; if that raises, sample by sample, marking failing samples invalid."""
        name = _function_name(reward_fn)
        try:
            return _as_scores(reward_fn(videos, list(prompts), fps=fps), reward_fn, videos.shape[0])
        except Exception as batch_error:
            rows: list[dict[str, torch.Tensor] | None] = []
            for index in range(videos.shape[0]):
                try:
                    rows.append(
                        _as_scores(
                            reward_fn(videos[index : index + 1], [prompts[index]], fps=fps), reward_fn, 1
                        )
                    )
                except Exception as error:
                    errors[index].append(f"reward {name!r} raised {type(error).__name__}: {error}")
                    rows.append(None)
            succeeded = [row for row in rows if row is not None]
            if not succeeded:
                raise batch_error
            template = succeeded[0]
            return {
                component: torch.cat(
                    [row[component] if row is not None else torch.tensor([math.nan]) for row in rows]
                )
                for component in template
            }

    def _component_weights(self, function_scores: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        if isinstance(self.reward_weights, list):
            weights = {}
            for reward_fn, scores, weight in zip(self.reward_funcs, function_scores, self.reward_weights):
                if len(scores) != 1:
                    raise ValueError(
                        f"Reward {_function_name(reward_fn)!r} returns several components {sorted(scores)}; "
                        "give reward_weights as a {component: weight} mapping instead of a list."
                    )
                weights[next(iter(scores))] = weight
            return weights
        produced = {name for scores in function_scores for name in scores}
        missing = sorted(set(self.reward_weights) - produced)
        if self._weights_are_explicit and missing:
            raise ValueError(
                f"reward_weights names {missing} but the reward functions produced only {sorted(produced)}; "
                "fix the names or drop those weights."
            )
        weights = {name: w for name, w in self.reward_weights.items() if name in produced}
        if not weights:
            raise ValueError(
                f"None of the reward components {sorted(produced)} has a weight in reward_weights "
                f"{self.reward_weights}; name at least one of them."
            )
        return weights


def as_composite_reward(reward: Callable | Sequence[Callable] | CompositeReward) -> CompositeReward:
    """Wrap a reward function (or list of them) in a `CompositeReward` with default weights."""
    return reward if isinstance(reward, CompositeReward) else CompositeReward(reward)
