"""The math of GRPO-style policy optimisation over denoising steps, shared by every agent and the trainer.

Paper references are to "Manifold-Aware Exploration for Reinforcement Learning in Video Generation"
(arXiv 2603.21872): group-normalised advantages (Eq. 10, App. A.4), the clipped ratio policy loss with the
temporal gradient equalizer (Eq. 9, Eq. 43), the position and velocity KL terms of the dual trust region
(Eq. 11-15, Eq. 40) and the adaptive KL coefficient (App. A.6, Eq. 41-42).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Literal

import torch

from sage_env import sde

__all__ = [
    "SCALE_REWARDS",
    "AdaptiveKLController",
    "PerPromptStatTracker",
    "clipped_policy_loss",
    "equalizer_matrix",
    "group_advantages",
    "normalized_log_ratio",
    "position_kl",
    "select_timesteps",
    "stepwise_kl",
]

SCALE_REWARDS = ("group", "batch", "none")
"""How advantages are scaled (TRL's ``scale_rewards``): by the group's std, the batch's std, or not at all."""

_ZERO_SPREAD = 1e-8


def _validate_group_inputs(rewards: torch.Tensor, group_index: torch.Tensor, valid: torch.Tensor) -> None:
    if rewards.ndim != 1 or group_index.shape != rewards.shape or valid.shape != rewards.shape:
        raise ValueError(
            f"rewards, group_index and valid must all have shape (N,), got {tuple(rewards.shape)}, "
            f"{tuple(group_index.shape)}, {tuple(valid.shape)}."
        )
    if bool((valid & ~torch.isfinite(rewards)).any()):
        raise ValueError("A sample marked valid has a NaN/inf reward; mark it invalid (valid=False) instead.")


def group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    valid: torch.Tensor | None = None,
    scale_rewards: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised advantages ``A_i = (r_i - mean_G) / (std_G + eps)`` (Eq. 10, population std).

    Invalid samples are excluded from their group's statistics. A group left with fewer than 2 valid
    samples, or whose valid rewards have zero spread, contributes no gradient: its advantages are 0 and
    ``usable`` is False (never NaN, never a division by ~0).

    Args:
        rewards: ``(N,)`` rewards (NaN allowed where invalid).
        group_index: ``(N,)`` group id of each sample.
        valid: ``(N,)`` bool; all True when None.
        scale_rewards: ``"group"`` (Eq. 10), ``"batch"`` (divide by the std of all valid rewards) or ``"none"``.
        eps: the stabiliser of Eq. 10.

    Returns:
        ``(advantages, usable)``, both ``(N,)``; ``advantages`` is float32.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}.")
    rewards = rewards.detach().float()
    valid = torch.isfinite(rewards) if valid is None else valid.bool() & torch.isfinite(rewards)
    _validate_group_inputs(rewards, group_index, valid)
    advantages = torch.zeros_like(rewards)
    usable = torch.zeros_like(valid)
    batch_std = rewards[valid].std(unbiased=False) if valid.sum() > 1 else torch.tensor(0.0)
    for group in torch.unique(group_index):
        members = (group_index == group) & valid
        if members.sum() < 2:
            continue
        group_rewards = rewards[members]
        group_std = group_rewards.std(unbiased=False)
        if group_std < _ZERO_SPREAD:
            continue
        centred = group_rewards - group_rewards.mean()
        scale = {"group": group_std + eps, "batch": batch_std + eps, "none": torch.tensor(1.0)}[scale_rewards]
        advantages[members] = centred / scale
        usable[members] = True
    return advantages, usable


