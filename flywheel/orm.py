"""The generative outcome reward model (UI-TARS-2 §2.5): an OpenAI-compatible endpoint (the embedded policy server or
`vllm serve`) reads a trajectory's task, its whole text history and its last screenshots, and answers with a score.

`attach_orm_scores` fills `Signals.orm` / `Signals.orm_source` of a chunk in place, before `validation.validate`:
only the trajectories that need a judge (by default those without a verifier result), with concurrent calls. The
answer is read strictly (training.policy.prompts.parse_orm_answer: a last line `Score: <0..1>`); an unparseable
answer or a failed call leaves no score and says why in the source ("unparseable: …", "ORM call failed: …"), so it
never counts as a pass. The iteration config's `orm` section is an `OrmConfig`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.files.storage import default_storage

from annotation_app.models import Step, Trajectory
from sandbox.actions import ActionSyntaxError, format_actions, parse_actions
from sandbox.coordinates import CoordinateMode, ScreenMapping, map_points
from training.policy.client import PolicyClient, PolicyError
from training.policy.prompts import ORM_ANSWER_REGEX, Turn, build_orm_messages, parse_orm_answer

from .validation import Signals, structural_problems

WHEN = ("no_verifier", "no_judgement", "always")
UNPARSEABLE = "unparseable: "
FAILED = "ORM call failed: "


@dataclass(frozen=True)
class OrmConfig:
    """Where the ORM is and how it is asked; written on the iteration (never the key: `api_key_env` names it)."""

    enabled: bool = False
    url: str = ""  # OpenAI base URL such as http://127.0.0.1:8020/v1; empty: settings.EMBEDDED_POLICY_URL
    model: str = ""  # served model name; empty: the endpoint's default model
    api_key_env: str = "POLICY_API_KEY"  # the environment variable holding its bearer key (empty value: none)
    timeout_s: float = 120.0
    concurrency: int = 4  # calls in flight at once
    when: str = "no_verifier"  # no_verifier | no_judgement (no verifier result and no review) | always
    keep_images: int = 5  # the last screenshots sent (the report's ORM: 5)
    max_tokens: int = 256
    temperature: float = 0.0
    constrain: bool = False  # decode under ORM_ANSWER_REGEX (vLLM structured outputs, the embedded server)
    coordinates: str = "absolute"  # the frame the history's actions are written in for the model
    api_key: str = field(default="", repr=False, compare=False)  # code only; a config names an env variable

    def __post_init__(self) -> None:
        for name in ("enabled", "constrain"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false")
        for name in ("url", "model", "api_key_env"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > 500:
                raise ValueError(f"{name} must be a string of at most 500 characters")
        if self.url and (urlsplit(self.url).scheme not in ("http", "https") or not urlsplit(self.url).netloc):
            raise ValueError(f"url must be an http(s) URL such as http://127.0.0.1:8020/v1, got {self.url!r}")
        _number("timeout_s", self.timeout_s, 1, 3600)
        _number("temperature", self.temperature, 0, 2)
        for name, low, high in (("concurrency", 1, 64), ("keep_images", 0, 20), ("max_tokens", 16, 4096)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
        if self.when not in WHEN:
            raise ValueError(f"when must be one of {', '.join(WHEN)}, got {self.when!r}")
        if self.coordinates not in {mode.value for mode in CoordinateMode}:
            raise ValueError(f"coordinates must be one of {', '.join(m.value for m in CoordinateMode)}")

    def to_dict(self) -> dict[str, Any]:
        """What an iteration records: every setting but the key."""
        data = asdict(self)
        data.pop("api_key")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> OrmConfig:
        """A config from JSON (missing keys take the defaults); ValueError names an unknown key or a bad value."""
        if data is not None and not isinstance(data, dict):
            raise ValueError("the ORM settings must be an object")
        data = dict(data or {})
        if "api_key" in data:
            raise ValueError(
                "api_key cannot be written in a config (data leads read it): put the key in an environment "
                "variable of the workers and name it in api_key_env"
            )
        known = sorted(f.name for f in fields(cls) if f.name != "api_key")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown ORM setting(s): {', '.join(unknown)} (known: {', '.join(known)})")
        return cls(**data)

    def base_url(self) -> str:
        return self.url or settings.EMBEDDED_POLICY_URL

    def key(self) -> str:
        return self.api_key or (os.environ.get(self.api_key_env, "") if self.api_key_env else "")


def check_orm_config(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The iteration config's `orm` section with the defaults filled in, as the iteration records it (no key);
    ValueError says what is wrong (flywheel.iterations.check_config calls it)."""
    return OrmConfig.from_dict(raw).to_dict()


