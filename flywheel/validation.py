"""The validation function V(s) of the data flywheel (UI-TARS-2 §2.3): a trajectory's signals in, a score in [0, 1],
its components and a route out. High V goes to the SFT store, the rest to CT; only broken data is held back.

Pure and Django-free: `flywheel.stages` gathers the signals in bulk and calls `validate` once per trajectory. The
weights, the threshold and the rules are a `VConfig`, written on the iteration that used them.

Components (each in [0, 1]; V is their weighted mean over the components a trajectory has):
- `verifier`: the task's evaluator result (`Trajectory.outcome_reward`), where there is one;
- `review`: the data lead's latest verdict and score;
- `structure`: 1 when every step's action parses in the grammar (sandbox.actions), the steps are numbered 0..n-1,
  every step has its screenshot and its recorded result; otherwise the trajectory is HELD with the reason;
- `thoughts`: the share of steps that carry a thought;
- `curation`: in-situ captures' flags (near-duplicate, no speech, too short…) and the trajectory's curation flags
  (annotation_app.curation: not_executable, divergent_steps, near_duplicate), the lowest flag value; a trajectory
  flagged not executable or divergent, or a near duplicate that is not its group's kept one, never reaches SFT
  (`curation_never_sft`);
- step verdicts: a reviewer's wrong action / wrong thought / bad screenshot on a kept step that no later edit fixed
  (annotation_app.step_edits) keeps the trajectory out of SFT (`flagged_steps_never_sft`); cut steps are not read;
- `orm`: the generative outcome reward model's score (flywheel.orm asks an OpenAI-compatible endpoint and fills
  `Signals.orm` and `Signals.orm_source`). An answer that does not parse, or a failed call, leaves `orm` None: the
  component is recorded with value None and its source ("unparseable: …", "ORM call failed: …"), weighs nothing and
  is no judgement, so it can never pass a trajectory.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sandbox.actions import ActionSyntaxError, parse_actions

SFT, CT, HELD = "sft", "ct", "held"
COMPONENTS = ("verifier", "review", "structure", "thoughts", "curation", "orm")
IN_SITU = "in_situ"


def _default_weights() -> dict[str, float]:
    return {"verifier": 2.0, "review": 2.0, "structure": 0.5, "thoughts": 0.5, "curation": 1.0, "orm": 1.0}


def _default_flags() -> dict[str, float]:
    return {
        "near_duplicate": 0.0,
        "no_actions": 0.0,
        "too_few_actions": 0.5,
        "too_short": 0.5,
        "no_speech": 0.3,
        "little_speech": 0.7,
        "not_executable": 0.0,
        "divergent_steps": 0.5,
        "near_duplicate_kept": 1.0,  # the one trajectory its duplicate group keeps
    }


@dataclass(frozen=True)
class VConfig:
    """Weights, threshold and rules of V; `to_dict()` is what an iteration records."""

    weights: dict[str, float] = field(default_factory=_default_weights)
    threshold: float = 0.8  # V >= threshold (and the rules below) routes to SFT
    flag_values: dict[str, float] = field(default_factory=_default_flags)  # curation value of each capture flag
    unknown_flag_value: float = 0.5
    review_approve_unscored: float = 1.0  # an approval without a score
    review_approve_min: float = 0.5  # an approval scored 1 (score 5 gives 1.0, linear between)
    sft_needs_judgement: bool = True  # SFT only with a verifier result, a review or an ORM score
    rejected_never_sft: bool = True  # a trajectory whose latest review rejects it never reaches SFT
    insitu_sft_min_review_score: int = 4  # in-situ thoughts reach SFT only when approved with at least this score
    curation_never_sft: bool = True  # not executable, divergent, or a near duplicate not kept: never SFT
    flagged_steps_never_sft: bool = True  # a kept step a reviewer marked wrong (and nobody fixed) keeps it out of SFT

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(COMPONENTS))
        if unknown:
            raise ValueError(
                f"unknown V component(s) in weights: {', '.join(unknown)} (known: {', '.join(COMPONENTS)})"
            )
        for name, weight in self.weights.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 <= weight <= 1000:
                raise ValueError(f"weight of {name!r} must be a number from 0 to 1000, got {weight!r}")
        for name, value in [("threshold", self.threshold), ("unknown_flag_value", self.unknown_flag_value),
                            ("review_approve_unscored", self.review_approve_unscored),
                            ("review_approve_min", self.review_approve_min), *self.flag_values.items()]:  # fmt: skip
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a number from 0 to 1, got {value!r}")
        if not isinstance(self.insitu_sft_min_review_score, int) or not 1 <= self.insitu_sft_min_review_score <= 5:
            raise ValueError("insitu_sft_min_review_score must be an integer from 1 to 5")
        for name in ("sft_needs_judgement", "rejected_never_sft", "curation_never_sft", "flagged_steps_never_sft"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> VConfig:
        """A config from JSON: missing keys take the defaults, weights and flag values merge over the defaults;
        ValueError names an unknown key or a bad value."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown V setting(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for name, default in (("weights", _default_weights()), ("flag_values", _default_flags())):
            if name in data:
                if not isinstance(data[name], dict):
                    raise ValueError(f"{name} must be an object")
                data[name] = {**default, **data[name]}
        return cls(**data)


