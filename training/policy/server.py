"""The embedded policy server: a local transformers checkpoint behind the OpenAI chat-completions protocol, on CPU.

Same wire format as `vllm serve`, so the web app, the trainer and the official `openai` client talk to either without
knowing which: images as data URLs, `n` candidates, `temperature`, `top_p`, `max_tokens`/`max_completion_tokens`,
`seed`, `structured_outputs={"regex": …}` / `guided_regex` for grammar-constrained decoding, `stream` (server-sent
`chat.completion.chunk` events ending in `data: [DONE]`, `stream_options.include_usage`), `logprobs`/`top_logprobs`
(the model's raw per-token log-probs, vLLM's default), vLLM's `return_token_ids` and `return_tokens_as_token_ids`, and
a 404 for a model it does not serve. With no checkpoint it builds the tiny random one (training.policy.tiny).

It serves several models: `POST /v1/models/load` {"model": name, "checkpoint": dir} loads another checkpoint (only
from under a `--models-root`), `DELETE /v1/models/<name>` drops it, `GET /v1/models` lists them all and chat
completions route by `model` (no name: the startup model). With `--api-key` (or POLICY_API_KEY) every /v1 route
wants `Authorization: Bearer <key>`, as vLLM's `--api-key`.

    python -m training.policy.server --checkpoint var/models/tiny-uitars --port 8020 --models-root var/flywheel-runs
"""

from __future__ import annotations

import argparse
import base64
import hmac
import io
import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from training.data import reduce_for, vision_token_ids
from training.policy.grounding import grounding_pattern, is_grounded

from .served import LoadError, ServedModels

DEFAULT_CHECKPOINT = Path("var/models/tiny-uitars")
DEFAULT_MAX_TOKENS = 256
MAX_TOKENS = 4096
MAX_TOP_LOGPROBS = 20  # OpenAI's and vLLM's default limit


class BadRequest(ValueError):
    """The request is well formed JSON but cannot be served (HTTP 400, OpenAI error shape)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownModel(LookupError):
    """The request names a model this server does not serve (HTTP 404, as vLLM answers)."""


class Unauthorized(Exception):
    """The server has an API key and the request does not carry it (HTTP 401, as vLLM's --api-key answers)."""


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, as vLLM fills it (`type` is the exception name, `code` the HTTP status)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model: str | None = None  # empty: the served model (vLLM's rule)
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=16)
    temperature: float = Field(default=1.0, ge=0, le=5)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    return_token_ids: bool = False  # vLLM extension: choices[i].token_ids, prompt_token_ids
    return_tokens_as_token_ids: bool = False  # vLLM extension: logprob tokens as "token_id:N"
    structured_outputs: dict[str, Any] | None = None
    guided_regex: str | None = None

    def check(self) -> None:
        """vLLM's cross-field rules, answered with a 400 naming the parameter."""
        if self.stream_options is not None and not self.stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.", "stream_options")
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


@dataclass
class Prepared:
    """A request rendered into the model's inputs, before any generation (so its errors are plain HTTP errors)."""

    request: ChatRequest
    input_ids: Any
    vision: dict[str, Any]
    processors: list[Any]  # the grammar's logits processor, when the request has one


@dataclass
class Choice:
    """One of the `n` sequences being generated: its token ids (the end token included, as vLLM counts it), their
    log-prob entries, the text already streamed and why it ended."""

    index: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    streamed: str = ""
    finish_reason: str | None = None
    ended_by_eos: bool = False

    def text_ids(self) -> list[int]:
        return self.ids[:-1] if self.ended_by_eos else self.ids


class _Steps:
    """A transformers streamer (put/end): hands each decoding step's tokens, one per sequence, to `on_step`; the
    first `put` is the prompt."""

    def __init__(self, on_step: Callable[[list[int]], None]) -> None:
        self.on_step = on_step
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.on_step(value.reshape(-1).tolist())

    def end(self) -> None:
        """Nothing is buffered here."""


