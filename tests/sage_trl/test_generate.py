"""sage-generate as a user runs it: the toy model, output files, adapters, and bad input refused before loading.

The diffusers models (sage-generate equal to ``pipe(...)``) are tested in tests/clients/test_diffusers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from peft import LoraConfig
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import sage_env  # noqa: F401  (registers the environment ids)
from sage_env.backbones import load_backbone
from sage_env.env import BackbonePolicy, run_episode
from sage_env.toy.env import TOY_ENV_DEFAULTS
from sage_env.video_io import read_video
from sage_trl import generate
from sage_trl.lora import LORA_WEIGHT_NAME, add_lora, save_lora_adapter

PROMPT = "a red square moving left"


def toy_adapter(directory: Path) -> Path:
    """A toy adapter saved by ``save_lora_adapter`` with non-zero ``lora_B`` (so it changes the videos)."""
    backbone = load_backbone("toy")
    add_lora(backbone, LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian"))
    with torch.no_grad():
        for name, parameter in backbone.transformer.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.05)
    save_lora_adapter(backbone, directory)
    return directory


def test_sage_generate_with_and_without_an_adapter(tmp_path: Path) -> None:
    base = tmp_path / "base.gif"
    generate.generate_main(["--prompt", PROMPT, "--seeds", "0", "1", "--output", str(base)])
    assert base.is_file()
    adapter = toy_adapter(tmp_path / "adapter")
    adapted = tmp_path / "adapted.gif"
    generate.generate_main(
        ["--prompt", PROMPT, "--seeds", "0", "1", "--adapter", str(adapter), "--output", str(adapted)]
    )
    assert adapted.read_bytes() != base.read_bytes()


def test_toy_videos_equal_an_ode_rollout_of_the_toy_env() -> None:
    settings = generate.parse_generate_arguments(["--prompt", PROMPT, "--seeds", "5", "6", "--device", "cpu"])
    assert (settings.sampling.num_steps, settings.sampling.shift) == (
        TOY_ENV_DEFAULTS["num_steps"],
        TOY_ENV_DEFAULTS["shift"],
    )
    videos = generate.generate_videos(settings)
    envs = gym.make_vec("sage_env/Toy-v0", num_envs=2, group_size=2, sde="ode", eta=0.0, array_mode="torch")
    env = envs.unwrapped
    trajectory = run_episode(
        env, BackbonePolicy(env.backbone, None), options={"prompts": [PROMPT], "seeds": [5, 6]}
    )
    torch.testing.assert_close(videos, trajectory.videos.cpu(), atol=1e-6, rtol=0)


def test_mp4_output_is_a_prompts_by_seeds_grid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    output = tmp_path / "grid.mp4"
    generate.generate_main(["--prompt", PROMPT, "--prompt", "a blue circle moving up", "--seeds", "0", "1",
                            "--steps", "2", "--device", "cpu", "--output", str(output)])  # fmt: skip
    frames, fps = read_video(output)
    # The toy's 16 x 16 videos are upscaled 4x: 2 prompts (rows) x 2 seeds (columns) of 64 x 64.
    assert frames.shape == (8, 3, 128, 128) and fps == 8.0
    assert "4 videos (2 prompts x 2 seeds)" in capsys.readouterr().out


def refuse(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """Run sage-generate, which must exit with status 2 before loading any model; return its error message."""

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(generate, "load_backbone", no_loading)
    with pytest.raises(SystemExit) as exit_info:
        generate.generate_main(["--prompt", PROMPT, *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/no/such/model"], "model: /no/such/model does not exist"),
        (["--model", "./missing-folder"], "model: ./missing-folder does not exist"),
        (["--adapter", "/no/such/adapter"], "--adapter: /no/such/adapter does not exist"),
        (["--output", "samples.png"], "--output: 'samples.png' must end in .mp4 or .gif"),
        (["--steps", "0"], "--steps must be a positive integer, got 0"),
        (["--height", "-16"], "--height must be a positive integer, got -16"),
        (["--num-frames", "0"], "--num-frames must be a positive integer"),
        (["--seeds", "1", "-2"], "--seeds must be >= 0, got [-2]"),
        (["--shift", "0"], "--shift must be a finite number > 0"),
    ],
)
def test_bad_arguments_are_refused_before_loading(argv, message, monkeypatch, capsys) -> None:
    assert message in refuse(argv, monkeypatch, capsys)


def test_an_existing_folder_as_output_is_refused_before_loading(tmp_path, monkeypatch, capsys) -> None:
    error = refuse(["--output", str(tmp_path)], monkeypatch, capsys)
    assert f"--output: {tmp_path} is a folder" in error and str(tmp_path / "samples.gif") in error


def rewrite_keys(adapter: Path, rename: Callable[[str], str]) -> None:
    """Rename the keys of a saved adapter, keeping its metadata (the LoraConfig)."""
    weights = adapter / LORA_WEIGHT_NAME
    with safe_open(weights, "pt") as handle:
        metadata = handle.metadata()
    save_file({rename(key): value for key, value in load_file(weights).items()}, weights, metadata=metadata)


@pytest.mark.parametrize(
    "rename",
    [
        # No "transformer." prefix (peft's own format): diffusers only warns and loads nothing.
        lambda key: key.removeprefix("transformer."),
        # Module names this model does not have, as in an adapter of another architecture.
        lambda key: key.replace(".attn", ".other_attn"),
    ],
    ids=["no-prefix", "other-modules"],
)
@pytest.mark.filterwarnings("ignore:While injecting the PEFT adapters:RuntimeWarning")  # peft, other-modules
def test_an_adapter_that_matches_no_module_is_an_error(rename, tmp_path, capsys) -> None:
    adapter = toy_adapter(tmp_path / "adapter")
    rewrite_keys(adapter, rename)
    output = tmp_path / "out.gif"
    with pytest.raises(SystemExit) as exit_info:
        generate.generate_main(["--prompt", PROMPT, "--adapter", str(adapter), "--output", str(output)])
    assert exit_info.value.code == 2 and not output.exists()
    assert f"adapter: {adapter}" in capsys.readouterr().err


def test_sizes_the_model_cannot_make_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        generate.generate_main(["--prompt", PROMPT, "--height", "15", "--output", str(tmp_path / "x.gif")])
    assert "even height" in capsys.readouterr().err


class _Payload:
    """A pickle that creates a file when unpickled: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("planted", [LORA_WEIGHT_NAME, "pytorch_lora_weights.bin"])