@dataclass(frozen=True)
class Review:
    id: int
    verdict: str  # "approve" | "reject"
    score: int | None


@dataclass
class Signals:
    """What is known about one trajectory. Step lists are in index order. Mutable: flywheel.orm fills the ORM
    fields of a chunk in place before `validate`."""

    trajectory_id: int
    mode: str
    indices: Sequence[int]
    actions: Sequence[str]  # each step's action_text (screen pixels)
    no_screenshot: Sequence[int] = ()  # indices of steps without a screenshot
    unfinished: Sequence[int] = ()  # indices of steps whose result was never recorded (status not done)
    with_thought: int = 0  # steps that carry a thought
    outcome_reward: float | None = None
    review: Review | None = None
    capture_flags: Sequence[str] | None = None  # None: not an in-situ capture
    orm: float | None = None  # the generative ORM's score in [0, 1] (flywheel.orm), None when it gave none
    orm_source: str = ""  # what the ORM was and said; with orm None: why there is no score (never a pass)
    curation_flags: Sequence[str] = ()  # the trajectory's curation flags (`trajectory_flag_names`)
    bad_steps: Sequence[tuple[int, str]] = ()  # (index, verdict) of kept steps a reviewer marked wrong, not fixed since


@dataclass(frozen=True)
class Verdict:
    v: float
    components: dict[str, dict[str, Any]]
    route: str
    reason: str
    threshold: float


# --- structural checks -----------------------------------------------------------------------------------------

# Canonical action text as sandbox.actions.format_actions writes it (and as steps are stored). Text this accepts
# is a strict subset of what the parser accepts (tests/flywheel/test_validation.py checks that on random text), so a
# match needs no parse; anything else goes through the parser itself. Coordinates stay below MAX_COORDINATE.
_N = r"-?\d{1,5}(?:\.\d{1,6})?"
_BOX = rf"'(?:<\|box_start\|>\({_N},{_N}\)<\|box_end\|>|\({_N},{_N}\))'"
_S = r"'(?:[^'\\\x00]|\\[^\x00])*'"  # never across a NUL: NUL separates the steps in _STEPS
_KEY = r"[a-z0-9_]+"
_CALL = "|".join(
    [
        rf"(?:click|left_double|right_single|hover)\(start_box={_BOX}\)",
        rf"drag\(start_box={_BOX}, end_box={_BOX}\)",
        rf"scroll\((?:start_box={_BOX}, )?direction='(?:up|down|left|right)'\)",
        rf"hotkey\(key='{_KEY}(?: {_KEY}){{0,2}}'\)",
        rf"(?:press|release)\(key='{_KEY}'\)",
        rf"(?:type|navigate)\(content={_S}\)",
        rf"finished\((?:content={_S})?\)",
        rf"open_app\(app_name={_S}\)",
        r"(?:wait|call_user|fail|navigate_back|press_home|press_back)\(\)",
    ]
)
_CANONICAL = re.compile(rf"(?:{_CALL})(?:\n\n(?:{_CALL}))*", re.DOTALL)
# A whole trajectory's actions joined by NUL (which PostgreSQL text never holds, and no token above matches) in one
# match: the common case costs one regex call per trajectory instead of one per step.
_STEPS = re.compile(rf"(?:{_CALL})(?:(?:\n\n|\x00)(?:{_CALL}))*", re.DOTALL)


