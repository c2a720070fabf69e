"""The toy world: prompt grammar and parser, the fixed split, and the deterministic renderer."""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
import torch

from sage_env.toy.world import (
    BACKGROUND_LEVEL,
    OBJECT_SIZE,
    START_JITTER,
    TOY_COLOURS,
    TOY_DIRECTIONS,
    TOY_EVAL_PROMPTS,
    TOY_PROMPTS,
    TOY_SHAPES,
    TOY_TRAIN_PROMPTS,
    ToyPrompt,
    object_mask,
    parse_prompt,
    render_video,
    render_videos,
)


def object_pixels(frame: torch.Tensor) -> torch.Tensor:
    """``(N, 2)`` row/column of the pixels of a rendered frame ``(3, H, W)`` that are not background."""
    return ((frame - BACKGROUND_LEVEL).abs().sum(dim=0) > 1e-6).nonzero()


# -- grammar and split -----------------------------------------------------------------------------


def test_the_grammar_has_every_combination_once():
    expected = {f"a {c} {s} moving {d}" for c, s, d in product(TOY_COLOURS, TOY_SHAPES, TOY_DIRECTIONS)}
    assert len(TOY_PROMPTS) == len(set(TOY_PROMPTS)) == 32
    assert set(TOY_PROMPTS) == expected


def test_the_split_is_disjoint_and_balanced():
    assert len(TOY_TRAIN_PROMPTS) == 24 and len(TOY_EVAL_PROMPTS) == 8
    assert not set(TOY_TRAIN_PROMPTS) & set(TOY_EVAL_PROMPTS)
    held_out = [parse_prompt(p) for p in TOY_EVAL_PROMPTS]
    assert Counter(p.colour for p in held_out) == dict.fromkeys(TOY_COLOURS, 2)
    assert Counter(p.direction for p in held_out) == dict.fromkeys(TOY_DIRECTIONS, 2)
    assert Counter(p.shape for p in held_out) == dict.fromkeys(TOY_SHAPES, 4)


def test_every_held_out_colour_direction_pair_is_trained_with_the_other_shape():
    trained = {(p.colour, p.direction) for p in map(parse_prompt, TOY_TRAIN_PROMPTS)}
    for prompt in map(parse_prompt, TOY_EVAL_PROMPTS):
        assert (prompt.colour, prompt.direction) in trained


def test_parser_round_trips_every_prompt():
    for text in TOY_PROMPTS:
        attributes = parse_prompt(text)
        assert attributes.text == str(attributes) == text
        assert parse_prompt(attributes) is attributes


@pytest.mark.parametrize(
    "text",
    [
        "A Red Square moving LEFT",
        "  a red   square moving left. ",
        "red square moving left",
        "an red square moving left",
    ],
)
def test_parser_ignores_case_spaces_article_and_full_stop(text):
    assert parse_prompt(text) == ToyPrompt("red", "square", "left")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a purple square moving left", "Unknown toy colour 'purple'"),
        ("a red triangle moving left", "Unknown toy shape 'triangle'"),
        ("a red square moving sideways", "Unknown toy direction 'sideways'"),
        ("a cat surfing", "not a toy-world prompt.*a <colour> <shape> moving <direction>"),
        (3, "not a toy-world prompt"),
    ],
)
def test_parser_rejects_text_outside_the_grammar(text, message):
    with pytest.raises(ValueError, match=message):
        parse_prompt(text)


# -- renderer --------------------------------------------------------------------------------------


def test_render_is_deterministic_and_in_range():
    video = render_video("a blue circle moving up", seed=7)
    assert video.shape == (8, 3, 16, 16) and video.dtype == torch.float32
    assert video.min() >= 0 and video.max() <= 1
    assert torch.equal(video, render_video("a blue circle moving up", seed=7))
    batch = render_videos(["a blue circle moving up", "a red square moving left"], [7, 3])
    assert torch.equal(batch[0], video) and torch.equal(batch[1], render_video("a red square moving left", 3))


@pytest.mark.parametrize(("shape", "area"), [("square", OBJECT_SIZE**2), ("circle", OBJECT_SIZE**2 - 4)])
def test_object_has_the_colour_and_footprint_of_its_shape(shape, area):
    video = render_video(f"a yellow {shape} moving right", seed=1)
    for frame in video:
        pixels = object_pixels(frame)
        assert len(pixels) == area
        colours = frame[:, pixels[:, 0], pixels[:, 1]].T
        assert torch.equal(colours, torch.tensor([TOY_COLOURS["yellow"]]).expand(area, 3))
    assert int(object_mask(shape).sum()) == area


@pytest.mark.parametrize("direction", list(TOY_DIRECTIONS))
def test_object_moves_one_pixel_per_frame_in_the_prompted_direction_and_stays_in_view(direction):
    step = torch.tensor(TOY_DIRECTIONS[direction])
    for seed in range(20):
        video = render_video(f"a green square moving {direction}", seed)
        corners = torch.stack([object_pixels(frame).min(dim=0).values for frame in video])
        assert torch.equal(corners[1:] - corners[:-1], step.expand(7, 2))
        # Whole object in view in every frame: the square's 16 pixels are all drawn.
        assert all(len(object_pixels(frame)) == OBJECT_SIZE**2 for frame in video)


@pytest.mark.parametrize(
    ("direction", "centred"), [("right", (6, 2)), ("left", (6, 13 - 4)), ("down", (2, 6))]
)
def test_seeds_jitter_the_centred_trajectory_by_at_most_start_jitter(direction, centred):
    # A trajectory spans 4 + 7 = 11 px along the motion (centred start 2; a left-mover's start corner is 7 px
    # further) and 4 px across it (centred start 6).
    starts = {
        tuple(
            object_pixels(render_video(f"a red square moving {direction}", s)[0]).min(dim=0).values.tolist()
        )
        for s in range(60)
    }
    offsets = {(row - centred[0], col - centred[1]) for row, col in starts}
    assert len(starts) > 15
    assert max(max(abs(r), abs(c)) for r, c in offsets) == START_JITTER


def test_renderer_rejects_bad_sizes_and_arguments():
    with pytest.raises(ValueError, match="height and width >= 11"):
        render_video("a red square moving left", 0, height=10)
    with pytest.raises(ValueError, match="num_frames must be a positive integer"):
        render_video("a red square moving left", 0, num_frames=0)
    with pytest.raises(ValueError, match="one seed per prompt"):
        render_videos(["a red square moving left"], [0, 1])
    with pytest.raises(ValueError, match="list of prompts"):
        render_videos("a red square moving left", [0])
    with pytest.raises(ValueError, match="Unknown toy shape"):
        object_mask("triangle")


def test_other_sizes_render_with_the_same_motion():
    video = render_video("a red square moving right", 0, num_frames=4, height=24, width=32)
    assert video.shape == (4, 3, 24, 32)
    corners = torch.stack([object_pixels(frame).min(dim=0).values for frame in video])
    assert torch.equal(corners[1:] - corners[:-1], torch.tensor([[0, 1]] * 3))