class PerPromptStatTracker:
    """DDPO's per-prompt reward statistics: normalise each reward by the recent history of its prompt.

    Each prompt keeps its last ``buffer_size`` valid rewards; with fewer than ``min_count`` the statistics of
    the whole current batch are used instead (Black et al., 2023, "Training Diffusion Models with RL").
    """

    def __init__(self, buffer_size: int = 16, min_count: int = 16, eps: float = 1e-6) -> None:
        if buffer_size < 1 or min_count < 1:
            raise ValueError("buffer_size and min_count must be >= 1.")
        self.buffer_size, self.min_count, self.eps = buffer_size, min_count, eps
        self.history: dict[str, deque[float]] = {}

    def advantages(
        self, prompts: Sequence[str], rewards: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update the history with this batch and return ``(advantages, usable)``."""
        rewards = rewards.detach().float()
        valid = valid.bool() & torch.isfinite(rewards)
        for prompt, reward, ok in zip(prompts, rewards.tolist(), valid.tolist()):
            if ok:
                self.history.setdefault(prompt, deque(maxlen=self.buffer_size)).append(reward)
        batch = rewards[valid]
        advantages = torch.zeros_like(rewards)
        for index, (prompt, ok) in enumerate(zip(prompts, valid.tolist())):
            if not ok:
                continue
            history = torch.tensor(list(self.history[prompt]))
            reference = history if len(history) >= self.min_count else batch
            std = reference.std(unbiased=False) if len(reference) > 1 else torch.tensor(0.0)
            advantages[index] = (
                (rewards[index] - reference.mean()) / (std + self.eps) if std > _ZERO_SPREAD else 0.0
            )
        return advantages, valid & (advantages != 0)

    def state_dict(self) -> dict[str, list[float]]:
        """History per prompt, for checkpoints."""
        return {prompt: list(values) for prompt, values in self.history.items()}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        """Restore `state_dict`."""
        self.history = {p: deque(v, maxlen=self.buffer_size) for p, v in state.items()}


def equalizer_matrix(
    sigmas: torch.Tensor,
    sde_types: Sequence[str],
    eta: float,
    enabled: bool = True,
    eps: float = 1e-8,
    median: str = "lower",
    experts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Equalizer weights ``S_t`` (Eq. 9) for every sample and step: ``(N, T)``, 0 at deterministic steps.

    ``N_t = |d mean / d v| / std_t`` is analytic per SDE (App. A.5); the median (``"lower"``: the official
    code's ``torch.median``) runs over each trajectory's stochastic steps. With ``enabled=False`` every
    stochastic step weighs 1.

    ``experts`` (``(N, T)`` long, `VideoBackbone.expert_of` of each step's sigma): with several experts (Wan 2.2
    A14B) the median runs over each expert's own stochastic steps. The paper's aim (Sec. 4.2) is that every step
    a network is trained on pulls with the same strength; each expert is its own network, so its steps are
    equalized among themselves, and one median over both would scale one expert's whole update up and the
    other's down (its steps' ``N_t`` lie on one side of the joint median). One expert: the same as ``None``.
    """
    sigma, sigma_next = sigmas[:, :-1].float(), sigmas[:, 1:].float()
    scales = torch.stack(
        [
            sde.gradient_scale(sde_type, sigma[:, t], sigma_next[:, t], eta)
            for t, sde_type in enumerate(sde_types)
        ],
        dim=1,
    )
    if not enabled:
        return torch.isfinite(scales).float()
    if experts is None:
        return sde.equalizer_weights(scales, eps=eps, median=median)
    experts = experts.to(scales.device)
    weights = torch.zeros_like(scales)
    for expert in experts.unique().tolist():
        mine = experts == expert
        # Steps of the other experts count as deterministic for this expert's median.
        own = sde.equalizer_weights(torch.where(mine, scales, torch.inf), eps=eps, median=median)
        weights = torch.where(mine, own, weights)
    return weights


def select_timesteps(
    trainable: torch.Tensor,
    fraction: float = 1.0,
    generator: torch.Generator | None = None,
    permute: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the (sample, step) pairs to train on.

    Each sample keeps ``ceil(fraction * n)`` of its ``n`` stochastic steps, in a random per-sample order when
    ``permute`` (the official "timestep permutation"); deterministic steps are never picked.

    Returns:
        ``(sample_index, step_index)``, each ``(M,)`` long.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"timestep_fraction must lie in (0, 1], got {fraction}.")
    samples, steps = [], []
    for row in range(trainable.shape[0]):
        candidates = torch.nonzero(trainable[row].cpu()).flatten()
        if permute and len(candidates) > 1:
            candidates = candidates[torch.randperm(len(candidates), generator=generator)]
        keep = candidates[: math.ceil(fraction * len(candidates))]
        samples.append(torch.full_like(keep, row))
        steps.append(keep)
    return torch.cat(samples), torch.cat(steps)


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    epsilon: float | None,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair PPO-clip surrogate weighted by the equalizer (Eq. 43 in its clipped-ratio form).

    ``loss = S_t * max(-A * r, -A * clip(r, 1 - epsilon, 1 + epsilon_high))`` with ``r = exp(log_prob -
    old_log_prob)``. ``epsilon=None`` disables clipping (plain policy gradient: at ``r = 1`` the gradient is
    ``-A * S_t * grad log_prob``).

    Returns:
        ``(per_pair_loss (M,), stats)`` with ``ratio`` and the boolean ``clipped`` mask.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    if epsilon is None:
        return unclipped * weights, {
            "ratio": ratio.detach(),
            "clipped": torch.zeros_like(ratio, dtype=torch.bool),
        }
    high = epsilon if epsilon_high is None else epsilon_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - epsilon, 1.0 + high)
    per_pair = torch.maximum(unclipped, clipped) * weights
    return per_pair, {"ratio": ratio.detach(), "clipped": (clipped > unclipped).detach()}


