"""The embedded policy server serves several models: `POST /v1/models/load` loads a checkpoint from under a
`--models-root` (nothing else), `GET /v1/models` lists every loaded model, chat completions route by `model`, an
unknown model stays a 404, `DELETE /v1/models/<name>` drops one, and with an API key every /v1 route wants it.
Real server process, the official `openai` client and plain HTTP, tiny checkpoints built from a config."""

from __future__ import annotations

import io
import json
import shutil
import sys

import httpx
import openai
import pytest
import torch
from PIL import Image

from training.policy.client import PolicyError, load_model
from training.policy.prompts import image_part
from training.policy.tiny import build_tiny_checkpoint, build_tiny_text_checkpoint

from ..servers import answers, free_port, running, subprocess_env

MODEL = "tiny-uitars"
KEY = "policy-load-test-key"
HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """Two models roots (as var/models and var/flywheel-runs), a second tiny VL checkpoint and a text-only one in
    them, and a directory outside both."""
    models, runs = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("flywheel-runs")
    second = build_tiny_checkpoint(runs / "iteration-1" / "sft", seed=1)
    text = build_tiny_text_checkpoint(models / "tiny-text", seed=2)
    outside = build_tiny_checkpoint(tmp_path_factory.mktemp("elsewhere") / "model", seed=3)
    return {"models": models, "runs": runs, "second": second, "text": text, "outside": outside}


@pytest.fixture(scope="module")
def server_url(tiny_vision, roots, tmp_path_factory) -> str:
    """The server as the Procfile runs it: the startup checkpoint (outside the roots: it is the operator's
    choice), two `--models-root`s and an API key."""
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(tiny_vision), "--name", MODEL]
    command += ["--port", str(port), "--threads", "1", "--max-models", "3", "--api-key", KEY]
    command += ["--models-root", str(roots["models"]), "--models-root", str(roots["runs"])]
    log = tmp_path_factory.mktemp("logs") / "policy.log"
    with running(command, subprocess_env(), log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def http(server_url):
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


@pytest.fixture
def client(server_url) -> openai.OpenAI:
    with openai.OpenAI(base_url=server_url, api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def load(http: httpx.Client, name: str, checkpoint) -> httpx.Response:  # type: ignore[no-untyped-def]
    return http.post("/models/load", json={"model": name, "checkpoint": str(checkpoint)})


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), "gray").save(buffer, "PNG")
    return buffer.getvalue()


def test_a_second_checkpoint_loads_is_listed_and_answers_under_its_name(client, http, roots):
    response = load(http, "iteration-1", roots["second"])
    assert response.status_code in (200, 201), response.text
    card = response.json()
    assert card["id"] == "iteration-1" and card["object"] == "model" and card["root"] == str(roots["second"])
    assert {m.id for m in client.models.list()} >= {MODEL, "iteration-1"}
    again = load(http, "iteration-1", roots["second"])  # idempotent: the same name and checkpoint
    assert again.status_code == 200 and again.json()["id"] == "iteration-1"

    answer = client.chat.completions.create(
        model="iteration-1", messages=HELLO, temperature=1.0, seed=5, max_tokens=8, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert answer.model == "iteration-1"
    data = answer.model_dump()
    # the log-probs are the second checkpoint's own, not the startup model's
    from transformers import AutoModelForImageTextToText

    ids = torch.tensor([data["prompt_token_ids"] + data["choices"][0]["token_ids"]])
    prompt = len(data["prompt_token_ids"])
    served = torch.tensor([e["logprob"] for e in data["choices"][0]["logprobs"]["content"]])
    for path, same in ((roots["second"], True), (roots["outside"], False)):
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        expected = torch.log_softmax(logits[prompt - 1 : -1], -1).gather(-1, ids[0, prompt:, None])[:, 0]
        assert torch.allclose(served, expected, atol=1e-4) is same

    chunks = list(client.chat.completions.create(model="iteration-1", messages=HELLO, max_tokens=4, stream=True))
    assert chunks and {c.model for c in chunks} == {"iteration-1"}
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert plain.model == MODEL  # the startup model still answers under its name


def test_only_checkpoints_under_a_models_root_load(http, roots):
    outside = load(http, "outside", roots["outside"])
    assert outside.status_code == 403
    assert "not under a models root" in outside.json()["error"]["message"]
    assert outside.json()["error"]["param"] == "checkpoint"
    escape = load(http, "escape", roots["runs"] / ".." / roots["outside"].parent.name / "model")
    assert escape.status_code == 403
    link = roots["runs"] / "link-out"
    link.symlink_to(roots["outside"], target_is_directory=True)
    assert load(http, "link", link).status_code == 403  # resolved: a symlink cannot leave the root
    missing = load(http, "missing", roots["runs"] / "no-such-run")
    assert missing.status_code == 400 and "no config.json" in missing.json()["error"]["message"]
    assert load(http, "nul", str(roots["runs"]) + "/a\x00b").status_code == 400
    for bad_name in ("", " spaced", "-dash-first", "x" * 201):
        assert load(http, bad_name, roots["second"]).status_code in (400, 422), bad_name
    assert http.post("/models/load", json={"model": "no-checkpoint"}).status_code == 422
    assert http.post("/models/load", content=b"not json", headers={"content-type": "application/json"}
                     ).status_code == 422  # fmt: skip
    names = [m["id"] for m in http.get("/models").json()["data"]]
    assert not {"outside", "escape", "link", "missing", "nul"} & set(names)


def test_a_name_on_another_checkpoint_is_a_conflict_and_the_limit_holds(http, roots):
    assert load(http, "iteration-1", roots["second"]).status_code in (200, 201)
    conflict = load(http, "iteration-1", roots["text"])
    assert conflict.status_code == 409 and "DELETE /v1/models/iteration-1 first" in conflict.json()["error"]["message"]
    assert load(http, "text", roots["text"]).status_code in (200, 201)  # 3 models now: the limit (--max-models 3)
    full = load(http, "one-more", roots["runs"] / "iteration-1" / "sft")
    assert full.status_code == 409 and "--max-models 3" in full.json()["error"]["message"]
    assert http.delete("/models/text").status_code == 200


def test_a_text_only_checkpoint_serves_text_and_unloading_makes_it_a_404(client, http, roots):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="never-loaded", messages=HELLO, max_tokens=2)
    assert load(http, "short-lived", roots["text"]).status_code in (200, 201)
    answer = client.chat.completions.create(model="short-lived", messages=HELLO, max_tokens=4)
    assert answer.model == "short-lived" and answer.choices[0].finish_reason in ("stop", "length")
    with_image = [{"role": "user", "content": [image_part(png(), "image/png"), {"type": "text", "text": "hi"}]}]
    with pytest.raises(openai.BadRequestError, match="text-only"):
        client.chat.completions.create(model="short-lived", messages=with_image, max_tokens=2)
    assert http.delete("/models/short-lived").json() == {"id": "short-lived", "object": "model", "deleted": True}
    assert "short-lived" not in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError, match="short-lived"):
        client.chat.completions.create(model="short-lived", messages=HELLO, max_tokens=2)
    assert http.delete("/models/short-lived").status_code == 404
    default = http.delete(f"/models/{MODEL}")
    assert default.status_code == 409 and "default model" in default.json()["error"]["message"]
    # a request naming no model still gets the startup one
    assert http.post("/chat/completions", json={"messages": HELLO, "max_tokens": 2}).json()["model"] == MODEL


