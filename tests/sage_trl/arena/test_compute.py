"""The arena's compute counter: every transformer forward's rows counted by kind, held-out evaluations told apart
(sage_trl.evaluation.sampling_held_out), each kind priced by torch's FLOP counter."""

from __future__ import annotations

import pytest
import torch

from sage_env.backbones.toy import ToyBackbone
from sage_env.rewards import CompositeReward
from sage_env.rewards.toy import ToyReward
from sage_trl.arena.compute import count_transformer_rows
from sage_trl.evaluation import evaluate_policy, sampling_held_out

PROMPTS = ["a red square moving left", "a blue circle moving up", "a green square moving right"]


def test_rows_are_counted_by_kind_and_evaluations_apart() -> None:
    backbone = ToyBackbone.from_scratch(seed=0)
    defaults = backbone.sampling_defaults
    latents = torch.zeros(2, 3, defaults.num_frames, defaults.height, defaults.width)
    conditioning = backbone.encode_prompts(PROMPTS[:2])
    sigma = torch.full((2,), 0.5)
    with count_transformer_rows() as counter:
        evaluate_policy(backbone, CompositeReward(ToyReward()), PROMPTS, [0, 1, 2], batch_size=2)
        assert not sampling_held_out()  # only while evaluate_policy samples
        with torch.no_grad():
            backbone.predict_velocity(latents, sigma, conditioning)
        backbone.predict_velocity(latents[:1], sigma[:1], conditioning.select([0]))
    # 3 held-out videos x the toy's 10 ODE steps, in batches of 2 and 1; then 2 rows without and 1 with gradient.
    assert counter.rows == {"evaluation": 3 * defaults.num_steps, "no_grad": 2, "grad": 1}
    flops = counter.flops()
    per_row = {kind: flops[kind] / rows for kind, rows in counter.rows.items()}
    assert per_row["evaluation"] == per_row["no_grad"] > 0
    assert per_row["grad"] == pytest.approx(3 * per_row["no_grad"], rel=0.2)  # forward + backward ~ 3 forwards
    assert flops["train"] == flops["grad"] + flops["no_grad"]
    assert flops["total"] == flops["train"] + flops["evaluation"]


def test_nothing_counted_prices_nothing() -> None:
    with count_transformer_rows() as counter:
        torch.nn.Linear(2, 2)(torch.ones(1, 2))  # not a diffusers transformer
    assert counter.rows == dict.fromkeys(counter.KINDS, 0)
    assert set(counter.flops().values()) == {0.0}
