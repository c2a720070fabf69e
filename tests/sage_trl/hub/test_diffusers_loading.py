"""The client is the oracle: adapters trained on tiny random-init Wan pipelines, pushed to a local fake Hub and
loaded back with diffusers' own ``pipe.load_lora_weights``."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig

from sage_trl import SageGRPOTrainer
from sage_trl.hub import push_output_dir
from sage_trl.run_folder import layout
from tests.doubles import mean_brightness
from tests.fixtures.hub_server import FakeHub
from tests.sage_trl.hub.published_run import PROMPTS, WAN_ID, tiny_args


def tiny_transformer_inputs() -> dict:
    """Random inputs for one forward of the tiny Wan transformer (tests/fixtures/tiny_pipelines.py)."""
    return {
        "hidden_states": torch.randn(1, 4, 2, 2, 2),
        "timestep": torch.tensor([700.0]),
        "encoder_hidden_states": torch.randn(1, 6, 32),
        "return_dict": False,
    }


def test_uploaded_adapter_loads_into_a_tiny_wan_pipeline(
    tiny_wan_path: Path, tmp_path: Path, hub: FakeHub
) -> None:
    from diffusers import WanPipeline

    from sage_env.backbones import load_backbone
    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    output = tmp_path / "wan-run"
    args = tiny_args(
        output, model_name_or_path=str(tiny_wan_path), max_steps=1, num_inference_steps=2, **TINY_VIDEO_SIZE
    )
    trainer = SageGRPOTrainer(
        load_backbone(str(tiny_wan_path)),
        mean_brightness,
        args=args,
        train_dataset=PROMPTS,
        peft_config=LoraConfig(r=2, lora_alpha=4, init_lora_weights="gaussian"),
    )
    trainer.train()
    push_output_dir(
        output, "tester/wan-lora", token="hf_write", license="apache-2.0", endpoint=hub.url, base_model=WAN_ID
    )
    assert 'pipe.load_lora_weights("tester/wan-lora")' in hub.files("tester/wan-lora")["README.md"].decode()
    pipe = WanPipeline.from_pretrained(tiny_wan_path)
    inputs = tiny_transformer_inputs()
    with torch.no_grad():
        base = pipe.transformer(**inputs)[0]
        pipe.load_lora_weights(str(hub.download("tester/wan-lora", tmp_path / "download")))
        loaded = pipe.transformer(**inputs)[0]
        trained_output = trainer.backbone.transformer(**inputs)[0]
    torch.testing.assert_close(loaded, trained_output)
    assert not torch.allclose(base, trained_output, atol=1e-6)


def test_both_wan22_experts_adapters_are_pushed_and_load_with_diffusers(
    tiny_wan22_path: Path, tmp_path: Path, hub: FakeHub
) -> None:
    from diffusers import WanPipeline

    from sage_env.backbones.wan import WanBackbone
    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    output = tmp_path / "wan22-run"
    args = tiny_args(
        output, model_name_or_path=str(tiny_wan22_path), max_steps=1, num_inference_steps=4, expert="both",
        learning_rate=5e-2, **TINY_VIDEO_SIZE,
    )  # fmt: skip
    trainer = SageGRPOTrainer(
        None, mean_brightness, args=args, train_dataset=PROMPTS, peft_config=LoraConfig(r=2, lora_alpha=4)
    )
    trainer.train()
    push_output_dir(output, "tester/wan22", token="hf_write", license="apache-2.0", endpoint=hub.url, base_model=WAN_ID)
    files = hub.files("tester/wan22")
    assert {layout.LORA_WEIGHT_NAME, layout.EXPERT_2_LORA_WEIGHT_NAME} <= set(files)
    card = files["README.md"].decode()
    assert (
        f'pipe.load_lora_weights("tester/wan22", weight_name="{layout.EXPERT_2_LORA_WEIGHT_NAME}", '
        "load_into_transformer_2=True)"
    ) in card
    download = str(hub.download("tester/wan22", tmp_path / "download"))
    pipe = WanPipeline.from_pretrained(tiny_wan22_path)  # loaded as the card says
    pipe.load_lora_weights(download)
    pipe.load_lora_weights(download, weight_name=layout.EXPERT_2_LORA_WEIGHT_NAME, load_into_transformer_2=True)
    inputs = tiny_transformer_inputs()
    base = WanBackbone(WanPipeline.from_pretrained(tiny_wan22_path)).pipeline
    with torch.no_grad():
        for name in ("transformer", "transformer_2"):
            loaded = getattr(pipe, name)(**inputs)[0]
            trained_output = trainer.backbone.transformer.expert(name)(**inputs)[0]
            torch.testing.assert_close(loaded, trained_output)
            assert not torch.allclose(getattr(base, name)(**inputs)[0], trained_output, atol=1e-6), name
