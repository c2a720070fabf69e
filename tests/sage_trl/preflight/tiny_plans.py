"""What the preflight tests share: the tiny pipeline's CPU run, a small LoRA, the example configs as
``sage-train --config`` parses them, and the tolerance of a trace against the CPU allocator."""

from __future__ import annotations

from pathlib import Path

from peft import LoraConfig

from sage_trl import SageGRPOConfig
from sage_trl.cli import parse_train_arguments

REPOSITORY = Path(__file__).resolve().parents[3]
CONFIGS = REPOSITORY / "examples" / "configs"
GIB = 2**30
EXACT_PHASES = ("encode prompts", "rollout step", "training micro-step", "optimizer step")
TOLERANCE = 0.05
"""Traced transient bytes lie within 5% below the CPU allocator's (PyTorch's CPU attention and matmul kernels
allocate small internal buffers that are not tensors: the "kernel workspaces" of `sage_trl.preflight.LIMITS`)."""


def tiny_config(model: Path, tmp_path: Path, **overrides: object) -> SageGRPOConfig:
    """A CPU run of the tiny pipeline: 2 videos of 5 x 32 x 32 per training step, 2 steps per round, CFG."""
    fields = {
        "output_dir": str(tmp_path / "run"),
        "model_name_or_path": str(model),
        "use_cpu": True,
        "bf16": False,
        "torch_dtype": "float32",
        "num_frames": 5,
        "height": 32,
        "width": 32,
        "num_inference_steps": 4,
        "guidance_scale": 5.0,
        "per_device_train_batch_size": 2,
        "steps_per_generation": 2,
        "gradient_accumulation_steps": 2,
        "num_generations": 2,
        "micro_batch_size": 2,
        "gradient_checkpointing": True,
        "vae_slicing": True,
        "report_to": "none",
        **overrides,
    }
    return SageGRPOConfig(**fields)


def tiny_lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8)


def example(name: str, *overrides: str) -> tuple[object, SageGRPOConfig]:
    """An example config parsed as ``sage-train --config`` parses it (``use_cpu``: this machine has no GPU)."""
    return parse_train_arguments(["--config", str(CONFIGS / name), "--use_cpu=true", *overrides])
