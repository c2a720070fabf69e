"""The prior's training script: a few steps into a temporary folder, determinism, flags, and its pieces."""

from __future__ import annotations

import json

import pytest
import torch

from sage_env.backbones import load_backbone
from sage_env.backbones.toy import ToyBackbone
from sage_env.toy.train_prior import (
    PriorTrainingConfig,
    flow_matching_loss,
    main,
    shifted_sigmas,
    train_prior,
    training_sigmas,
)
from sage_env.toy.world import render_videos

SMOKE_FLAGS = [
    "--max-steps",
    "3",
    "--eval-every",
    "2",
    "--eval-seeds",
    "1",
    "--sampling-steps",
    "2",
    "--batch-size",
    "4",
]


def test_cli_smoke_run_writes_a_loadable_prior_and_a_log(tmp_path, capsys):
    threads = torch.get_num_threads()
    main(["--output", str(tmp_path / "prior"), "--snapshots", str(tmp_path / "snapshots"), *SMOKE_FLAGS])
    assert torch.get_num_threads() == threads  # the CLI restores the thread count it changed
    printed = capsys.readouterr().out
    assert "step      2" in printed and "direction" in printed and "Saved the prior" in printed
    records = [json.loads(line) for line in (tmp_path / "prior" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]
    assert {"colour_accuracy", "direction_accuracy", "vq", "mq", "ta", "overall", "loss", "minutes"} <= set(
        records[0]
    )
    index = json.loads((tmp_path / "prior" / "model_index.json").read_text())
    assert index["training"]["steps"] == 3 and index["num_frames"] == 8
    assert isinstance(load_backbone(str(tmp_path / "prior")), ToyBackbone)
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["step_000002", "step_000003"]


def test_training_is_deterministic_given_the_seed(tmp_path):
    def trained(seed: int, name: str) -> dict[str, torch.Tensor]:
        config = PriorTrainingConfig(tmp_path / name, max_steps=2, eval_every=5, eval_seeds=1, sampling_steps=1,
                                     batch_size=2, seed=seed)  # fmt: skip
        return train_prior(config).transformer.state_dict()

    first, second, other = trained(0, "a"), trained(0, "b"), trained(1, "c")
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_training_lowers_the_flow_matching_loss_on_a_fixed_batch():
    backbone = ToyBackbone.from_scratch(0)
    generator = torch.Generator().manual_seed(0)
    prompts = ["a red square moving left", "a blue circle moving up"]
    videos, conditioning = render_videos(prompts, [0, 1]), backbone.encode_prompts(prompts)
    sigma, noise = torch.tensor([0.9, 0.5]), torch.randn(2, 3, 8, 16, 16, generator=generator)
    optimizer = torch.optim.AdamW(backbone.transformer.parameters(), lr=5e-3)
    losses = []
    for _ in range(5):
        loss = flow_matching_loss(backbone, videos, conditioning, sigma, noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_shifted_sigmas_are_biased_to_high_noise():
    sigmas = shifted_sigmas(20_000, 3.0, torch.Generator().manual_seed(0))
    assert sigmas.min() >= 0 and sigmas.max() <= 1
    # sigma = 3u / (1 + 2u): P(sigma > 1/2) = P(u > 1/4) = 3/4.
    assert (sigmas > 0.5).float().mean().item() == pytest.approx(0.75, abs=0.01)


def test_high_noise_draws_are_mixed_in_with_the_requested_share():
    generator = torch.Generator().manual_seed(0)
    sigmas = training_sigmas(20_000, 3.0, 0.5, 0.7, generator)
    # P(sigma >= 0.7) = 0.5 (high draws) + 0.5 * P(shifted >= 0.7) = 0.5 + 0.5 * P(u >= 7/16).
    expected = 0.5 + 0.5 * (1 - 7 / 16)
    assert (sigmas >= 0.7).float().mean().item() == pytest.approx(expected, abs=0.01)
    only_shifted = training_sigmas(20_000, 3.0, 0.0, 0.7, torch.Generator().manual_seed(0))
    assert (only_shifted > 0.5).float().mean().item() == pytest.approx(0.75, abs=0.01)


def test_init_continues_from_a_saved_model(tmp_path):
    start = ToyBackbone.from_scratch(seed=7)
    start.save_pretrained(tmp_path / "start")
    config = PriorTrainingConfig(tmp_path / "continued", max_steps=1, eval_every=5, eval_seeds=1, sampling_steps=1,
                                 batch_size=2, learning_rate=1e-6, init=tmp_path / "start")  # fmt: skip
    continued = train_prior(config).transformer.state_dict()
    fresh = ToyBackbone.from_scratch(seed=0).transformer.state_dict()
    initial = start.transformer.state_dict()
    assert all(torch.allclose(continued[k], initial[k], atol=1e-4) for k in initial)
    assert not all(torch.allclose(continued[k], fresh[k], atol=1e-4) for k in fresh)
    index = json.loads((tmp_path / "continued" / "model_index.json").read_text())
    assert index["training"]["init"] == str(tmp_path / "start")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"minutes": 0}, "minutes must be > 0"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"eval_every": 0}, "eval_every"),
        ({"high_noise_fraction": 1.5}, r"high_noise_fraction must lie in \[0, 1\]"),
        ({"high_noise_min": 1.0}, r"high_noise_min must lie in \[0, 1\)"),
    ],
)
def test_bad_settings_raise(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        PriorTrainingConfig(tmp_path, **change)
