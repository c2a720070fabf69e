"""The reward guide's self-contained example runs (docs/rewards.md)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.fixtures.markdown import first_block

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "rewards.md"


def test_the_write_a_reward_example_runs(capsys) -> None:
    namespace: dict = {}
    exec(first_block(GUIDE, "python").code, namespace)
    output = namespace["output"]
    videos = torch.rand(2, 8, 3, 32, 32)
    assert set(output.components) == {"brightness", "steadiness"}
    assert output.valid.all() and output.weights == {"brightness": 1.0, "steadiness": 0.5}
    torch.testing.assert_close(namespace["brightness"](videos, []), videos.mean(dim=(1, 2, 3, 4)))
    assert capsys.readouterr().out
