"""SageGRPOTrainer runs for tests/sage_trl/test_distributed.py, in one process or under a multi-process launch.

    python distributed_run.py ROOT --runs toy-lora,wan-full [--pipelines wan=PATH,hunyuan=PATH]
        [--max-steps N] [--kill-at STEP] [--resume] [--engine-on-cpu fsdp|deepspeed]

Trains each named run (``<toy|wan|wan22|hunyuan>-<lora|full>[-flat]``; wan22: two experts, both trained, flat: `flat_for_red` as the reward) in ``ROOT/<name>``, one after the other in the same
processes (a launch costs seconds of imports, a run less), with the same global batch whatever the number of
processes. ``--kill-at STEP`` stops every run once STEP is logged, after its checkpoint of step 3: the last run by
SIGKILL of every process (a real kill: nothing of the trainer runs after it), the others by an exception (so that
the launch goes on to the next run). ``--resume`` resumes every run from its latest checkpoint.
``--engine-on-cpu`` lets accelerate set FSDP or DeepSpeed up on CPU (`tests.sage_trl.accelerate_on_cpu`).

At exit, every process writes ``ROOT/exit-<rank>.json`` from an atexit handler registered before any trainer
exists, so it runs after the trainer's own (handlers run last-registered first): whether the process group was
destroyed by then (`sage_trl.distributed.release_process_group_at_exit`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from peft import LoraConfig
from transformers import TrainerCallback

from tests.sage_trl import accelerate_on_cpu

ENGINE = sys.argv[sys.argv.index("--engine-on-cpu") + 1] if "--engine-on-cpu" in sys.argv else None
if ENGINE is not None:  # before any Accelerator exists
    {"fsdp": accelerate_on_cpu.enable_fsdp, "deepspeed": accelerate_on_cpu.enable_deepspeed}[ENGINE]()

from sage_trl import SageGRPOConfig, SageGRPOTrainer  # noqa: E402
from tests.doubles import mean_brightness  # noqa: E402
from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE  # noqa: E402

PROMPTS = ["a red ball", "a blue cube", "a green cone"]
GLOBAL_BATCH = 4  # videos per optimizer step over all processes (one rollout: 2 prompts x 4 generations)
SETTINGS = {
    "max_steps": 5,
    "save_strategy": "steps",
    "save_steps": 3,  # mid-way through a rollout's two steps (num_iterations): resuming needs the buffered rollout
    "num_iterations": 2,
    "anchor_update_steps": 2,  # refreshed after steps 2 and 4
    "kl_strategy": "dual",
    "kl_coef_schedule": "constant",
    "beta": 0.1,
    "gradient_accumulation_steps": 2,
    "num_generations": 4,
    "num_inference_steps": 4,
    "micro_batch_size": 3,
    "learning_rate": 2e-2,
    "adam_epsilon": 1e-3,  # see test_distributed.py: Adam's default 1e-8 turns rounding noise into whole updates
    "seed": 0,
    "disable_tqdm": True,
    "report_to": "none",
    "logging_steps": 1,
}
SIZES = {
    "toy": {"num_frames": 2, "height": 8, "width": 8},
    "wan": TINY_VIDEO_SIZE,
    "wan22": {**TINY_VIDEO_SIZE, "expert": "both"},  # Wan 2.2 A14B's layout, both experts trained
    "hunyuan": TINY_VIDEO_SIZE,
}


def flat_for_red(videos: torch.Tensor, prompts: list[str], **kwargs) -> torch.Tensor:
    """`mean_brightness`, but one value for every video of a prompt with "red": that group has no signal, and the
    process holding it (each holds one group) trains on no pair at that step."""
    flat = torch.tensor(["red" in prompt for prompt in prompts], device=videos.device)
    return torch.where(flat, torch.full_like(flat, 0.5, dtype=videos.dtype), mean_brightness(videos, prompts))


class _InterruptedError(Exception):
    """Ends a run the way a crash would, without ending the launch."""


class _StopAt(TrainerCallback):
    """Stop the run once ``step`` is logged (after metrics.jsonl has it, before the next checkpoint)."""

    def __init__(self, step: int, kill: bool) -> None:
        self.step, self.kill = step, kill

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if state.global_step == self.step and "train_runtime" not in (logs or {}):
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise _InterruptedError


ALGORITHMS = {  # run-name variant: the algorithm's settings over SETTINGS
    "nft": {"algorithm": "diffusion_nft", "kl_strategy": "fixed"},  # likelihood-free, its old policy as anchor
    "mix": {"algorithm": "mix_grpo", "algorithm_args": {"sde_window_size": 2, "sde_window_shift_interval": 1}},
    "awm": {"algorithm": "awm", "kl_strategy": "fixed", "num_iterations": 1},  # on-policy only
    "guard": {"algorithm": "grpo_guard"},  # ratio_norm: the rollout's means buffered and checkpointed
    # One tree of 4 per process, advantages per tree level. Rollout forwards one video at a time: a tree's root is one
    # row per process but two in one process, and on a CPU one row takes a matrix-vector kernel whose rounding
    # differs from the matrix-matrix one (the runs then drift apart by ~3e-5, beyond WEIGHTS_ATOL).
    "branch": {"algorithm": "branch_grpo", "rollout_batch_size": 1},
    "seq": {"sequential_cfg": True},  # CFG branches checkpointed as wholes, around FSDP's gathers
    "flash": {  # each rollout on its own compressed schedule, solved with DPM-Solver++ after the window
        "algorithm": "mix_grpo_flash",
        "algorithm_args": {"sde_window_size": 2, "sde_window_shift_interval": 1},
    },
}


def build(
    name: str, root: Path, pipelines: dict[str, str], world_size: int, max_steps: int
) -> SageGRPOTrainer:
    """The trainer of run ``name`` (``<model>-<lora|full>[-flat|-nft|-mix|-awm|-guard|-branch|-flash]``) writing into ``root / name``."""
    model, mode, *variant = name.split("-")
    algorithm = ALGORITHMS.get(variant[0], {}) if variant else {}
    args = SageGRPOConfig(
        output_dir=str(root / name),
        per_device_train_batch_size=GLOBAL_BATCH // world_size,
        use_cpu=ENGINE != "deepspeed",  # accelerate never uses DeepSpeed with use_cpu (see accelerate_on_cpu)
        **SIZES[model],
        **{**SETTINGS, "max_steps": max_steps, **algorithm},
    )
    lora = LoraConfig(r=2, lora_alpha=4, init_lora_weights="gaussian") if mode == "lora" else None
    return SageGRPOTrainer(
        pipelines.get(model, model),
        flat_for_red if variant == ["flat"] else mean_brightness,
        args=args,
        train_dataset=PROMPTS,
        peft_config=lora,
    )


def record_exit(root: Path) -> None:
    """Write whether the process group is gone (see the module docstring)."""
    rank = os.environ.get("RANK", "0")
    state = {"process_group_destroyed": dist.is_available() and not dist.is_initialized()}
    (root / f"exit-{rank}.json").write_text(json.dumps(state))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--runs", required=True)
    parser.add_argument("--pipelines", default="", help="NAME=PATH,...: the tiny pipelines' folders")
    parser.add_argument("--max-steps", type=int, default=SETTINGS["max_steps"])
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--engine-on-cpu", choices=["fsdp", "deepspeed"])
    cli = parser.parse_args()
    torch.set_num_threads(1)
    cli.root.mkdir(parents=True, exist_ok=True)
    atexit.register(record_exit, cli.root)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    pipelines = dict(item.split("=", 1) for item in cli.pipelines.split(",") if item)
    names = cli.runs.split(",")
    for index, name in enumerate(names):
        trainer = build(name, cli.root, pipelines, world_size, cli.max_steps)
        if cli.kill_at is not None:
            trainer.add_callback(_StopAt(cli.kill_at, kill=index == len(names) - 1))
        with contextlib.suppress(_InterruptedError):
            trainer.train(resume_from_checkpoint=True if cli.resume else None)


if __name__ == "__main__":
    main()
