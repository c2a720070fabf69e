"""sage_trl.preflight's pieces: the memory meter, the values the program decides (and the activations it does
not), and replayed calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sage_trl.preflight import resolve_model_configs
from sage_trl.preflight.models import build_pipeline
from sage_trl.preflight.replay import replay_calls
from sage_trl.preflight.tracing import TraceError, trace_session


def test_meter_counts_live_storages_once_and_follows_frees() -> None:
    with trace_session() as meter:
        base = meter.device_bytes
        first = torch.empty(1000, 1000)  # 4 MB
        view = first[:10]  # same storage: counted once
        with meter.phase("work"):
            second = torch.empty(500, 1000)  # 2 MB
            del second
            torch.empty(250, 1000)  # 1 MB, freed at once
        assert meter.phases[-1].peak_bytes - meter.phases[-1].start_bytes == 2_000_000
        assert meter.device_bytes - base == 4_000_000 and view.shape == (10, 1000)
        meter.set_host([first])
        assert meter.device_bytes == base


def test_meter_counts_host_copies_apart_and_in_the_total() -> None:
    with trace_session() as meter:
        device = torch.empty(1000, 1000)  # 4 MB on the device
        with meter.phase("offload"):
            with meter.host_allocations():
                host = device.to("cpu", copy=True)  # a saver's copy to the host
            del device
        phase = meter.phases[-1]
        assert phase.peak_bytes == phase.start_bytes and phase.end_bytes == phase.start_bytes - 4_000_000
        assert phase.total_peak_bytes - phase.total_start_bytes == 4_000_000  # both copies alive for a moment
        assert meter.host_bytes == 4_000_000 and meter.on_host([host])
        del host
        assert meter.host_bytes == 0


def test_program_decided_values_are_known_and_activations_are_not() -> None:
    with trace_session():
        sigma = torch.tensor([0.5, 0.25])
        assert bool(torch.all((sigma >= 0) & (sigma <= 1))) and sigma.tolist() == [0.5, 0.25]
        mask = torch.zeros(1000, dtype=torch.bool)
        mask[:100] = True
        activations = torch.randn(4, 1000)
        assert activations[:, mask].shape == (4, 100)  # the data-dependent shape of a known mask
        assert bool(torch.all(torch.zeros(2, 729, 1152) == 0))  # HunyuanVideo 1.5's text-to-video test
        assert bool(torch.isfinite(activations).all())  # finiteness checks answer as for a finite run
        with pytest.raises(TraceError, match="value of a fake tensor"):
            float(activations.sum())


def test_replayed_vae_decode_equals_running_every_call(tiny_wan_path: Path) -> None:
    configs = resolve_model_configs(str(tiny_wan_path))

    def decode(replay: bool) -> tuple[int, int]:
        with trace_session() as meter:
            pipeline = build_pipeline(configs, torch.float32)
            vae = pipeline.vae
            vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64)
            vae.enable_slicing()
            latents = torch.randn(3, 4, 3, 24, 24)
            with torch.no_grad(), meter.phase("decode"):
                if replay:
                    with replay_calls(meter, vae, "_decode"), replay_calls(meter, vae.decoder, "forward"):
                        vae.decode(latents)
                else:
                    vae.decode(latents)
            phase = meter.phases[-1]
            return phase.peak_bytes - phase.start_bytes, phase.flops

    assert decode(replay=True) == decode(replay=False)
