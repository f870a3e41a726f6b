"""Start the project's real server processes (gunicorn, daphne) against pytest's test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment a subprocess needs to share this test run's database and settings."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "annotation_app.settings_test",
        "DATABASE_NAME": connection.settings_dict["NAME"],
        "TEST_MEDIA_ROOT": str(settings.MEDIA_ROOT),
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def answers(url: str) -> Callable[[], bool]:
    """A readiness check: `url` answers 200."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    return check


# How long a server may take to answer after it starts: a cold Django or torch import took over 60 s on a loaded
# 2-core machine.
START_S = 150

Service = tuple[list[str], dict[str, str], Path, Callable[[], bool]]  # command, environment, log, readiness


@contextmanager
def running(command: list[str], env: dict[str, str], log: Path, ready: Callable[[], bool]) -> Iterator[None]:
    """Run `command` until the block ends, once `ready()` says it is up. Its output goes to `log`."""
    with running_together((command, env, log, ready)):
        yield


@contextmanager
def running_together(*services: Service) -> Iterator[None]:
    """Start every service at once (their imports overlap instead of adding up), yield when all are ready, and stop
    each one's whole process group afterwards."""
    procs: list[subprocess.Popen] = []
    try:
        for command, env, log, _ in services:
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        deadline = time.monotonic() + START_S
        waiting = list(zip(services, procs, strict=True))
        while waiting:
            (command, _, log, ready), proc = waiting[0]
            if ready():
                waiting.pop(0)
                deadline = max(deadline, time.monotonic() + START_S)  # each service still gets its own allowance
                continue
            assert proc.poll() is None, f"{command[0]} exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{command[0]} did not come up:\n{log.read_text()}"
            time.sleep(0.2)
        yield
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the whole group: forked handlers too (websockify, gunicorn)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextmanager
def web_stack(tmp_path: Path, *, http_port: int = 0, ws_port: int = 0, **env_extra: str) -> Iterator[str]:
    """gunicorn (HTTP) and daphne (websockets) as the Procfile runs them; yields the HTTP base URL."""
    http_port, ws_port = http_port or free_port(), ws_port or free_port()
    env = subprocess_env(**{**env_extra, "WS_PUBLIC_PORT": str(ws_port)})
    bin_dir = Path(sys.executable).parent
    gunicorn = [str(bin_dir / "gunicorn"), "annotation_app.wsgi:application", "--bind", f"127.0.0.1:{http_port}"]
    gunicorn += ["--worker-class", "gthread", "--workers", "2", "--threads", "2"]
    daphne = [str(bin_dir / "daphne"), "-b", "127.0.0.1", "-p", str(ws_port), "annotation_app.asgi:application"]
    base = f"http://127.0.0.1:{http_port}"
    with running_together(
        (daphne, env, tmp_path / "daphne.log", answers(f"http://127.0.0.1:{ws_port}/healthz")),
        (gunicorn, env, tmp_path / "gunicorn.log", answers(f"{base}/healthz")),
    ):
        yield base


@contextmanager
def sandbox_service(root: Path, logs: Path, api_key: str, *, warm: int = 0, redis_db: int = 12) -> Iterator[str]:
    """A sandbox service of its own (isolated sessions, capacity 2, its own Redis namespace, cleared afterwards);
    yields its base URL."""
    import redis

    port, namespace = free_port(), f"test-{uuid.uuid4().hex}"
    env = subprocess_env(
        SANDBOX_API_KEY=api_key, SANDBOX_REDIS_URL=f"{settings.REDIS_URL}/{redis_db}", SANDBOX_CAPACITY="2",
        SANDBOX_WARM=str(warm), SANDBOX_ROOT=str(root), SANDBOX_NAMESPACE=namespace, SANDBOX_ISOLATE="1",
        SANDBOX_PORT=str(port),
    )  # fmt: skip
    with running([sys.executable, "-m", "sandbox.service"], env, logs / "service.log",
                 answers(f"http://127.0.0.1:{port}/docs")):  # fmt: skip
        yield f"http://127.0.0.1:{port}"
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/{redis_db}")
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)
