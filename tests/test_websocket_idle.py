"""Idle websockets on the real daphne stay open: an event sent after 30 s of silence arrives on the same connection."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import Client
from websockets.sync.client import ClientConnection, connect

from annotation_app.consumers import role_group
from annotation_app.live.sessions import group as live_group
from annotation_app.models import LiveSession, Role

from .factories import TrajectoryFactory, UserFactory
from .servers import free_port, web_stack

pytestmark = pytest.mark.slow

IDLE_S = 30  # six times the channel layer's 5 s blocking read, which the Redis client's socket timeout used to cut


def open_socket(base: str, ws_port: int, path: str, user) -> ClientConnection:
    """A websocket to daphne on `ws_port`, signed in as `user` (its session cookie), from the page's own origin."""
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    url = f"ws://127.0.0.1:{ws_port}{path}"
    return connect(url, additional_headers={"Cookie": cookie, "Origin": base}, open_timeout=10)


def test_idle_websockets_still_receive_events_after_30_seconds(transactional_db, tmp_path):
    ws_port = free_port()
    lead = UserFactory(role=Role.DATA_LEAD)
    annotator = UserFactory(role=Role.ANNOTATOR)
    live = LiveSession.objects.create(trajectory=TrajectoryFactory(annotator=annotator))
    with web_stack(tmp_path, ws_port=ws_port) as base:
        events = open_socket(base, ws_port, "/ws/events/", lead)
        live_socket = open_socket(base, ws_port, f"/ws/live/{live.trajectory_id}/", annotator)
        with events, live_socket:
            assert json.loads(live_socket.recv(timeout=10))["event"] == "state"
            time.sleep(IDLE_S)
            layer = get_channel_layer()
            async_to_sync(layer.group_send)(
                role_group(Role.DATA_LEAD), {"type": "page.event", "event": "tasks_changed", "created": 1}
            )
            async_to_sync(layer.group_send)(live_group(live.trajectory_id), {"type": "live.event", "event": "ping"})
            assert json.loads(events.recv(timeout=10)) == {"event": "tasks_changed", "created": 1}
            assert json.loads(live_socket.recv(timeout=10)) == {"event": "ping"}
            # The page's lease heartbeat (once a minute) is answered on the same connection too.
            live_socket.send(json.dumps({"type": "heartbeat"}))
            assert json.loads(live_socket.recv(timeout=10)) == {"event": "heartbeat", "alive": True}
        log = (tmp_path / "daphne.log").read_text()
        assert "TimeoutError" not in log, log
