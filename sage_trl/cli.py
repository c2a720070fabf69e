"""Command-line entry points: ``sage-train`` (the main job) and ``sage-generate``.

``sage-train`` with no arguments trains SAGE-GRPO with LoRA on the built-in toy world on CPU (defaults in
``sage_trl/configs/toy.yaml``); ``--config run.yaml`` and ``--<field> value`` overrides select anything else,
TRL-style (every field of `SageGRPOConfig` and `TrainScriptArguments`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

__all__ = [
    "TOY_CONFIG",
    "TrainScriptArguments",
    "generate_main",
    "resolve_reward",
    "run_training",
    "train_main",
]

TOY_CONFIG = Path(__file__).with_name("configs") / "toy.yaml"
"""The defaults of ``sage-train`` without arguments (the toy world on CPU)."""


@dataclass
class TrainScriptArguments:
    """What ``sage-train`` needs besides `SageGRPOConfig`: rewards, prompts, evaluation, LoRA."""

    reward: list[str] = field(
        default_factory=lambda: ["toy"],
        metadata={
            "help": (
                "Reward functions: 'toy' (the toy world's VQ/MQ/TA), 'videoalign:<checkpoint dir>' (VideoAlign), or "
                "'package.module:function' (any function following the reward protocol). Several may be given."
            )
        },
    )
    dataset_name: str = field(
        default="toy",
        metadata={
            "help": (
                "Training prompts: 'toy', a text file (one prompt per line), or a datasets name/folder with a 'prompt' "
                "column."
            )
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Split of a datasets dataset."})
    eval_prompts: str = field(
        default="toy",
        metadata={
            "help": (
                "Held-out prompts for the before/after evaluation: 'toy', a text file, or 'none' to skip it."
            )
        },
    )
    num_eval_prompts: int = field(default=8, metadata={"help": "How many held-out prompts to evaluate."})
    eval_seeds: list[int] = field(
        default_factory=lambda: [0, 1], metadata={"help": "Seeds per held-out prompt."}
    )
    use_peft: bool = field(default=True, metadata={"help": "Train a LoRA adapter (False: full fine-tuning)."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules LoRA adapts; None: the backbone's defaults (attention projections)."},
    )


# ----------------------------------------------------------------------------------------------
# Resolution of rewards and prompts
# ----------------------------------------------------------------------------------------------


def resolve_reward(spec: str, offload: bool = False) -> Callable:
    """Turn a reward spec (see `TrainScriptArguments.reward`) into a reward function.

    ``offload``: a VideoAlign model loads on first use and leaves the accelerator between scoring calls.
    """
    if spec == "toy":
        from sage_env.rewards.toy import ToyReward

        return ToyReward()
    if spec.startswith("videoalign:"):
        from sage_env.rewards.videoalign import VideoAlignReward

        return VideoAlignReward(spec.split(":", 1)[1], lazy=offload, offload_between_calls=offload)
    if ":" in spec:
        module_name, function_name = spec.split(":", 1)
        try:
            return getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"Cannot import reward {spec!r}: {error}.") from error
    raise ValueError(
        f"Unknown reward {spec!r}; use 'toy', 'videoalign:<checkpoint dir>' or 'package.module:function'."
    )


def _prompts_from_file(path: Path) -> list[str]:
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts (one per line expected).")
    return prompts


def resolve_train_prompts(name: str, split: str) -> Any:
    """Training prompts: a list, or a `datasets.Dataset` with a ``prompt`` column."""
    if name == "toy":
        from sage_env.toy.world import TOY_TRAIN_PROMPTS

        return list(TOY_TRAIN_PROMPTS)
    if Path(name).suffix == ".txt":
        return _prompts_from_file(Path(name))
    from datasets import load_dataset

    return load_dataset(name, split=split)


def resolve_eval_prompts(name: str, count: int, seeds: Sequence[int]) -> tuple[list[str], list[int]]:
    """Held-out ``(prompts, seeds)``: every prompt with every seed."""
    if name == "none":
        return [], []
    if name == "toy":
        from sage_env.toy.world import TOY_EVAL_PROMPTS

        prompts = list(TOY_EVAL_PROMPTS)
    else:
        prompts = _prompts_from_file(Path(name))
    prompts = prompts[:count]
    return [p for p in prompts for _ in seeds], [s for _ in prompts for s in seeds]


# ----------------------------------------------------------------------------------------------
# sage-train
# ----------------------------------------------------------------------------------------------


def parse_train_arguments(argv: Sequence[str] | None) -> tuple[TrainScriptArguments, Any]:
    """TRL-style parsing; without ``--config``, a toy-world run starts from ``configs/toy.yaml``."""
    from trl import TrlParser

    from sage_trl.config import SageGRPOConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = TrlParser((TrainScriptArguments, SageGRPOConfig))
    if "--config" not in argv and _model_from_argv(argv) == "toy":
        argv = ["--config", str(TOY_CONFIG), *argv]
    script_args, config = parser.parse_args_and_config(argv)
    return script_args, config


def _model_from_argv(argv: Sequence[str]) -> str:
    for index, token in enumerate(argv):
        if token.startswith("--model_name_or_path"):
            return token.split("=", 1)[1] if "=" in token else argv[index + 1]
    return "toy"


def _lora_config(script_args: TrainScriptArguments) -> Any:
    if not script_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=script_args.lora_r,
        lora_alpha=script_args.lora_alpha,
        lora_dropout=script_args.lora_dropout,
        target_modules=script_args.lora_target_modules,
        init_lora_weights=True,
    )


def _evaluate(trainer: Any, prompts: list[str], seeds: list[int]) -> Any:
    from sage_trl.evaluation import evaluate_policy

    args = trainer.args
    return evaluate_policy(
        trainer.backbone,
        trainer.reward,
        prompts,
        seeds,
        num_frames=args.num_frames,
        height=args.height,
        width=args.width,
        num_steps=args.num_inference_steps,
        shift=args.shift,
        guidance_scale=args.guidance_scale,
        negative_prompt=args.negative_prompt,
    )


def _write_run_config(script_args: TrainScriptArguments, config: Any, output_dir: Path) -> None:
    resolved = {
        "script": asdict(script_args),
        "training": json.loads(json.dumps(config.to_dict(), default=str)),
    }
    (output_dir / "run_config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))


def run_training(script_args: TrainScriptArguments, config: Any) -> dict[str, Any]:
    """Train, evaluate before/after on held-out prompts, and write the output folder; returns the summary."""
    from sage_trl import SageGRPOTrainer
    from sage_trl.outputs import MetricsFileCallback, StatusCallback

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_run_config(script_args, config, output_dir)
    rewards = [resolve_reward(spec, offload=config.reward_offload) for spec in script_args.reward]
    trainer = SageGRPOTrainer(
        None,
        rewards,
        args=config,
        train_dataset=resolve_train_prompts(script_args.dataset_name, script_args.dataset_split),
        peft_config=_lora_config(script_args),
        callbacks=[MetricsFileCallback(output_dir / "metrics.jsonl"), StatusCallback()],
    )
    _quiet_trainer_printing(trainer)
    eval_prompts, eval_seeds = resolve_eval_prompts(
        script_args.eval_prompts, script_args.num_eval_prompts, script_args.eval_seeds
    )
    before = _evaluate(trainer, eval_prompts, eval_seeds) if eval_prompts else None
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model(str(output_dir))
    summary = _finish_outputs(trainer, output_dir, before, eval_prompts, eval_seeds)
    if config.push_to_hub:
        trainer.push_to_hub()
    return summary


def _quiet_trainer_printing(trainer: Any) -> None:
    """The status line replaces the Trainer's progress bar and its printed log dictionaries."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)


