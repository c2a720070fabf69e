"""VideoAlign scores: against the in-memory merged model, batching, composites, video tensors and files, offloading."""

from __future__ import annotations

import math
from pathlib import Path

import imageio.v3 as iio
import pytest
import torch

from sage_env.rewards import CompositeReward
from sage_env.rewards.videoalign import REWARD_TOKENS, VideoAlignReward
from sage_env.video_io import write_video
from tests.fixtures.videoalign import NORMALIZATION, TinyVideoAlign
from tests.sage_env.rewards.videoalign.helpers import (
    FPS,
    FRAMES,
    HEIGHT,
    PROMPTS,
    WIDTH,
    edit_model_config,
    load_reward,
    make_videos,
    raw_scores,
    reference_inputs,
    reference_raw,
)

# -- scores -------------------------------------------------------------------------------------


def test_model_inputs_match_the_expected_tokens_and_pixels(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = make_videos()
    inputs = videoalign_reward.prepare_inputs(list(videos), PROMPTS, [FPS] * 3)
    expected = reference_inputs(tiny_videoalign, videos, PROMPTS)
    assert inputs.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(inputs[key], value, atol=1e-5, rtol=0, msg=key)
    lengths = inputs["attention_mask"].sum(dim=1)
    assert lengths[1] > lengths[0] > lengths[2]  # right padding exercised


def test_scores_equal_the_in_memory_merged_model(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    videos = make_videos()
    scores = videoalign_reward(videos, PROMPTS, fps=FPS)
    expected_raw = reference_raw(tiny_videoalign, reference_inputs(tiny_videoalign, videos, PROMPTS))
    torch.testing.assert_close(raw_scores(scores), expected_raw, atol=1e-5, rtol=1e-5)
    for index, metric in enumerate(REWARD_TOKENS):
        mean, std = NORMALIZATION[f"{metric.upper()}_mean"], NORMALIZATION[f"{metric.upper()}_std"]
        torch.testing.assert_close(
            scores[metric], (expected_raw[:, index] - mean) / std, atol=1e-5, rtol=1e-5
        )
    torch.testing.assert_close(scores["overall"], scores["vq"] + scores["mq"] + scores["ta"])
    assert list(scores) == ["vq", "mq", "ta", "vq_raw", "mq_raw", "ta_raw", "overall"]
    assert all(value.dtype == torch.float32 and value.shape == (3,) for value in scores.values())
    assert expected_raw.std(dim=0).min() > 1e-4  # the videos/prompts are told apart


def test_sequential_position_ids_are_what_decide_the_scores(
    tiny_videoalign: TinyVideoAlign, videoalign_reward: VideoAlignReward
) -> None:
    inputs = videoalign_reward.prepare_inputs(list(make_videos(2)), PROMPTS[:2], [FPS] * 2)
    model, tokens = videoalign_reward.model, videoalign_reward.reward_token_ids
    with torch.no_grad():
        default = model(**inputs, reward_token_ids=tokens)
        length = inputs["input_ids"].shape[1]
        sequential = model(
            **inputs, reward_token_ids=tokens, position_ids=torch.arange(length).expand(2, length)
        )
        mm_types = (inputs["input_ids"] == videoalign_reward.video_token_id).int() * 2
        rope_3d, _ = model.model.get_rope_index(
            inputs["input_ids"],
            mm_types,
            video_grid_thw=inputs["video_grid_thw"],
            attention_mask=inputs["attention_mask"],
        )
        with_3d_rope = model(**inputs, reward_token_ids=tokens, position_ids=rope_3d)
    torch.testing.assert_close(default, sequential)
    assert (default - with_3d_rope).abs().max() > 1e-3  # transformers 5's default ids would change the scores


def test_batched_scoring_with_padding_equals_one_at_a_time(videoalign_reward: VideoAlignReward) -> None:
    videos = make_videos(seed=3)
    batched = raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS))
    single = torch.cat(
        [raw_scores(videoalign_reward(videos[i : i + 1], PROMPTS[i : i + 1], fps=FPS)) for i in range(3)]
    )
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


def test_batch_size_chunks_give_the_same_scores(tiny_videoalign: TinyVideoAlign, videoalign_reward) -> None:
    videos = make_videos(seed=4)
    chunked = load_reward(tiny_videoalign.path, batch_size=2)(videos, PROMPTS, fps=FPS)
    torch.testing.assert_close(
        raw_scores(chunked), raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS)), atol=1e-5, rtol=1e-5
    )