def _number(name: str, value: Any, low: float, high: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")


def needs_orm(signals: Signals, config: OrmConfig) -> bool:
    """Whether the judge is asked about this trajectory: never for broken data (it is held anyway), else by
    `config.when`."""
    if structural_problems(signals, limit=1):
        return False
    if config.when == "always":
        return True
    if config.when == "no_judgement":
        return signals.outcome_reward is None and signals.review is None
    return signals.outcome_reward is None


@dataclass(frozen=True)
class _Steps:
    """What the judge is shown of one trajectory, before its screenshots are read."""

    instruction: str
    mapping: ScreenMapping
    steps: list[tuple[str, str, str]]  # (thought, action_text in screen pixels, screenshot name)


def _inputs(ids: list[int], config: OrmConfig) -> dict[int, _Steps]:
    """Task, screen and steps of `ids` (two queries, whatever the number of trajectories and steps)."""
    mode = CoordinateMode(config.coordinates)
    rows = Trajectory.objects.filter(pk__in=ids).order_by().values_list("pk", "task__instruction", "screen_width",
                                                                         "screen_height")  # fmt: skip
    out = {pk: _Steps(text or "", ScreenMapping(w, h, mode), []) for pk, text, w, h in rows}
    steps = (
        Step.objects.filter(trajectory_id__in=ids).exclude(status=Step.Status.CUT).order_by("trajectory_id", "index")
    )
    for pk, thought, action_text, screenshot in steps.values_list("trajectory_id", "thought", "action_text",
                                                                  "screenshot"):  # fmt: skip
        out[pk].steps.append((thought, action_text, screenshot))
    return out


def _in_model_frame(action_text: str, mapping: ScreenMapping) -> str:
    try:
        return format_actions(map_points(parse_actions(action_text), mapping.to_model))
    except (ActionSyntaxError, ValueError):
        return action_text


def _turns(inputs: _Steps, keep_images: int) -> list[Turn]:
    """The history as the judge reads it: actions in the model's frame, the last `keep_images` screenshots."""
    first_with_image = len(inputs.steps) - keep_images
    turns = []
    for n, (thought, action_text, name) in enumerate(inputs.steps):
        image = None
        if n >= first_with_image and name:
            with default_storage.open(name, "rb") as f:
                image = f.read()
        turns.append(Turn(image, thought, _in_model_frame(action_text, inputs.mapping)))
    return turns


def judge(client: PolicyClient, config: OrmConfig, inputs: _Steps | None) -> tuple[float | None, str]:
    """(score, source) for one trajectory; every failure is recorded in the source, never raised."""
    if inputs is None:
        return None, FAILED + "the trajectory is gone"
    try:
        messages = build_orm_messages(inputs.instruction, _turns(inputs, config.keep_images),
                                      keep_images=config.keep_images)  # fmt: skip
        body: dict[str, Any] = {"messages": messages, "n": 1, "temperature": config.temperature,
                                "max_tokens": config.max_tokens}  # fmt: skip
        if config.model:
            body["model"] = config.model
        if config.constrain:
            body["structured_outputs"] = {"regex": ORM_ANSWER_REGEX}
        data = client.complete(body)
        choice = (data.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or ""
    except (PolicyError, OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        return None, (FAILED + (str(exc) or type(exc).__name__))[:300]
    answer = parse_orm_answer(text)
    if answer.score is None:
        return None, UNPARSEABLE + text[:80].replace("\n", "\\n")
    return answer.score, f"generative ORM {data.get('model') or config.model or '?'}: Score {answer.score:g}"


def attach_orm_scores(signals: list[Signals], config: OrmConfig) -> None:
    """Fill `orm` and `orm_source` of the trajectories in `signals` that need a judge, in place: the calls run
    `config.concurrency` at a time; a failed or unparseable call leaves `orm` None with the reason in the source."""
    if not config.enabled:
        return
    chosen = [s for s in signals if needs_orm(s, config)]
    if not chosen:
        return
    inputs = _inputs([s.trajectory_id for s in chosen], config)
    client = PolicyClient(config.base_url(), config.model, api_key=config.key(), timeout_s=config.timeout_s,
                          retries=1, constrain=False)  # fmt: skip
    try:
        with ThreadPoolExecutor(max_workers=min(config.concurrency, len(chosen)), thread_name_prefix="orm") as pool:
            results = list(pool.map(lambda s: judge(client, config, inputs.get(s.trajectory_id)), chosen))
    finally:
        client.close()
    for s, (score, source) in zip(chosen, results, strict=True):
        s.orm, s.orm_source = score, source


def orm_counts(signals: Sequence[Signals]) -> dict[str, int]:
    """How a chunk's judging went, for a stage's output: scored, unparseable, failed (not asked: not counted)."""
    counts: Counter[str] = Counter()
    for s in signals:
        if s.orm is not None:
            counts["scored"] += 1
        elif s.orm_source.startswith(UNPARSEABLE):
            counts["unparseable"] += 1
        elif s.orm_source:
            counts["failed"] += 1
    return {name: counts[name] for name in ("scored", "unparseable", "failed")}
