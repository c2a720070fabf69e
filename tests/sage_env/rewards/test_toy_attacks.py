"""The toy reward cannot be gamed: what scores as high as the world's own videos is the world's own videos.

Checked adversarially against the gold score (`sage_env.toy.gold`, the distance to the world's videos, which no
reward can fool): off-world families of videos (larger, smaller, blurred, misshapen, flickering, off-palette,
darkened background, out-of-range start) each score clearly below a clean render; and gradient ascent on the
pixels, from clean renders, from those off-world videos and from the prior's samples, finds nothing that scores
within `NEAR_OPTIMAL` of a clean render while lying farther than `WORLD_BOUND` from the world. The reward that
shipped as ``toy`` before (`HackableToyReward`) fails both checks: a larger object scores exactly as high as the
world's, which is how RL learned to draw objects up to three times too large.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from sage_env.rewards.toy import HackableToyReward, ToyReward
from sage_env.toy.gold import distance_to_world
from sage_env.toy.world import BACKGROUND_LEVEL, TOY_EVAL_PROMPTS, render_videos

PROMPTS = list(TOY_EVAL_PROMPTS[:4])  # two squares and two circles, every direction, four colours
SEEDS = [7] * len(PROMPTS)
NEAR_OPTIMAL = 0.02
"""Setting B totals (at most 2) this close to a clean render's count as "as high as the world"."""
WORLD_BOUND = 0.03
"""RMS pixel distance to the world within which a video counts as the world's (the prior's samples: ~0.10)."""
ASCENT_STEPS = 150


def total(
    reward: ToyReward, videos: torch.Tensor, differentiable: bool = False, prompts: list[str] | None = None
) -> torch.Tensor:
    """The Setting B total the trainer optimises: 0.5 vq + 0.5 mq + ta."""
    details = reward.evaluate(videos, prompts or PROMPTS, differentiable=differentiable)
    return 0.5 * details.vq + 0.5 * details.mq + details.ta


def _object(videos: torch.Tensor) -> torch.Tensor:
    return (videos - BACKGROUND_LEVEL).abs().amax(dim=2, keepdim=True) > 0.3


def _colour(videos: torch.Tensor) -> torch.Tensor:
    """``(B, 1, 3, 1, 1)`` the colour of each video's object (its pixels' mean)."""
    mask = _object(videos).float()
    return ((videos * mask).sum(dim=(1, 3, 4)) / mask.sum(dim=(1, 3, 4)))[:, None, :, None, None]


def larger(videos: torch.Tensor) -> torch.Tensor:
    """The object grown by one pixel on every side, in its own colour: a 6-pixel object where the world draws 4."""
    mask = _object(videos).float().flatten(0, 1)
    dilated = torch.nn.functional.max_pool2d(mask, 3, stride=1, padding=1).view(
        *videos.shape[:2], 1, *videos.shape[3:]
    )
    return torch.where(dilated > 0, _colour(videos).expand_as(videos), videos)


def smaller(videos: torch.Tensor) -> torch.Tensor:
    """The object's border pixels turned into background."""
    inside = -torch.nn.functional.max_pool2d(-_object(videos).float().flatten(0, 1), 3, 1, 1)
    inside = inside.view(*videos.shape[:2], 1, *videos.shape[3:]) > 0
    return torch.where(_object(videos) & ~inside, torch.full_like(videos, BACKGROUND_LEVEL), videos)


def blurred(videos: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.avg_pool2d(videos.flatten(0, 1), 3, 1, 1, count_include_pad=False).view_as(
        videos
    )


def misshapen(videos: torch.Tensor) -> torch.Tensor:
    """The object squeezed into a bar: its top rows removed, its colour smeared sideways."""
    bar = torch.roll(videos, 2, dims=-1).maximum(torch.roll(videos, -2, dims=-1))
    return torch.where(
        _object(bar) & ~_object(torch.roll(videos, 2, dims=-2)),
        bar,
        torch.full_like(videos, BACKGROUND_LEVEL),
    )


def flickering(videos: torch.Tensor) -> torch.Tensor:
    out = videos.clone()
    out[:, 1::2] = torch.where(
        _object(videos[:, 1::2]), torch.full_like(videos[:, 1::2], BACKGROUND_LEVEL), videos[:, 1::2]
    )
    return out


def off_palette(videos: torch.Tensor) -> torch.Tensor:
    return torch.where(_object(videos), 0.5 * videos + 0.5 * BACKGROUND_LEVEL + 0.15, videos)


def darker_background(videos: torch.Tensor) -> torch.Tensor:
    return torch.where(_object(videos), videos, videos - 0.1)


def out_of_range(videos: torch.Tensor) -> torch.Tensor:
    """The whole track moved 3 pixels down and right of every start the world draws."""
    return torch.roll(videos, shifts=(3, 3), dims=(-2, -1))


OFF_WORLD: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "larger": larger,
    "smaller": smaller,
    "blurred": blurred,
    "misshapen": misshapen,
    "flickering": flickering,
    "off_palette": off_palette,
    "darker_background": darker_background,
    "out_of_range": out_of_range,
}


