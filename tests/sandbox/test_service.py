"""The sandbox service as its own process (uvicorn) driven through the Python client, errors included."""

import io
import socket
import subprocess
import time
import uuid

import pytest
from PIL import Image

from sandbox.client import ActionError, NoCapacityError, SandboxClient, SandboxError, SessionGoneError
from sandbox.desktop import available
from sandbox.isolation import isolation_available

from ..servers import sandbox_service

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)
API_KEY = "test-key-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root, logs = tmp_path_factory.mktemp("sessions"), tmp_path_factory.mktemp("logs")
    with sandbox_service(root, logs, API_KEY, warm=1) as url:
        yield url


@pytest.fixture
def client(service):
    client = SandboxClient(service, API_KEY, owner=f"test:{uuid.uuid4().hex[:6]}")
    yield client
    client.close()


def test_allocate_step_observe_shell_files_release(client):
    session = client.allocate(ttl_s=60)
    sid = session["session_id"]
    assert (session["model_width"], session["model_height"]) == (1288, 812)
    result = client.step(sid, "click(start_box='(644,406)')\n\nscroll(direction='down')")
    assert result.results == ["ok", "ok"] and result.actions[0] == {"type": "click", "point": [644, 406]}
    assert Image.open(io.BytesIO(result.observation_jpeg)).size == (1288, 812)
    assert Image.open(io.BytesIO(client.observe(sid, fmt="png", size="screen"))).size == (1280, 800)
    client.write_file(sid, "in/data.txt", "ünïcode".encode())
    shell = client.shell(sid, "cat in/data.txt; echo; id -un")
    assert shell["stdout"].split("\n")[0] == "ünïcode" and shell["stdout"].split()[1] == f"sbx-{sid}"
    assert [f["name"] for f in client.list_files(sid, "in")] == ["data.txt"]
    assert client.read_file(sid, "in/data.txt") == "ünïcode".encode()
    assert client.setup(sid, [{"type": "execute", "parameters": {"command": "echo done > flag", "shell": True}}])
    flag = {
        "func": "exact_match",
        "result": {"type": "vm_file", "path": "flag"},
        "expected": {"type": "rule", "rules": {"expected": "done"}},
    }
    assert client.evaluate(sid, flag) == 1.0
    with pytest.raises(SandboxError, match="task_config: config\\[0\\]: unknown setup type 'warp'"):
        client.setup(sid, [{"type": "warp"}])
    client.renew(sid, ttl_s=120)
    assert len(client.vnc_token(sid, user="user:7")) >= 40
    client.release(sid)
    with pytest.raises(SessionGoneError):
        client.step(sid, "wait()")


def test_an_idle_connection_outlives_the_clients_keep_alive(service):
    """The service keeps an idle connection longer than httpx does (5 s), so a client never sends on a connection
    the service is closing: one request, 6 s idle, then a second request on the same socket is answered."""
    host, port = service.removeprefix("http://").split(":")
    request = f"GET /docs HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        reader = conn.makefile("rb")
        for attempt in range(2):
            conn.sendall(request)
            assert reader.readline().startswith(b"HTTP/1.1 200"), attempt
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            if attempt == 0:
                time.sleep(6)


def test_errors_are_typed_and_clear(service, client):
    sid = client.allocate(ttl_s=60)["session_id"]
    try:
        with pytest.raises(ActionError, match="line 3, column 1: unknown action 'clik'"):
            client.step(sid, "click(start_box='(1,1)')\n\nclik()")
        with pytest.raises(ActionError, match="navigate is not a desktop action"):
            client.step(sid, "navigate(content='https://example.org')")
        with pytest.raises(SandboxError, match="path_outside_session"):
            client.read_file(sid, "../../etc/passwd")
        other = SandboxClient(service, API_KEY, owner="someone-else")
        with pytest.raises(SandboxError, match="not_owner"):
            other.step(sid, "wait()")
        second = other.allocate(ttl_s=60)["session_id"]
        with pytest.raises(NoCapacityError, match="all 2 sessions are leased"):
            other.allocate(ttl_s=60)
        other.release(second)
        wrong_key = SandboxClient(service, "not-the-key", owner="x")
        with pytest.raises(SandboxError, match="unauthorized"):
            wrong_key.allocate()
    finally:
        client.release(sid)