def canonical(text: str) -> bool:
    """True when `text` is canonical action text (then it certainly parses)."""
    return _CANONICAL.fullmatch(text) is not None


@functools.lru_cache(maxsize=65536)
def _parse_error(text: str) -> str | None:
    try:
        parse_actions(text)
    except ActionSyntaxError as exc:
        return str(exc)
    return None


def action_error(text: str) -> str | None:
    """None when `text` parses in the action grammar (sandbox.actions), else the parser's message."""
    if canonical(text):
        return None
    return _parse_error(text)


def structural_problems(signals: Signals, *, limit: int = 3) -> list[str]:
    """What makes a trajectory broken (empty when it is not): no steps, steps out of order or missing, a missing
    screenshot, an unrecorded step, an action that does not parse. At most `limit` problems are named."""
    problems: list[str] = []
    if not signals.indices:
        return ["it has no steps"]
    if list(signals.indices) != list(range(len(signals.indices))):
        problems.append(f"its steps are not numbered 0..{len(signals.indices) - 1} in order")
    if signals.no_screenshot:
        problems.append(f"step {signals.no_screenshot[0]} has no screenshot")
    if signals.unfinished:
        problems.append(f"step {signals.unfinished[0]}'s result was never recorded")
    joined = "\x00".join(signals.actions)
    if joined.count("\x00") == len(signals.actions) - 1 and _STEPS.fullmatch(joined):
        return problems[:limit]
    for index, text in zip(signals.indices, signals.actions, strict=True):
        if len(problems) >= limit:
            break
        error = action_error(text)
        if error is not None:
            problems.append(f"step {index}'s action does not parse ({error})")
            break
    return problems[:limit]


# --- V and the route -------------------------------------------------------------------------------------------


def review_value(review: Review, config: VConfig) -> float:
    """A verdict as a number: reject 0; approve `review_approve_unscored`, or from `review_approve_min` (score 1)
    to 1.0 (score 5) when scored."""
    if review.verdict != "approve":
        return 0.0
    if review.score is None:
        return config.review_approve_unscored
    return config.review_approve_min + (1.0 - config.review_approve_min) * (review.score - 1) / 4


def curation_value(flags: Sequence[str], config: VConfig) -> float:
    """The lowest value of a capture's flags (a flag may carry a suffix, e.g. near_duplicate:17); 1 without flags."""
    values = [config.flag_values.get(flag.split(":", 1)[0], config.unknown_flag_value) for flag in flags]
    return min(values, default=1.0)


BLOCKING_FLAGS = ("not_executable", "divergent_steps", "near_duplicate")


def trajectory_flag_names(flags: Sequence[Any] | None) -> list[str]:
    """`Trajectory.flags` ([{kind, …}]) as flag names: a near duplicate is `near_duplicate:<group>`, or
    `near_duplicate_kept:<group>` for the one its group keeps."""
    names = []
    for flag in flags or []:
        if not isinstance(flag, dict) or not flag.get("kind"):
            continue
        kind = str(flag["kind"])
        if kind == "near_duplicate":
            kind = f"near_duplicate{'_kept' if flag.get('keep') else ''}:{flag.get('group', '')}"
        names.append(kind)
    return names


