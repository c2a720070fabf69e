"""A SageGRPOTrainer on the tiny analytic backbone of tests.doubles: the set-up the trainer tests share."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig
from transformers import TrainerCallback

from sage_trl import SageGRPOConfig, SageGRPOTrainer
from tests.doubles import LinearBackbone, mean_brightness

PROMPTS = ["a red ball", "a blue cube", "a green cone", "a white star"]


def make_args(tmp_path: Path, **kwargs) -> SageGRPOConfig:
    values = {
        "output_dir": str(tmp_path / "run"),
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_generations": 4,
        "num_frames": 2,
        "height": 4,
        "width": 4,
        "num_inference_steps": 4,
        "learning_rate": 5e-2,
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        "micro_batch_size": 5,
        "kl_warmup_steps": 2,
    }
    values.update(kwargs)
    return SageGRPOConfig(**values)


def lora() -> LoraConfig:
    return LoraConfig(
        r=2, lora_alpha=4, target_modules=["mix", "prompt_proj", "sigma_proj"], init_lora_weights="gaussian"
    )


def make_trainer(
    tmp_path: Path, reward=mean_brightness, peft: bool = True, eval_dataset=None, **kwargs
) -> SageGRPOTrainer:
    return SageGRPOTrainer(
        LinearBackbone(),
        reward,
        args=make_args(tmp_path, **kwargs),
        train_dataset=PROMPTS,
        eval_dataset=eval_dataset,
        peft_config=lora() if peft else None,
    )


def named_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


class Interrupt(TrainerCallback):
    """Stops a run as a kill would, with ``KeyboardInterrupt`` at optimizer step ``step``: once that step is done
    (``after="step"``) or once its evaluation was logged and written (``after="evaluation"``)."""

    def __init__(self, step: int, after: str = "step") -> None:
        self.step, self.after = step, after

    def _interrupt(self, state, event: str) -> None:
        if state.global_step == self.step and event == self.after:
            raise KeyboardInterrupt(f"interrupted after the {event} of step {self.step}")

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self._interrupt(state, "step")

    def on_evaluate(self, args, state, control, **kwargs) -> None:
        self._interrupt(state, "evaluation")
