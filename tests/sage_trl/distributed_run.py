"""One SageGRPOTrainer optimizer step, run by test_distributed.py in one process or under torchrun.

Writes, from the main process, the global advantages and the trained LoRA weights to ``--output``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from peft import LoraConfig

from sage_trl import SageGRPOConfig, SageGRPOTrainer
from tests.doubles import LinearBackbone, mean_brightness

GLOBAL_BATCH = 8  # videos per generation round: 2 prompts x 4 generations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--world-size", type=int, default=1)
    cli = parser.parse_args()
    args = SageGRPOConfig(
        output_dir=str(Path(cli.output).parent / "run"),
        max_steps=1,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        per_device_train_batch_size=GLOBAL_BATCH // cli.world_size,
        gradient_accumulation_steps=1,
        num_generations=4,
        num_frames=2,
        height=4,
        width=4,
        num_inference_steps=4,
        learning_rate=5e-2,
        micro_batch_size=3,
        report_to="none",
    )
    lora = LoraConfig(
        r=2, lora_alpha=4, target_modules=["mix", "prompt_proj", "sigma_proj"], init_lora_weights="gaussian"
    )
    trainer = SageGRPOTrainer(
        LinearBackbone(),
        mean_brightness,
        args=args,
        train_dataset=["a red ball", "a blue cube", "a green cone"],
        peft_config=lora,
    )
    recorded = {}
    compute = trainer.algorithm.compute_advantages

    def record(prompts, rewards, valid, group_index):
        advantages, usable = compute(prompts, rewards, valid, group_index)
        recorded.update(prompts=list(prompts), rewards=rewards.cpu(), advantages=advantages.cpu())
        return advantages, usable

    trainer.algorithm.compute_advantages = record
    trainer.train()
    if trainer.accelerator.is_main_process:
        lora_weights = {
            n: p.detach().cpu() for n, p in trainer.backbone.transformer.named_parameters() if "lora_" in n
        }
        torch.save({**recorded, "lora": lora_weights}, cli.output)


if __name__ == "__main__":
    main()
