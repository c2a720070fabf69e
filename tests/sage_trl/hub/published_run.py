"""A finished tiny run as sage-train leaves it, for the Hub tests: its config, its outputs and the files a push
uploads from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from PIL import Image

from sage_trl import SageGRPOConfig, SageGRPOTrainer
from sage_trl.hub.card import ADAPTER_INFO_FILE
from sage_trl.run_folder import layout
from sage_trl.run_folder.layout import LORA_WEIGHT_NAME
from tests.sage_trl.tiny_trainer import make_args

PROMPTS = ["a red ball", "a blue cube", "a green cone", "a white star"]
WAN_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
REPO = "tester/sage-lora"
EVAL_RESULTS = {
    "before": {"mean_brightness": 0.5, "total": 0.5},
    "after": {"mean_brightness": 0.625, "total": 0.625},
    "prompts": ["a red ball", "a blue cube"],
    "seeds": [0, 1],
}
UPLOADED = {
    LORA_WEIGHT_NAME,
    ADAPTER_INFO_FILE,
    "sage_config.json",
    "metrics.jsonl",
    "eval_results.json",
    "summary.md",
    "reward_total.png",
    "reward_mean_brightness.png",
    "samples_before_after.gif",
    "README.md",
}


def tiny_args(output_dir: Path, **kwargs) -> SageGRPOConfig:
    """The trainer tests' tiny config (`tests.sage_trl.tiny_trainer.make_args`), recorded as a Wan run."""
    values = {"output_dir": str(output_dir), "model_name_or_path": WAN_ID, "gradient_accumulation_steps": 1}
    return make_args(output_dir.parent, **{**values, **kwargs})


def record_pipeline(run_dir: Path, pipeline_class: str) -> None:
    """The tiny analytic backbone has no diffusers pipeline: record the one a Wan run would have."""
    config = json.loads((run_dir / layout.CONFIG_FILE).read_text())
    config["run"]["base_model"]["pipeline_class"] = pipeline_class
    (run_dir / layout.CONFIG_FILE).write_text(json.dumps(config))


def write_run_outputs(run_dir: Path, trainer: SageGRPOTrainer) -> None:
    """What sage-train writes next to the weights: metrics, curves, samples, evaluation."""
    records = [{"step": h["step"], **h} for h in trainer.state.log_history if "loss" in h]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for name, colour in (("reward_total.png", "red"), ("reward_mean_brightness.png", "blue")):
        Image.new("RGB", (8, 6), colour).save(run_dir / name)
    frames = [Image.new("RGB", (8, 4), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(
        run_dir / "samples_before_after.gif", save_all=True, append_images=frames[1:], duration=100
    )
    (run_dir / "eval_results.json").write_text(json.dumps(EVAL_RESULTS))
    (run_dir / "summary.md").write_text("| component | before | after | change |\n|---|---|---|---|\n")
    record_pipeline(run_dir, "WanPipeline")


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def copy_run(run_dir: Path, target: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns(*skip))
    return target