class _Cancelled:
    """A transformers stopping criterion: stops every sequence once `event` is set (a streaming client went away)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class PolicyEngine:
    """One checkpoint in memory; generation runs one request at a time (it seeds the global RNG)."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        name: str | None = None,
        threads: int | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        import torch
        from transformers import (
            AutoConfig,
            AutoImageProcessor,
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoTokenizer,
        )

        from .constrained import token_strings

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.checkpoint = Path(checkpoint)
        self.name = name or self.checkpoint.name
        self.created = int(time.time())
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.vision_tokens = vision_token_ids(self.tokenizer)  # placed by the template only, never generated
        # A vision-language checkpoint (UI-TARS, the tiny one) or a text-only causal LM (the trainer's text tasks).
        vision = hasattr(AutoConfig.from_pretrained(checkpoint), "vision_config")
        self.image_processor = AutoImageProcessor.from_pretrained(checkpoint) if vision else None
        loader = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        self.model = loader.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.image_token = "<|image_pad|>"
        self.merge = getattr(self.image_processor, "merge_size", 2)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.token_strings = token_strings(self.tokenizer, vocab)
        self.eos = self.model.generation_config.eos_token_id
        self.eos = self.eos[0] if isinstance(self.eos, list) else self.eos
        self.grounded = is_grounded(self.model.config)  # the suite agent's decoding rule (training/policy/grounding.py)
        self.lock = lock or threading.Lock()  # shared by every engine of a server: generation seeds the global RNG
        self._token_text: dict[int, str] = {}

    def serves(self, model: str | None) -> bool:
        """Whether a request naming `model` is ours; no name means the served model, as in vLLM."""
        return not model or model == self.name

    def card(self) -> dict[str, Any]:
        """This model's `/v1/models` entry (vLLM's fields: id, created, owned_by, root, parent)."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "local",
                "root": str(self.checkpoint), "parent": None}  # fmt: skip

    def _render(self, messages: list[ChatMessage]) -> tuple[str, list[Any], list[tuple[int, int]]]:
        from PIL import Image, UnidentifiedImageError

        chat, images, sizes = [], [], []
        for message in messages:
            if isinstance(message.content, str):
                chat.append({"role": message.role, "content": message.content})
                continue
            parts = []
            for part in message.content:
                if part.get("type") == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif part.get("type") == "image_url":
                    if self.image_processor is None:
                        raise BadRequest(f"the model `{self.name}` is text-only: it takes no images")
                    url = str((part.get("image_url") or {}).get("url", ""))
                    if not url.startswith("data:image/") or ";base64," not in url:
                        raise BadRequest("images must be data URLs (data:image/...;base64,...): no network here")
                    try:
                        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1], validate=True)))
                        sizes.append(image.size)  # the model frame (grounded decoding's bounds), before reducing
                        images.append(reduce_for(image, self.image_processor).convert("RGB"))
                    except (ValueError, UnidentifiedImageError) as exc:
                        raise BadRequest(f"image {len(images) + 1} is not a readable image: {exc}") from exc
                    parts.append({"type": "image"})
                else:
                    raise BadRequest(f"unsupported content part type {part.get('type')!r}")
            chat.append({"role": message.role, "content": parts})
        prompt = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return prompt, images, sizes

    def prepare(self, request: ChatRequest) -> Prepared:
        """Check the request and render it into token ids, image tensors and the grammar (raises BadRequest /
        UnknownModel)."""
        import regex

        from .constrained import RegexLogitsProcessor

        if not self.serves(request.model):
            raise UnknownModel(f"The model `{request.model}` does not exist.")
        request.check()
        prompt, images, sizes = self._render(request.messages)
        vision: dict[str, Any] = {}
        if images and self.image_processor is not None:
            processed = self.image_processor(images=images, return_tensors="pt")
            vision = {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}
            pieces = prompt.split(self.image_token)
            if len(pieces) != len(images) + 1:
                raise BadRequest("the chat template placed a different number of images than were sent")
            counts = [int(grid.prod()) // self.merge**2 for grid in processed["image_grid_thw"]]
            prompt = pieces[0] + "".join(self.image_token * c + p for c, p in zip(counts, pieces[1:], strict=True))
        input_ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        pattern = (request.structured_outputs or {}).get("regex") or request.guided_regex
        if self.grounded and images:
            # The checkpoint's own rule, when the observation has an outline: every reply it allows is also a
            # well-formed, in-bounds UI-TARS step, so it stands in for a caller's generic grammar (live proposals
            # and RFT send one) rather than being overridden by it.
            chat = [{"role": m.role, "content": m.content} for m in request.messages]
            pattern = grounding_pattern(chat, *sizes[-1]) or pattern
        processors = []
        if pattern:
            try:
                grammar = RegexLogitsProcessor(str(pattern), self.token_strings, self.eos, input_ids.shape[1])
            except regex.error as exc:
                raise BadRequest(f"the regex does not compile: {exc}", "structured_outputs") from exc
            processors.append(grammar)
        return Prepared(request, input_ids, vision, processors)

    def _token(self, token_id: int, as_id: bool) -> dict[str, Any]:
        """A token as OpenAI's logprob entries name it: its text (special tokens spelled out) and UTF-8 bytes."""
        if as_id:
            text = f"token_id:{token_id}"
        else:
            text = self._token_text.get(token_id)
            if text is None:
                text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "bytes": list(text.encode("utf-8", errors="replace"))}

    def _logprob_entry(self, token_id: int, row: Any, request: ChatRequest) -> dict[str, Any]:
        """OpenAI's `logprobs.content[i]`: the sampled token's log-prob and the `top_logprobs` most likely ones,
        most likely first. Values are the model's raw distribution (before temperature, top-p and the grammar mask,
        as vLLM's default `raw_logprobs`), so they are what the trainer computes for the same tokens; -inf is
        clamped to -9999 as vLLM does, to stay valid JSON."""
        as_id = request.return_tokens_as_token_ids
        entry = {**self._token(token_id, as_id), "logprob": max(float(row[token_id]), -9999.0), "top_logprobs": []}
        if request.top_logprobs:
            values, ids = self.torch.topk(row, request.top_logprobs)
            entry["top_logprobs"] = [{**self._token(int(i), as_id), "logprob": max(float(v), -9999.0)}
                                     for v, i in zip(values.tolist(), ids.tolist(), strict=True)]  # fmt: skip
        return entry

    def generate(self, prepared: Prepared, on_token: Callable[[Choice, str], None] | None = None,
                 cancel: threading.Event | None = None) -> list[Choice]:  # fmt: skip
        """Generate the request's `n` sequences; `on_token(choice, delta_text)` is called after every token of a
        sequence (the streaming path), with the text it adds; a sequence's last call has its finish_reason set."""
        from transformers import StoppingCriteriaList

        torch, request = self.torch, prepared.request
        limit = request.token_limit
        choices = [Choice(index) for index in range(request.n)]
        logits: list[Any] = [None]

        def keep_logits(module: Any, args: Any, output: Any) -> None:  # the raw distribution of this step's tokens
            logits[0] = torch.log_softmax(output.logits[:, -1].float(), dim=-1)

        def on_step(tokens: list[int]) -> None:
            for choice, token in zip(choices, tokens, strict=True):
                if choice.finish_reason is not None:
                    continue  # generate pads a finished sequence; those tokens are not its own
                choice.ids.append(token)
                if request.logprobs:
                    choice.logprobs.append(self._logprob_entry(token, logits[0][choice.index], request))
                if token == self.eos:
                    choice.finish_reason, choice.ended_by_eos = "stop", True
                elif len(choice.ids) >= limit:
                    choice.finish_reason = "length"
                if on_token is not None:
                    on_token(choice, self._delta(choice))

        stopping = StoppingCriteriaList([_Cancelled(cancel)] if cancel is not None else [])
        sample = request.temperature > 0
        with self.lock, torch.inference_mode():
            hook = self.model.register_forward_hook(keep_logits) if request.logprobs else None
            try:
                if request.seed is not None:
                    torch.manual_seed(request.seed)
                self.model.generate(
                    input_ids=prepared.input_ids,
                    attention_mask=torch.ones_like(prepared.input_ids),
                    **prepared.vision,
                    do_sample=sample,
                    temperature=request.temperature if sample else None,
                    top_p=request.top_p if sample else None,
                    top_k=None,
                    num_return_sequences=request.n,
                    max_new_tokens=limit,
                    logits_processor=prepared.processors,
                    stopping_criteria=stopping,
                    eos_token_id=self.eos,
                    pad_token_id=self.tokenizer.pad_token_id,
                    suppress_tokens=self.vision_tokens or None,
                    streamer=_Steps(on_step),
                )
            finally:
                if hook is not None:
                    hook.remove()
        for choice in choices:  # stopped early (cancelled, or the model's own length limit)
            if choice.finish_reason is None:
                choice.finish_reason = "length"
                if on_token is not None:
                    on_token(choice, self._delta(choice))
        return choices

    def _delta(self, choice: Choice) -> str:
        """The text a sequence's newest token adds. A token that ends inside a multi-byte character adds nothing
        until the character is complete; the last call flushes, so the deltas join to exactly the final text."""
        text = self.tokenizer.decode(choice.text_ids(), skip_special_tokens=True)
        if not text.startswith(choice.streamed):
            return ""
        if choice.finish_reason is None and text.endswith("\ufffd"):
            return ""
        delta = text[len(choice.streamed) :]
        choice.streamed = text
        return delta

    def _text(self, choice: Choice) -> str:
        return self.tokenizer.decode(choice.text_ids(), skip_special_tokens=True)

    def _usage(self, prepared: Prepared, choices: list[Choice]) -> dict[str, int]:
        prompt = int(prepared.input_ids.shape[1])
        completion = sum(len(c.ids) for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def complete(self, request: ChatRequest) -> dict[str, Any]:
        """One `chat.completion` object (the non-streaming answer)."""
        prepared = self.prepare(request)
        choices = self.generate(prepared)
        body: dict[str, Any] = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [self._choice(c, request) for c in choices],
            "usage": self._usage(prepared, choices),
        }
        if request.return_token_ids:
            body["prompt_token_ids"] = prepared.input_ids[0].tolist()
        return body

    def _choice(self, choice: Choice, request: ChatRequest) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": choice.index,
            "message": {"role": "assistant", "content": self._text(choice)},
            "logprobs": {"content": choice.logprobs} if request.logprobs else None,
            "finish_reason": choice.finish_reason,
        }
        if request.return_token_ids:
            out["token_ids"] = choice.ids
        return out

    def stream(self, request: ChatRequest) -> Iterator[str]:
        """Server-sent events as vLLM sends them: per sequence a first chunk with the role, then one chunk per token
        (its text delta and log-probs), the last with its finish_reason; with `stream_options.include_usage` a
        final chunk with no choices and the usage; then `data: [DONE]`. The request is checked before this
        returns, so a bad one is an HTTP error, not a stream."""
        prepared = self.prepare(request)
        return self._events(prepared)

    def _events(self, prepared: Prepared) -> Iterator[str]:
        request = prepared.request
        head = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.name}  # fmt: skip
        events: queue.Queue[dict[str, Any] | Exception | None] = queue.Queue()
        cancel = threading.Event()
        result: list[list[Choice]] = []

        def on_token(choice: Choice, delta: str) -> None:
            part: dict[str, Any] = {"index": choice.index, "delta": {"content": delta},
                                    "logprobs": None, "finish_reason": choice.finish_reason}  # fmt: skip
            if request.logprobs:
                part["logprobs"] = {"content": choice.logprobs[-1:]}
            if request.return_token_ids:
                part["token_ids"] = choice.ids[-1:]
            events.put({**head, "choices": [part]})

        def work() -> None:
            try:
                result.append(self.generate(prepared, on_token, cancel))
            except Exception as exc:  # the client learns why, in the stream (vLLM's way)
                events.put(exc)
            finally:
                events.put(None)

        thread = threading.Thread(target=work, name="policy-stream", daemon=True)
        try:
            for index in range(request.n):
                first = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}  # fmt: skip
                chunk = {**head, "choices": [first]}
                if request.return_token_ids and index == 0:
                    chunk["prompt_token_ids"] = prepared.input_ids[0].tolist()
                yield _sse(chunk)
            thread.start()
            while (event := events.get()) is not None:
                if isinstance(event, Exception):
                    yield _sse(error_body(str(event), "InternalServerError", 500))
                else:
                    yield _sse(event)
            if result and request.stream_options is not None and request.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": self._usage(prepared, result[0])})
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()  # a client that goes away stops the generation at the next token


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(
    engine: PolicyEngine,
    *,
    roots: list[Path] | None = None,
    api_key: str = "",
    max_models: int = 8,
    threads: int | None = None,
    state: Path | None = None,
) -> FastAPI:
    """The HTTP app serving `engine` (the default model) and any checkpoint loaded later from under `roots`; with
    `state`, the models loaded before a restart are loaded again first."""
    served = ServedModels(roots or [], max_models=max_models, state=state)
    served.add(engine)
    app = FastAPI(title="Embedded policy server", description=__doc__)

    def authorized(request: Request) -> None:
        if not api_key:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise Unauthorized("this server wants its API key: send `Authorization: Bearer <key>`")

    v1 = [Depends(authorized)]

    def engine_for(model: str | None) -> PolicyEngine:
        found = served.get(model)
        if found is None:
            raise UnknownModel(f"The model `{model}` does not exist.")
        return found  # type: ignore[return-value]

    def build(path: Path, name: str) -> PolicyEngine:
        return PolicyEngine(path, name=name, threads=threads, lock=engine.lock)

    for problem in served.restore(build):
        print(f"policy server: {problem}", flush=True)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Any, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "BadRequestError", 400, exc.param), status_code=400)

    @app.exception_handler(UnknownModel)
    async def unknown_model(request: Any, exc: UnknownModel) -> JSONResponse:
        return JSONResponse(error_body(str(exc.args[0]), "NotFoundError", 404, "model"), status_code=404)

    @app.exception_handler(Unauthorized)
    async def unauthorized(request: Any, exc: Unauthorized) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "AuthenticationError", 401), status_code=401)

    @app.exception_handler(LoadError)
    async def load_error(request: Any, exc: LoadError) -> JSONResponse:
        kinds = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError", 409: "ConflictError"}
        body = error_body(str(exc), kinds.get(exc.status, "BadRequestError"), exc.status, exc.param)
        return JSONResponse(body, status_code=exc.status)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "model": served.default}

    @app.get("/v1/models", dependencies=v1)
    def models() -> dict[str, Any]:
        return {"object": "list", "data": served.cards()}

    @app.post("/v1/models/load", dependencies=v1)
    def load(body: LoadRequest) -> JSONResponse:
        card, new = served.load(body.model, body.checkpoint, build)
        return JSONResponse(card, status_code=201 if new else 200)

    @app.delete("/v1/models/{name:path}", dependencies=v1)
    def unload(name: str) -> dict[str, Any]:
        served.unload(name)
        return {"id": name, "object": "model", "deleted": True}

    @app.post("/v1/chat/completions", response_model=None, dependencies=v1)
    def chat_completions(request: ChatRequest) -> dict[str, Any] | StreamingResponse:
        chosen = engine_for(request.model)
        if request.stream:
            return StreamingResponse(chosen.stream(request), media_type="text/event-stream")
        return chosen.complete(request)

    return app


