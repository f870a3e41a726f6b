"""The generative ORM: the prompt it gets (task, whole text history, last 5 screenshots from storage), its strict
answer format both ways, failures recorded and never a pass, which trajectories it is asked about, and the V
component and route that follow. Against a real HTTP server in the test that answers fixed texts (the parser's both
ways) and against the real embedded policy server on the tiny VL model (random answers: parsed or recorded as
unparseable, never a silent pass)."""

from __future__ import annotations

import base64
import io
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.files.storage import default_storage
from PIL import Image

from annotation_app.models import Review, Step, Task, Trajectory
from flywheel.iterations import gather
from flywheel.orm import OrmConfig, attach_orm_scores, needs_orm, orm_counts
from flywheel.validation import CT, SFT, VConfig, validate
from sandbox.coordinates import ScreenMapping
from training.policy.prompts import parse_orm_answer
from training.policy.tiny import build_tiny_checkpoint

from ..servers import answers, free_port, running, subprocess_env

pytestmark = pytest.mark.django_db

CLICK = "click(start_box='<|box_start|>(640,400)<|box_end|>')"
KEY = "orm-test-key"


def png(colour: tuple[int, int, int], size: tuple[int, int] = (112, 112)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def trajectory(instruction: str, steps: int = 3, *, reward: float | None = None, mode: str = "interactive",
               size: tuple[int, int] = (112, 112)) -> Trajectory:  # fmt: skip
    """A finished trajectory whose steps each have a stored screenshot of their own colour and a thought."""
    task = Task.objects.create(instruction=instruction, domain="os")
    t = Trajectory.objects.create(task=task, mode=mode, status=Trajectory.Status.SUBMITTED, outcome_reward=reward,
                                  screen_width=1280, screen_height=800)  # fmt: skip
    for i in range(steps):
        name = default_storage.save(f"trajectories/{t.pk}/steps/{i:05d}.png", io.BytesIO(png((i * 30, 90, 200), size)))
        Step.objects.create(trajectory=t, index=i, action_text=CLICK, screenshot=name, thought=f"thought {i}")
    return t


def signals_of(*trajectories: Trajectory):  # type: ignore[no-untyped-def]
    """The flywheel's own signal gathering (flywheel.iterations.gather), latest review included."""
    rows = []
    for t in trajectories:
        review = t.reviews.order_by("-created_at", "-id").first()
        rows.append((t.pk, t.mode, t.outcome_reward,
                     {"id": review.pk, "verdict": review.verdict, "score": review.score} if review else None,
                     None, None))  # fmt: skip
    return gather(rows)


class FixedAnswers:
    """A real HTTP server speaking OpenAI chat completions: its answer is `answers[instruction]` (the text after
    '## Task' in the prompt); '!500' answers HTTP 500 and '!garbage' a body that is not JSON. It records every
    request body and its Authorization header, and the most requests it had in flight at once."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.requests, self.in_flight, self.max_in_flight = answers, [], 0, 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                with outer.lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    with outer.lock:
                        outer.requests.append((body, self.headers.get("Authorization")))
                    prompt = body["messages"][0]["content"][0]["text"]
                    instruction = prompt.split("## Task\n", 1)[1].split("\n", 1)[0]
                    answer = outer.answers[instruction]
                    if answer == "!500":
                        self._send(500, b'{"error": {"message": "boom"}}')
                    elif answer == "!garbage":
                        self._send(200, b"<html>not json</html>")
                    else:
                        message = {"role": "assistant", "content": answer}
                        data = {"object": "chat.completion", "model": "judge", "choices": [
                            {"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
                        self._send(200, json.dumps(data).encode())
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FixedAnswers:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fixed(media, monkeypatch) -> Iterator:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ORM_TEST_KEY", KEY)

    def make(answers: dict[str, str]) -> FixedAnswers:
        return FixedAnswers(answers)

    return make


def config(url: str, **kwargs: object) -> OrmConfig:
    kwargs.setdefault("model", "judge")
    return OrmConfig(enabled=True, url=url, api_key_env="ORM_TEST_KEY", **kwargs)  # type: ignore[arg-type]


def test_answers_are_read_strictly_both_ways_and_the_route_follows(fixed):
    replies = {
        "done": "The file is saved.\nScore: 0.9",
        "done-exact": "Score: 1",
        "not-done": "Nothing happened.\nScore: 0.1",
        "chatty": "I believe the agent succeeded, score 1.",
        "trailing": "Score: 1\nActually I am not sure.",
        "out-of-range": "Score: 7",
        "empty": "",
        "server-error": "!500",
        "garbage": "!garbage",
    }
    with fixed(replies) as server:
        made = {name: trajectory(name) for name in replies}
        signals = signals_of(*made.values())
        attach_orm_scores(signals, config(server.url))
    by_name = {t.task.instruction: s for t, s in zip(made.values(), signals, strict=True)}
    assert by_name["done"].orm == 0.9 and by_name["done"].orm_source == "generative ORM judge: Score 0.9"
    assert by_name["done-exact"].orm == 1.0 and by_name["not-done"].orm == 0.1
    for name in ("chatty", "trailing", "out-of-range", "empty"):
        assert by_name[name].orm is None, name
        assert by_name[name].orm_source == "unparseable: " + replies[name][:80].replace("\n", "\\n"), name
    for name in ("server-error", "garbage"):
        assert by_name[name].orm is None and by_name[name].orm_source.startswith("ORM call failed: "), name
    assert "500" in by_name["server-error"].orm_source
    assert orm_counts(signals) == {"scored": 3, "unparseable": 4, "failed": 2}

    v = VConfig()
    done = validate(by_name["done"], v)
    assert done.components["orm"] == {"value": 0.9, "source": "generative ORM judge: Score 0.9"} and done.route == SFT
    assert validate(by_name["not-done"], v).route == CT
    for name in ("chatty", "trailing", "out-of-range", "empty", "server-error", "garbage"):
        verdict = validate(by_name[name], v)
        assert verdict.components["orm"] == {"value": None, "source": by_name[name].orm_source}
        # structure and thoughts alone give V = 1, yet no score is no judgement: never SFT on an unread answer
        assert verdict.v == 1.0 and verdict.route == CT, name
        assert verdict.reason == "ct: no verifier result, review or ORM score to vouch for it"


def test_the_judge_gets_the_task_the_whole_history_and_the_last_five_screenshots(fixed):
    with fixed({"Rename the file": "Score: 0.5"}) as server:
        t = trajectory("Rename the file", steps=7)
        signals = signals_of(t)
        attach_orm_scores(signals, config(server.url, concurrency=2))
    [(body, authorization)] = server.requests
    assert authorization == f"Bearer {KEY}" and body["model"] == "judge" and body["n"] == 1
    assert body["temperature"] == 0.0 and "structured_outputs" not in body
    [message] = body["messages"]
    parts = message["content"]
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    stored = [step.screenshot.read() for step in t.steps.order_by("index")]
    assert images == ["data:image/png;base64," + base64.b64encode(s).decode() for s in stored[-5:]]
    texts = "".join(p["text"] for p in parts if p["type"] == "text")
    assert "## Task\nRename the file\n" in texts and texts.rstrip().endswith("Score: <0 to 1>`.")
    x, y = ScreenMapping(1280, 800).to_model(640, 400)  # actions in the model's frame, as the policy reads them
    for i in range(7):
        assert (
            f"Step {i + 1}\nThought: thought {i}\nAction: click(start_box='<|box_start|>({x},{y})<|box_end|>')" in texts
        )
    # each of the last five steps' text follows its screenshot; the first two are text only
    kinds = ["image" if p["type"] == "image_url" else p["text"][:6] for p in parts]
    assert kinds.index("image") == kinds.index("Step 1") + 2 and kinds.count("image") == 5
    assert signals[0].orm == 0.5


def test_which_trajectories_are_judged_is_configurable(fixed, engineer):
    with fixed({name: "Score: 0.7" for name in ("plain", "verified", "reviewed", "broken")}) as server:
        plain, verified, reviewed = trajectory("plain"), trajectory("verified", reward=1.0), trajectory("reviewed")
        broken = trajectory("broken")
        Step.objects.filter(trajectory=broken, index=1).update(action_text="clik(oops)")
        Review.objects.create(trajectory=reviewed, reviewer=engineer, verdict="approve", score=4)
        made = (plain, verified, reviewed, broken)
        asked = {}
        for when in ("no_verifier", "no_judgement", "always"):
            signals = signals_of(*made)
            attach_orm_scores(signals, config(server.url, when=when))
            asked[when] = {t.task.instruction for t, s in zip(made, signals, strict=True) if s.orm is not None}
        signals = signals_of(*made)
        attach_orm_scores(signals, OrmConfig(url=server.url))  # not enabled: nothing is asked
        assert all(s.orm is None and not s.orm_source for s in signals)
    assert asked == {"no_verifier": {"plain", "reviewed"}, "no_judgement": {"plain"},
                     "always": {"plain", "verified", "reviewed"}}  # fmt: skip
    assert not needs_orm(signals_of(broken)[0], config(server.url, when="always"))  # held anyway: not worth a call
    assert len(server.requests) == 2 + 1 + 3


def test_calls_run_concurrently_up_to_the_limit_and_each_is_recorded(fixed):
    names = [f"task {n}" for n in range(12)]
    with fixed({name: f"Score: 0.{n % 10}" for n, name in enumerate(names)}) as server:
        made = [trajectory(name, steps=1) for name in names]
        signals = signals_of(*made)
        attach_orm_scores(signals, config(server.url, concurrency=3))
    assert 1 <= server.max_in_flight <= 3 and len(server.requests) == 12
    assert [s.orm for s in signals] == [(n % 10) / 10 for n in range(12)]


def test_an_unreachable_orm_is_recorded_per_trajectory_not_raised(media):
    port = free_port()  # nothing listens there
    made = [trajectory("a"), trajectory("b")]
    signals = signals_of(*made)
    attach_orm_scores(signals, OrmConfig(enabled=True, url=f"http://127.0.0.1:{port}/v1", timeout_s=5))
    assert all(s.orm is None and s.orm_source.startswith("ORM call failed: ") for s in signals)
    assert all(validate(s, VConfig()).route == CT for s in signals)


def test_the_config_is_checked_and_recorded_without_the_key():
    cfg = OrmConfig.from_dict({"enabled": True, "url": "http://127.0.0.1:8000/v1", "model": "ui-tars", "when": "always",
                               "concurrency": 8, "constrain": True})  # fmt: skip
    assert OrmConfig.from_dict(cfg.to_dict()) == cfg and "api_key" not in cfg.to_dict()
    assert OrmConfig.from_dict(None) == OrmConfig() and not OrmConfig().enabled
    bad = [
        ({"api_key": "secret"}, "api_key_env"),
        ({"bogus": 1}, "unknown ORM setting"),
        ({"url": "ftp://x"}, "http(s) URL"),
        ({"concurrency": 0}, "concurrency must be an integer from 1 to 64"),
        ({"when": "sometimes"}, "when must be one of"),
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"timeout_s": -1}, "timeout_s must be a number"),
        ({"coordinates": "inches"}, "coordinates must be one of"),
        ({"keep_images": 50}, "keep_images"),
        (["enabled"], "must be an object"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            OrmConfig.from_dict(data)


def test_an_iteration_checks_and_records_its_orm_section():
    from flywheel.iterations import IterationError, check_config

    checked = check_config({"orm": {"enabled": True, "model": "ui-tars", "when": "always"}})
    assert checked["orm"] == {**OrmConfig().to_dict(), "enabled": True, "model": "ui-tars", "when": "always"}
    assert check_config({})["orm"] == OrmConfig().to_dict()  # recorded even when off: the iteration says so
    with pytest.raises(IterationError, match=r"config\.orm: api_key cannot be written"):
        check_config({"orm": {"api_key": "secret"}})
    with pytest.raises(IterationError, match=r"config\.orm: unknown ORM setting"):
        check_config({"orm": {"threshold": 0.5}})


@pytest.mark.parametrize(
    ("text", "score"),
    [("Score: 0.8", 0.8), ("why\nScore: 1", 1.0), ("why\nScore:0.25  \n\n", 0.25), ("Score: 0", 0.0),
     ("Score: 1.5", None), ("Score: 0.8 yes", None), ("Score: 0.8\nmore", None), ("", None), ("score: 1", None),
     ("Score: -0", None), ("Verdict: success", None), ("Score: 1e0", None)],
)  # fmt: skip
def test_the_answer_format_is_strict(text, score):
    answer = parse_orm_answer(text)
    assert answer.score == score and (answer.problem == "") is (score is not None)


# --- the real embedded policy server on the tiny VL model ----------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Iterator[str]:
    checkpoint = build_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny-uitars")
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(checkpoint), "--name", "tiny-uitars"]
    command += ["--port", str(port), "--threads", "1", "--api-key", KEY]
    log = tmp_path_factory.mktemp("logs") / "policy.log"
    env = subprocess_env()
    env.pop("POLICY_API_KEY", None)
    with running(command, env, log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


def test_the_tiny_model_as_judge_is_parsed_or_recorded_unparseable_never_a_silent_pass(embedded, fixed):
    made = [trajectory(f"Open the settings {n}", steps=6) for n in range(3)]
    signals = signals_of(*made)
    attach_orm_scores(signals, config(embedded, model="tiny-uitars", temperature=1.0, max_tokens=48, concurrency=2))
    for s in signals:
        verdict = validate(s, VConfig())
        if s.orm is None:  # random text: almost surely no final Score line
            assert s.orm_source.startswith("unparseable: ")
            assert verdict.components["orm"]["value"] is None and verdict.route == CT
        else:
            assert 0.0 <= s.orm <= 1.0 and s.orm_source.startswith("generative ORM tiny-uitars: Score ")
            assert verdict.components["orm"]["value"] == s.orm
    # decoding under the answer's grammar makes every answer of even a random model parse
    signals = signals_of(*made)
    attach_orm_scores(signals, config(embedded, model="tiny-uitars", constrain=True, max_tokens=256))
    assert orm_counts(signals) == {"scored": 3, "unparseable": 0, "failed": 0}
    assert all(validate(s, VConfig()).components["orm"]["value"] == s.orm for s in signals)
