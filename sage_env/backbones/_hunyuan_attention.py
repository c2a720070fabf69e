"""HunyuanVideo 1.5 joint attention with a key-padding mask instead of a dense ``(B, N, N)`` mask.

diffusers' ``HunyuanVideo15AttnProcessor2_0`` (0.42) turns the ``(B, N)`` token mask of the joint
video + text sequence into ``mask_i & mask_j``, a dense boolean ``(B, 1, N, N)`` tensor built in every
attention call: at 480p x 81 frames N = 35,375 tokens, i.e. ~1.2 GB of booleans per video, which SDPA then
turns into a bias of 4-6 bytes per entry (docs/training_on_gpus.md). The dense mask differs from a
key-padding mask ``(B, 1, 1, N)`` only in the rows of padded *queries*: those rows are the padded text
tokens, which no later layer reads (they are masked as keys everywhere) and the model's output drops
(only video tokens are projected out). The video output is therefore the same with either mask, while the
key-padding mask costs O(N) memory.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb

__all__ = ["KeyPaddingAttnProcessor", "use_key_padding_attention"]


class KeyPaddingAttnProcessor:
    """Attention processor for ``HunyuanVideo15TransformerBlock.attn`` that masks padded keys only.

    Same projections, QK norms, rotary embedding and output projections as diffusers'
    ``HunyuanVideo15AttnProcessor2_0``; the only change is the mask handed to the attention kernel. The
    attention backend chosen with diffusers' ``set_attention_backend`` is honoured as in the original.
    """

    _attention_backend = None
    _parallel_config = None

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Joint attention over ``[video tokens, text tokens]``; returns the two streams' outputs."""
        query, key, value = _video_qkv(attn, hidden_states, image_rotary_emb)
        if encoder_hidden_states is not None:
            text_query, text_key, text_value = _text_qkv(attn, encoder_hidden_states)
            query = torch.cat([query, text_query], dim=1)
            key = torch.cat([key, text_key], dim=1)
            value = torch.cat([value, text_value], dim=1)
        key_mask = None
        if attention_mask is not None:
            # The mask covers the trailing (text) tokens; video tokens in front are always attended.
            padding = key.shape[1] - attention_mask.shape[1]
            key_mask = torch.nn.functional.pad(attention_mask.bool(), (padding, 0), value=True)
        attended = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=key_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        attended = attended.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return _project_out(attn, attended), None
        text_length = encoder_hidden_states.shape[1]
        video_out, text_out = attended[:, :-text_length], attended[:, -text_length:]
        if getattr(attn, "to_add_out", None) is not None:
            text_out = attn.to_add_out(text_out)
        return _project_out(attn, video_out), text_out


def _video_qkv(
    attn: torch.nn.Module, hidden_states: torch.Tensor, image_rotary_emb: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(B, N, heads, head_dim)`` query, key, value of the video stream, normalised, with rotary positions."""
    query, key, value = (
        projection(hidden_states).unflatten(2, (attn.heads, -1))
        for projection in (attn.to_q, attn.to_k, attn.to_v)
    )
    query, key = attn.norm_q(query), attn.norm_k(key)
    if image_rotary_emb is not None:
        query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
    return query, key, value


def _text_qkv(
    attn: torch.nn.Module, encoder_hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key, value of the text stream (``add_*_proj``), with the added QK norms when present."""
    query, key, value = (
        projection(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        for projection in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
    )
    if attn.norm_added_q is not None:
        query = attn.norm_added_q(query)
    if attn.norm_added_k is not None:
        key = attn.norm_added_k(key)
    return query, key, value


def _project_out(attn: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if getattr(attn, "to_out", None) is not None:
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    return hidden_states


def use_key_padding_attention(transformer: torch.nn.Module) -> int:
    """Install `KeyPaddingAttnProcessor` in every joint-attention block of a HunyuanVideo 1.5 transformer.

    Returns the number of attention modules changed. The token refiner's attention (text tokens only, a
    small mask) is left as it is.
    """
    blocks = getattr(transformer, "transformer_blocks", None)
    if blocks is None:
        raise ValueError(
            f"{type(transformer).__name__} has no transformer_blocks; pass a HunyuanVideo15Transformer3DModel."
        )
    for block in blocks:
        block.attn.set_processor(KeyPaddingAttnProcessor())
    return len(blocks)
