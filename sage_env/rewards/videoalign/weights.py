"""VideoAlign's weights in the installed transformers: peft/4.45 state dict conversion and the reward model.

A released ``model.pth`` is the state dict of a peft-wrapped transformers-4.45 ``Qwen2VLForConditionalGeneration``
with a bias-free ``rm_head``; `convert_videoalign_state_dict` merges its LoRA pairs and renames its keys, and
`build_videoalign_model` loads the result into `VideoAlignModel` (``transformers.Qwen2VLModel`` + ``rm_head``)
with the numerics of VideoAlign's own inference (see `build_videoalign_model`).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from transformers import Qwen2VLConfig, Qwen2VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding

__all__ = [
    "ReleasedVisionRotaryEmbedding",
    "VideoAlignModel",
    "build_videoalign_model",
    "convert_videoalign_state_dict",
    "merge_lora_weight",
    "remap_qwen2_vl_key",
]

_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<factor>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")
_BASE_LAYER = ".base_layer."


def merge_lora_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``W + scale * B @ A`` in float32: the weight a peft LoRA linear layer computes with (unmerged forward)."""
    return base.float() + scale * (lora_b.float() @ lora_a.float())


def remap_qwen2_vl_key(key: str) -> str:
    """Map a transformers-4.45 ``Qwen2VLForConditionalGeneration`` key to the installed (5.x) layout.

    transformers 5 moved the decoder under ``model.language_model`` and the vision tower under
    ``model.visual`` (its own conversion rules for this class do the same); module names inside are unchanged.
    Keys already in the new layout pass through.
    """
    if key.startswith(("model.language_model.", "model.visual.", "lm_head.", "rm_head.")):
        return key
    if key.startswith("model."):
        return "model.language_model." + key.removeprefix("model.")
    if key.startswith("visual."):
        return "model.visual." + key.removeprefix("visual.")
    raise ValueError(
        f"Unexpected key {key!r} in the VideoAlign checkpoint: expected Qwen2-VL keys under model., visual., "
        "lm_head. or rm_head."
    )


def _strip_peft_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefixed = [key.startswith(_PEFT_PREFIX) for key in state_dict]
    if any(prefixed) and not all(prefixed):
        outliers = [key for key, has in zip(state_dict, prefixed) if not has][:5]
        raise ValueError(
            f"Mixed key layout in the VideoAlign checkpoint: {outliers} lack the {_PEFT_PREFIX!r} prefix."
        )
    return {key.removeprefix(_PEFT_PREFIX): value for key, value in state_dict.items()}


def _collect_lora_factors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{module: {"A": lora_A, "B": lora_B}}`` for every LoRA pair; one adapter only."""
    factors: dict[str, dict[str, torch.Tensor]] = {}
    adapters = set()
    for key, value in state_dict.items():
        match = _LORA_KEY.match(key)
        if match:
            adapters.add(match.group("adapter"))
            factors.setdefault(match.group("module"), {})[match.group("factor")] = value
    if len(adapters) > 1:
        raise ValueError(
            f"The VideoAlign checkpoint holds several LoRA adapters {sorted(map(str, adapters))}; expected one."
        )
    incomplete = [module for module, pair in factors.items() if set(pair) != {"A", "B"}]
    if incomplete:
        raise ValueError(f"LoRA modules {incomplete[:5]} have lora_A or lora_B but not both.")
    return factors


def _lora_scale(
    module: str,
    pair: dict[str, torch.Tensor],
    base: torch.Tensor,
    lora_alpha: float | None,
    lora_rank: int | None,
    use_rslora: bool,
) -> float:
    """Check one LoRA pair's shapes against its base weight and the configured rank; return alpha / r."""
    lora_a, lora_b = pair["A"], pair["B"]
    rank = lora_a.shape[0]
    if (
        lora_a.ndim != 2
        or lora_b.ndim != 2
        or lora_b.shape[1] != rank
        or base.shape != (lora_b.shape[0], lora_a.shape[1])
    ):
        raise ValueError(
            f"LoRA shape mismatch at {module}: base {tuple(base.shape)}, lora_A {tuple(lora_a.shape)}, lora_B "
            f"{tuple(lora_b.shape)}; expected lora_A (r, {base.shape[-1]}) and lora_B ({base.shape[0]}, r)."
        )
    if lora_rank is not None and rank != lora_rank:
        raise ValueError(
            f"LoRA rank mismatch at {module}: the weights have r={rank} but model_config.json says lora_r={lora_rank}."
        )
    if lora_alpha is None:
        raise ValueError(
            "The checkpoint has LoRA weights but model_config.json gives no peft_lora_config.lora_alpha."
        )
    # peft's LoraLayer scaling: alpha / r, or alpha / sqrt(r) for rank-stabilised LoRA.
    return lora_alpha / (math.sqrt(rank) if use_rslora else rank)


