"""Second-order multistep DPM-Solver++ for the untrained steps: the published formula by hand, and the environment's
``ode_solver="dpmsolver++"`` rollout against diffusers' own ``DPMSolverMultistepScheduler`` on the same model."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

import sage_env  # noqa: F401  (registers the ids)
from sage_env.env import BackbonePolicy, run_episode
from sage_env.sde import dpm_solver_2m_correction, half_log_snr


def test_the_second_order_step_by_hand() -> None:
    # sigma_prev 0.8, sigma_s 0.6, sigma_t 0.4; x_s 0.5, x0_s 1.0, x0_prev 0.8 (MixGRPO-Flash's update, by hand):
    # lambda = log((1 - sigma) / sigma); h = lambda_t - lambda_s; r0 = (lambda_s - lambda_prev) / h.
    lam = [math.log(0.2 / 0.8), math.log(0.4 / 0.6), math.log(0.6 / 0.4)]
    h = lam[2] - lam[1]
    r0 = (lam[1] - lam[0]) / h
    euler = (0.4 / 0.6) * 0.5 + (1 - 0.4 / 0.6) * 1.0  # first order: (sigma_t/sigma_s) x_s + (1 - sigma_t/sigma_s) x0
    second = euler + 0.5 * (1 - 0.4 / 0.6) * (1.0 - 0.8) / r0
    assert euler == pytest.approx(0.666667, abs=1e-6) and second == pytest.approx(0.694226, abs=1e-6)
    correction = dpm_solver_2m_correction(
        torch.tensor([[1.0]]), torch.tensor([[0.8]]), torch.tensor([0.8]), torch.tensor([0.6]), torch.tensor([0.4])
    )
    assert euler + float(correction) == pytest.approx(second, abs=1e-6)
    assert torch.isinf(half_log_snr(torch.tensor([1.0, 0.0]))).all()


def test_no_history_at_sigma_one_gives_the_first_order_step() -> None:
    correction = dpm_solver_2m_correction(
        torch.ones(1, 3), torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([0.9]), torch.tensor([0.8])
    )
    assert torch.equal(correction, torch.zeros(1, 3))


def test_the_env_rollout_equals_diffusers_dpm_solver_multistep() -> None:
    """All steps deterministic: every step but the first (no history) and the last (lower-order final) is second
    order, as diffusers' scheduler with solver_order=2, midpoint, flow sigmas does on the same schedule."""
    scheduler = DPMSolverMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0, algorithm_type="dpmsolver++",
        solver_order=2, solver_type="midpoint", lower_order_final=True, final_sigmas_type="zero",
    )  # fmt: skip
    scheduler.set_timesteps(6)
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=2, group_size=1, num_steps=6, sde="ode", sde_window=None)
    env = envs.unwrapped
    policy = BackbonePolicy(env.backbone)
    options = {"sigmas": scheduler.sigmas, "ode_solver": "dpmsolver++", "prompts": ["a red ball", "a blue cube"]}
    ours = run_episode(env, policy, seed=0, options=options)
    latents = ours.latents[:, 0].clone()
    conditioning = env.backbone.encode_prompts(["a red ball", "a blue cube"])
    with torch.no_grad():
        for index, timestep in enumerate(scheduler.timesteps):
            sigma = scheduler.sigmas[index].expand(2).float()
            velocity = env.backbone.predict_velocity(latents, sigma, conditioning, 1.0)
            latents = scheduler.step(velocity, timestep, latents).prev_sample
    torch.testing.assert_close(ours.latents[:, -1], latents, rtol=1e-5, atol=1e-5)
    euler = run_episode(env, policy, seed=0, options={**options, "ode_solver": "euler"})
    assert not torch.allclose(euler.latents[:, -1], latents, atol=1e-4)  # the solver made the difference


def test_bad_schedule_options_are_refused_with_the_option_named() -> None:
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=2, group_size=1, num_steps=4, sde_window=None)
    for options, message in (
        ({"sigmas": [1.0, 0.5, 0.6, 0.0]}, r"options\['sigmas'\]: Sigmas must be strictly decreasing"),
        ({"sigmas": [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]}, "more than the 4 the observation space declares"),
        ({"sigmas": "fast"}, r"options\['sigmas'\]"),
        ({"ode_solver": "heun"}, r"options\['ode_solver'\] must be one of"),
        ({"sigmas": [1.0, 0.5, 0.0], "sde_window": (0, 3)}, r"options\['sde_window'\]"),
    ):
        with pytest.raises(ValueError, match=message):
            envs.reset(seed=0, options=options)
    _, _ = envs.reset(seed=0, options={"sigmas": [1.0, 0.5, 0.0]})
    assert envs.unwrapped._batch.num_steps == 2  # a shorter episode of the same environment