def test_a_killed_x_server_loses_the_session(client):
    session = client.allocate(ttl_s=60)
    sid = session["session_id"]
    uid = int(subprocess.run(["id", "-u", f"sbx-{sid}"], capture_output=True, text=True).stdout)
    subprocess.run(["pkill", "-KILL", "-u", str(uid), "Xvfb"], capture_output=True)
    with pytest.raises(SessionGoneError, match="session_lost"):
        client.step(sid, "wait()")
    with pytest.raises(SessionGoneError):
        client.release(sid)


def test_browser_sessions_navigate_verify_and_evaluate(client):
    session = client.allocate(ttl_s=60, kind="browser")
    sid = session["session_id"]
    try:
        # Chromium has the session's network namespace (no route to the host): the page is a file in the session.
        page = b'<html><body style="margin:0"><button style="width:400px;height:200px" '
        page += b'onclick="window.score=(window.score||0)+1">+1</button></body></html>'
        client.write_file(sid, "game.html", page)
        url = f"file://{client.shell(sid, 'pwd')['stdout'].strip()}/game.html"
        assert session["kind"] == "browser"
        client.setup(sid, [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [url]}}])
        client.step(sid, "click(start_box='(100,50)')\n\nclick(start_box='(100,50)')", coordinates="screen")
        assert client.verify(sid, "window.score") == 2
        evaluator = {
            "func": ["exact_match", "exact_match"],
            "result": [{"type": "js_value", "script": "String(window.score)"}, {"type": "active_url"}],
            "expected": [{"type": "rule", "rules": {"expected": "2"}}, {"type": "rule", "rules": {"expected": url}}],
        }
        assert client.evaluate(sid, evaluator) == 1.0
        with pytest.raises(ActionError, match="VNC is for desktop sessions"):
            client.vnc_token(sid, user="user:1")
    finally:
        client.release(sid)


def test_a_browser_session_resets_for_the_next_task_as_a_new_one_would_start(service, client):
    """reset: a blank page, the last task's page state and site storage gone, the lease renewed; only the owner may
    reset, and only a browser session."""
    sid = client.allocate(ttl_s=30, kind="browser")["session_id"]
    desktop = None
    try:
        page = b"<html><body style='margin:0'><button style='width:300px;height:100px' "
        page += b"onclick=\"localStorage.setItem('x','1');window.score=1\">+1</button></body></html>"
        client.write_file(sid, "page.html", page)
        url = f"file://{client.shell(sid, 'pwd')['stdout'].strip()}/page.html"
        open_page = [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [url]}}]
        client.setup(sid, open_page)
        fresh = client.observe(sid, fmt="png")
        client.step(sid, "click(start_box='(50,30)')", coordinates="screen")
        assert client.verify(sid, "[localStorage.getItem('x'), window.score]") == ["1", 1]

        info = client.reset(sid, ttl_s=120)
        assert info["session_id"] == sid and info["kind"] == "browser"
        assert client.verify(sid, "location.href") == "about:blank"
        client.setup(sid, open_page)
        assert client.verify(sid, "[localStorage.getItem('x'), window.score ?? null]") == [None, None]
        assert client.observe(sid, fmt="png") == fresh  # the same task looks as it did on the new session

        with pytest.raises(SandboxError, match="not_owner"):
            SandboxClient(service, API_KEY, owner="someone-else").reset(sid)
        with pytest.raises(SandboxError, match="unauthorized"):
            SandboxClient(service, "not-the-key", owner=client.owner).reset(sid)
        desktop = client.allocate(ttl_s=30)["session_id"]
        with pytest.raises(ActionError, match="only a browser session can be reset"):
            client.reset(desktop)
    finally:
        client.release(sid)
        if desktop:
            client.release(desktop)


def test_think_aloud_capture_records_the_desktop_and_hands_back_the_archive(client):
    import json
    import tarfile

    sid = client.allocate(ttl_s=60)["session_id"]
    try:
        t0 = client.capture_start(sid, instruction="type a word")
        assert 0 <= t0 < 5
        with pytest.raises(SandboxError) as twice:
            client.capture_start(sid)
        assert twice.value.status == 409
        time.sleep(2.0)
        client.step(sid, "click(start_box='(644,406)')", observe=False)
        client.step(sid, "click(start_box='(100,100)')", observe=False)
        client.step(sid, "type(content='hi')", observe=False)
        archive = client.capture_stop(sid)
    finally:
        client.release(sid)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        meta = json.load(tar.extractfile("session.json"))
        events = [json.loads(line) for line in tar.extractfile("events.jsonl").read().splitlines()]
    assert meta["platform"] == "sandbox" and meta["instruction"] == "type a word" and meta["screen"]["width"] == 1280
    kinds = [e["type"] for e in events]
    assert kinds.count("down") == 2 and kinds.count("up") == 2, events
    assert [e["key"] for e in events if e["type"] == "key_down"][-2:] == ["h", "i"], events
    frames = [e["file"] for e in events if e["type"] == "screenshot"]
    assert frames and all(f in names for f in frames)
    with pytest.raises(SandboxError) as gone:
        client.capture_stop(sid)
    assert gone.value.status in (404, 409)


