"""VideoAlign's checkpoint folder, model_config.json, prompt template, base config and tokenizer checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2VLConfig

from sage_env.rewards.videoalign import (
    VideoAlignReward,
    find_videoalign_checkpoint,
    load_prompt_template,
)
from tests.fixtures.videoalign import STAND_IN_TEMPLATE, TinyVideoAlign, tiny_videoalign_tokenizer
from tests.sage_env.rewards.videoalign.helpers import (
    FPS,
    PROMPTS,
    edit_model_config,
    load_reward,
    make_videos,
    raw_scores,
    replace_tokenizer,
)

# -- prompt template and checkpoint folder ----------------------------------------------------------


def test_prompt_template_is_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "template.txt"
    path.write_text(STAND_IN_TEMPLATE.replace("\n", "\r\n"), encoding="utf-8", newline="")
    assert load_prompt_template(path) == STAND_IN_TEMPLATE.replace("\n", "\r\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no placeholder <|VQ_reward|> <|MQ_reward|> <|TA_reward|>", r"\{text_prompt\} exactly once"),
        ("{text_prompt} <|VQ_reward|> <|TA_reward|>", "exactly once, in that order"),
        ("{text_prompt} <|MQ_reward|> <|VQ_reward|> <|TA_reward|>", "exactly once, in that order"),
        ("{text_prompt} <|VQ_reward|> <|VQ_reward|> <|MQ_reward|> <|TA_reward|>", "exactly once"),
    ],
)
def test_bad_prompt_templates(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "template.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_prompt_template(path)


def test_missing_template_explains_where_to_get_it(videoalign_copy: Path) -> None:
    (videoalign_copy / "prompt_template.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"prompt_template.py, see docs/rewards.md"):
        load_reward(videoalign_copy)


def test_template_path_argument(videoalign_copy: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "my_template.txt"
    (videoalign_copy / "prompt_template.txt").rename(elsewhere)
    assert load_reward(videoalign_copy, template_path=elsewhere, lazy=True).template == STAND_IN_TEMPLATE


def test_latest_step_is_the_default_and_steps_sort_numerically(tiny_videoalign: TinyVideoAlign) -> None:
    assert tiny_videoalign.steps == (9, 10)
    assert find_videoalign_checkpoint(tiny_videoalign.path).step == 10
    checkpoint = find_videoalign_checkpoint(tiny_videoalign.path, step=9)
    assert checkpoint.weights_path == tiny_videoalign.path / "checkpoint-9" / "model.pth"
    with pytest.raises(FileNotFoundError, match=r"No checkpoint-7 .* available steps: \[9, 10\]"):
        find_videoalign_checkpoint(tiny_videoalign.path, step=7)


def test_step_picks_the_checkpoint(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = make_videos(2)
    older = load_reward(tiny_videoalign.path, step=9)
    # The fixture stores the older step's head negated.
    torch.testing.assert_close(
        raw_scores(older(videos, PROMPTS[:2], fps=FPS)),
        -raw_scores(videoalign_reward(videos, PROMPTS[:2], fps=FPS)),
    )


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("model_config.json", "model_config.json not found"),
        ("checkpoint-10/model.pth", "model.pth not found"),
        ("checkpoint-10/tokenizer", "Tokenizer folder .* not found"),
    ],
)
def test_missing_files(videoalign_copy: Path, remove: str, message: str) -> None:
    target = videoalign_copy / remove
    if target.is_dir():
        for child in target.iterdir():
            child.unlink()
        target.rmdir()
    else:
        target.unlink()
    with pytest.raises(FileNotFoundError, match=message):
        load_reward(videoalign_copy)


def test_no_checkpoint_folders(tmp_path: Path) -> None:
    (tmp_path / "model_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="No checkpoint-<step> folder"):
        find_videoalign_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["model_config"].update(output_dim=1), "output_dim=1 but the reward head has 3 outputs"),
        (lambda c: c["peft_lora_config"].pop("lora_alpha"), "no peft_lora_config.lora_alpha"),
        (lambda c: c["model_config"].update(use_special_tokens=False), "use_special_tokens is false"),
        (lambda c: c["data_config"].update(sample_type="multi_pts"), "only 'uniform'"),
        (lambda c: c["inference_config"].pop("TA_std"), r"lacks \['TA_std'\]"),
        (lambda c: c["inference_config"].update(MQ_std=0.0), "must be positive"),
    ],
)
def test_model_config_errors(videoalign_copy: Path, edit, message: str) -> None:
    edit_model_config(videoalign_copy, edit)
    with pytest.raises(ValueError, match=message):
        load_reward(videoalign_copy)


# -- base config, tokenizer, chat template ------------------------------------------------------------


def test_base_config_sources(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    edit_model_config(videoalign_copy, lambda c: c["model_config"].update(model_name_or_path="/nowhere/qwen"))
    with pytest.raises(OSError, match="Could not load the Qwen2-VL config from '/nowhere/qwen'"):
        load_reward(videoalign_copy, lazy=True)
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    assert (
        load_reward(videoalign_copy, base_config=config, lazy=True).config.video_token_id
        == config.video_token_id
    )
    assert (
        load_reward(videoalign_copy, base_config=tiny_videoalign.base_path, lazy=True).config.model_type
        == "qwen2_vl"
    )
    (videoalign_copy / "config.json").write_text((tiny_videoalign.base_path / "config.json").read_text())
    assert load_reward(videoalign_copy, lazy=True).config.text_config.hidden_size == 32


def test_wrong_base_model_type(tmp_path: Path, videoalign_copy: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    with pytest.raises(ValueError, match="'qwen2_5_vl' config; VideoAlign is built on Qwen2-VL"):
        load_reward(videoalign_copy, base_config=tmp_path, lazy=True)


def test_wrong_base_architecture_is_caught_by_shapes(
    tiny_videoalign: TinyVideoAlign, videoalign_copy: Path
) -> None:
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    config.text_config.intermediate_size = 64
    with pytest.raises(ValueError, match=r"mlp.gate_proj.weight: checkpoint \(48, 32\), model \(64, 32\)"):
        load_reward(videoalign_copy, base_config=config)


def test_tokenizer_without_reward_tokens(videoalign_copy: Path) -> None:
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocabulary = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    plain = Qwen2Tokenizer(vocab=vocabulary, merges=[], chat_template="{{ messages }}")
    replace_tokenizer(videoalign_copy, plain)
    with pytest.raises(ValueError, match=r"no token <\|VQ_reward\|>"):
        load_reward(videoalign_copy, lazy=True)


def test_chat_template_missing_or_given(videoalign_copy: Path, tmp_path: Path) -> None:
    tokenizer = tiny_videoalign_tokenizer()
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    replace_tokenizer(videoalign_copy, tokenizer)
    with pytest.raises(ValueError, match="has no chat template; pass chat_template="):
        load_reward(videoalign_copy, lazy=True)
    jinja = tmp_path / "chat_template.json"
    jinja.write_text(json.dumps({"chat_template": template}))
    reward = load_reward(videoalign_copy, chat_template=jinja, lazy=True)
    assert reward.build_text("a cat").startswith("<|im_start|>system\n")


def test_video_token_must_match_the_config(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path) -> None:
    config = Qwen2VLConfig.from_pretrained(tiny_videoalign.base_path)
    config.video_token_id = 5
    with pytest.raises(ValueError, match="differs from the config's video_token_id 5"):
        load_reward(videoalign_copy, base_config=config, lazy=True)
