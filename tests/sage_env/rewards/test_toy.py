"""The toy reward's heads on hand-made videos rendered by the toy world, and its protocol behaviour."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sage_env.rewards import CompositeReward
from sage_env.rewards.toy import HackableToyReward, ToyReward, ToyRewardDetails, toy_overall_score
from sage_env.toy.world import BACKGROUND_LEVEL, TOY_COLOURS, TOY_PROMPTS, render_videos

PROMPTS = list(TOY_PROMPTS[::4])  # 8 prompts covering every colour and direction
SEEDS = list(range(len(PROMPTS)))
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
OTHER_COLOUR = {"red": "green", "green": "blue", "blue": "yellow", "yellow": "red"}


@pytest.fixture
def clean() -> torch.Tensor:
    return render_videos(PROMPTS, SEEDS)


def with_noise(videos: torch.Tensor, std: float, seed: int = 0) -> torch.Tensor:
    noise = torch.randn(videos.shape, generator=torch.Generator().manual_seed(seed))
    return (videos + std * noise).clamp(0, 1)


def replace_word(prompt: str, mapping: dict[str, str]) -> str:
    return " ".join(mapping.get(word, word) for word in prompt.split())


def means(scores: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: value.mean().item() for name, value in scores.items()}


# -- the three heads on clean and damaged videos ----------------------------------------------------


def test_clean_rendered_videos_score_one_on_every_head(clean):
    scores = ToyReward()(clean, PROMPTS)
    assert set(scores) == {"vq", "mq", "ta"}
    for name in ("vq", "mq"):
        torch.testing.assert_close(scores[name], torch.ones(len(PROMPTS)))
    assert (scores["ta"] > 0.998).all()


def test_direction_probability_matches_a_softmax_over_displacements(clean):
    # A clean object moves exactly 7 px along the prompted direction: logits 7, 0, 0, -7 (temperature 1 px).
    details = ToyReward().evaluate(clean, PROMPTS)
    expected = math.exp(7) / (math.exp(7) + 2 + math.exp(-7))
    torch.testing.assert_close(details.direction_probability, torch.full((len(PROMPTS),), expected))
    torch.testing.assert_close(details.colour_probability, torch.ones(len(PROMPTS)))


def test_wrong_colour_in_the_prompt_loses_the_colour_half_of_text_alignment(clean):
    wrong = [replace_word(p, OTHER_COLOUR) for p in PROMPTS]
    right, details = ToyReward()(clean, PROMPTS), ToyReward().evaluate(clean, wrong)
    assert not details.colour_correct.any() and details.direction_correct.all()
    assert (details.colour_probability < 1e-6).all()
    torch.testing.assert_close(details.ta, right["ta"] - 0.5, atol=1e-6, rtol=0)  # colour term 1 -> 0
    torch.testing.assert_close(details.vq, right["vq"])
    torch.testing.assert_close(details.mq, right["mq"])


def test_opposite_direction_in_the_prompt_halves_text_alignment_only(clean):
    wrong = [replace_word(p, OPPOSITE) for p in PROMPTS]
    details = ToyReward().evaluate(clean, wrong)
    assert details.colour_correct.all() and not details.direction_correct.any()
    assert (details.direction_probability < 1e-5).all()
    assert (details.ta - 0.5).abs().max() < 1e-4
    assert (details.vq == 1).all()
    for term in (details.smooth_track, details.persistent_object, details.steady_speed):
        assert (term == 1).all()
    # The world starts an object on the side it moves away from: a left-moving video starts where no right-moving
    # one does.
    assert (details.start_in_range < 1).all()


def test_colour_is_read_from_the_pixels():
    videos = render_videos(["a blue square moving up"], [0])
    scores = {
        colour: ToyReward()(videos, [f"a {colour} square moving up"])["ta"].item() for colour in TOY_COLOURS
    }
    assert max(scores, key=scores.get) == "blue"


def test_jittery_motion_lowers_motion_quality_only(clean):
    back_and_forth = clean[:, [0, 2, 1, 3, 5, 4, 6, 7]]
    stutter = clean[:, [0, 0, 2, 2, 4, 4, 6, 6]]
    reward = ToyReward()
    smooth = means(reward(clean, PROMPTS))
    for jittery in (back_and_forth, stutter):
        scores = means(reward(jittery, PROMPTS))
        assert scores["mq"] < smooth["mq"] - 0.3
        assert scores["vq"] == pytest.approx(smooth["vq"])
        assert scores["ta"] > 0.95  # the object still travels in the prompted direction


def test_a_static_object_gets_neither_motion_quality_nor_direction(clean):
    static = clean[:, :1].expand_as(clean)
    details = ToyReward().evaluate(static, PROMPTS)
    assert (details.steady_speed < 0.2).all() and (details.smooth_track == 1).all()
    torch.testing.assert_close(details.direction_probability, torch.full((len(PROMPTS),), 0.25))


def test_vanishing_object_breaks_persistence(clean):
    flicker = clean.clone()
    flicker[:, 1::2] = BACKGROUND_LEVEL
    details = ToyReward().evaluate(flicker, PROMPTS)
    assert (details.persistent_object < 0.1).all()


def test_noise_lowers_visual_quality_monotonically(clean):
    reward = ToyReward()
    levels = [0.0, 0.01, 0.03, 0.1]
    visual = [reward(with_noise(clean, std), PROMPTS)["vq"].mean().item() for std in levels]
    assert visual == sorted(visual, reverse=True) and visual[0] == 1.0 and visual[-1] < 0.5
    noisy = means(reward(with_noise(clean, 0.03), PROMPTS))
    assert noisy["ta"] > 0.99 and noisy["mq"] > 0.95  # the object is as clear as before


def test_the_hackable_reward_measures_background_spread_not_level(clean):
    # A darker (or brighter) clean background scores as well as the world's own grey: one of the holes of the proxy.
    for level in (0.0, 0.1, 0.4):
        recoloured = torch.where(clean == BACKGROUND_LEVEL, torch.full_like(clean, level), clean)
        torch.testing.assert_close(HackableToyReward()(recoloured, PROMPTS)["vq"], torch.ones(len(PROMPTS)))


def test_a_background_off_the_worlds_grey_lowers_visual_quality(clean):
    for level in (0.0, 0.1, 0.4):
        recoloured = torch.where(clean == BACKGROUND_LEVEL, torch.full_like(clean, level), clean)
        assert (ToyReward().evaluate(recoloured, PROMPTS).clean_background < 0.1).all(), level


def test_background_flicker_lowers_visual_quality(clean):
    flicker = clean + 0.05 * torch.tensor([1.0, -1.0] * 4).view(1, 8, 1, 1, 1)
    details = ToyReward().evaluate(flicker.clamp(0, 1), PROMPTS)
    assert (details.clean_background < 0.5).all()


def test_blur_lowers_crispness_and_visual_quality(clean):
    blurred = F.avg_pool2d(clean.flatten(0, 1), 3, stride=1, padding=1, count_include_pad=False).view_as(
        clean
    )
    details = ToyReward().evaluate(blurred, PROMPTS)
    assert (details.crisp_object < 0.9).all() and details.vq.mean() < 0.6
    assert details.colour_correct.all() and details.direction_correct.all()


def test_an_empty_video_scores_zero_where_an_object_is_needed():
    empty = torch.full((2, 8, 3, 16, 16), BACKGROUND_LEVEL)
    details = ToyReward().evaluate(empty, PROMPTS[:2])
    assert (details.presence == 0).all() and (details.ta == 0).all() and (details.mq == 0).all()
    torch.testing.assert_close(details.vq, torch.full((2,), 1 / 5))  # the world's background, no object


# -- protocol --------------------------------------------------------------------------------------


def test_deterministic_and_batch_equals_one_at_a_time(clean):
    reward = ToyReward()
    videos = torch.cat([clean, with_noise(clean, 0.05), clean[:, [0, 2, 1, 3, 5, 4, 6, 7]]])
    prompts = PROMPTS * 3
    batch = reward(videos, prompts)
    again = reward(videos, prompts)
    singles = [reward(videos[i : i + 1], prompts[i : i + 1]) for i in range(len(prompts))]
    for name in ("vq", "mq", "ta"):
        assert torch.equal(batch[name], again[name])
        torch.testing.assert_close(batch[name], torch.cat([s[name] for s in singles]), atol=1e-6, rtol=0)


def test_fps_is_accepted_and_ignored(clean):
    reward = ToyReward()
    assert all(
        torch.equal(a, b)
        for a, b in zip(reward(clean, PROMPTS, fps=8).values(), reward(clean, PROMPTS, fps=30).values())
    )


def test_details_hold_every_term_and_the_heads(clean):
    details = ToyReward().evaluate(clean, PROMPTS)
    assert isinstance(details, ToyRewardDetails)
    terms = details.as_dict()
    assert {"vq", "mq", "ta", "clean_background", "smooth_track", "colour_correct"} <= set(terms)
    assert all(t.shape == (len(PROMPTS),) for t in terms.values())
    torch.testing.assert_close(
        details.vq, (details.clean_background + details.crisp_object + details.on_palette) / 3
    )


def test_overall_score_is_the_mean_of_the_heads():
    scores = {"vq": torch.tensor([1.0, 0.0]), "mq": torch.tensor([0.5, 0.0]), "ta": torch.tensor([0.0, 0.3])}
    torch.testing.assert_close(toy_overall_score(scores), torch.tensor([0.5, 0.1]))
    with pytest.raises(ValueError, match="missing \\['ta'\\]"):
        toy_overall_score({"vq": torch.ones(1), "mq": torch.ones(1)})


def test_composite_reward_marks_prompts_outside_the_grammar_invalid(clean):
    prompts = [*PROMPTS[:-1], "a cat surfing"]
    output = CompositeReward(ToyReward())(clean, prompts)
    assert output.valid.tolist() == [True] * 7 + [False]
    assert "not a toy-world prompt" in output.errors[-1]
    assert set(output.components) == {"vq", "mq", "ta"} and output.weights == {
        "vq": 0.5,
        "mq": 0.5,
        "ta": 1.0,
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r, v: r(v[:, :2], PROMPTS), "at least 3 frames"),
        (lambda r, v: r(v[:1], PROMPTS[0]), "one prompt per video"),
        (lambda r, v: r(v, PROMPTS[:3]), "8 videos but 3 prompts"),
        (lambda r, v: r(v * 2, PROMPTS), r"lie in \[0, 1\]"),
    ],
)
def test_bad_inputs_raise_clear_errors(clean, call, message):
    with pytest.raises(ValueError, match=message):
        call(ToyReward(), clean)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="spread_scale must be a finite number > 0"):
        ToyReward(spread_scale=0)
    with pytest.raises(ValueError, match="object_low < object_high"):
        ToyReward(object_low=0.5, object_high=0.2)