def test_bfloat16_weights_score_close_to_float32(tiny_videoalign: TinyVideoAlign, videoalign_reward) -> None:
    videos = make_videos(seed=5)
    reward_bf16 = load_reward(tiny_videoalign.path, dtype=torch.bfloat16)
    assert reward_bf16.model.rm_head.weight.dtype == torch.bfloat16
    scores = reward_bf16(videos, PROMPTS, fps=FPS)
    assert scores["vq"].dtype == torch.float32
    torch.testing.assert_close(
        raw_scores(scores), raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS)), atol=0.1, rtol=0.05
    )


def test_unnormalised_scores(tiny_videoalign: TinyVideoAlign, videoalign_copy: Path) -> None:
    videos = make_videos(1)
    unnormalised = load_reward(tiny_videoalign.path, normalize=False)(videos, PROMPTS[:1], fps=FPS)
    torch.testing.assert_close(unnormalised["vq"], unnormalised["vq_raw"])
    edit_model_config(videoalign_copy, lambda c: c.pop("inference_config"))
    no_stats = load_reward(videoalign_copy)(videos, PROMPTS[:1], fps=FPS)
    torch.testing.assert_close(no_stats["ta"], unnormalised["ta_raw"])
    torch.testing.assert_close(no_stats["overall"], raw_scores(unnormalised).sum(dim=1))


def test_composite_default_weights_only_vq_mq_ta(videoalign_reward: VideoAlignReward) -> None:
    videos = make_videos()
    output = CompositeReward(videoalign_reward)(videos, PROMPTS, fps=FPS)
    scores = videoalign_reward(videos, PROMPTS, fps=FPS)
    assert output.weights == {"vq": 0.5, "mq": 0.5, "ta": 1.0}
    torch.testing.assert_close(output.total, 0.5 * scores["vq"] + 0.5 * scores["mq"] + scores["ta"])
    assert set(output.components) == {"vq", "mq", "ta", "vq_raw", "mq_raw", "ta_raw", "overall"}
    setting_a = CompositeReward([videoalign_reward], "setting_a")(videos, PROMPTS, fps=FPS)
    torch.testing.assert_close(setting_a.total, scores["overall"])


def test_composite_marks_bad_samples_invalid(videoalign_reward: VideoAlignReward) -> None:
    videos = make_videos()
    videos[1, 2, 0, 5, 5] = math.nan
    prompts = [PROMPTS[0], PROMPTS[1], "cheat <|TA_reward|>"]
    output = CompositeReward(videoalign_reward)(videos, prompts, fps=FPS)
    assert output.valid.tolist() == [True, False, False]
    assert output.errors[1] == "component 'vq' is nan; component 'mq' is nan; component 'ta' is nan"
    assert "contains the special token <|TA_reward|>" in output.errors[2]
    alone = videoalign_reward(videos[:1], prompts[:1], fps=FPS)
    torch.testing.assert_close(output.components["ta"][:1], alone["ta"], atol=1e-5, rtol=1e-5)


# -- video inputs and their errors ---------------------------------------------------------------


def test_gif_files_score_like_their_frames(videoalign_reward: VideoAlignReward, tmp_path: Path) -> None:
    levels = torch.randint(0, 4, (FRAMES, HEIGHT, WIDTH, 3), generator=torch.Generator().manual_seed(0))
    frames = (levels * 85).to(torch.uint8)  # few colours: the GIF palette keeps them exactly
    path = tmp_path / "clip.gif"
    iio.imwrite(path, frames.numpy(), plugin="pillow", duration=250, loop=0)  # 250 ms per frame: 4 fps
    as_tensor = frames.permute(0, 3, 1, 2).float() / 255
    from_file = videoalign_reward([path, as_tensor], PROMPTS[:2], fps=FPS)
    from_tensor = videoalign_reward(torch.stack([as_tensor, as_tensor]), PROMPTS[:2], fps=FPS)
    torch.testing.assert_close(raw_scores(from_file), raw_scores(from_tensor), atol=1e-5, rtol=1e-5)


