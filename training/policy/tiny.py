"""A tiny UI-TARS-shaped checkpoint (Qwen2.5-VL architecture, random weights) built from a config, never downloaded.

It lets the whole propose → execute loop run on a CPU with no weights on disk: the tokenizer is byte-level (every
ASCII character one token, so grammar-constrained decoding is exact), the image processor uses UI-TARS-1.5's pixel
range, and the result is saved with `save_pretrained` so the policy server loads it like any real checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|box_start|>",
    "<|box_end|>",
]

# Qwen2-VL's chat template, reduced to what the policy server sends: text and image parts, system/user/assistant.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MIN_PIXELS = 100 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28


def build_tokenizer():  # type: ignore[no-untyped-def]
    """Byte-level BPE with no merges: 256 byte tokens plus Qwen's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def _is_built(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def _text_config(tokenizer: Any, hidden: int, layers: int, max_positions: int, heads: int = 4) -> dict[str, Any]:
    """The decoder's size and special-token ids, shared by the text-only and the vision-language checkpoint."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "max_position_embeddings": max_positions,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


def _save(path: Path, model: Any, tokenizer: Any, *, seed: int, hidden: int, layers: int) -> Path:
    """Generation stops at <|im_end|>; writes the tokenizer, the weights and a note that they are random."""
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    (path / "tiny.json").write_text(json.dumps({"seed": seed, "hidden": hidden, "layers": layers, "random": True}))
    return path


def build_tiny_checkpoint(
    path: Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> Path:
    """Write a random tiny Qwen2.5-VL checkpoint with its processor to `path` (idempotent: kept if complete).
    `heads` divides `hidden` into heads of a size divisible by 8 (M-RoPE's sections); `min_pixels`/`max_pixels`
    bound the image processor's resolution (training/agent.py builds a low-resolution one)."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    path = Path(path)
    if _is_built(path):
        return path
    head_half = hidden // heads // 2  # M-RoPE splits each head's rotary half into time, height and width
    if hidden % heads or head_half % 4:
        raise ValueError(f"hidden ({hidden}) / heads ({heads}) must be a multiple of 8")
    tokenizer = build_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config={
            **_text_config(tokenizer, hidden, layers, max_positions=32768, heads=heads),
            "rope_scaling": {"type": "mrope", "mrope_section": [head_half // 2, head_half // 4, head_half // 4]},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "fullatt_block_indexes": [0],
            "window_size": 112,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    # Tokenizer and image processor are saved apart: the combined processor also wants a video processor,
    # which needs torchvision (no CPU build here); the policy server expands image tokens itself.
    path.mkdir(parents=True, exist_ok=True)
    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(path)
    return _save(path, model, tokenizer, seed=seed, hidden=hidden, layers=layers)


def build_tiny_text_checkpoint(path: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Write a random tiny text-only Qwen2 causal LM with the same byte-level tokenizer (for the trainer's text
    environments and tests: fast on a CPU, same chat template as the vision-language one)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if _is_built(path):
        return path
    tokenizer = build_tokenizer()
    config = Qwen2Config(**_text_config(tokenizer, hidden, layers, max_positions=4096), tie_word_embeddings=True)
    torch.manual_seed(seed)
    return _save(path, Qwen2ForCausalLM(config), tokenizer, seed=seed, hidden=hidden, layers=layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", action="store_true", help="a text-only causal LM instead of the vision-language one")
    args = parser.parse_args()
    build = build_tiny_text_checkpoint if args.text else build_tiny_checkpoint
    print(build(args.path, seed=args.seed))


if __name__ == "__main__":
    main()
