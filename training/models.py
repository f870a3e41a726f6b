"""Loading the actor, critic and reference models, LoRA, and token log-probabilities.

Any transformers causal LM or image-text-to-text checkpoint loads as the actor; the critic is the same backbone with
a scalar value head (saved beside the backbone as `value_head.safetensors`), so a value-pretrained critic is an
ordinary directory that PPO starts from.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

VISION_KEYS = ("pixel_values", "image_grid_thw")


@dataclass
class LoraSettings:
    """LoRA on every linear layer of the language model (peft); r = 0 trains all weights."""

    r: int = 0
    alpha: int = 16
    dropout: float = 0.0


def load_tokenizer(path: str | Path) -> tuple[Any, Any]:
    """(tokenizer, image processor or None) of a checkpoint."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    processor = None
    if (Path(path) / "preprocessor_config.json").is_file():
        processor = AutoImageProcessor.from_pretrained(path)
    return tokenizer, processor


def load_actor(path: str | Path, lora: LoraSettings | None = None, dtype: torch.dtype = torch.float32) -> Any:
    """The policy model; with LoRA, a peft model whose base weights are frozen (a peft adapter dir also loads)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    path = Path(path)
    if (path / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(path, is_trainable=True, dtype=dtype)
    config = AutoConfig.from_pretrained(path)
    loader = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = loader.from_pretrained(path, dtype=dtype)
    if lora is not None and lora.r > 0:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules="all-linear", task_type="CAUSAL_LM")  # fmt: skip
        model = get_peft_model(model, config)
    return model


def save_actor(model: Any, tokenizer: Any, processor: Any, out: Path, *, merged: bool = True) -> Path:
    """A checkpoint the policy server (or vLLM) can load: LoRA is merged into full weights unless `merged=False`,
    which saves the adapter alone (what vLLM's runtime LoRA loading takes)."""
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "peft_config") and merged:
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if processor is not None:
        processor.save_pretrained(out)
    return out


class Critic(nn.Module):
    """V(s_t) for every position: the backbone's last hidden state through a linear head (zero-initialised, so
    a new critic starts from V = 0)."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Critic:
        from transformers import AutoConfig, AutoModel

        path = Path(path)
        config = AutoConfig.from_pretrained(path)
        text = getattr(config, "text_config", config)
        critic = cls(AutoModel.from_pretrained(path, dtype=dtype), text.hidden_size)
        head = path / "value_head.safetensors"
        if head.is_file():
            critic.value_head.load_state_dict(load_file(head))
        return critic.to(dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs: Any
                ) -> torch.Tensor:  # fmt: skip
        """(B, T) values; takes what `model_inputs` gives (a packed batch has `position_ids` and no attention mask)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **inputs)
        return self.value_head(out.last_hidden_state).squeeze(-1).float()

    def save_pretrained(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()}, out / "value_head.safetensors")
        return out


def vision_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in VISION_KEYS if k in batch}


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The forward arguments of a padded batch (input ids, attention mask, images) or of a packed one (input ids,
    position ids; see training.packing)."""
    keys = ("input_ids", "position_ids") if "position_ids" in batch else ("input_ids", "attention_mask")
    # no KV cache: a scoring pass never reuses it, and transformers only recognises packed rows without one
    return {k: batch[k] for k in keys} | vision_inputs(batch) | {"use_cache": False}


def token_log_probs(
    model: Any,
    batch: dict[str, torch.Tensor],
    *,
    only: torch.Tensor | None = None,
    entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(x_t | x_<t) for t = 1..T−1, shape (B, T−1), and the entropy of each of those distributions if asked.

    `only` (B, T−1), nonzero where a value is needed (the trained tokens): the vocabulary projection and the
    normaliser are computed there alone, zeros elsewhere. With a 150k-token vocabulary the projection is most of a
    small model's work, so skipping prompt and observation positions roughly halves a PPO step. The entropy is a
    metric unless an entropy bonus trains on it, so `entropy_grad=False` keeps its softmax out of the autograd graph.
    """
    ids = batch["input_ids"]
    targets = ids[:, 1:]
    keep = None if only is None else only.bool()
    kwargs: dict[str, Any] = {}
    if keep is not None and _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = torch.nn.functional.pad(keep, (0, 1), value=False)  # (B, T): no target after T
    logits = model(**model_inputs(batch), **kwargs).logits
    if "logits_to_keep" in kwargs:
        chosen_ids = targets[keep]  # logits is (N, V): the kept positions, row-major
    else:
        logits = logits[:, :-1]
        chosen_ids = targets
        if keep is not None:
            logits, chosen_ids = logits[keep], targets[keep]
    logits = logits.float()
    normaliser = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, chosen_ids[..., None]).squeeze(-1) - normaliser
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    if keep is None:
        return chosen, ent
    return _scatter(chosen, keep), None if ent is None else _scatter(ent, keep)


def _scatter(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Values of the kept positions back into a (B, T−1) tensor with zeros elsewhere (differentiable)."""
    return torch.zeros(keep.shape, dtype=values.dtype, device=values.device).masked_scatter(keep, values)


def _accepts_logits_to_keep(model: Any) -> bool:
    """Whether the causal LM under DDP/peft wrappers takes `logits_to_keep` (transformers ≥ 4.50 models do)."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    return _forward_takes_logits_to_keep(type(inner))


@functools.cache
def _forward_takes_logits_to_keep(cls: type) -> bool:
    """Per model class, once: reading a signature on every minibatch would be work repeated on the hot path."""
    return "logits_to_keep" in inspect.signature(cls.forward).parameters