def test_the_trainers_sandbox_environment_plays_scores_and_renders_an_episode(client, tmp_path):
    """training.envs.SandboxEnv on a real desktop: the task's setup runs, a malformed reply costs the format penalty,
    typed input changes the desktop, `finished` is scored by the evaluator, and the episode (screenshots included)
    renders for a vision-language model after a round trip through the episode file format."""
    from training.data import Renderer, read_episodes, write_episodes
    from training.envs import SandboxEnv
    from training.models import load_tokenizer
    from training.policy.tiny import build_tiny_checkpoint
    from training.rollout import Reply, run_episode

    terminal = "xterm -e sh -c 'read line; printf %s \"$line\" > answer.txt'"
    evaluator = {"func": "exact_match", "result": {"type": "vm_file", "path": "answer.txt"},
                 "expected": {"type": "rule", "rules": {"expected": "42"}}}  # fmt: skip
    setup = [{"type": "launch", "parameters": {"command": terminal, "shell": True}},
             {"type": "sleep", "parameters": {"seconds": 1.5}}]  # fmt: skip
    task = {"id": "answer", "instruction": "Type 42 and press Enter.", "config": setup, "evaluator": evaluator}
    images = tmp_path / "images"

    def play(replies: list[str], seed: int):
        scripted = iter(replies)
        env = SandboxEnv(client, task, images, max_steps=5)
        try:
            return run_episode(env, lambda messages: (Reply(next(scripted)), 0), seed)
        finally:
            env.close()

    solved = play(["I will type the answer now.",  # no Action: the format penalty, the screen stays
                   "Thought: The terminal waits for a line.\nAction: type(content='42\\n')",
                   "Thought: The answer is in.\nAction: finished(content='42')"], seed=1)  # fmt: skip
    rewards = [m["reward"] for m in solved.messages if m["role"] == "assistant"]
    assert rewards == [-0.1, 0.0, 1.0] and solved.meta["done"]
    gave_up = play(["Thought: Nothing to do.\nAction: finished(content='')"], seed=2)
    assert [m["reward"] for m in gave_up.messages if m["role"] == "assistant"] == [0.0]
    assert len(list(images.glob("*.jpg"))) == 4  # 3 observations of the first episode, 1 of the second

    write_episodes(tmp_path / "episodes.jsonl", [solved, gave_up])
    loaded = next(iter(read_episodes(tmp_path / "episodes.jsonl")))
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny-vl", seed=0)
    tokenizer, processor = load_tokenizer(checkpoint)
    sample = Renderer(tokenizer, image_processor=processor).render(loaded)
    assert sample.image_grid_thw is not None and sample.image_grid_thw.shape[0] == 3
    assert float(sample.rewards.sum()) == pytest.approx(0.9)


def test_absurd_coordinates_are_refused_with_a_400_not_a_500(client):
    """1e999 or 400 digits parsed to infinity, and the pixel conversion's OverflowError made /step answer 500."""
    sid = client.allocate(ttl_s=60)["session_id"]
    try:
        for text in ("click(start_box='(1e999,5)')", f"click(start_box='({'9' * 400},5)')"):
            with pytest.raises(ActionError, match="out of range") as refused:
                client.step(sid, text)
            assert refused.value.status == 400
        assert client.step(sid, "hotkey(key='ctrl+c')", observe=False).results == ["ok"]  # '+' separates keys
    finally:
        client.release(sid)


