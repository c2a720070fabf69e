"""The private helpers shared by the diffusers backbones (sage_env/backbones/_diffusers.py)."""

from __future__ import annotations

import pytest
import torch

from sage_env.backbones import _diffusers


class PlacedModule(torch.nn.Module):
    """Records where ``to`` sends it without moving memory, to test placement logic on a CPU-only machine."""

    def __init__(self, placed_on: str) -> None:
        super().__init__()
        self.placed_on = torch.device(placed_on)
        self.moves: list[str] = []

    def to(self, device):  # type: ignore[override]
        self.placed_on = torch.device(device)
        self.moves.append(str(device))
        return self


@pytest.fixture
def placement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_diffusers, "module_device", lambda module: module.placed_on)


def test_modules_on_brings_offloaded_modules_and_puts_them_back(placement):
    offloaded, resident = PlacedModule("cpu"), PlacedModule("cuda:0")
    with _diffusers.modules_on([offloaded, resident], torch.device("cuda:0")):
        assert offloaded.placed_on == resident.placed_on == torch.device("cuda:0")
    assert offloaded.moves == ["cuda:0", "cpu"] and resident.moves == []


def test_modules_on_restores_placement_when_encoding_fails(placement):
    offloaded = PlacedModule("cpu")
    with (
        pytest.raises(RuntimeError, match="encoder failed"),
        _diffusers.modules_on([offloaded], torch.device("cuda:0")),
    ):
        raise RuntimeError("encoder failed")
    assert offloaded.placed_on == torch.device("cpu")


def test_module_device_of_a_module_without_parameters_is_cpu():
    assert _diffusers.module_device(torch.nn.ReLU()) == torch.device("cpu")


@pytest.mark.parametrize("value", [True, "2", float("inf")])
def test_guidance_scale_must_be_a_finite_number(value):
    with pytest.raises(ValueError, match="guidance_scale must be"):
        _diffusers.check_guidance_scale(value)
