"""The policy-gradient loss, KL strategies, equalizer and references against independent computations."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agents import AlgorithmConfig, PolicyGradientAlgorithm, References
from agents.references import DisabledAdapters, ParameterSnapshot
from sage_env import sde
from sage_env.env import DenoisingVectorEnv
from tests.doubles import LinearBackbone, mean_brightness

SIZE = {"num_frames": 2, "height": 4, "width": 4}


def rollout(backbone: LinearBackbone, config: AlgorithmConfig, seed: int = 0):
    env = DenoisingVectorEnv(
        backbone,
        mean_brightness,
        ["a", "b"],
        num_envs=8,
        group_size=4,
        num_steps=5,
        sde=config.sde,
        eta=config.eta,
        log_prob_kind=config.log_prob_kind,
        array_mode="torch",  # the backbone is called on the observations directly
        **SIZE,
    )
    observation, _ = env.reset(seed=seed)
    conditioning = backbone.encode_prompts(list(observation["prompt"]))
    while True:
        with torch.no_grad():
            velocity = backbone.predict_velocity(observation["latents"], observation["sigma"], conditioning)
        observation, _, terminated, _, _ = env.step(velocity)
        if terminated.all():
            return env.trajectory


def perturb(module: torch.nn.Module, scale: float = 0.05) -> None:
    generator = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def independent_step(backbone: LinearBackbone, batch, eta: float) -> sde.SDEStepOutput:
    velocity = backbone.predict_velocity(batch.latents, batch.sigma, batch.conditioning)
    return sde.sde_step(
        batch.sde_type, batch.latents, velocity, batch.sigma, batch.sigma_next, eta, x_next=batch.next_latents
    )


def prepared(config: AlgorithmConfig):
    backbone = LinearBackbone()
    algorithm = PolicyGradientAlgorithm(config)
    trajectory = rollout(backbone, config)
    advantages, usable = algorithm.advantages(trajectory)
    batch = algorithm.training_batch(trajectory, advantages, usable, backbone)
    return backbone, algorithm, trajectory, batch


def test_on_policy_ratio_is_exactly_one() -> None:
    backbone, algorithm, _, batch = prepared(AlgorithmConfig(kl_strategy="none"))
    batch.on_policy = True
    _, metrics = algorithm.loss(backbone, batch, References())
    assert metrics["ratio_mean"].item() == 1.0 and metrics["ratio_std"].item() == 0.0
    assert metrics["clip_fraction"].item() == 0.0
    batch.on_policy = False  # against the rollout's log-probs: equal up to batch-dependent rounding
    _, metrics = algorithm.loss(backbone, batch, References())
    assert abs(metrics["ratio_mean"].item() - 1.0) < 1e-5


def test_batch_holds_the_selected_stochastic_pairs() -> None:
    _, _, trajectory, batch = prepared(AlgorithmConfig(kl_strategy="none"))
    assert len(batch) == 8 * 5  # 8 samples x 5 stochastic steps, all usable
    pair = 13
    sample, step = batch.sample_index[pair].item(), batch.step_index[pair].item()
    assert torch.equal(batch.latents[pair], trajectory.latents[sample, step])
    assert torch.equal(batch.next_latents[pair], trajectory.latents[sample, step + 1])
    assert batch.old_log_prob[pair] == trajectory.log_probs[sample, step]
    assert batch.conditioning.prompts[pair] == trajectory.prompts[sample]


@pytest.mark.parametrize("equalizer", [True, False])
def test_policy_loss_equals_hand_computation(equalizer: bool) -> None:
    backbone, algorithm, trajectory, batch = prepared(
        AlgorithmConfig(kl_strategy="none", equalizer=equalizer)
    )
    loss, _ = algorithm.loss(backbone, batch, References())
    scales = sde.gradient_scale("sage", trajectory.sigmas[:, :-1], trajectory.sigmas[:, 1:], 0.5)
    median = scales.quantile(0.5, dim=1, keepdim=True)
    step_weights = median / (scales + 1e-8) if equalizer else torch.ones_like(scales)
    weights = step_weights[batch.sample_index, batch.step_index]
    expected = (-batch.advantages.clamp(-5, 5) * weights).mean()  # on-policy: ratio = 1
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("strategy", ["none", "fixed", "stepwise", "moving", "dual"])
def test_kl_strategies_change_the_loss_as_the_formulas_say(strategy: str) -> None:
    config = AlgorithmConfig(
        kl_strategy=strategy, kl_coef_schedule="constant", beta=0.3, epsilon=math.inf, equalizer=False
    )
    backbone, algorithm, _, batch = prepared(config)
    initial = copy.deepcopy(backbone)
    references = algorithm.build_references(backbone.transformer)
    perturb(backbone.transformer)  # the policy moves away from its rollout / anchor / initial weights
    loss, metrics = algorithm.loss(backbone, batch, references)

    current = independent_step(backbone, batch, 0.5)
    reference = independent_step(initial, batch, 0.5)
    ratio = torch.exp(current.log_prob - batch.old_log_prob)
    policy = (-batch.advantages * ratio).mean()
    position = ((current.mean - reference.mean) ** 2).mean(dim=(1, 2, 3, 4)) / (2 * current.std**2)
    velocity = batch.old_log_prob - current.log_prob
    kl = {
        "none": 0.0,
        "fixed": position.mean(),
        "moving": position.mean(),
        "stepwise": velocity.mean(),
        "dual": 1.0 * position.mean() + 0.1 * velocity.mean(),
    }[strategy]
    torch.testing.assert_close(loss, policy + 0.3 * kl, rtol=1e-5, atol=1e-8)
    if strategy != "none":
        assert metrics["kl/total"] != 0
    assert all(p.grad is None for p in backbone.transformer.parameters())


def test_references_are_restored_after_use() -> None:
    backbone = LinearBackbone()
    snapshot = ParameterSnapshot(backbone.transformer)
    before = {n: p.detach().clone() for n, p in backbone.transformer.named_parameters()}
    perturb(backbone.transformer)
    after = {n: p.detach().clone() for n, p in backbone.transformer.named_parameters()}
    with snapshot.applied():
        assert all(torch.equal(p, before[n]) for n, p in backbone.transformer.named_parameters())
    assert all(torch.equal(p, after[n]) for n, p in backbone.transformer.named_parameters())
    snapshot.refresh()
    with snapshot.applied():
        assert all(torch.equal(p, after[n]) for n, p in backbone.transformer.named_parameters())
    offloaded = ParameterSnapshot(backbone.transformer, offload=True)
    assert offloaded.num_bytes() == sum(p.numel() * 4 for p in backbone.transformer.parameters())
    with pytest.raises(ValueError, match="LoRA"):
        DisabledAdapters(backbone.transformer)


def test_anchor_refreshes_every_n_optimizer_steps() -> None:
    backbone = LinearBackbone()
    algorithm = PolicyGradientAlgorithm(AlgorithmConfig(anchor_update_steps=3))
    references = algorithm.build_references(backbone.transformer)
    initial = {n: v.clone() for n, v in references.anchor.values.items()}
    perturb(backbone.transformer)
    for step in range(1, 4):
        algorithm.after_optimizer_step(0.0, references)
        refreshed = all(
            torch.equal(references.anchor.values[n], p) for n, p in backbone.transformer.named_parameters()
        )
        unchanged = all(torch.equal(references.anchor.values[n], initial[n]) for n in initial)
        assert (refreshed, unchanged) == ((True, False) if step == 3 else (False, True))
    assert algorithm.kl_controller.step == 3


def test_algorithm_state_round_trip() -> None:
    algorithm = PolicyGradientAlgorithm(AlgorithmConfig(kl_warmup_steps=5))
    for value in (0.1, 0.2):
        algorithm.after_optimizer_step(value, References())
    restored = PolicyGradientAlgorithm(AlgorithmConfig(kl_warmup_steps=5))
    restored.load_state_dict(algorithm.state_dict())
    assert restored.optimizer_steps == 2 and restored.kl_controller.coef == algorithm.kl_controller.coef
    assert torch.equal(restored.generator.get_state(), algorithm.generator.get_state())


def test_trajectory_from_another_sde_is_refused() -> None:
    backbone = LinearBackbone()
    trajectory = rollout(backbone, AlgorithmConfig(sde="flow_grpo", eta=0.7))
    algorithm = PolicyGradientAlgorithm(AlgorithmConfig())
    advantages, usable = algorithm.advantages(trajectory)
    with pytest.raises(ValueError, match="build the environment with the same values"):
        algorithm.training_batch(trajectory, advantages, usable, backbone)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kl_strategy": "forward"}, "kl_strategy"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"sde": "ode"}, "injects no noise"),
        ({"timestep_fraction": 0}, "timestep_fraction"),
        ({"kl_coef_min": 1.0, "beta": 0.1}, "kl_coef_min"),
        ({"scale_rewards": "token"}, "scale_rewards"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AlgorithmConfig(**kwargs)