def normalized_log_ratio(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    """GRPO-Guard's log-ratio (arXiv 2510.22319, RatioNorm): ``std x (log p - log p_old + mean_d (mu - mu_old)^2 /
    (2 std^2))`` per transition.

    With ``x' = mu_old + std eps``, ``log p - log p_old = mean_d(eps (mu - mu_old)) / std - mean_d (mu - mu_old)^2 /
    (2 std^2)``: the second term always shifts the ratio below 1, the more so at low-noise steps. Adding it back
    and scaling by ``std`` leaves ``mean_d(eps (mu - mu_old))``, centred at 0 with a spread that does not depend on
    the step's noise level. ``std`` is the transition's (``eta sqrt(-dt)`` times the SDE's scale), ``(M,)``.
    """
    dims = tuple(range(1, mean.ndim))
    bias = (mean - old_mean).pow(2).mean(dims) / (2 * std.pow(2))
    return std * (log_prob - old_log_prob + bias)


def position_kl(mean: torch.Tensor, reference_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(mu_theta - mu_ref)^2 / (2 std^2)``, averaged over non-batch dimensions (Eq. 11 / 13): ``(M,)``.

    The KL between two Gaussians of equal variance; like the log-probabilities it is averaged per element.
    """
    dims = tuple(range(1, mean.ndim))
    squared = (mean.float() - reference_mean.float()) ** 2
    safe_std = torch.where(std > 0, std, torch.ones_like(std)).float()
    return squared.mean(dim=dims) / (2.0 * safe_std**2)


def stepwise_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """Eq. 15: ``log pi_{k-1}(x' | x) - log pi_theta(x' | x)`` on rollout samples of the previous policy."""
    return old_log_prob - log_prob


class AdaptiveKLController:
    """The KL coefficient ``lambda_KL`` of App. A.6: linear warm-up, then proportional feedback.

    * Warm-up (Eq. 41): ``lambda(k) = lambda_min + (lambda_max - lambda_min) * k / K`` for optimizer steps
      ``k <= K``.
    * Feedback (Eq. 42): with ``D`` the mean of the last ``H`` observed KL values, multiply by 0.9 when
      ``D > 1.5 * target`` and by 1.1 when ``D < 0.5 * target``, clipped to ``[lambda_min, lambda_max]``.
      As in the paper the coefficient is *lowered* when KL is too high (the trust region is relaxed).

    Counts optimizer steps (the paper), not inner calls. ``adaptive=False`` keeps ``lambda_max`` throughout.
    """

    def __init__(
        self,
        coef_min: float = 1e-7,
        coef_max: float = 1e-5,
        warmup_steps: int = 100,
        target: float = 1e-5,
        history: int = 10,
        adaptive: bool = True,
    ) -> None:
        if not 0 <= coef_min <= coef_max:
            raise ValueError(f"Need 0 <= kl coef_min <= coef_max, got {coef_min} and {coef_max}.")
        if warmup_steps < 0 or history < 1 or target <= 0:
            raise ValueError("warmup_steps must be >= 0, history >= 1 and target > 0.")
        self.coef_min, self.coef_max, self.warmup_steps = coef_min, coef_max, warmup_steps
        self.target, self.history_size, self.adaptive = target, history, adaptive
        self.step = 0
        self.history: deque[float] = deque(maxlen=history)
        self.coef = coef_min if adaptive else coef_max

    def observe(self, kl_value: float) -> float:
        """Record the KL of one optimizer step and return the coefficient for the next one."""
        self.step += 1
        if math.isfinite(kl_value):
            self.history.append(float(kl_value))
        if not self.adaptive:
            return self.coef
        if self.step <= self.warmup_steps:
            self.coef = self.coef_min + (self.coef_max - self.coef_min) * self.step / self.warmup_steps
        elif self.history:
            mean_kl = sum(self.history) / len(self.history)
            if mean_kl > 1.5 * self.target:
                self.coef *= 0.9
            elif mean_kl < 0.5 * self.target:
                self.coef *= 1.1
            self.coef = min(max(self.coef, self.coef_min), self.coef_max)
        return self.coef

    def state_dict(self) -> dict[str, object]:
        """Everything needed to resume the schedule exactly."""
        return {"step": self.step, "coef": self.coef, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore `state_dict`."""
        self.step, self.coef = int(state["step"]), float(state["coef"])
        self.history = deque(state["history"], maxlen=self.history_size)
