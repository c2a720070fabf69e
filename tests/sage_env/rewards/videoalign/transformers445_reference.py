"""VideoAlign's own inference path under transformers 4.45, for the tests of `test_released_stack`.

Run as a script in a process whose ``PYTHONPATH`` puts a transformers-4.45 install first::

    python transformers445_reference.py <inputs.pt> <output.json>

It rebuilds what VideoAlign's inference does with the tiny checkpoint, written independently of
`sage_env.rewards.videoalign`: a ``Qwen2VLForConditionalGeneration`` subclass with the bias-free head,
embeddings resized to the tokenizer, in bfloat16 the whole model cast with ``model.to(torch.bfloat16)`` (as
VideoAlign's ``create_model_and_processor`` does, rotary ``inv_freq`` buffers included), peft LoRA on every
non-visual linear layer when ``lora_enable``, ``load_state_dict(strict=True)`` of ``model.pth``, the 4.45
``Qwen2VLProcessor`` (right padding) on frames as qwen-vl-utils hands them over (uint8 values as float,
``do_rescale=True``), and the reward model's forward: decoder called without position ids, head at the three
reward tokens, diagonal read-out. ``inputs.pt`` also names the dtype and the attention implementation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed.tensor  # peft's LoRA layers expect the submodule imported
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

REWARD_TOKENS = ["<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]


class RewardModel(Qwen2VLForConditionalGeneration):
    """The special-token forward of VideoAlign's reward model, on 4.45's module layout."""

    def __init__(self, config: Qwen2VLConfig) -> None:
        super().__init__(config)
        self.rm_head = nn.Linear(config.hidden_size, 3, bias=False)
        self.reward_token_ids: list[int] = []

    def forward(self, input_ids, attention_mask, pixel_values_videos, video_grid_thw):
        """Raw (B, 3) scores."""
        embeds = self.model.embed_tokens(input_ids)
        video = self.visual(pixel_values_videos.type(self.visual.get_dtype()), grid_thw=video_grid_thw)
        mask = (input_ids == self.config.video_token_id).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, video.to(embeds.dtype))
        hidden = self.model(
            input_ids=None, position_ids=None, attention_mask=attention_mask, inputs_embeds=embeds
        )[0]
        logits = self.rm_head(hidden)
        at_tokens = torch.zeros_like(input_ids, dtype=torch.bool)
        for token_id in self.reward_token_ids:
            at_tokens |= input_ids == token_id
        return logits[at_tokens].view(input_ids.shape[0], 3, -1).diagonal(dim1=1, dim2=2)


def load_model(folder: Path, tokenizer, dtype: torch.dtype, attn_implementation: str) -> nn.Module:
    """VideoAlign's create_model_and_processor + load_model_from_checkpoint, on the tiny checkpoint."""
    model_config = json.loads((folder / "model_config.json").read_text())
    config = Qwen2VLConfig.from_pretrained(model_config["model_config"]["model_name_or_path"])
    config._attn_implementation = attn_implementation
    model = RewardModel(config)
    model.reward_token_ids = tokenizer.convert_tokens_to_ids(REWARD_TOKENS)
    model.resize_token_embeddings(len(tokenizer))
    model.to(dtype)  # create_model_and_processor: `if training_args.bf16: model.to(torch.bfloat16)`
    step = max(int(path.name.split("-")[1]) for path in folder.glob("checkpoint-*"))
    weights = torch.load(folder / f"checkpoint-{step}" / "model.pth", weights_only=True)
    lora = model_config["peft_lora_config"]
    if not lora["lora_enable"]:
        model.load_state_dict(weights, strict=True)
        return model.eval()
    excluded = ("lm_head", "rm_head", "embed_tokens", "visual")
    targets = [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, nn.Embedding)) and not any(word in name for word in excluded)
    ]
    peft_config = LoraConfig(
        target_modules=targets, r=lora["lora_r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0
    )
    model = get_peft_model(model, peft_config)
    model.load_state_dict(weights, strict=True)
    return model.eval().base_model.model


def main(inputs_path: str, output_path: str) -> None:
    """Score the saved frames and prompts; write the rewards and the processor's inputs as JSON."""
    saved = torch.load(inputs_path, weights_only=False)
    folder = Path(saved["path"])
    tokenizer_folder = next(folder.glob("checkpoint-*")) / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, padding_side="right")
    tokenizer.chat_template = (tokenizer_folder / "chat_template.jinja").read_text()  # 4.45 reads no .jinja
    dtype = getattr(torch, saved["dtype"])
    model = load_model(folder, tokenizer, dtype, saved["attn_implementation"])
    texts = []
    for prompt in saved["prompts"]:
        content = [
            {"type": "video", "video": "file"},
            {"type": "text", "text": saved["template"].format(text_prompt=prompt)},
        ]
        texts.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
            )
        )
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer)
    batch = processor(
        text=texts,
        videos=saved["frames"],
        padding=True,
        return_tensors="pt",
        videos_kwargs={"do_rescale": True},
    )
    with torch.no_grad():
        rewards = model(
            batch["input_ids"], batch["attention_mask"], batch["pixel_values_videos"], batch["video_grid_thw"]
        ).float()
    keys = ("input_ids", "attention_mask", "pixel_values_videos", "video_grid_thw")
    result = {"rewards": rewards.tolist(), **{key: batch[key].tolist() for key in keys}}
    Path(output_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