def test_a_planted_pickle_as_adapter_is_refused_and_runs_nothing(
    planted: str, tmp_path: Path, capsys
) -> None:
    adapter, marker = tmp_path / "adapter", tmp_path / "payload-ran"
    adapter.mkdir()
    torch.save({"transformer.blocks.0.attn1.to_q.lora_A.weight": _Payload(marker)}, adapter / planted)
    output = tmp_path / "out.gif"
    with pytest.raises(SystemExit) as exit_info:
        generate.generate_main(["--prompt", PROMPT, "--adapter", str(adapter), "--output", str(output)])
    assert exit_info.value.code == 2 and not output.exists() and not marker.exists()
    assert f"adapter: {adapter}" in capsys.readouterr().err


def test_a_planted_pickle_in_a_wan_adapter_runs_nothing(tiny_wan_path: Path, tmp_path: Path) -> None:
    """Wan adapters load through ``pipe.load_lora_weights``, which falls back to ``.bin`` files."""
    adapter, marker = tmp_path / "adapter", tmp_path / "payload-ran"
    adapter.mkdir()
    torch.save(
        {"transformer.blocks.0.attn1.to_q.lora_A.weight": _Payload(marker)},
        adapter / "pytorch_lora_weights.bin",
    )
    with pytest.raises(ValueError, match="adapter"):
        load_backbone(str(tiny_wan_path)).load_lora_weights(adapter)
    assert not marker.exists()
