"""Client of an OpenAI-compatible policy server (vLLM or the embedded one): n proposals per step, parsed and checked.

A proposal that does not parse, or that points outside the screenshot, comes back with `error` set and its raw text;
the caller shows it as invalid and never executes it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from sandbox.action_regex import proposal_regex
from sandbox.actions import (
    Action,
    ActionSyntaxError,
    action_points,
    action_to_dict,
    format_actions,
    out_of_bounds,
    parse_step,
)


class PolicyError(Exception):
    """The server could not be reached or answered with an error, after the retries."""


@dataclass
class Proposal:
    raw: str
    thought: str = ""
    action_text: str = ""
    actions: list[dict[str, Any]] = field(default_factory=list)
    points: list[list[float]] = field(default_factory=list)
    error: str = ""

    @property
    def valid(self) -> bool:
        return not self.error

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proposal:
        """The inverse of `as_dict`; extra keys (such as the model name stored beside it) are ignored."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw, "thought": self.thought, "action_text": self.action_text, "actions": self.actions,
            "points": self.points, "error": self.error,
        }  # fmt: skip


@dataclass
class ProposalBatch:
    proposals: list[Proposal]
    model: str
    latency_ms: float


def parse_proposal(raw: str, width: int, height: int) -> Proposal:
    """Parse one model output against the grammar and the `width`x`height` model image."""
    try:
        step = parse_step(raw.strip())
    except ActionSyntaxError as exc:
        return Proposal(raw=raw, error=f"does not parse: {exc}")
    return proposal_of(raw, step.thought, step.actions, width, height)


def proposal_of(raw: str, thought: str, actions: list[Action], width: int, height: int) -> Proposal:
    """Parsed actions in their canonical, typed and drawable forms; `error` names any point off the model image.
    One place for the model's proposals and the annotator's overrides."""
    return Proposal(
        raw=raw,
        thought=thought,
        action_text=format_actions(actions),
        actions=[action_to_dict(a) for a in actions],
        points=[[p.x, p.y] for a in actions for p in action_points(a)],
        error="; ".join(out_of_bounds(actions, width, height)),
    )


def connection(base_url: str, api_key: str = "", timeout_s: float = 60.0) -> httpx.Client:
    """An HTTP client for one policy server; thread-safe and kept alive, so callers can share it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)


@dataclass
class PolicyClient:
    """`base_url` like http://127.0.0.1:8020/v1 (vLLM: http://host:8000/v1); `model` is the served model name."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 60.0
    retries: int = 2
    constrain: bool = True  # send the grammar as structured_outputs (vLLM ≥ 0.10 and the embedded server)

    http: httpx.Client | None = None  # a shared client (see `connection`); one is made when not given

    def __post_init__(self) -> None:
        self.owns_http = self.http is None
        if self.http is None:
            self.http = connection(self.base_url, self.api_key, self.timeout_s)

    def close(self) -> None:
        if self.owns_http and self.http is not None:
            self.http.close()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /chat/completions with retries on connection errors, timeouts and 5xx (exponential back-off)."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.25 * 2 ** (attempt - 1), 2.0))
            try:
                response = self.http.post("/chat/completions", json=body)  # type: ignore[union-attr]
            except httpx.HTTPError as exc:
                last = exc
                continue
            if response.status_code >= 500:
                last = PolicyError(f"policy server answered {response.status_code}: {response.text[:300]}")
                continue
            if response.status_code >= 400:
                raise PolicyError(f"policy server refused the request ({response.status_code}): {response.text[:300]}")
            return response.json()
        raise PolicyError(f"policy server at {self.base_url} failed after {self.retries + 1} tries: {last}")

    def propose(
        self,
        messages: list[dict[str, Any]],
        *,
        width: int,
        height: int,
        n: int = 4,
        temperature: float = 1.0,
        max_tokens: int = 256,
        seed: int | None = None,
        greedy_first: bool = False,
    ) -> ProposalBatch:
        """`n` proposals sampled at `temperature`. With `greedy_first`, the first is the model's most likely answer
        (greedy decoding) and the other n-1 are sampled: the annotator always sees the model's best guess, and
        alternatives beside it. The two requests go out together; the latency is the slower one's."""
        if greedy_first and n > 1 and temperature > 0:
            bodies = [self._proposal_body(messages, width, height, 1, 0.0, max_tokens, None),
                      self._proposal_body(messages, width, height, n - 1, temperature, max_tokens, seed)]  # fmt: skip
        else:
            bodies = [self._proposal_body(messages, width, height, n, temperature, max_tokens, seed)]
        started = time.perf_counter()
        if len(bodies) == 1:
            answers = [self.complete(bodies[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
                answers = list(pool.map(self.complete, bodies))
        latency_ms = (time.perf_counter() - started) * 1000
        proposals = []
        for data in answers:
            choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
            proposals += [parse_proposal((c.get("message") or {}).get("content") or "", width, height) for c in choices]
        return ProposalBatch(proposals=proposals, model=answers[0].get("model", self.model), latency_ms=latency_ms)

    def _proposal_body(
        self,
        messages: list[dict[str, Any]],
        width: int,
        height: int,
        n: int,
        temperature: float,
        max_tokens: int,
        seed: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "n": n, "temperature": temperature, "max_tokens": max_tokens,
        }  # fmt: skip
        if seed is not None:
            body["seed"] = seed
        if self.constrain:
            body["structured_outputs"] = {"regex": proposal_regex(width, height)}
        return body


def load_model(
    base_url: str, name: str, checkpoint: str, *, api_key: str = "", timeout_s: float = 600.0
) -> dict[str, Any]:
    """Have the embedded policy server at `base_url` (…/v1) serve `checkpoint` as `name` (POST /v1/models/load):
    its model card; PolicyError with the server's message when it refuses (403 outside its models roots, 400 not a
    checkpoint, 409 the name is taken) or cannot be reached. vLLM has no such endpoint (restart it, or load LoRA)."""
    try:
        with connection(base_url, api_key, timeout_s) as http:
            response = http.post("/models/load", json={"model": name, "checkpoint": str(checkpoint)})
    except httpx.HTTPError as exc:
        raise PolicyError(f"policy server at {base_url} could not load {name}: {exc or type(exc).__name__}") from exc
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise PolicyError(f"policy server refused to load {name} ({response.status_code}): {message}")
    return response.json()
