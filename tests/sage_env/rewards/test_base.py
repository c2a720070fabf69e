"""Tests for the reward protocol and `CompositeReward` (presets, weights, invalid samples, errors)."""

from __future__ import annotations

import math

import pytest
import torch

from sage_env.rewards import (
    REWARD_PRESETS,
    CompositeReward,
    RewardFailureError,
    RewardFailureMonitor,
    RewardFunction,
    RewardOutput,
    as_composite_reward,
    check_videos,
    resolve_reward_weights,
)

BATCH = 4


def _videos(batch: int = BATCH) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(batch, 3, 3, 4, 4, generator=generator)


def _prompts(batch: int = BATCH) -> list[str]:
    return [f"prompt {index}" for index in range(batch)]


def videoalign_like(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
    """Three weighted components with known values plus a reported-only one."""
    rows = torch.arange(videos.shape[0], dtype=torch.float32)
    return {"vq": rows + 1.0, "mq": 10 * (rows + 1.0), "ta": 100 * (rows + 1.0), "overall": -rows}


def brightness(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
    """A plain function written in one line: mean pixel value per video."""
    return videos.mean(dim=(1, 2, 3, 4))


def prompt_length(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> list[float]:
    """A reward returning a plain list of floats."""
    return [float(len(prompt)) for prompt in prompts]


def _expected_total(weights: dict[str, float], batch: int = BATCH) -> torch.Tensor:
    rows = torch.arange(batch, dtype=torch.float32) + 1.0
    scale = {"vq": 1.0, "mq": 10.0, "ta": 100.0}
    return sum(weights[name] * scale[name] * rows for name in weights)


# -- presets and weights -------------------------------------------------------------------------


def test_presets_are_the_paper_settings() -> None:
    assert REWARD_PRESETS["setting_a"] == {"vq": 1.0, "mq": 1.0, "ta": 1.0}
    assert REWARD_PRESETS["setting_b"] == {"vq": 0.5, "mq": 0.5, "ta": 1.0}


@pytest.mark.parametrize("preset", ["setting_a", "setting_b"])
def test_preset_weights_the_three_components(preset: str) -> None:
    output = CompositeReward(videoalign_like, preset)(_videos(), _prompts())
    torch.testing.assert_close(output.total, _expected_total(REWARD_PRESETS[preset]))
    assert output.weights == REWARD_PRESETS[preset]
    assert output.valid.all() and output.errors == [None] * BATCH
    assert set(output.components) == {"vq", "mq", "ta", "overall"}


def test_default_is_setting_b_and_leaves_other_components_reported_only() -> None:
    output = CompositeReward(videoalign_like)(_videos(), _prompts())
    assert output.weights == {"vq": 0.5, "mq": 0.5, "ta": 1.0}
    torch.testing.assert_close(output.total, _expected_total(REWARD_PRESETS["setting_b"]))
    torch.testing.assert_close(output.components["overall"], -torch.arange(BATCH, dtype=torch.float32))


def test_user_weights_mapping() -> None:
    weights = {"vq": 2.0, "ta": -1.0}
    output = CompositeReward(videoalign_like, weights)(_videos(), _prompts())
    torch.testing.assert_close(output.total, _expected_total(weights))
    assert output.weights == weights


def test_zero_weight_component_is_reported_but_cannot_invalidate() -> None:
    def nan_mq(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
        scores = videoalign_like(videos, prompts)
        scores["mq"] = torch.full((videos.shape[0],), math.nan)
        return scores

    output = CompositeReward(nan_mq, {"vq": 1.0, "mq": 0.0, "ta": 1.0})(_videos(), _prompts())
    assert output.valid.all()
    torch.testing.assert_close(output.total, _expected_total({"vq": 1.0, "ta": 1.0}))


def test_trl_style_list_weights_one_per_function() -> None:
    videos, prompts = _videos(), _prompts()
    output = CompositeReward([brightness, prompt_length], [2.0, 0.5])(videos, prompts)
    expected = 2.0 * videos.mean(dim=(1, 2, 3, 4)) + 0.5 * torch.tensor([8.0] * BATCH)
    torch.testing.assert_close(output.total, expected)
    assert output.weights == {"brightness": 2.0, "prompt_length": 0.5}


def test_list_weights_refuse_multi_component_functions() -> None:
    with pytest.raises(ValueError, match="several components"):
        CompositeReward([videoalign_like, brightness], [1.0, 1.0])(_videos(), _prompts())


def test_list_weights_need_one_weight_per_function() -> None:
    with pytest.raises(ValueError, match="2 reward_weights for 1 reward functions"):
        CompositeReward(brightness, [1.0, 2.0])


def test_several_functions_combined_with_default_weights() -> None:
    videos, prompts = _videos(), _prompts()
    output = CompositeReward([videoalign_like, brightness, prompt_length])(videos, prompts)
    assert output.weights == {"vq": 0.5, "mq": 0.5, "ta": 1.0, "brightness": 1.0, "prompt_length": 1.0}
    expected = _expected_total(REWARD_PRESETS["setting_b"]) + videos.mean(dim=(1, 2, 3, 4)) + 8.0
    torch.testing.assert_close(output.total, expected)


def test_a_single_score_function_named_like_a_preset_component_keeps_the_preset_weight() -> None:
    def ta(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        return torch.ones(videos.shape[0])

    weights = resolve_reward_weights(None, [ta, brightness])
    assert weights == {"vq": 0.5, "mq": 0.5, "ta": 1.0, "brightness": 1.0}


def test_plain_function_and_callable_object_are_rewards() -> None:
    class Contrast:
        __name__ = "contrast"

        def __call__(self, videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
            return videos.std(dim=(1, 2, 3, 4))

    assert isinstance(brightness, RewardFunction)
    videos = _videos()
    output = as_composite_reward([brightness, Contrast()])(videos, _prompts())
    torch.testing.assert_close(output.total, videos.mean(dim=(1, 2, 3, 4)) + videos.std(dim=(1, 2, 3, 4)))


def test_reward_receives_fps_and_python_lists() -> None:
    seen: dict[str, object] = {}

    def spy(videos: torch.Tensor, prompts: list[str], *, fps: float) -> torch.Tensor:
        seen.update(fps=fps, prompts=prompts)
        return torch.zeros(videos.shape[0])

    CompositeReward(spy)(_videos(), tuple(_prompts()), fps=8.0)
    assert seen == {"fps": 8.0, "prompts": _prompts()}


def test_as_composite_reward_passes_a_composite_through() -> None:
    composite = CompositeReward(brightness)
    assert as_composite_reward(composite) is composite
    assert isinstance(as_composite_reward(brightness), CompositeReward)


# -- invalid samples ------------------------------------------------------------------------------


def _fails_on(bad_prompt: str):
    def picky(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
        if bad_prompt in prompts:
            raise RuntimeError(f"cannot score {bad_prompt!r}")
        return videoalign_like(videos, prompts)

    return picky


def test_sample_whose_reward_raises_is_invalid_with_reason_and_nan_total() -> None:
    output = CompositeReward(_fails_on("prompt 2"))(_videos(), _prompts())
    assert output.valid.tolist() == [True, True, False, True]
    assert output.num_invalid == 1
    assert output.errors[2] == "reward 'picky' raised RuntimeError: cannot score 'prompt 2'"
    assert [output.errors[i] for i in (0, 1, 3)] == [None, None, None]
    assert math.isnan(output.total[2])
    for name in ("vq", "mq", "ta", "overall"):
        assert math.isnan(output.components[name][2])
    # Sample by sample, each valid sample is scored alone: row index 0 in its own call.
    expected = _expected_total(REWARD_PRESETS["setting_b"], batch=1).expand(BATCH)
    torch.testing.assert_close(output.total[[0, 1, 3]], expected[[0, 1, 3]])


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf])
def test_non_finite_weighted_component_marks_sample_invalid(bad_value: float) -> None:
    def spoiled(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
        scores = videoalign_like(videos, prompts)
        scores["ta"][1] = bad_value
        return scores

    output = CompositeReward(spoiled)(_videos(), _prompts())
    assert output.valid.tolist() == [True, False, True, True]
    assert output.errors[1] == f"component 'ta' is {bad_value}"
    assert math.isnan(output.total[1])
    assert torch.isfinite(output.total[[0, 2, 3]]).all()


def test_non_finite_reported_only_component_keeps_sample_valid() -> None:
    def spoiled(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
        scores = videoalign_like(videos, prompts)
        scores["overall"][0] = math.nan
        return scores

    output = CompositeReward(spoiled)(_videos(), _prompts())
    assert output.valid.all()
    assert math.isnan(output.components["overall"][0])


def test_failure_of_a_reported_only_function_keeps_samples_valid() -> None:
    def diagnostics(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        if "prompt 0" in prompts:
            raise RuntimeError("no diagnostics for prompt 0")
        return torch.zeros(videos.shape[0])

    output = CompositeReward([videoalign_like, diagnostics], {"vq": 1.0})(_videos(), _prompts())
    assert output.valid.all()
    assert math.isnan(output.components["diagnostics"][0])


def test_non_finite_videos_pass_the_check_and_end_invalid() -> None:
    videos = _videos()
    videos[3, 0, 0, 0, 0] = math.nan
    output = CompositeReward(brightness)(videos, _prompts())
    assert output.valid.tolist() == [True, True, True, False]
    assert output.errors[3] == "component 'brightness' is nan"


def test_whole_batch_failure_marks_every_sample_invalid_and_counts_the_call() -> None:
    class ModelCrashError(RuntimeError):
        pass

    def broken(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        raise ModelCrashError("out of memory")

    for size in (BATCH, 1):
        output = CompositeReward(broken)(_videos(size), _prompts(size))
        assert not output.valid.any() and output.total.isnan().all()
        assert output.failed_calls == 1
        assert output.errors == ["reward 'broken' raised ModelCrashError: out of memory"] * size


def test_batches_concatenate_around_one_whose_every_sample_failed() -> None:
    """Rollouts and evaluations score in batches (rollout_batch_size); a batch the reward failed on whole has no
    component names. Concatenating it raised 'different components' and stopped the run."""
    reward = CompositeReward(_fails_on("prompt 5"))
    scored, failed = reward(_videos(), _prompts()), reward(_videos(2), ["prompt 5", "prompt 5"])
    assert failed.components == {}
    for parts in ([scored, failed], [failed, scored]):
        output = RewardOutput.concat(parts)
        assert output.components.keys() == scored.components.keys()
        failed_rows = slice(BATCH, None) if parts[0] is scored else slice(0, 2)
        assert all(values[failed_rows].isnan().all() for values in output.components.values())
        assert output.valid.tolist().count(False) == 2 and output.failed_calls == 1
    only_failed = RewardOutput.concat([failed, failed])
    assert only_failed.components == {} and not only_failed.valid.any()


def test_batches_with_other_components_are_refused() -> None:
    with pytest.raises(ValueError, match="different components"):
        RewardOutput.concat([CompositeReward(brightness)(_videos(), _prompts()), CompositeReward(
            videoalign_like)(_videos(), _prompts())])


def test_failure_of_one_function_keeps_the_weights_of_the_others() -> None:
    def broken(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        raise RuntimeError("server down")

    output = CompositeReward([brightness, broken], {"brightness": 1.0, "broken": 1.0})(_videos(), _prompts())
    assert not output.valid.any()
    assert output.weights == {"brightness": 1.0}
    assert output.components["brightness"].isfinite().all()


def test_monitor_tolerates_single_failures_and_stops_on_consecutive_ones() -> None:
    monitor = RewardFailureMonitor(2)
    monitor.observe(0, 4, ["reward 'x' raised OSError: gone"] * 4)
    monitor.observe(3, 4, [None] * 4)  # a good rollout resets the count
    monitor.observe(0, 4, ["reward 'x' raised OSError: gone"] * 4)
    with pytest.raises(RewardFailureError, match=r"2 consecutive rollouts.*reward 'x' raised OSError: gone"):
        monitor.observe(0, 4, ["reward 'x' raised OSError: gone"] * 4)
    with pytest.raises(ValueError, match="max_consecutive_reward_failures"):
        RewardFailureMonitor(0)


def test_per_sample_fallback_calls_each_sample_once() -> None:
    calls: list[int] = []

    def counting(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        calls.append(videos.shape[0])
        if videos.shape[0] > 1:
            raise RuntimeError("batch too large")
        return torch.ones(1)

    output = CompositeReward(counting)(_videos(), _prompts())
    assert calls == [BATCH] + [1] * BATCH
    assert output.valid.all()


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (torch.zeros(3), r"returned \(3,\) values for component 'bad'; expected one score per video \(4\)"),
        (torch.zeros(4, 2), r"returned \(8,\) values"),
        ("not a number", "return a \\(B,\\) tensor"),
        ({}, "returned no components"),
    ],
)
def test_bad_output_shapes_raise_clearly_without_per_sample_retry(returned: object, message: str) -> None:
    calls: list[int] = []

    def bad(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> object:
        calls.append(videos.shape[0])
        return returned

    with pytest.raises(ValueError, match=message):
        CompositeReward(bad, {"bad": 1.0})(_videos(), _prompts())
    assert calls == [BATCH]


@pytest.mark.parametrize(
    ("videos", "message"),
    [
        (torch.rand(4, 3, 4, 4), r"layout \(B, F, 3, H, W\), got shape \(4, 3, 4, 4\)"),
        (torch.rand(4, 2, 4, 4, 3), "permute channels-last"),
        (torch.rand(4, 3, 3, 4, 4) * 2 - 1, r"\[0, 1\].*\(v \+ 1\) / 2"),
        (torch.randint(0, 255, (4, 3, 3, 4, 4), dtype=torch.uint8), r"torch.uint8 tensor.*v.float\(\) / 255"),
        (torch.tensor([2.0, math.nan]).repeat(48).reshape(4, 3, 2, 2, 2).transpose(2, 1), r"got \[2, 2\]"),
        ([[0.5]], "got list"),
    ],
)
def test_check_videos_rejects_bad_layouts_and_ranges(videos: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_videos(videos)


def test_prompt_count_must_match() -> None:
    with pytest.raises(ValueError, match="Got 4 videos but 3 prompts"):
        CompositeReward(brightness)(_videos(), _prompts(3))


def test_unknown_preset() -> None:
    with pytest.raises(
        ValueError, match="Unknown reward preset 'setting_c'; choose one of setting_a, setting_b"
    ):
        CompositeReward(brightness, "setting_c")


def test_weight_names_not_produced() -> None:
    with pytest.raises(ValueError, match=r"names \['aesthetic'\] but the reward functions produced only"):
        CompositeReward(videoalign_like, {"vq": 1.0, "aesthetic": 1.0})(_videos(), _prompts())
    with pytest.raises(ValueError, match=r"names \['mq', 'ta', 'vq'\]"):
        CompositeReward(brightness, "setting_a")(_videos(), _prompts())


def test_no_component_weighted_by_default() -> None:
    def stats(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> dict[str, torch.Tensor]:
        return {"mean": videos.mean(dim=(1, 2, 3, 4)), "std": videos.std(dim=(1, 2, 3, 4))}

    with pytest.raises(ValueError, match=r"None of the reward components \['mean', 'std'\] has a weight"):
        CompositeReward(stats)(_videos(), _prompts())


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"vq": math.nan}, "'vq' must be finite"),
        ({"vq": "high"}, "'vq' must be a number, got 'high'"),
        ([math.inf], "'#0' must be finite"),
    ],
)
def test_bad_weight_values(weights: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CompositeReward(brightness, weights)


def test_bad_reward_funcs() -> None:
    with pytest.raises(ValueError, match="non-empty list of callables"):
        CompositeReward([])
    with pytest.raises(ValueError, match="non-empty list of callables"):
        CompositeReward([brightness, 42])
    with pytest.raises(ValueError, match="Unknown reward 'brightness'; known: toy"):
        CompositeReward([brightness, "brightness"])  # a string is a reward's registered name
    with pytest.raises(ValueError, match="distinct names"):
        CompositeReward([brightness, brightness])


def test_two_functions_producing_the_same_component() -> None:
    with pytest.raises(
        ValueError, match=r"Two reward functions produced the component\(s\) \['mq', 'overall', 'ta', 'vq'\]"
    ):
        CompositeReward([videoalign_like, _fails_on("never")])(_videos(), _prompts())


def test_output_is_a_reward_output_on_cpu_float32() -> None:
    def on_other_dtype(videos: torch.Tensor, prompts: list[str], **kwargs: object) -> torch.Tensor:
        return torch.ones(videos.shape[0], dtype=torch.float64, requires_grad=True) * 2

    output = CompositeReward(on_other_dtype)(_videos(), _prompts())
    assert isinstance(output, RewardOutput)
    assert output.total.dtype == torch.float32 and not output.total.requires_grad
    assert output.valid.dtype == torch.bool