def convert_videoalign_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    lora_alpha: float | None,
    lora_rank: int | None = None,
    use_rslora: bool = False,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Turn a released ``model.pth`` into `VideoAlignModel` weights in the installed layout.

    Strips peft's ``base_model.model.`` prefix, folds every unmerged LoRA pair into its base weight
    (``W + (alpha / r) * B @ A`` computed in float32, ``alpha / sqrt(r)`` with rsLoRA; r from the weights,
    alpha from model_config.json), renames the transformers-4.45 keys (`remap_qwen2_vl_key`) and drops
    ``lm_head`` (the reward never computes language-model logits). Every tensor is cast to ``dtype`` as soon
    as it is ready (None: merged weights float32, the others as stored), which bounds peak memory.
    """
    flat = _strip_peft_prefix(state_dict)
    factors = _collect_lora_factors(flat)
    merged: dict[str, torch.Tensor] = {}
    for module, pair in factors.items():
        base_key = f"{module}{_BASE_LAYER}weight"
        if base_key not in flat:
            raise ValueError(f"LoRA module {module} has no base weight {base_key} in the checkpoint.")
        scale = _lora_scale(module, pair, flat[base_key], lora_alpha, lora_rank, use_rslora)
        merged[f"{module}.weight"] = merge_lora_weight(flat[base_key], pair["A"], pair["B"], scale).to(dtype)
        if f"{module}{_BASE_LAYER}bias" in flat:
            merged[f"{module}.bias"] = flat[f"{module}{_BASE_LAYER}bias"].to(dtype)
    for key, value in flat.items():
        if _LORA_KEY.match(key) or key.split(_BASE_LAYER)[0] in factors:
            continue
        if _BASE_LAYER in key:
            raise ValueError(f"{key} is a LoRA base layer without lora_A/lora_B weights.")
        merged[key] = value.to(dtype)
    return {remap_qwen2_vl_key(key): value for key, value in merged.items() if not key.startswith("lm_head.")}


# -- the model ---------------------------------------------------------------------------------------


class ReleasedVisionRotaryEmbedding(Qwen2VLVisionRotaryEmbedding):
    """Qwen2-VL's vision RoPE with the angles and their cos / sin computed in the dtype of ``inv_freq``.

    transformers 4.45, which VideoAlign was trained and released with, computed ``outer(arange(n), inv_freq)``
    and its cos / sin in the buffer's dtype, so the bfloat16 model of VideoAlign's inference (which casts the
    whole model, buffers included) used bfloat16 angles; transformers 5 computes them in float32 whatever the
    model's dtype. In float32 both are the same computation.
    """

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of the ``(2, N)`` row / column patch positions, in the dtype of ``inv_freq``."""
        inv_freq = self.inv_freq.to(x.device)
        freqs = position_ids[..., None].to(inv_freq.dtype) * inv_freq
        cos = self.recomposition_frequencies(freqs.cos() * self.attention_scaling)
        sin = self.recomposition_frequencies(freqs.sin() * self.attention_scaling)
        return cos, sin


