"""The live-annotation stack as `scripts/run` starts it: the embedded policy server on a tiny checkpoint, the sandbox
service, websockify, a Celery worker on the `live` queue, gunicorn and daphne. All real processes."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from flywheel.models import ModelVersion
from sandbox.desktop import available
from sandbox.vnc import websockify_command
from training.policy.tiny import build_tiny_checkpoint

from ..sandbox.conftest import listening
from ..servers import answers, free_port, running, subprocess_env, web_stack

API_KEY = "live-test-key-" + uuid.uuid4().hex
needs_desktop = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny-uitars")


@pytest.fixture(scope="session")
def policy_url(tiny_checkpoint, tmp_path_factory) -> str:
    """The embedded policy server, as the Procfile runs it; yields its OpenAI base URL."""
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(tiny_checkpoint)]
    command += ["--name", "tiny-uitars", "--port", str(port), "--threads", "1"]
    log = tmp_path_factory.mktemp("logs") / "policy.log"
    with running(command, subprocess_env(), log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


@dataclass
class LiveServices:
    sandbox_url: str
    vnc_port: int
    web_port: int
    ws_port: int
    policy_url: str
    namespace: str

    def env(self) -> dict[str, str]:
        return {
            "SANDBOX_URL": self.sandbox_url, "SANDBOX_API_KEY": API_KEY, "VNC_PUBLIC_PORT": str(self.vnc_port),
            "WS_PUBLIC_PORT": str(self.ws_port), "LIVE_CANDIDATES": "3", "LIVE_MAX_TOKENS": "200",
        }  # fmt: skip


@pytest.fixture(scope="session")
def live_services(policy_url, tmp_path_factory) -> LiveServices:
    """Sandbox service and websockify for the whole run; the web ports are chosen here so websockify can check the
    pages' Origin. Sessions are isolated, as in production (the tests run as root)."""
    sandbox_port, vnc_port, web_port, ws_port = free_port(), free_port(), free_port(), free_port()
    namespace, redis_url = f"live-{uuid.uuid4().hex}", f"{settings.REDIS_URL}/12"
    logs = tmp_path_factory.mktemp("live-logs")
    env = subprocess_env(
        SANDBOX_API_KEY=API_KEY, SANDBOX_REDIS_URL=redis_url, SANDBOX_CAPACITY="10", SANDBOX_WARM="0",
        SANDBOX_ROOT=str(tmp_path_factory.mktemp("sessions")), SANDBOX_NAMESPACE=namespace, SANDBOX_ISOLATE="1",
        SANDBOX_PORT=str(sandbox_port),
    )  # fmt: skip
    bridge = websockify_command(f"127.0.0.1:{vnc_port}", redis_url, namespace, [f"http://127.0.0.1:{web_port}"])
    with (
        running([sys.executable, "-m", "sandbox.service"], env, logs / "sandbox.log",
                answers(f"http://127.0.0.1:{sandbox_port}/docs")),
        running(bridge, subprocess_env(), logs / "websockify.log", lambda: listening(vnc_port)),
    ):  # fmt: skip
        yield LiveServices(f"http://127.0.0.1:{sandbox_port}", vnc_port, web_port, ws_port, policy_url, namespace)
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)


@pytest.fixture
def live_settings(live_services, settings):
    """This process talks to the same services as the servers it starts."""
    settings.SANDBOX_URL, settings.SANDBOX_API_KEY = live_services.sandbox_url, API_KEY
    settings.VNC_PUBLIC_PORT, settings.WS_PUBLIC_PORT = str(live_services.vnc_port), str(live_services.ws_port)
    settings.LIVE_CANDIDATES, settings.LIVE_MAX_TOKENS = 3, 200
    return live_services


@pytest.fixture
def embedded_model(db, live_services) -> ModelVersion:
    model = ModelVersion.objects.create(
        name="tiny-uitars-test", checkpoint_uri="tiny", endpoint_url=live_services.policy_url, served_name="tiny-uitars"
    )
    model.promote()
    return model


@pytest.fixture
def live_worker(transactional_db, live_settings, tmp_path):
    """A Celery worker on the `live` queue (threads, as in the Procfile), pointed at the test database."""
    from annotation_app.celery import app

    name = f"live-{uuid.uuid4().hex[:6]}@%h"
    command = [sys.executable, "-m", "celery", "-A", "annotation_app", "worker", "-Q", "live", "--pool", "threads"]
    command += ["--concurrency", "4", "-n", name, "--loglevel", "INFO"]
    env = subprocess_env(**live_settings.env())
    app.control.purge()  # tasks left in the broker by earlier tests refer to rows that no longer exist

    def up() -> bool:
        return bool(app.control.ping(timeout=0.5))

    with running(command, env, tmp_path / "live-worker.log", up):
        yield tmp_path / "live-worker.log"


@pytest.fixture
def live_web(live_worker, live_settings, tmp_path):
    """gunicorn and daphne on the ports websockify expects; yields the HTTP base URL."""
    ports = {"http_port": live_settings.web_port, "ws_port": live_settings.ws_port}
    with web_stack(tmp_path, **ports, **live_settings.env()) as base:
        yield base