def _finish_outputs(
    trainer: Any, output_dir: Path, before: Any, prompts: list[str], seeds: list[int]
) -> dict:
    from sage_trl.evaluation import summary_table
    from sage_trl.outputs import plot_reward_curves, save_comparison_gif

    if trainer.is_world_process_zero() and (output_dir / "metrics.jsonl").is_file():
        plot_reward_curves(output_dir / "metrics.jsonl", output_dir)
    if before is None:
        return {}
    after = _evaluate(trainer, prompts, seeds)
    summary = {
        "before": before.means(),
        "after": after.means(),
        "before_std": before.stds(),
        "after_std": after.stds(),
        "prompts": prompts,
        "seeds": seeds,
    }
    if trainer.is_world_process_zero():
        table = summary_table(before, after)
        (output_dir / "summary.md").write_text(f"# Held-out evaluation (deterministic sampling)\n\n{table}\n")
        (output_dir / "eval_results.json").write_text(json.dumps(summary, indent=2) + "\n")
        save_comparison_gif(
            before.videos,
            after.videos,
            output_dir / "samples_before_after.gif",
            fps=trainer.backbone.default_fps,
        )
        print(f"\nHeld-out reward, {len(prompts)} videos (before -> after training):\n{table}\n")
        print(f"Outputs written to {output_dir}")
    return summary


