"""benchmarks/gpu_memory.py: full-size model shapes, the scaled-down CPU run, the memory meter and the projection."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import gpu_memory
from benchmarks.gpu_memory import (
    HUNYUAN_VIDEO_15,
    SCENARIOS,
    WAN_21_1_3B,
    PhaseResult,
    activation_features,
    fit_activation_model,
    format_results,
    parameter_counts,
    run_benchmark,
    scaled_spec,
)

CPU = torch.device("cpu")


def test_full_size_models_have_the_published_sizes() -> None:
    hunyuan, wan = parameter_counts(HUNYUAN_VIDEO_15, 1), parameter_counts(WAN_21_1_3B, 1)
    assert hunyuan["total"] == pytest.approx(8.3e9, rel=0.01)  # "8.3B parameters"
    assert 1.3e9 < wan["total"] < 1.45e9  # "1.3B" (1.42B counting the embedders)
    # Rank-1 adapter on the default targets, counted by hand: HunyuanVideo 1.5 has 8 square 2048-wide
    # projections per double-stream block (54) and 4 per token-refiner block (2); Wan has 4 per attention, 2
    # attentions per block, 30 blocks of width 1536.
    assert hunyuan["lora"] == (54 * 8 + 2 * 4) * (2048 + 2048)
    assert wan["lora"] == 30 * 2 * 4 * (1536 + 1536)


def test_full_size_latent_shapes_follow_the_backbones() -> None:
    from sage_env.backbones.hunyuan import HunyuanVideo15Backbone
    from sage_env.backbones.wan import WanBackbone

    small = {spec.name: scaled_spec(spec, 1 / 64) for spec in (HUNYUAN_VIDEO_15, WAN_21_1_3B)}
    hunyuan = gpu_memory.build_backbone(small["hunyuanvideo-1.5"], CPU, torch.float32)
    wan = gpu_memory.build_backbone(small["wan2.1-1.3b"], CPU, torch.float32)
    assert isinstance(hunyuan, HunyuanVideo15Backbone) and isinstance(wan, WanBackbone)
    assert hunyuan.latent_shape(81, 480, 848) == HUNYUAN_VIDEO_15.latent_shape
    assert wan.latent_shape(81, 480, 832) == WAN_21_1_3B.latent_shape
    assert HUNYUAN_VIDEO_15.latent_tokens == 21 * 30 * 53
    assert HUNYUAN_VIDEO_15.attended_tokens == 21 * 30 * 53 + 1000 + 256 + 729
    assert WAN_21_1_3B.latent_tokens == 21 * 30 * 52


def test_scaled_spec_shrinks_layers_width_and_tokens() -> None:
    spec = scaled_spec(WAN_21_1_3B, 1 / 8)
    assert spec.num_layers == round(30 / 8) and spec.config["num_attention_heads"] == round(12 / 8)
    assert spec.config["ffn_dim"] == round(8960 * 2 / 12)
    assert spec.latent_shape[2] % 2 == 0 and spec.latent_shape[3] % 2 == 0  # (1, 2, 2) patches
    assert spec.latent_tokens == pytest.approx(WAN_21_1_3B.latent_tokens / 8, rel=0.35)
    assert spec.text_tokens["prompt_embeds"] == (64, 4096)
    custom = scaled_spec(HUNYUAN_VIDEO_15, 1 / 32, num_layers=3, num_heads=2)
    assert custom.num_layers == 3 and custom.width == 256 and custom.image_tokens == round(729 / 32)
    assert scaled_spec(WAN_21_1_3B, 1.0) == WAN_21_1_3B
    with pytest.raises(ValueError, match="scale"):
        scaled_spec(WAN_21_1_3B, 0.0)
    with pytest.raises(ValueError, match="num_layers"):
        scaled_spec(WAN_21_1_3B, 0.5, num_layers=0)


def test_full_size_run_is_refused_on_cpu() -> None:
    with pytest.raises(ValueError, match="--scale"):
        gpu_memory.main(["--device", "cpu"])


def test_profiled_peak_counts_live_tensor_bytes() -> None:
    def work() -> None:
        first = torch.empty(1000, 1000)  # 4 MB
        second = torch.empty(500, 1000)  # 2 MB, both alive
        del first, second
        torch.empty(250, 1000)  # 1 MB after both were freed

    peak, seconds = gpu_memory._profiled_peak(work)
    assert peak == 6_000_000 and seconds >= 0


def test_fit_recovers_known_coefficients() -> None:
    specs = [
        scaled_spec(HUNYUAN_VIDEO_15, scale, layers, heads)
        for scale in (1 / 32, 1 / 64)
        for layers in (1, 2)
        for heads in (1, 2)
    ]
    truth = torch.tensor([7.0, 50.0, 3.0, 20.0, 4.0, 2.0], dtype=torch.float64)
    samples = [
        (spec, float(torch.tensor(activation_features(spec, dense_mask=True), dtype=torch.float64) @ truth))
        for spec in specs
    ]
    coefficients, residual = fit_activation_model(samples, dense_mask=True)
    torch.testing.assert_close(coefficients, truth, rtol=1e-6, atol=1e-6)
    assert residual < 1e-9
    with pytest.raises(ValueError, match="at least 6"):
        fit_activation_model(samples[:3], dense_mask=True)


def test_rollout_features_have_no_per_layer_terms() -> None:
    shallow, deep = scaled_spec(HUNYUAN_VIDEO_15, 1 / 32, 1, 2), scaled_spec(HUNYUAN_VIDEO_15, 1 / 32, 5, 2)
    assert activation_features(shallow, "rollout") == activation_features(deep, "rollout")
    tokens, attended = shallow.latent_tokens, shallow.attended_tokens
    assert activation_features(shallow, "rollout", dense_mask=True) == [tokens, 2 * tokens, attended**2]
    # The backbone's default key-padding mask has no N^2 term.
    assert activation_features(shallow, "rollout") == [tokens, 2 * tokens]
    assert len(activation_features(scaled_spec(WAN_21_1_3B, 1 / 32), "train")) == 4  # no attention mask
    with pytest.raises(ValueError, match="phase"):
        activation_features(shallow, "decode")


def test_projected_resident_memory_follows_the_parameter_counts() -> None:
    counts = parameter_counts(WAN_21_1_3B, 32)
    activations = {
        key: (1e9, 0.0) for key in [("lora", "train"), ("lora", "rollout"), ("lora-fp32", "train")]
    }
    lora = gpu_memory._projected_setting(WAN_21_1_3B, "lora", "train", activations, 32)
    full = gpu_memory._projected_setting(WAN_21_1_3B, "full", "train", activations, 32)
    offload = gpu_memory._projected_setting(WAN_21_1_3B, "full-reference-offload", "rollout", activations, 32)
    fp32 = gpu_memory._projected_setting(WAN_21_1_3B, "lora-fp32", "train", activations, 32)
    assert lora.resident_bytes == 2 * counts["total"] + 16 * counts["lora"]
    assert lora.activation_bytes == 1e9 + 4 * counts["lora"]  # adapter gradients
    assert fp32.resident_bytes == 4 * counts["total"] + 16 * counts["lora"]
    assert full.resident_bytes == 16 * counts["total"]  # fp32 weights, 2 AdamW moments, fp32 anchor
    assert full.activation_bytes == 1e9 + 6 * counts["total"]  # + fp32 gradients + bf16 autocast copies
    assert (
        offload.resident_bytes == 12 * counts["total"]
        and offload.activation_bytes == 1e9 + 2 * counts["total"]
    )


def test_format_results_shows_ratios_and_out_of_memory() -> None:
    results = [
        PhaseResult("m", "lora", "train", 2**20, 4 * 2**20, 2.0),
        PhaseResult("m", "lora-no-ckpt", "train", 2**20, 10 * 2**20, 1.0),
        PhaseResult("m", "full", "train", None, None, None),
    ]
    table = format_results(results)
    assert "| m | lora-no-ckpt | train | 1.0 | 10.0 | 2.50 | 1.000 | 0.50 |" in table
    assert "| m | full | train | OOM | OOM | - | - | - |" in table


@pytest.mark.slow
def test_scaled_cpu_run_shows_what_each_saver_saves() -> None:
    spec = scaled_spec(WAN_21_1_3B, 1 / 64, num_layers=2)
    names = ["lora", "lora-no-ckpt", "lora-fp32", "full"]
    results = {(r.scenario, r.phase): r for r in run_benchmark([spec], [SCENARIOS[n] for n in names], CPU, 8)}
    assert set(results) == {(n, phase) for n in names for phase in SCENARIOS[n].phases}
    assert all(r.peak_bytes > r.resident_bytes > 0 and r.seconds > 0 for r in results.values())
    lora, no_ckpt = results[("lora", "train")], results[("lora-no-ckpt", "train")]
    assert no_ckpt.resident_bytes == lora.resident_bytes and no_ckpt.peak_bytes > lora.peak_bytes
    fp32 = results[("lora-fp32", "rollout")]
    assert fp32.resident_bytes > results[("lora", "rollout")].resident_bytes  # fp32 base weights
    assert (
        fp32.peak_bytes - fp32.resident_bytes > results[("lora", "rollout")].peak_bytes - lora.resident_bytes
    )
    full_state = 12 * parameter_counts(spec, 8)["total"]  # fp32 weights + AdamW moments, at least
    assert results[("full", "train")].resident_bytes > full_state


@pytest.mark.slow
def test_command_line_writes_the_report(tmp_path) -> None:
    output = tmp_path / "memory.md"
    results = gpu_memory.main(
        ["--scale", "0.015625", "--model", "hunyuanvideo-1.5", "--scenario", "lora", "--output", str(output)]
    )
    report = output.read_text()
    assert [(r.scenario, r.phase) for r in results] == [("lora", "train"), ("lora", "rollout")]
    assert "| hunyuanvideo-1.5 | lora | rollout |" in report and "Full-size parameter counts" in report
    assert math.isfinite(results[0].seconds)


@pytest.mark.slow
def test_key_padding_attention_saves_the_dense_mask_memory() -> None:
    spec = scaled_spec(HUNYUAN_VIDEO_15, 1 / 64, num_layers=1)
    scenarios = [SCENARIOS["lora"], SCENARIOS["lora-dense-mask"]]
    results = {(r.scenario, r.phase): r for r in run_benchmark([spec], scenarios, CPU, 8)}
    for phase in ("rollout", "train"):
        key_padding, dense = results[("lora", phase)], results[("lora-dense-mask", phase)]
        saved = (dense.peak_bytes - dense.resident_bytes) - (key_padding.peak_bytes - key_padding.resident_bytes)
        # The dense mask holds at least one byte per (query, key) pair of the joint sequence.
        assert saved >= spec.attended_tokens**2, (phase, saved, spec.attended_tokens**2)