class VideoAlignModel(nn.Module):
    """Qwen2-VL (``transformers.Qwen2VLModel``) with VideoAlign's bias-free reward head.

    Args:
        config: the Qwen2-VL configuration (vocabulary size as in the checkpoint).
        output_dim: outputs of ``rm_head``: 3 (one per metric, read diagonally) or 1 (shared).
    """

    def __init__(self, config: Qwen2VLConfig, output_dim: int) -> None:
        super().__init__()
        if output_dim not in (1, 3):
            raise ValueError(f"VideoAlign's reward head has 1 or 3 outputs, got {output_dim}.")
        self.config = config
        self.model = Qwen2VLModel(config)
        self.model.visual.rotary_pos_emb = ReleasedVisionRotaryEmbedding(config.vision_config)
        self.rm_head = nn.Linear(config.text_config.hidden_size, output_dim, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values_videos: torch.Tensor,
        video_grid_thw: torch.Tensor,
        reward_token_ids: Sequence[int],
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Raw ``(B, 3)`` float32 scores (VQ, MQ, TA) of right-padded token sequences with their videos.

        ``position_ids`` defaults to ``0..L-1`` for every sequence: VideoAlign was trained with transformers
        4.45, whose Qwen2-VL decoder numbered tokens sequentially when called without position ids;
        transformers 5 would build 3-D M-RoPE ids instead, which change the scores.
        """
        if position_ids is None:
            length = input_ids.shape[1]
            position_ids = torch.arange(length, device=input_ids.device).expand(input_ids.shape[0], length)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=video_grid_thw,
            use_cache=False,
        )
        return self.read_rewards(outputs.last_hidden_state, input_ids, reward_token_ids)

    def read_rewards(
        self, hidden_states: torch.Tensor, input_ids: torch.Tensor, reward_token_ids: Sequence[int]
    ) -> torch.Tensor:
        """Apply ``rm_head`` at each reward token; metric i reads output i (or output 0 of a 1-output head)."""
        scores = []
        for metric, token_id in enumerate(reward_token_ids):
            at_token = input_ids == token_id
            counts = at_token.sum(dim=1)
            if not bool((counts == 1).all()):
                raise ValueError(
                    f"Each sequence needs reward token id {token_id} exactly once, got counts {counts.tolist()}."
                )
            logits = self.rm_head(hidden_states[at_token])
            scores.append(logits[:, metric if logits.shape[1] == 3 else 0])
        return torch.stack(scores, dim=1).float()


def _check_state_dict(model: VideoAlignModel, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Fail loudly, naming the keys, when the converted checkpoint does not fit the model exactly."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(
            f"The VideoAlign checkpoint does not match the Qwen2-VL architecture: missing keys {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''} ({len(missing)}), unexpected keys {unexpected[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''} ({len(unexpected)}). Is the base config the right one?"
        )
    wrong = [(k, tuple(v.shape), expected[k]) for k, v in state_dict.items() if tuple(v.shape) != expected[k]]
    if wrong:
        details = "; ".join(f"{key}: checkpoint {got}, model {want}" for key, got, want in wrong[:5])
        raise ValueError(
            f"Shape mismatch between the VideoAlign checkpoint and the Qwen2-VL config: {details}."
        )


def build_videoalign_model(
    config: Qwen2VLConfig,
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.bfloat16,
    attn_implementation: str = "sdpa",
) -> VideoAlignModel:
    """Instantiate `VideoAlignModel` from converted weights (`convert_videoalign_state_dict`) without random init.

    The vocabulary size and the head's shape come from the weights; the architecture from ``config``. The
    whole model, the rotary embeddings' ``inv_freq`` buffers included, is cast to ``dtype``, as VideoAlign's
    inference does (``model.to(torch.bfloat16)`` after loading); with `ReleasedVisionRotaryEmbedding` a
    bfloat16 model computes its rotary angles as the released one did. float32 changes nothing.
    """
    from accelerate import init_empty_weights

    head = state_dict.get("rm_head.weight")
    embeddings = state_dict.get("model.language_model.embed_tokens.weight")
    if head is None or embeddings is None:
        raise ValueError(
            "The VideoAlign checkpoint lacks rm_head.weight or the token embeddings (model.embed_tokens)."
        )
    if head.ndim != 2 or head.shape[1] != config.text_config.hidden_size:
        raise ValueError(
            f"Reward head shape {tuple(head.shape)} does not fit hidden size {config.text_config.hidden_size} of "
            "the Qwen2-VL config; expected (1 or 3, hidden_size)."
        )
    config = copy.deepcopy(config)
    config.text_config.vocab_size = embeddings.shape[0]
    config._attn_implementation = attn_implementation
    with init_empty_weights(include_buffers=False):
        model = VideoAlignModel(config, output_dim=head.shape[0])
    _check_state_dict(model, state_dict)
    model.load_state_dict(
        {key: value.to(dtype) for key, value in state_dict.items()}, strict=True, assign=True
    )
    return model.to(dtype).eval().requires_grad_(False)
