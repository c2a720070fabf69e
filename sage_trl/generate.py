"""``sage-generate``: videos from a base model, with or without a trained LoRA adapter, to a GIF or an mp4.

What it produces (one video per prompt and seed, tiled prompts x seeds into one file):

* a diffusers model: exactly ``pipe(prompt, generator=torch.Generator().manual_seed(seed),
  num_inference_steps=..., num_frames=..., height=..., width=..., output_type="pt")``, the pipeline's own
  sampler on its own scheduler, with the adapter loaded as users load it (``pipe.load_lora_weights`` for Wan,
  ``pipe.transformer.load_lora_adapter(path, prefix="transformer", use_safetensors=True)`` for HunyuanVideo
  1.5; an adapter folder of both Wan 2.2 A14B experts loads each file into its expert, the low-noise one with
  ``load_into_transformer_2=True``). With ``FlowMatchEulerDiscreteScheduler`` (HunyuanVideo 1.5; the tests' tiny pipelines) this is also
  what an ``ode`` rollout of `sage_env.DenoisingVectorEnv` gives; with the released Wan checkpoints (UniPC)
  it is UniPC sampling, which an Euler rollout on the same sigmas does not reproduce.
* any other backbone (the toy model): `sage_env.env.sample_videos`, the environment's own sampler with deterministic
  Euler steps (what an ``ode`` rollout of ``sage_env/Toy-v0`` gives).

Unset sizes, steps, shift, guidance and the file's frame rate are the model's
`sage_env.models.SamplingDefaults`; ``--shift`` replaces the scheduler's shift
(`sage_env.backbones.pipeline.PipelineBackbone.make_scheduler`). Bad arguments (a missing model or adapter
path, an existing folder as ``--output``, non-positive sizes or steps, negative seeds) are refused before any
model is loaded; an adapter that matches no module of the model is an error, not a warning.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sage_env.backbones import VideoBackbone, backbone_class, load_backbone
from sage_env.backbones.pipeline import PipelineBackbone
from sage_env.env import sample_videos
from sage_env.models import SamplingDefaults, check_local_reference, pipeline_class_of
from sage_env.video_io import WRITABLE_SUFFIXES, write_video
from sage_trl.cli.resolve import check_prompts
from sage_trl.config import TORCH_DTYPES
from sage_trl.model_facts import check_video_settings
from sage_trl.run_folder import layout

__all__ = [
    "GenerationSettings",
    "generate_main",
    "generate_videos",
    "parse_generate_arguments",
    "resolve_settings",
    "write_grid",
]

_MIN_GRID_SIDE = 64
"""Videos smaller than this (the toy's 16 x 16) are upscaled (nearest) in the written file."""


@dataclass(frozen=True)
class GenerationSettings:
    """Everything ``sage-generate`` does, resolved and checked before a model is loaded."""

    model: str
    adapter: str | None
    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    sampling: SamplingDefaults
    negative_prompt: str | None
    output: Path
    device: str
    dtype: torch.dtype


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sage-generate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy", help="Diffusers pipeline folder, Hub id, or 'toy'.")
    parser.add_argument(
        "--adapter", default=None, help="LoRA folder or file (diffusers format, from sage-train)."
    )
    parser.add_argument("--prompt", action="append", required=True, help="Prompt; repeat for several.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="One video per prompt and seed.")
    parser.add_argument("--num-frames", type=int, default=None, help="Default: the model's.")
    parser.add_argument("--height", type=int, default=None, help="Default: the model's.")
    parser.add_argument("--width", type=int, default=None, help="Default: the model's.")
    parser.add_argument("--steps", type=int, default=None, help="Denoising steps; default: the model's.")
    parser.add_argument(
        "--shift", type=float, default=None, help="Schedule shift; default: the model's own scheduler."
    )
    parser.add_argument("--guidance-scale", type=float, default=None, help="CFG scale; default: the model's.")
    parser.add_argument(
        "--negative-prompt", default=None, help="Negative prompt of CFG (default: the model's)."
    )
    parser.add_argument(
        "--output", default="samples.gif", help="Output .gif or .mp4 (a grid: prompts x seeds)."
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available).")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="float32", help="Model dtype.")
    return parser


def _check_output(output: str) -> Path:
    path = Path(output)
    if path.is_dir():
        raise ValueError(
            f"--output: {path} is a folder; pass a file name in it, e.g. {path / 'samples.gif'}."
        )
    if path.suffix.lower() not in WRITABLE_SUFFIXES:
        raise ValueError(f"--output: {path.name!r} must end in {' or '.join(WRITABLE_SUFFIXES)}.")
    return path


def _positive(name: str, value: int | None) -> int:
    if value is None:
        raise ValueError(f"--{name}: the model declares no default; pass one.")
    if value < 1:
        raise ValueError(f"--{name} must be a positive integer, got {value}.")
    return value


def _check_numbers(args: argparse.Namespace) -> None:
    negative = [seed for seed in args.seeds if seed < 0]
    if negative:
        raise ValueError(f"--seeds must be >= 0, got {negative}.")
    if args.shift is not None and not (math.isfinite(args.shift) and args.shift > 0):
        raise ValueError(f"--shift must be a finite number > 0, got {args.shift}.")
    if args.guidance_scale is not None and not math.isfinite(args.guidance_scale):
        raise ValueError(f"--guidance-scale must be finite, got {args.guidance_scale}.")


def _check_device(device: str | None) -> str:
    """``--device``, or the default (cuda when there is one); a device this machine does not have is an error."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device name; use cpu, cuda or cuda:N.") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available.get(parsed.type, True):
        raise ValueError(f"--device {device}: this machine has no {parsed.type} device; use --device cpu.")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s).")
    return device


def resolve_settings(args: argparse.Namespace) -> GenerationSettings:
    """Check the arguments and fill the unset ones from the model's `sage_env.models.SamplingDefaults`.

    Reads at most the model's ``model_index.json``; raises ``ValueError`` naming the argument and the fix.
    """
    output = _check_output(args.output)
    _check_numbers(args)
    check_prompts(args.prompt, "--prompt", toy_grammar=False)
    device = _check_device(args.device)
    if args.adapter is not None:
        check_local_reference(args.adapter, "--adapter")
    defaults = backbone_class(pipeline_class_of(args.model, download=True)).sampling_defaults
    sizes = {
        name: _positive(flag, given if given is not None else declared)
        for name, flag, given, declared in (
            ("num_frames", "num-frames", args.num_frames, defaults.num_frames),
            ("height", "height", args.height, defaults.height),
            ("width", "width", args.width, defaults.width),
            ("num_steps", "steps", args.steps, defaults.num_steps),
        )
    }
    check_video_settings(args.model, None, sizes["num_frames"], sizes["height"], sizes["width"])
    chosen = SamplingDefaults(**sizes, shift=args.shift, guidance_scale=args.guidance_scale, fps=None)
    return GenerationSettings(
        model=args.model,
        adapter=args.adapter,
        prompts=tuple(args.prompt),
        seeds=tuple(args.seeds),
        sampling=chosen.filled_from(defaults),
        negative_prompt=args.negative_prompt,
        output=output,
        device=device,
        dtype=TORCH_DTYPES[args.dtype],
    )


def parse_generate_arguments(argv: Sequence[str] | None = None) -> GenerationSettings:
    """The command line of ``sage-generate`` as checked `GenerationSettings` (`resolve_settings`)."""
    return resolve_settings(_parser().parse_args(argv))


def generate_videos(settings: GenerationSettings) -> torch.Tensor:
    """Load the model (and adapter) and sample every (prompt, seed): ``(P * S, F, 3, H, W)`` float32 in [0, 1]."""
    backbone = load_backbone(
        settings.model, torch_dtype=settings.dtype, device=settings.device, **_adapter_experts(settings.adapter)
    )
    # A size the model cannot make is an error here; the pipelines would silently round it.
    backbone.latent_shape(settings.sampling.num_frames, settings.sampling.height, settings.sampling.width)
    if settings.adapter is not None:
        backbone.load_lora_weights(settings.adapter)
    if isinstance(backbone, PipelineBackbone):
        return _pipeline_videos(backbone, settings)
    return _sampled_videos(backbone, settings)


def _adapter_experts(adapter: str | None) -> dict[str, str]:
    """The Wan 2.2 expert(s) an adapter folder of sage-train belongs to, so that each file loads into its expert:
    the run's ``expert`` (its ``sage_config.json``), else ``"both"`` for a folder with one file per expert
    (`layout.EXPERT_2_LORA_WEIGHT_NAME` beside the usual one); nothing for other adapters."""
    if adapter is None or not Path(adapter).is_dir():
        return {}
    folder, expert = Path(adapter), None
    if (folder / layout.CONFIG_FILE).is_file():
        try:
            expert = json.loads((folder / layout.CONFIG_FILE).read_text()).get("expert")
        except (json.JSONDecodeError, AttributeError) as error:
            raise ValueError(f"--adapter: {folder / layout.CONFIG_FILE} is not a sage-train config ({error}).") from error
    if expert is None and (folder / layout.EXPERT_2_LORA_WEIGHT_NAME).is_file():
        expert = "both"
    return {"expert": expert} if expert else {}


def _sampled_videos(backbone: VideoBackbone, settings: GenerationSettings) -> torch.Tensor:
    prompts = [prompt for prompt in settings.prompts for _ in settings.seeds]
    seeds = list(settings.seeds) * len(settings.prompts)
    return sample_videos(
        backbone, prompts, seeds, settings.sampling, negative_prompt=settings.negative_prompt
    ).cpu()


def _pipeline_videos(backbone: PipelineBackbone, settings: GenerationSettings) -> torch.Tensor:
    """``pipe(...)`` once per (prompt, seed), each with its own seeded generator (as the env draws noise)."""
    pipeline, sampling = backbone.pipeline, settings.sampling
    if sampling.shift is not None:
        pipeline.scheduler = backbone.make_scheduler(sampling.shift)
    arguments = {
        "negative_prompt": settings.negative_prompt,
        "num_frames": sampling.num_frames,
        "height": sampling.height,
        "width": sampling.width,
        "num_inference_steps": sampling.num_steps,
        "output_type": "pt",
    }
    if sampling.guidance_scale is not None:
        _set_guidance(pipeline, arguments, sampling.guidance_scale)
    videos = [
        pipeline(prompt=prompt, generator=torch.Generator().manual_seed(seed), **arguments)
        .frames.float()
        .cpu()
        for prompt in settings.prompts
        for seed in settings.seeds
    ]
    return torch.cat(videos)


def _set_guidance(pipeline: object, arguments: dict, guidance_scale: float) -> None:
    """``guidance_scale=`` where ``__call__`` takes it (Wan); else a copy of ``pipe.guider`` with that scale."""
    if "guidance_scale" in inspect.signature(type(pipeline).__call__).parameters:
        arguments["guidance_scale"] = guidance_scale
    elif getattr(pipeline, "guider", None) is not None:
        pipeline.guider = pipeline.guider.new(guidance_scale=guidance_scale)
    else:
        raise ValueError(
            f"--guidance-scale: {type(pipeline).__name__} takes no guidance scale; leave it unset."
        )


def write_grid(videos: torch.Tensor, path: str | Path, fps: float, columns: int) -> Path:
    """Tile ``(N, F, 3, H, W)`` videos (N a multiple of ``columns``) into one .gif or .mp4 at ``fps``."""
    count, num_frames, channels, height, width = videos.shape
    scale = max(1, math.ceil(_MIN_GRID_SIDE / min(height, width)))
    videos = videos.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    rows = count // columns
    grid = videos.reshape(rows, columns, num_frames, channels, height * scale, width * scale)
    grid = grid.permute(2, 3, 0, 4, 1, 5).reshape(num_frames, channels, rows * height * scale, -1)
    return write_video(grid, path, fps)


def generate_main(argv: Sequence[str] | None = None) -> None:
    """``sage-generate``: sample videos from a base model, with or without a trained adapter, to a .gif or .mp4."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = resolve_settings(args)
        videos = generate_videos(settings)
    except ValueError as error:
        parser.exit(2, f"sage-generate: error: {error}\n")
    path = write_grid(videos, settings.output, settings.sampling.fps, columns=len(settings.seeds))
    print(
        f"{len(videos)} videos ({len(settings.prompts)} prompts x {len(settings.seeds)} seeds) written to {path}"
    )


if __name__ == "__main__":
    generate_main()
