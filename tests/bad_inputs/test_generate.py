"""The bad-input sweep through ``sage-generate``: each case fails before any video model is loaded, naming
the flag (more cases, with the adapter ones, in tests/sage_trl/test_generate.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.bad_inputs.user_files import with_paths

GENERATE_CASES: list[tuple[list[str], str]] = [
    (["--prompt", "a cat", "--model", "{missing}"], "{missing}"),
    (["--prompt", "a cat", "--adapter", "{missing}"], "{missing}"),
    (["--prompt", "a cat", "--output", "{not_a_pipeline}"], "--output"),
    (["--prompt", "a cat", "--width", "0"], "--width"),
    (["--prompt", "a cat", "--steps", "-3"], "--steps"),
    (["--prompt", "a cat", "--seeds", "-1"], "--seeds"),
    (["--prompt", "a cat", "--dtype", "int8"], "--dtype"),
    (["--prompt", "a cat", "--guidance-scale", "high"], "--guidance-scale"),
    (["--seeds", "0"], "--prompt"),
    (["--prompt", "a cat", "--steep", "4"], "--steep"),
    (["--prompt", ""], "--prompt"),
    (["--prompt", "a cat", "--prompt", "   "], "--prompt"),
    (
        ["--prompt", "a cat", "--device", "cuda"]
        if not torch.cuda.is_available()
        else ["--prompt", "a", "--device", "x"],
        "--device",
    ),
    (["--prompt", "a cat", "--device", "warp-drive"], "--device"),
    (["--prompt", "a cat", "--width", "7"], "width"),
    (["--prompt", "a cat", "--num-frames", "100000"], "frames"),
    (["--prompt", "a cat", "--shift", "nan"], "--shift"),
    (["--prompt", "a cat", "--guidance-scale", "inf"], "--guidance-scale"),
    (["--prompt", "a cat", "--output", "video.txt"], "--output"),
    (["--prompt", "a cat", "--seeds", "1.5"], "--seeds"),
    (["--prompt", "a cat", "--dtype", "float64"], "--dtype"),
]


@pytest.mark.parametrize(("arguments", "words"), GENERATE_CASES, ids=[c[1] for c in GENERATE_CASES])
def test_sage_generate_refuses_before_loading_a_model(
    arguments: list[str], words: str, files: dict[str, Path], no_model_loads: None, capsys
) -> None:
    from sage_trl.generate import generate_main

    with pytest.raises(SystemExit) as caught:
        generate_main(with_paths(arguments, files))
    message = f"{caught.value.code} {capsys.readouterr().err}"
    assert caught.value.code not in (0, None)
    assert words.format(**{k: str(v) for k, v in files.items()}) in message, message
