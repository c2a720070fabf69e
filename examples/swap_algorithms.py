"""Swap RL algorithms against the same environment: a plain gymnasium loop, CleanRL style.

    python examples/swap_algorithms.py --algorithm sage_grpo
    python examples/swap_algorithms.py --algorithm flow_grpo --iterations 20
    python examples/swap_algorithms.py --algorithm dance_grpo --learning-rate 3e-3
    python examples/swap_algorithms.py --algorithm diffusion_nft

Every registered agent (`agents.list_agents()`) trains against `sage_env/Toy-v0`, the built-in toy world,
with the SDE its algorithm explores with; the script prints the rollout reward per iteration.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, fields

import gymnasium as gym
import torch
from peft import LoraConfig

import agents
import sage_env  # noqa: F401  (registers the sage_env/ environment ids)
from sage_trl.lora import add_lora


@dataclass
class Args:
    algorithm: str = "sage_grpo"
    """registered agent name (see agents.list_agents())"""
    iterations: int = 10
    """rollout + update iterations"""
    prompts_per_batch: int = 8
    """distinct prompts per rollout"""
    group_size: int = 4
    """generations per prompt (the GRPO group G)"""
    learning_rate: float = 3e-3
    """Adam learning rate of the LoRA adapter"""
    lora_rank: int = 8
    """rank of the LoRA adapter on the attention projections"""
    seed: int = 0
    """seed of the environment and of the adapter's initialisation"""
    threads: int = 0
    """torch CPU threads (0: torch's default)"""


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for spec in fields(Args):
        flag = "--" + spec.name.replace("_", "-")
        parser.add_argument(flag, type=type(spec.default), default=spec.default)
    return Args(**vars(parser.parse_args()))


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # -- environment: the toy world with the SDE of the chosen algorithm ----------------------------
    algorithm_config = agents.ALGORITHM_CONFIGS[args.algorithm]()
    envs = gym.make_vec(
        "sage_env/Toy-v0",
        num_envs=args.prompts_per_batch * args.group_size,
        group_size=args.group_size,
        sde=algorithm_config.sde,
        eta=algorithm_config.eta,
        log_prob_kind=algorithm_config.log_prob_kind,
    )

    # -- agent: LoRA on the env's prior, the algorithm's published defaults, the env's SDE settings ---
    add_lora(envs.unwrapped.backbone, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank))
    agent = agents.make(args.algorithm, env=envs, learning_rate=args.learning_rate, micro_batch_size=64)

    # -- training loop --------------------------------------------------------------------------------
    for iteration in range(args.iterations):
        start = time.perf_counter()
        # An algorithm that chooses its rollout schedule (MixGRPO's sliding SDE window) asks for it here.
        observation, _ = envs.reset(seed=args.seed + iteration, options=agent.rollout_options(envs))
        while True:
            observation, _reward, terminated, _truncated, _info = envs.step(agent.act(observation))
            if terminated.all():
                break
        metrics = agent.update(envs.unwrapped.trajectory)
        metrics["time/iteration"] = time.perf_counter() - start
        components = " ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in metrics.items()
                              if k.startswith("reward/") and k not in ("reward/total", "reward/invalid_count"))
        print(f"iteration {iteration:3d} | reward/total={metrics['reward/total']:.4f} {components} | "
              f"policy_loss={metrics.get('policy_loss', 0.0):+.2e} | "
              f"time/iteration={metrics['time/iteration']:.1f}s", flush=True)


if __name__ == "__main__":
    main()