def test_every_v1_route_wants_the_api_key_when_the_server_has_one(server_url, roots):
    calls = [
        ("GET", "/models", None),
        ("POST", "/models/load", {"model": "sneaky", "checkpoint": str(roots["second"])}),
        ("DELETE", "/models/iteration-1", None),
        ("POST", "/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 2}),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for method, path, body in calls:
            response = httpx.request(method, server_url + path, json=body, headers=headers, timeout=60)
            assert response.status_code == 401, (method, path, headers)
            assert response.json()["error"]["type"] == "AuthenticationError"
    with openai.OpenAI(base_url=server_url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    assert httpx.get(server_url.removesuffix("/v1") + "/health", timeout=10).status_code == 200


def test_load_model_is_the_client_side_of_the_load_endpoint(server_url, http, roots):
    card = load_model(server_url, "via-client", str(roots["text"]), api_key=KEY)
    assert card["id"] == "via-client" and card["root"] == str(roots["text"])
    with pytest.raises(PolicyError, match=r"refused to load elsewhere \(403\): .*not under a models root"):
        load_model(server_url, "elsewhere", str(roots["outside"]), api_key=KEY)
    with pytest.raises(PolicyError, match=r"\(401\)"):
        load_model(server_url, "keyless", str(roots["text"]))
    with pytest.raises(PolicyError, match="could not load"):
        load_model(f"http://127.0.0.1:{free_port()}/v1", "nowhere", str(roots["text"]), timeout_s=5)
    assert http.delete("/models/via-client").status_code == 200


def test_with_a_state_file_loaded_models_are_served_again_after_a_restart(tiny_vision, roots, tmp_path):
    state = tmp_path / "served.json"
    gone = build_tiny_text_checkpoint(roots["runs"] / "soon-gone", seed=4)

    def server() -> tuple[list[str], str]:
        port = free_port()
        command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(tiny_vision), "--name", MODEL]
        command += ["--port", str(port), "--threads", "1", "--models-root", str(roots["runs"]), "--state", str(state)]
        return command, f"http://127.0.0.1:{port}"

    command, url = server()
    env = subprocess_env()
    env.pop("POLICY_API_KEY", None)
    with running(command, env, tmp_path / "first.log", answers(f"{url}/health")):
        assert load_model(f"{url}/v1", "kept", str(roots["second"]))["id"] == "kept"
        assert load_model(f"{url}/v1", "gone", str(gone))["id"] == "gone"
        assert load_model(f"{url}/v1", "dropped", str(gone))["id"] == "dropped"
        assert httpx.delete(f"{url}/v1/models/dropped", timeout=30).status_code == 200
    assert json.loads(state.read_text()) == {"models": {"kept": str(roots["second"]), "gone": str(gone)}}
    shutil.rmtree(gone)  # its checkpoint disappears while the server is down
    command, url = server()
    with running(command, env, tmp_path / "second.log", answers(f"{url}/health")):
        assert [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]] == [MODEL, "kept"]
        answer = httpx.post(f"{url}/v1/chat/completions", json={"model": "kept", "messages": HELLO, "max_tokens": 2},
                            timeout=120)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["model"] == "kept"
    assert "gone not restored: no checkpoint at" in (tmp_path / "second.log").read_text()
    assert json.loads(state.read_text()) == {"models": {"kept": str(roots["second"])}}