@pytest.fixture(scope="module")
def clean() -> torch.Tensor:
    return render_videos(PROMPTS, SEEDS)


@pytest.fixture(scope="module")
def prior_samples() -> torch.Tensor:
    from sage_env.backbones import load_backbone
    from sage_env.env import sample_videos

    return sample_videos(load_backbone("toy"), PROMPTS, [100 + i for i in range(len(PROMPTS))])


def test_the_families_are_off_the_world(clean: torch.Tensor) -> None:
    for name, make in OFF_WORLD.items():
        assert (distance_to_world(make(clean).clamp(0, 1), PROMPTS) > WORLD_BOUND).all(), name


def off_world_scores(reward: ToyReward, clean: torch.Tensor) -> dict[str, float]:
    """Each family's worst margin below the clean renders' total (positive: every video scores lower)."""
    best = total(reward, clean)
    return {
        name: float((best - total(reward, make(clean).clamp(0, 1))).min()) for name, make in OFF_WORLD.items()
    }


def test_every_off_world_family_scores_below_the_world(clean: torch.Tensor) -> None:
    margins = off_world_scores(ToyReward(), clean)
    assert all(margin > NEAR_OPTIMAL for margin in margins.values()), margins


def test_the_hackable_reward_scores_a_larger_object_as_high_as_the_world(clean: torch.Tensor) -> None:
    margins = off_world_scores(HackableToyReward(), clean)
    assert margins["larger"] < NEAR_OPTIMAL and margins["darker_background"] < NEAR_OPTIMAL, margins


def ascend(reward: ToyReward, start: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Projected gradient ascent on the pixels (Adam, kept in [0, 1]) of the Setting B total."""
    pixels = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([pixels], lr=0.01)
    for _ in range(ASCENT_STEPS):
        optimizer.zero_grad()
        (-total(reward, pixels, differentiable=True, prompts=prompts).sum()).backward()
        optimizer.step()
        with torch.no_grad():
            pixels.clamp_(0, 1)
    return pixels.detach()


def near_optimal_but_off_world(reward: ToyReward, clean: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Distances to the world of the ascended videos that score within `NEAR_OPTIMAL` of the world's best."""
    copies = len(starts) // len(PROMPTS)
    ascended = ascend(reward, starts, PROMPTS * copies)
    scores = total(reward, ascended, prompts=PROMPTS * copies)
    best = total(reward, clean).repeat(copies)
    assert (scores <= best + 1e-3).all()  # nothing outscores the world
    distances = distance_to_world(ascended, PROMPTS * copies)
    return distances[scores >= best - NEAR_OPTIMAL]


@pytest.fixture(scope="module")
def starts(clean: torch.Tensor, prior_samples: torch.Tensor) -> torch.Tensor:
    """Clean renders, every off-world family and the prior's samples, `PROMPTS` each."""
    return torch.cat([clean, *(make(clean).clamp(0, 1) for make in OFF_WORLD.values()), prior_samples])


@pytest.mark.slow
def test_gradient_ascent_finds_nothing_off_the_world_that_scores_as_high(clean, starts) -> None:
    distances = near_optimal_but_off_world(ToyReward(), clean, starts)
    assert len(distances) >= len(PROMPTS)  # the clean renders stay where they are
    assert (distances <= WORLD_BOUND).all(), distances


@pytest.mark.slow
def test_gradient_ascent_games_the_hackable_reward(clean, starts) -> None:
    distances = near_optimal_but_off_world(HackableToyReward(), clean, starts)
    assert (distances > WORLD_BOUND).any(), distances