def test_the_sandbox_environment_ends_on_fail_call_user_and_finished_and_records_evaluator_errors(client, tmp_path):
    """OSWorld's rule in training.envs.SandboxEnv: infeasible tasks score 1 only for fail(); call_user() is not FAIL
    and is evaluated like finished(); an evaluator that can't run scores 0 with its error on the episode instead of
    raising out of the rollout; a refused action costs the format penalty; leading space or a BOM is fine."""
    from training.envs import SandboxEnv
    from training.rollout import Reply, run_episode

    setup = [{"type": "execute", "parameters": {"command": "echo done > flag", "shell": True}}]
    flag = {"func": "exact_match", "result": {"type": "vm_file", "path": "flag"},
            "expected": {"type": "rule", "rules": {"expected": "done"}}}  # fmt: skip
    broken = {"func": "exact_match", "result": {"type": "vm_screen"}}  # a getter the sandbox lacks

    def play(evaluator: dict, *replies: str):
        task = {"id": "t", "instruction": "Do it, or say it can't be done.", "config": setup, "evaluator": evaluator}
        env = SandboxEnv(client, task, tmp_path / "images", max_steps=4)
        scripted = iter(replies)
        try:
            episode = run_episode(env, lambda messages: (Reply(next(scripted)), 0), seed=0)
        finally:
            env.close()
        assert episode.meta["done"]
        return [m["reward"] for m in episode.messages if m["role"] == "assistant"], episode.meta["info"]

    rewards, info = play({"func": "infeasible"}, " Thought: No such feature.\nAction: fail()")
    assert rewards == [1.0] and info["last_action"] == "fail"
    assert play({"func": "infeasible"}, "Thought: Done.\nAction: finished(content='')")[0] == [0.0]
    assert play({"func": "infeasible"}, "Thought: Help.\nAction: call_user()")[0] == [0.0]
    refused = "Thought: Open the site.\nAction: navigate(content='https://example.org')"  # not a desktop action
    assert play(flag, refused, "\ufeff  Thought: It is done; ask.\n  Action: call_user()")[0] == [-0.1, 1.0]
    assert play(flag, "Thought: Give up.\nAction: wait()\n\nfail()")[0] == [0.0]
    rewards, info = play(broken, "Thought: Done.\nAction: finished()")
    assert rewards == [0.0] and "unknown getter type 'vm_screen'" in info["evaluator_error"]


def test_the_task_environment_keeps_its_browser_session_for_the_next_browser_task(service, client, tmp_path):
    """SandboxTaskEnv with reuse (the default): browser episodes share one session, reset in between, and each
    starts on the screen a fresh session shows; a desktop task gets a desktop, and close() gives every session back.
    With reuse=0 every episode leases its own. evaluate.play keeps an environment per worker across episodes."""
    from sandbox.suite import suite_tasks
    from training.envs import SandboxSettings, SandboxTaskEnv, make_sandbox_env
    from training.evaluate import play
    from training.rollout import Reply, run_episode

    browser = suite_tasks(["click-button"], train=0, heldout=2, levels=[1])
    desktop = {"id": "d", "instruction": "Nothing.", "config": [], "evaluator": {"func": "infeasible"}}
    tasks = [browser[0], browser[1], desktop, browser[0]]
    done = "Thought: The task is done.\nAction: finished(content='')"

    def first_screens(env: SandboxTaskEnv, seeds: list[int]) -> list[bytes]:
        screens = []
        try:
            for seed in seeds:
                episode = run_episode(env, lambda messages: (Reply(done), 0), seed)
                screens.append((tmp_path / episode.messages[1]["content"][0]["image"]).read_bytes())
        finally:
            env.close()
        return screens

    def own_client() -> SandboxClient:  # an environment closes its client with itself
        return SandboxClient(service, API_KEY, owner=client.owner)

    reused = SandboxTaskEnv(own_client(), tasks, tmp_path / "kept")
    kept = first_screens(reused, [0, 1, 2, 3])
    assert reused.leased == 3  # one browser for tasks 0 and 1, the desktop, then a browser again
    single = SandboxTaskEnv(own_client(), tasks, tmp_path / "single", reuse=False)
    fresh = first_screens(single, [0, 1, 2, 3])
    assert single.leased == 4
    assert kept[:2] == fresh[:2] and kept[3] == fresh[3]  # the reset session shows what a new one shows
    sessions = [client.allocate(ttl_s=30, kind="browser")["session_id"] for _ in range(2)]  # nothing still held
    for sid in sessions:
        client.release(sid)

    made: list[SandboxTaskEnv] = []

    settings = SandboxSettings(browser, service, API_KEY, tmp_path / "play", owner=client.owner)

    def factory() -> SandboxTaskEnv:
        made.append(make_sandbox_env("sandbox:max_steps=2", settings))
        return made[-1]

    episodes, errors = play(factory, lambda messages: (Reply(done), 0), [0, 1, 2], max_turns=2, concurrency=1)
    assert len(episodes) == 3 and not errors
    assert len(made) == 1 and made[0].leased == 1
