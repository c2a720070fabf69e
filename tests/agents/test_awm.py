"""AWM: its weighting and loss against values worked by hand from the authors' formulas, its stratified noise levels,
and on-policy training with no transition likelihood in the gymnasium loop."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import agents
import sage_env  # noqa: F401  (registers the ids)
from agents.algorithm import FinalSampleBatch, References
from agents.awm import AWMAlgorithm, matching_weight, stratified_levels
from tests.doubles import LinearBackbone


def test_the_weightings_match_the_hand_computed_values() -> None:
    loss, t = torch.tensor([0.125], requires_grad=True), torch.tensor([0.5])
    ghuber = matching_weight(loss, t, "ghuber", 0.25)
    assert ghuber.item() == pytest.approx(1.1828826, abs=1e-7)
    (0.5 * ghuber).sum().backward()  # A' = 0.5: d(-A' x -w)/dl = A' dw/dl
    assert loss.grad.item() == pytest.approx(1.1892071, abs=1e-6)
    assert matching_weight(loss, t, "uniform", 0.25).item() == pytest.approx(0.125)
    assert matching_weight(loss, t, "huber", 0.25).item() == pytest.approx(0.1767717, abs=1e-7)


def test_the_levels_are_one_per_stratum_and_never_pure_noise() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):  # the authors' 14 steps x 0.9: strata {1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}
        levels = stratified_levels(14, 0.9, 6, generator).tolist()
        strata = [(1, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
        assert all(lo <= level < hi for level, (lo, hi) in zip(levels, strata, strict=True))
    assert stratified_levels(4, 0.9, 6, generator).tolist() == [1, 2]  # int(3.6) = 3: levels 1, 2, two strata
    assert stratified_levels(1, 0.9, 6, generator).tolist() == [0]


def test_on_policy_loss_is_minus_the_clipped_advantage_and_off_policy_is_refused() -> None:
    algorithm = AWMAlgorithm(agents.ALGORITHM_CONFIGS["awm"](beta=1e-3, ema_kl_coef=0.0))
    backbone = LinearBackbone()
    conditioning = backbone.encode_prompts(["a"], None)
    batch = FinalSampleBatch(
        clean=torch.zeros(1, 3, 2, 4, 4), noise=torch.ones(1, 3, 2, 4, 4), sigma=torch.tensor([0.5]),
        advantages=torch.tensor([2.5]), sample_index=torch.tensor([0]), step_index=torch.tensor([1]),
        conditioning=conditioning, on_policy=True,
    )  # fmt: skip
    loss, metrics = algorithm.loss(backbone, batch, References())
    assert metrics["policy_loss"].item() == pytest.approx(-0.5)  # -A' x ratio 1, A' = 2.5 / 5
    assert metrics["kl/total"].item() == 0.0 and loss.item() == pytest.approx(-0.5)  # no reference given
    batch.on_policy = False
    with pytest.raises(ValueError, match="on-policy only"):
        algorithm.loss(backbone, batch, References())


def test_it_trains_on_ode_rollouts_in_the_gymnasium_loop() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=4, group_size=2, num_steps=6, sde="ode", sde_window=None)
    agent = agents.make("awm", env=envs, learning_rate=1e-3)
    observation, _ = envs.reset(seed=0, options=agent.rollout_options(envs))
    while not envs.step(agent.act(observation))[2].all():
        pass
    before = [p.detach().clone() for p in agent.parameters]
    metrics = agent.update(envs.unwrapped.trajectory)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters))
    assert metrics["matching_loss"] > 0
    with pytest.raises(ValueError, match="needs transition log-probabilities"):
        agents.ALGORITHM_CONFIGS["awm"](kl_strategy="moving")
    with pytest.raises(ValueError, match="num_iterations=2: AWM trains on-policy only"):
        agents.ALGORITHM_CONFIGS["awm"](num_iterations=2)
