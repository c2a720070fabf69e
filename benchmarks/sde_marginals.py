"""Marginal preservation of every SDE type on Gaussian data, where the exact velocity is known.

For data ``x0 ~ N(m, s^2 I)`` and noise ``z ~ N(0, I)`` the rectified-flow marginal at noise level sigma
is ``x ~ N((1-sigma) m, V I)`` with ``V = (1-sigma)^2 s^2 + sigma^2``, and the exact velocity
``v(x, sigma) = E[z - x0 | x]`` is affine in ``x`` (Gaussian conditioning). Sampling from pure noise with
that velocity, a marginal-preserving sampler must end with mean ``m`` and variance ``s^2``; what is left
is the discretisation error, which this script reports per SDE type and number of steps.

Run: ``python -m benchmarks.sde_marginals [--steps 20 200] [--eta 0.7]``.
"""

from __future__ import annotations

import argparse

import torch

from sage_env.sde import SDE_TYPES, flow_match_sigmas, sde_step

DATA_MEAN = 1.5
DATA_STD = 0.5


def gaussian_data_velocity(
    latents: torch.Tensor, sigma: float, data_mean: float = DATA_MEAN, data_std: float = DATA_STD
) -> torch.Tensor:
    """Exact velocity ``E[z - x0 | x_sigma = latents]`` for ``x0 ~ N(data_mean, data_std^2)``."""
    signal = 1.0 - sigma
    variance = signal**2 * data_std**2 + sigma**2
    centred = latents - signal * data_mean
    expected_noise = sigma / variance * centred
    expected_data = data_mean + signal * data_std**2 / variance * centred
    return expected_noise - expected_data


def sample_final_moments(
    sde_type: str,
    num_steps: int,
    eta: float,
    num_samples: int = 4096,
    dim: int = 16,
    seed: int = 0,
    shift: float = 1.0,
) -> tuple[float, float]:
    """Run the sampler from pure noise with the exact velocity; return the final (mean, variance)."""
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(num_samples, dim, generator=generator)
    sigmas = flow_match_sigmas(num_steps, shift=shift)
    for index in range(num_steps):
        sigma, sigma_next = sigmas[index].item(), sigmas[index + 1].item()
        velocity = gaussian_data_velocity(latents, sigma)
        latents = sde_step(sde_type, latents, velocity, sigma, sigma_next, eta, generator=generator).x_next
    return latents.mean().item(), latents.var().item()


def marginal_error_table(step_counts: list[int], eta: float, seed: int = 0) -> list[dict[str, float]]:
    """Relative errors of the final mean and variance for every SDE type and step count."""
    rows = []
    for sde_type in SDE_TYPES:
        for num_steps in step_counts:
            mean, variance = sample_final_moments(sde_type, num_steps, eta, seed=seed)
            rows.append(
                {
                    "sde": sde_type,
                    "steps": num_steps,
                    "mean_rel_err": abs(mean - DATA_MEAN) / DATA_MEAN,
                    "var_rel_err": abs(variance - DATA_STD**2) / DATA_STD**2,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--eta", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"Gaussian data N({DATA_MEAN}, {DATA_STD}^2), exact velocity, eta={args.eta}, 4096 x 16 samples")
    print(f"{'sde':<12}{'steps':>6}{'|mean err| / m':>16}{'|var err| / s^2':>17}")
    for row in marginal_error_table(args.steps, args.eta, args.seed):
        print(f"{row['sde']:<12}{row['steps']:>6}{row['mean_rel_err']:>16.4f}{row['var_rel_err']:>17.4f}")


if __name__ == "__main__":
    main()
