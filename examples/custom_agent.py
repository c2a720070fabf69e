"""Write your own RL algorithm, register it, and train it in the same loop as the built-in ones.

    python examples/custom_agent.py --iterations 10

`WinnerTakesAllAgent` (about 30 lines) pushes up the log-likelihood of the best video of each group and down
that of the worst, re-scoring the recorded transitions with `sage_env.sde.sde_step`; it knows nothing about
the trainer, only the `agents.Agent` interface and the environment's `Trajectory`.
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import torch
from peft import LoraConfig

import agents
import sage_env
from sage_env import sde
from sage_trl.lora import add_lora


class WinnerTakesAllAgent(agents.Agent):
    """Raise log pi of each group's best rollout and lower its worst one's, over the stochastic steps."""

    def __init__(self, policy, learning_rate: float = 3e-3) -> None:
        super().__init__(policy)
        self.parameters = [p for p in policy.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.parameters, lr=learning_rate)

    def act(self, observation: dict[str, Any]) -> torch.Tensor:
        conditioning = self.policy.encode_prompts(list(observation["prompt"]))
        latents = torch.as_tensor(observation["latents"], device=self.policy.device)  # numpy by default
        sigma = torch.as_tensor(observation["sigma"], device=self.policy.device)
        with torch.no_grad():
            return self.policy.predict_velocity(latents, sigma, conditioning)

    def update(self, trajectory: sage_env.Trajectory) -> dict[str, float]:
        rewards = trajectory.rewards.total.view(-1, int((trajectory.group_index == 0).sum()))
        signs = torch.zeros_like(rewards)
        signs.scatter_(1, rewards.argmax(1, keepdim=True), 1.0).scatter_(1, rewards.argmin(1, keepdim=True), -1.0)
        signs = signs.flatten()
        conditioning = self.policy.encode_prompts(list(trajectory.prompts))
        self.optimizer.zero_grad()
        for step in torch.nonzero(trajectory.trainable.all(0)).flatten().tolist():
            latents, sigmas = trajectory.latents[:, step], trajectory.sigmas
            velocity = self.policy.predict_velocity(latents, sigmas[:, step], conditioning)
            out = sde.sde_step(trajectory.sde_types[step], latents, velocity, sigmas[:, step], sigmas[:, step + 1],
                               trajectory.eta, x_next=trajectory.latents[:, step + 1])
            (-(signs * out.log_prob).mean()).backward()
        self.optimizer.step()
        return {"reward/total": float(trajectory.rewards.total.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--prompts-per-batch", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    # -- register the algorithm: from now on agents.make("winner_takes_all", ...) builds it ------------
    agents.register("winner_takes_all", lambda policy, **config: WinnerTakesAllAgent(policy, **config))

    # -- the same loop as examples/swap_algorithms.py -----------------------------------------------
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=args.prompts_per_batch * args.group_size,
                        group_size=args.group_size)
    add_lora(envs.unwrapped.backbone, LoraConfig(r=8, lora_alpha=16))
    agent = agents.make("winner_takes_all", env=envs, learning_rate=3e-3)
    for iteration in range(args.iterations):
        observation, _ = envs.reset(seed=args.seed + iteration)
        while True:
            observation, _, terminated, _, _ = envs.step(agent.act(observation))
            if terminated.all():
                break
        metrics = agent.update(envs.unwrapped.trajectory)
        print(f"iteration {iteration:3d} | reward/total={metrics['reward/total']:.4f}", flush=True)


if __name__ == "__main__":
    main()