def validate(signals: Signals, config: VConfig) -> Verdict:
    """V(s) of one trajectory and its route (SFT, CT or HELD), with the reason in words."""
    threshold = config.threshold
    problems = structural_problems(signals)
    if problems:
        components = {"structure": {"value": 0.0, "source": "structural checks: " + "; ".join(problems)}}
        return Verdict(0.0, components, HELD, "held: " + "; ".join(problems), threshold)
    steps = len(signals.indices)
    comps: dict[str, tuple[float, str]] = {
        "structure": (1.0, f"{steps} steps: actions parse, in order, screenshots present"),
        "thoughts": (signals.with_thought / steps, f"{signals.with_thought} of {steps} steps have a thought"),
    }
    if signals.outcome_reward is not None:
        comps["verifier"] = (min(max(float(signals.outcome_reward), 0.0), 1.0), "task evaluator (outcome_reward)")
    review = signals.review
    if review is not None:
        scored = f", score {review.score}" if review.score is not None else ""
        comps["review"] = (review_value(review, config), f"review {review.id}: {review.verdict}{scored}")
    if signals.capture_flags is not None or signals.curation_flags:
        flags = list(signals.capture_flags or []) + list(signals.curation_flags)
        what = "capture flags" if signals.capture_flags is not None else "curation flags"
        comps["curation"] = (curation_value(flags, config), f"{what}: " + (", ".join(flags) or "none"))
    if signals.orm is not None:
        comps["orm"] = (min(max(float(signals.orm), 0.0), 1.0), signals.orm_source or "generative ORM")
    total = sum(config.weights.get(name, 0.0) for name in comps)
    v = sum(value * config.weights.get(name, 0.0) for name, (value, _) in comps.items()) / total if total else 0.0
    v = min(max(v, 0.0), 1.0)
    components: dict[str, dict[str, Any]] = {
        name: {"value": round(value, 6), "source": source} for name, (value, source) in comps.items()
    }
    if signals.orm is None and signals.orm_source:  # asked, but no score: recorded, weightless, no judgement
        components["orm"] = {"value": None, "source": signals.orm_source}
    route, reason = _route(signals, v, config, comps)
    return Verdict(round(v, 6), components, route, reason, threshold)


def _route(signals: Signals, v: float, config: VConfig, comps: dict[str, tuple[float, str]]) -> tuple[str, str]:
    review = signals.review
    if config.rejected_never_sft and review is not None and review.verdict != "approve":
        return CT, f"ct: rejected by review {review.id}"
    blocking = [f for f in signals.curation_flags if f.split(":", 1)[0] in BLOCKING_FLAGS]
    if config.curation_never_sft and blocking:
        return CT, f"ct: curation flagged it ({', '.join(blocking)})"
    if config.flagged_steps_never_sft and signals.bad_steps:
        index, verdict = signals.bad_steps[0]
        more = f" (and {len(signals.bad_steps) - 1} more)" if len(signals.bad_steps) > 1 else ""
        return CT, f"ct: a reviewer marked step {index} {verdict.replace('_', ' ')}{more}"
    if signals.mode == IN_SITU and not (
        review is not None
        and review.verdict == "approve"
        and review.score is not None
        and review.score >= config.insitu_sft_min_review_score
    ):
        return CT, (
            "ct: in-situ thoughts are CT material unless a review approves them with score "
            f">= {config.insitu_sft_min_review_score}"
        )
    if config.sft_needs_judgement and not ({"verifier", "review", "orm"} & set(comps)):
        return CT, "ct: no verifier result, review or ORM score to vouch for it"
    if v >= config.threshold:
        return SFT, f"sft: V={v:.3f} >= {config.threshold:g}"
    return CT, f"ct: V={v:.3f} < {config.threshold:g}"