def train_main(argv: Sequence[str] | None = None) -> None:
    """``sage-train``: see the module docstring."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    script_args, config = parse_train_arguments(argv)
    run_training(script_args, config)


# ----------------------------------------------------------------------------------------------
# sage-generate
# ----------------------------------------------------------------------------------------------


def generate_main(argv: Sequence[str] | None = None) -> None:
    """``sage-generate``: sample videos from a base model, with or without a trained adapter, to a GIF."""
    parser = argparse.ArgumentParser(prog="sage-generate", description=generate_main.__doc__)
    parser.add_argument("--model", default="toy", help="Model folder, Hub id, or 'toy'.")
    parser.add_argument(
        "--adapter", default=None, help="Folder with pytorch_lora_weights.safetensors (diffusers LoRA)."
    )
    parser.add_argument("--prompt", action="append", required=True, help="Prompt; repeat for several.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="One video per prompt and seed.")
    parser.add_argument("--num-frames", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="Denoising steps (toy: 10).")
    parser.add_argument("--shift", type=float, default=None, help="Schedule shift (toy: 3).")
    parser.add_argument("--guidance-scale", type=float, default=None, help="CFG scale; default: the model's.")
    parser.add_argument("--output", default="samples.gif", help="Output GIF (a grid: prompts x seeds).")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available).")
    args = parser.parse_args(argv)
    videos = generate_videos(args)
    from sage_trl.outputs import save_video_gif

    path = save_video_gif(videos, args.output, columns=len(args.seeds))
    print(f"{len(videos)} videos written to {path}")


def _generation_defaults(model: str) -> dict[str, Any]:
    if model != "toy":
        return {"num_frames": 81, "height": 480, "width": 832, "steps": 20, "shift": 5.0}
    from sage_env.toy.sampling import TOY_NUM_STEPS, TOY_SHIFT
    from sage_env.toy.world import TOY_HEIGHT, TOY_NUM_FRAMES, TOY_WIDTH

    return {
        "num_frames": TOY_NUM_FRAMES,
        "height": TOY_HEIGHT,
        "width": TOY_WIDTH,
        "steps": TOY_NUM_STEPS,
        "shift": TOY_SHIFT,
    }


def unscored(videos: torch.Tensor, prompts: Sequence[str], **kwargs: Any) -> torch.Tensor:
    """The reward of plain generation: nothing is scored."""
    return torch.zeros(len(prompts))


def generate_videos(args: argparse.Namespace) -> torch.Tensor:
    """Deterministic (ODE) sampling of one video per prompt and seed; returns ``(N, F, 3, H, W)``."""
    from sage_env.backbones import load_backbone
    from sage_trl.evaluation import evaluate_policy

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backbone = load_backbone(args.model, device=device)
    if args.adapter is not None:
        backbone.load_lora_weights(args.adapter)
    defaults = _generation_defaults(args.model)
    settings = {
        key: getattr(args, key) if getattr(args, key, None) is not None else value
        for key, value in defaults.items()
    }
    prompts = [p for p in args.prompt for _ in args.seeds]
    seeds = [s for _ in args.prompt for s in args.seeds]
    result = evaluate_policy(
        backbone,
        unscored,
        prompts,
        seeds,
        num_frames=settings["num_frames"],
        height=settings["height"],
        width=settings["width"],
        num_steps=settings["steps"],
        shift=settings["shift"],
        guidance_scale=args.guidance_scale
        if args.guidance_scale is not None
        else backbone.default_guidance_scale,
    )
    return result.videos


if __name__ == "__main__":
    train_main()