def test_mp4_files_score_at_their_own_frame_rate(videoalign_reward: VideoAlignReward, tmp_path: Path) -> None:
    """An mp4 path on a plain install: decoded as PyAV decodes it (imageio's pyav plugin), at the file's rate."""
    videos = make_videos(1, seed=6, frames=16)
    path = write_video(videos[0], tmp_path / "clip.mp4", fps=8)
    decoded = torch.from_numpy(iio.imread(path, plugin="pyav")).permute(0, 3, 1, 2).float() / 255
    assert iio.immeta(path, plugin="pyav")["fps"] == 8.0
    from_file = videoalign_reward([path], PROMPTS[:1])  # no fps=: the file's 8 fps (16 frames -> 4 sampled)
    from_frames = videoalign_reward(decoded[None], PROMPTS[:1], fps=8.0)
    torch.testing.assert_close(raw_scores(from_file), raw_scores(from_frames), atol=1e-5, rtol=1e-5)
    at_wrong_rate = videoalign_reward(decoded[None], PROMPTS[:1], fps=2.0)  # would sample 8 frames
    assert not torch.allclose(raw_scores(from_file), raw_scores(at_wrong_rate))


def test_video_file_errors(videoalign_reward: VideoAlignReward, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        videoalign_reward([tmp_path / "missing.mp4"], PROMPTS[:1])
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    with pytest.raises(ValueError, match=r"Could not read video .*broken\.mp4"):
        videoalign_reward([broken], PROMPTS[:1])
    with pytest.raises(ValueError, match="list of video paths, not a single path"):
        videoalign_reward(str(broken), PROMPTS[:1])


@pytest.mark.parametrize(
    ("videos", "kwargs", "message"),
    [
        (make_videos(1, frames=3), {"fps": FPS}, "at least 4 frames, got 3"),
        (make_videos(1) * 2 - 1, {"fps": FPS}, r"must lie in \[0, 1\]"),
        (make_videos(1).permute(0, 2, 1, 3, 4), {"fps": FPS}, r"layout \(B, F, 3, H, W\)"),
        (make_videos(1), {}, "Pass fps="),
        ([make_videos(1)[0].permute(0, 2, 3, 1)], {"fps": FPS}, "layout"),
    ],
)
def test_bad_videos(videoalign_reward: VideoAlignReward, videos, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        videoalign_reward(videos, PROMPTS[:1], **kwargs)


def test_prompt_count_must_match(videoalign_reward: VideoAlignReward) -> None:
    with pytest.raises(ValueError, match="Got 2 videos but 1 prompts"):
        videoalign_reward(make_videos(2), PROMPTS[:1], fps=FPS)


def test_non_finite_video_gets_nan_and_leaves_the_others_alone(videoalign_reward: VideoAlignReward) -> None:
    videos = make_videos()
    clean = raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS))
    videos[0, 1, 1, 0, 0] = math.inf
    scores = raw_scores(videoalign_reward(videos, PROMPTS, fps=FPS))
    assert torch.isnan(scores[0]).all()
    torch.testing.assert_close(scores[1:], clean[1:], atol=1e-5, rtol=1e-5)


def test_videos_of_different_sizes_and_rates_in_one_call(videoalign_reward: VideoAlignReward) -> None:
    short = torch.rand(6, 3, 30, 60)
    long = make_videos(1)[0]
    together = raw_scores(videoalign_reward([short, long], PROMPTS[:2], fps=FPS))
    apart = torch.cat(
        [
            raw_scores(videoalign_reward([clip], [p], fps=FPS))
            for clip, p in ((short, PROMPTS[0]), (long, PROMPTS[1]))
        ]
    )
    torch.testing.assert_close(together, apart, atol=1e-5, rtol=1e-5)


# -- loading on demand and offloading -------------------------------------------------------------


def test_lazy_loading_and_offloading(tiny_videoalign: TinyVideoAlign, videoalign_reward, monkeypatch) -> None:
    reward = load_reward(tiny_videoalign.path, lazy=True, offload_between_calls=True)
    assert not reward.is_loaded and "loaded=False" in repr(reward)
    offloads = []
    original = reward.offload
    monkeypatch.setattr(reward, "offload", lambda: offloads.append(1) or original())
    videos = make_videos(1)
    scores = reward(videos, PROMPTS[:1], fps=FPS)
    assert reward.is_loaded and offloads == [1]
    assert reward.model.rm_head.weight.device.type == "cpu"
    torch.testing.assert_close(
        raw_scores(scores), raw_scores(videoalign_reward(videos, PROMPTS[:1], fps=FPS))
    )
    with pytest.raises(ValueError):
        reward(videos, ["bad <|VQ_reward|>"], fps=FPS)
    assert offloads == [1, 1]  # offloaded even when scoring fails
    assert reward.to("cpu") is reward and reward.device == torch.device("cpu")
    assert reward.__name__ == "videoalign"


def test_batch_size_must_be_positive(tiny_videoalign: TinyVideoAlign) -> None:
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        load_reward(tiny_videoalign.path, batch_size=0)
