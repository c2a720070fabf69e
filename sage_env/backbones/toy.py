"""The toy world's video model: a tiny pixel-space flow-matching ``WanTransformer3DModel`` behind `VideoBackbone`.

The model denoises pixels directly (no VAE): latents are videos in [-1, 1] laid out ``(B, 3, F, H, W)`` and
`ToyBackbone.decode` is ``(x.clamp(-1, 1) + 1) / 2`` moved to ``(B, F, 3, H, W)``. It was trained on the
synthetic videos of `sage_env.toy.world` by ``python -m sage_env.toy.train_prior`` and ships inside the package
(`TOY_PRIOR_PATH`, a few hundred KB), so ``load_backbone("toy")`` works offline.

Architecture:

* transformer: diffusers ``WanTransformer3DModel``, patch (1, 2, 2), 2 layers, 2 heads x 32, ffn 128,
  ``in_channels=6``, ``out_channels=3`` (~143k parameters). Wan attends with relative (rotary) positions only,
  with which the model never learned the direction of motion; three fixed coordinate channels (ramps in
  [-1, 1] along time, rows and columns) are appended to the 3 pixel channels of every input to fix that.
* text encoder: a frozen, randomly initialised 1-layer ``UMT5EncoderModel`` (d_model 32) over the bytes of
  the prompt (``ByT5Tokenizer``, which needs no vocabulary file), padded to ``max_sequence_length`` tokens
  with padding embeddings zeroed, as ``WanPipeline.encode_prompt`` does.
* velocity: ``timestep = sigma * 1000`` as in diffusers' Wan, diffusers' convention ``v = noise - x0``; CFG
  ``uncond + g * (cond - uncond)`` against the empty negative prompt when ``guidance_scale > 1`` (the prior
  needs none: `ToyBackbone.default_guidance_scale` is 1).
* schedule: `VideoBackbone.sigmas` is `sage_env.sde.flow_match_sigmas` at the declared shift 3; the size, steps,
  shift, guidance and fps are ``sage_env.models.TOY_SAMPLING_DEFAULTS``.

The folder layout imitates a diffusers pipeline: ``model_index.json`` (``"_class_name": "toy"``, plus the video
size and text length the model was trained with), ``transformer/`` (``save_pretrained``), ``text_encoder/``
and ``tokenizer/``. LoRA adapters on `ToyBackbone.transformer` save and load in the diffusers Wan LoRA format
(`VideoBackbone.save_lora_weights`).

Sizes: any ``F <= 32`` and even ``H, W <= 64`` run, but the prior was trained at 8 frames of 16 x 16 only (the
coordinate ramps are normalised, so other sizes stretch the world it knows).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import diffusers
import torch
from diffusers import WanTransformer3DModel
from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

from sage_env.backbones import _diffusers
from sage_env.backbones.base import PromptConditioning, VideoBackbone
from sage_env.models import TOY_SAMPLING_DEFAULTS

__all__ = ["TOY_PRIOR_PATH", "ToyBackbone"]

TOY_PRIOR_PATH = Path(__file__).resolve().parent.parent / "toy" / "assets" / "prior"
"""Folder of the shipped prior (what ``ToyBackbone.from_pretrained("toy")`` loads)."""

PIXEL_CHANNELS = 3
COORDINATE_CHANNELS = 3
"""Fixed (time, row, column) ramps appended to the pixels of every transformer input."""
NUM_TRAIN_TIMESTEPS = 1000
"""``timestep = sigma * NUM_TRAIN_TIMESTEPS``, as diffusers' Wan pipeline feeds its transformer."""
_ROPE_MAX_SEQ_LEN = 32
_BYT5_VOCAB_SIZE = 384  # 3 special tokens + 256 bytes + 125 extra ids, as ByT5Tokenizer()
_MODEL_INDEX = "model_index.json"