class LoadRequest(BaseModel):
    model: str = Field(min_length=1, max_length=200, description="the name to serve it under")
    checkpoint: str = Field(min_length=1, max_length=4096, description="a checkpoint directory under a models root")


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
    parser.add_argument("--models-root", type=Path, action="append", default=[], dest="roots",
                        help="a directory POST /v1/models/load may load checkpoints from (repeatable)")  # fmt: skip
    parser.add_argument("--max-models", type=int, default=8, help="models held at once, the startup one included")
    parser.add_argument("--state", type=Path, default=None,
                        help="JSON file the loaded models are written to and restored from on start")  # fmt: skip
    key_help = "bearer key every /v1 request must carry (default $POLICY_API_KEY; empty: none)"
    parser.add_argument("--api-key", default=os.environ.get("POLICY_API_KEY", ""), help=key_help)
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        print(f"no checkpoint at {args.checkpoint}: building the tiny random one there")
        build_tiny_checkpoint(args.checkpoint)
    engine = PolicyEngine(args.checkpoint, name=args.name, threads=args.threads)
    app = create_app(engine, roots=args.roots, api_key=args.api_key, max_models=args.max_models, threads=args.threads,
                     state=args.state)  # fmt: skip
    # Idle connections live longer than the clients' (httpx: 5 s), as in the sandbox service: equal timeouts let a
    # client send on a connection the server is closing.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=75)


if __name__ == "__main__":
    main()
