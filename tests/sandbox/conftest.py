"""Fixtures of the sandbox tests: a Redis client on the tests' database and a key namespace cleaned afterwards."""

import contextlib
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from sandbox.desktop import Desktop
from sandbox.leases import LeaseStore
from sandbox.vnc import websockify_command

from ..servers import free_port, running, subprocess_env
from ..waiting import wait_for

REDIS_TEST_URL = f"{settings.REDIS_URL}/12"


@pytest.fixture
def client():
    client = redis.Redis.from_url(REDIS_TEST_URL)
    yield client
    client.close()


@pytest.fixture
def namespace(client):
    """A fresh lease-store namespace; every key under it is deleted when the test ends."""
    name = f"test-{uuid.uuid4().hex}"
    yield name
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)


@dataclass
class Bridge:
    url: str  # ws://127.0.0.1:<port>/ of websockify
    store: LeaseStore
    session_id: str
    vnc_socket: Path
    desktop: Desktop


def listening(port: int) -> bool:
    """Whether something listens on the port, asked of the kernel: a probe connection would leave websockify a
    forked handler waiting forever for a handshake."""
    result = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True)
    return bool(result.stdout.strip())


@pytest.fixture
def bridge_for(tmp_path, client, namespace):
    """Factory: websockify as supervised in production, accepting pages of `origin`, and one leased desktop."""
    stack = contextlib.ExitStack()

    def start(origin: str) -> Bridge:
        store = LeaseStore(client, capacity=4, namespace=namespace)
        desktop = Desktop.start(tmp_path / "home")
        stack.callback(desktop.stop)
        lease = store.acquire("annotation-app", ttl_s=60, session_id="s" + uuid.uuid4().hex[:8])
        assert wait_for(desktop.vnc_socket.exists)
        port = free_port()
        command = websockify_command(f"127.0.0.1:{port}", REDIS_TEST_URL, namespace, [origin])
        stack.enter_context(running(command, subprocess_env(), tmp_path / "websockify.log", lambda: listening(port)))
        return Bridge(f"ws://127.0.0.1:{port}/", store, lease.session_id, desktop.vnc_socket, desktop)

    yield start
    stack.close()