def build_toy_transformer(seed: int = 0) -> WanTransformer3DModel:
    """A randomly initialised toy transformer (the architecture of the shipped prior), seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=32,
            in_channels=PIXEL_CHANNELS + COORDINATE_CHANNELS,
            out_channels=PIXEL_CHANNELS,
            text_dim=32,
            freq_dim=64,
            ffn_dim=128,
            num_layers=2,
            rope_max_seq_len=_ROPE_MAX_SEQ_LEN,
        )


def build_toy_text_encoder(seed: int = 0) -> UMT5EncoderModel:
    """The frozen random text encoder: 1-layer UMT5 over bytes (d_model 32), seeded, in eval mode."""
    config = UMT5Config(
        vocab_size=_BYT5_VOCAB_SIZE,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return UMT5EncoderModel(config).eval().requires_grad_(False)


def coordinate_channels(num_frames: int, height: int, width: int) -> torch.Tensor:
    """The fixed input channels ``(3, F, H, W)``: ramps from -1 to 1 along time, rows and columns."""
    ramps = [torch.linspace(-1.0, 1.0, n) if n > 1 else torch.zeros(1) for n in (num_frames, height, width)]
    time, rows, cols = torch.meshgrid(*ramps, indexing="ij")
    return torch.stack([time, rows, cols])


class ToyBackbone(VideoBackbone):
    """The toy world's pixel-space text-to-video model (see the module docstring).

    Args:
        transformer: a ``WanTransformer3DModel`` with ``in_channels = 6`` and ``out_channels = 3``.
        text_encoder: the frozen ``UMT5EncoderModel`` whose ``d_model`` is the transformer's ``text_dim``.
        tokenizer: a ``ByT5Tokenizer``.
        max_sequence_length: text tokens per prompt (bytes + end-of-sequence); longer prompts are truncated.

    Example:
        ```python
        from sage_env.backbones import load_backbone
        from sage_env.env import sample_videos

        backbone = load_backbone("toy")
        videos = sample_videos(backbone, ["a red square moving left"], seeds=[0])  # (1, 8, 3, 16, 16)
        ```
    """

    default_lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")
    pipeline_class = "toy"
    sampling_defaults = TOY_SAMPLING_DEFAULTS

    def __init__(
        self,
        transformer: WanTransformer3DModel,
        text_encoder: UMT5EncoderModel,
        tokenizer: ByT5Tokenizer,
        *,
        max_sequence_length: int = 32,
    ) -> None:
        super().__init__()
        self._check_modules(transformer, text_encoder)
        if (
            isinstance(max_sequence_length, bool)
            or not isinstance(max_sequence_length, int)
            or max_sequence_length < 2
        ):
            raise ValueError(f"max_sequence_length must be an integer >= 2, got {max_sequence_length!r}.")
        self.transformer = transformer
        self.text_encoder = text_encoder.eval()
        self.tokenizer = tokenizer
        self.max_sequence_length = max_sequence_length
        _diffusers.freeze([self.text_encoder])

    @staticmethod
    def _check_modules(transformer: torch.nn.Module, text_encoder: torch.nn.Module) -> None:
        if not isinstance(transformer, WanTransformer3DModel):
            raise ValueError(
                f"transformer must be a diffusers WanTransformer3DModel, got {type(transformer).__name__}."
            )
        channels = (transformer.config.in_channels, transformer.config.out_channels)
        if channels != (PIXEL_CHANNELS + COORDINATE_CHANNELS, PIXEL_CHANNELS):
            raise ValueError(
                f"The toy transformer maps 3 pixel + 3 coordinate channels to 3 pixel channels; got (in, out) = "
                f"{channels}. Build one with sage_env.backbones.toy.build_toy_transformer()."
            )
        if (
            not isinstance(text_encoder, UMT5EncoderModel)
            or text_encoder.config.d_model != transformer.config.text_dim
        ):
            raise ValueError(
                "text_encoder must be a UMT5EncoderModel whose d_model equals the transformer's text_dim "
                f"({transformer.config.text_dim})."
            )

    # -- construction and saving ------------------------------------------------------------------

    @classmethod
    def from_scratch(cls, seed: int = 0, *, text_encoder_seed: int = 0) -> ToyBackbone:
        """A randomly initialised toy backbone (what `sage_env.toy.train_prior` starts from), float32 on CPU."""
        return cls(build_toy_transformer(seed), build_toy_text_encoder(text_encoder_seed), ByT5Tokenizer())

    @classmethod
    def from_pretrained(
        cls,
        model: str = "toy",
        *,
        torch_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> ToyBackbone:
        """Load ``"toy"`` (the shipped prior), a local toy folder (see `save_pretrained`) or a Hub id of one.

        ``torch_dtype`` is the transformer's dtype (float32 when None); the tiny text encoder stays float32.
        ``kwargs`` may override ``max_sequence_length``.
        """
        folder = cls._resolve_folder(model)
        index = json.loads((folder / _MODEL_INDEX).read_text())
        if index.get("_class_name") != "toy":
            raise ValueError(
                f"{folder} holds a {index.get('_class_name')!r} pipeline, not the toy model; load it with "
                "sage_env.backbones.load_backbone(path) instead."
            )
        transformer = WanTransformer3DModel.from_pretrained(
            folder, subfolder="transformer", torch_dtype=torch_dtype or torch.float32
        )
        text_encoder = UMT5EncoderModel.from_pretrained(folder / "text_encoder", dtype=torch.float32)
        tokenizer = ByT5Tokenizer.from_pretrained(folder / "tokenizer")
        max_sequence_length = kwargs.pop("max_sequence_length", index.get("max_sequence_length", 32))
        if kwargs:
            raise ValueError(f"Unexpected arguments for ToyBackbone.from_pretrained: {sorted(kwargs)}.")
        backbone = cls(transformer.eval(), text_encoder, tokenizer, max_sequence_length=max_sequence_length)
        if device is not None:
            backbone.to(device)
        return backbone

    @staticmethod
    def _resolve_folder(model: str) -> Path:
        if not isinstance(model, (str, Path)) or not str(model):
            raise ValueError(f"model must be 'toy', a local folder or a Hub id, got {model!r}.")
        if str(model) == "toy":
            return TOY_PRIOR_PATH
        folder = Path(model)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(str(model)))
        if not (folder / _MODEL_INDEX).is_file():
            raise ValueError(
                f"{folder} has no {_MODEL_INDEX}; point to a folder written by ToyBackbone.save_pretrained."
            )
        return folder

    def save_pretrained(
        self, save_directory: str | Path, *, extra_metadata: dict[str, Any] | None = None
    ) -> None:
        """Write the diffusers-like folder `from_pretrained` reads (safetensors, float32 as loaded)."""
        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(folder / "transformer", safe_serialization=True)
        self.text_encoder.save_pretrained(folder / "text_encoder", safe_serialization=True)
        self.tokenizer.save_pretrained(folder / "tokenizer")
        index = {
            "_class_name": "toy",
            "_diffusers_version": diffusers.__version__,
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "ByT5Tokenizer"],
            "max_sequence_length": self.max_sequence_length,
            **(extra_metadata or {}),
        }
        (folder / _MODEL_INDEX).write_text(json.dumps(index, indent=2) + "\n")

    def to(self, device: torch.device | str) -> ToyBackbone:
        """Move the transformer and the text encoder to ``device``; returns self."""
        self.transformer.to(device)
        self.text_encoder.to(device)
        return self

    # -- sizes -----------------------------------------------------------------------------------

    @classmethod
    def check_video_size(
        cls, configs: Mapping[str, Any], num_frames: int, height: int, width: int
    ) -> tuple[int, int]:
        """Raise unless the toy transformer (its patch size, its rotary table of `_ROPE_MAX_SEQ_LEN` positions) can
        denoise this video; returns ``(1, 1)``: the latents are the pixels."""
        for name, value in (("num_frames", num_frames), ("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        _, patch_height, patch_width = configs["transformer"]["patch_size"]
        for name, value, patch in (("height", height, patch_height), ("width", width, patch_width)):
            if value % patch != 0:
                raise ValueError(
                    f"The toy model needs an even {name} (patch size {patch}); got {value}, use {value + 1}."
                )
            if value // patch > _ROPE_MAX_SEQ_LEN:
                raise ValueError(
                    f"The toy model supports {name} up to {_ROPE_MAX_SEQ_LEN * patch}; got {value}."
                )
        if num_frames > _ROPE_MAX_SEQ_LEN:
            raise ValueError(f"The toy model supports up to {_ROPE_MAX_SEQ_LEN} frames; got {num_frames}.")
        return 1, 1

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(3, F, H, W)``: the pixels themselves. ``H`` and ``W`` must be even (patch 2 x 2)."""
        self.check_video_size({"transformer": self.transformer.config}, num_frames, height, width)
        return (PIXEL_CHANNELS, num_frames, height, width)

    # -- prompts ---------------------------------------------------------------------------------

    def _encode_uncached(self, prompts: Sequence[str], negative_prompt: str | None) -> PromptConditioning:
        """Byte-level UMT5 embeddings of the prompts and of the negative prompt (``""`` when None)."""
        with _diffusers.modules_on([self.text_encoder], self.device):
            # One batch: every text is padded to max_sequence_length, so rows do not affect each other.
            embeds = self._text_embeds([*prompts, negative_prompt or ""])
        prompt_embeds, negative_embeds = embeds[:-1], embeds[-1:].expand(len(prompts), -1, -1)
        return PromptConditioning(
            prompts, {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_embeds}
        )

    def _text_embeds(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = tokens.attention_mask.to(self.device)
        hidden = self.text_encoder(tokens.input_ids.to(self.device), attention_mask=mask).last_hidden_state
        # WanPipeline.encode_prompt keeps each prompt's tokens and pads with zero vectors: same here.
        return (hidden * mask[..., None]).float()

    def offload_text_encoders(self, device: torch.device | str = "cpu") -> None:
        """Move the text encoder to ``device``; new prompts are encoded on the transformer's device."""
        self.text_encoder.to(device)

    # -- model -----------------------------------------------------------------------------------

    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor,
        conditioning: PromptConditioning,
        guidance_scale: float | None = 1.0,
        *,
        transformer: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """Velocity ``(B, 3, F, H, W)`` float32 for pixel latents at per-sample ``sigma`` ``(B,)``, with CFG.

        ``guidance_scale=None`` uses `default_guidance_scale`; above 1 the conditional and unconditional
        predictions run as one batched forward.
        """
        sigma = _diffusers.check_velocity_inputs(
            latents, sigma, conditioning, PIXEL_CHANNELS, ("prompt_embeds", "negative_prompt_embeds")
        )
        scale = _diffusers.check_guidance_scale(
            self.default_guidance_scale if guidance_scale is None else guidance_scale
        )
        model = transformer if transformer is not None else self.transformer
        dtype, device = self.dtype, self.device
        pixels = latents.to(device, dtype)
        coordinates = coordinate_channels(*pixels.shape[2:]).to(device, dtype)
        hidden_states = torch.cat([pixels, coordinates.expand(pixels.shape[0], -1, -1, -1, -1)], dim=1)
        timestep = (sigma * NUM_TRAIN_TIMESTEPS).to(device)
        prompt_embeds = conditioning.tensors["prompt_embeds"].to(device, dtype)
        if scale <= 1.0:
            return self._forward(model, hidden_states, timestep, prompt_embeds).float()
        negative_embeds = conditioning.tensors["negative_prompt_embeds"].to(device, dtype)
        both = self._forward(
            model,
            torch.cat([hidden_states, hidden_states]),
            torch.cat([timestep, timestep]),
            torch.cat([prompt_embeds, negative_embeds]),
        )
        conditional, unconditional = both.chunk(2)
        return (unconditional + scale * (conditional - unconditional)).float()

    @staticmethod
    def _forward(
        model: torch.nn.Module, hidden_states: torch.Tensor, timestep: torch.Tensor, embeds: torch.Tensor
    ) -> torch.Tensor:
        return model(
            hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=embeds, return_dict=False
        )[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Videos ``(B, F, 3, H, W)`` float32 in [0, 1]: ``(x.clamp(-1, 1) + 1) / 2``, channels after frames."""
        if not isinstance(latents, torch.Tensor) or latents.ndim != 5 or latents.shape[1] != PIXEL_CHANNELS:
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise ValueError(f"latents must be pixel latents (B, 3, F, H, W) in [-1, 1], got {shape}.")
        return ((latents.float().clamp(-1.0, 1.0) + 1.0) / 2.0).permute(0, 2, 1, 3, 4).contiguous()
