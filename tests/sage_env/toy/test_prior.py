"""The shipped prior: loads through ``load_backbone("toy")`` and makes recognisable videos for held-out prompts."""

from __future__ import annotations

import torch

from sage_env.backbones import load_backbone
from sage_env.env import sample_videos
from sage_env.rewards.toy import ToyReward
from sage_env.toy.world import TOY_EVAL_PROMPTS

SEEDS = (0, 1)


def test_shipped_prior_makes_recognisable_videos_for_most_held_out_prompts():
    backbone = load_backbone("toy")
    prompts = [prompt for prompt in TOY_EVAL_PROMPTS for _ in SEEDS]
    videos = sample_videos(backbone, prompts, list(SEEDS) * len(TOY_EVAL_PROMPTS))  # 10 Euler steps, no CFG
    details = ToyReward().evaluate(videos, prompts)
    alignment_per_prompt = details.ta.view(len(TOY_EVAL_PROMPTS), len(SEEDS)).mean(dim=1)
    # Measured on the shipped prior: every held-out prompt has TA >= 0.96 with these seeds.
    assert (alignment_per_prompt > 0.8).sum() > len(TOY_EVAL_PROMPTS) // 2
    assert details.colour_correct.float().mean() >= 0.9
    assert details.direction_correct.float().mean() >= 0.75
    assert (details.presence > 0.8).float().mean() >= 0.9  # an object is drawn in (almost) every video


def test_shipped_prior_leaves_room_for_rl_on_motion_and_visual_quality():
    # The toy demo needs a prior RL can improve: its frames are not yet clean and its motion not yet smooth.
    backbone = load_backbone("toy")
    prompts = list(TOY_EVAL_PROMPTS)
    details = ToyReward().evaluate(sample_videos(backbone, prompts, [0] * len(prompts)), prompts)
    assert details.vq.mean() < 0.85 and details.mq.mean() < 0.85
    assert torch.isfinite(details.vq).all() and torch.isfinite(details.mq).all()
