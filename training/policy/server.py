"""The embedded policy server: a local transformers checkpoint behind the OpenAI chat-completions protocol, on CPU.

Same wire format as `vllm serve` (images as data URLs, `n` candidates, `temperature`, `top_p`, `max_tokens`, `seed`,
and `structured_outputs={"regex": …}` / `guided_regex` for grammar-constrained decoding), so the web app and the
trainer talk to either without knowing which. With no checkpoint it builds the tiny random one (training.policy.tiny).

    python -m training.policy.server --checkpoint var/models/tiny-uitars --port 8020
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

DEFAULT_CHECKPOINT = Path("var/models/tiny-uitars")


class BadRequest(ValueError):
    """The request is well formed JSON but cannot be served (HTTP 400, OpenAI error shape)."""


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]


class ChatRequest(BaseModel):
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=16)
    temperature: float = Field(default=1.0, ge=0, le=5)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=256, ge=1, le=4096)
    seed: int | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_regex: str | None = None


class PolicyEngine:
    """One checkpoint in memory; `complete` runs one request at a time (generation seeds the global RNG)."""

    def __init__(self, checkpoint: Path, *, name: str | None = None, threads: int | None = None) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        from .constrained import token_strings

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.name = name or Path(checkpoint).name
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.image_processor = AutoImageProcessor.from_pretrained(checkpoint)
        self.model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.image_token = "<|image_pad|>"
        self.merge = getattr(self.image_processor, "merge_size", 2)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.token_strings = token_strings(self.tokenizer, vocab)
        self.eos = self.model.generation_config.eos_token_id
        self.eos = self.eos[0] if isinstance(self.eos, list) else self.eos
        self.lock = threading.Lock()

    def _render(self, messages: list[ChatMessage]) -> tuple[str, list[Any]]:
        from PIL import Image, UnidentifiedImageError

        chat, images = [], []
        for message in messages:
            if isinstance(message.content, str):
                chat.append({"role": message.role, "content": message.content})
                continue
            parts = []
            for part in message.content:
                if part.get("type") == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif part.get("type") == "image_url":
                    url = str((part.get("image_url") or {}).get("url", ""))
                    if not url.startswith("data:image/") or ";base64," not in url:
                        raise BadRequest("images must be data URLs (data:image/...;base64,...): no network here")
                    try:
                        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1], validate=True)))
                        images.append(image.convert("RGB"))
                    except (ValueError, UnidentifiedImageError) as exc:
                        raise BadRequest(f"image {len(images) + 1} is not a readable image: {exc}") from exc
                    parts.append({"type": "image"})
                else:
                    raise BadRequest(f"unsupported content part type {part.get('type')!r}")
            chat.append({"role": message.role, "content": parts})
        prompt = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return prompt, images

    def complete(self, request: ChatRequest) -> dict[str, Any]:
        from .constrained import RegexLogitsProcessor

        torch = self.torch
        prompt, images = self._render(request.messages)
        inputs: dict[str, Any] = {}
        if images:
            vision = self.image_processor(images=images, return_tensors="pt")
            inputs = {"pixel_values": vision["pixel_values"], "image_grid_thw": vision["image_grid_thw"]}
            pieces = prompt.split(self.image_token)
            if len(pieces) != len(images) + 1:
                raise BadRequest("the chat template placed a different number of images than were sent")
            counts = [int(grid.prod()) // self.merge**2 for grid in vision["image_grid_thw"]]
            prompt = pieces[0] + "".join(self.image_token * c + p for c, p in zip(counts, pieces[1:], strict=True))
        input_ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        pattern = (request.structured_outputs or {}).get("regex") or request.guided_regex
        processors = []
        if pattern:
            processors.append(RegexLogitsProcessor(pattern, self.token_strings, self.eos, input_ids.shape[1]))
        sample = request.temperature > 0
        with self.lock, torch.inference_mode():
            if request.seed is not None:
                torch.manual_seed(request.seed)
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                **inputs,
                do_sample=sample,
                temperature=request.temperature if sample else None,
                top_p=request.top_p if sample else None,
                top_k=None,
                num_return_sequences=request.n,
                max_new_tokens=request.max_tokens,
                logits_processor=processors,
                eos_token_id=self.eos,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        generated = output[:, input_ids.shape[1] :]
        choices = []
        for index, ids in enumerate(generated.tolist()):
            finished = self.eos in ids
            ids = ids[: ids.index(self.eos)] if finished else ids
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop" if finished else "length",
                    "completion_tokens": len(ids),
                }
            )
        completion = sum(c.pop("completion_tokens") for c in choices)
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": int(input_ids.shape[1]),
                "completion_tokens": completion,
                "total_tokens": int(input_ids.shape[1]) + completion,
            },
        }


def create_app(engine: PolicyEngine) -> FastAPI:
    app = FastAPI(title="Embedded policy server", description=__doc__)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Any, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "model": engine.name}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": engine.name, "object": "model", "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    def chat_completions(request: ChatRequest) -> dict[str, Any]:
        return engine.complete(request)

    return app


def main() -> None:
    import uvicorn

    from .tiny import build_tiny_checkpoint

    parser = argparse.ArgumentParser(description="Serve a transformers checkpoint over the OpenAI protocol.")
    default_checkpoint = Path(os.environ.get("POLICY_CHECKPOINT", DEFAULT_CHECKPOINT))
    parser.add_argument("--checkpoint", type=Path, default=default_checkpoint)
    parser.add_argument("--name", default=os.environ.get("POLICY_MODEL_NAME"), help="served model name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("POLICY_PORT", "8020")))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("POLICY_THREADS", "2")))
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        print(f"no checkpoint at {args.checkpoint}: building the tiny random one there")
        build_tiny_checkpoint(args.checkpoint)
    engine = PolicyEngine(args.checkpoint, name=args.name, threads=args.threads)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
