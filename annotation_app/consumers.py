"""Websocket for live page updates: each signed-in user joins a group per role and gets pushed events as JSON."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer


def role_group(role: str) -> str:
    return f"role.{role}"


def notify_role(role: str, event: str, **payload: Any) -> None:
    """Push `{event, ...payload}` to every open page of users with `role` (call after the change is committed)."""
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(role_group(role), {"type": "page.event", "event": event, **payload})


class EventsConsumer(AsyncJsonWebsocketConsumer):
    """`/ws/events/`: closes with 4401 for anonymous users; forwards group messages to the browser."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = [role_group(user.role)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def page_event(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """`/ws/live/<trajectory>/`: the live page of the trajectory's own annotator (4404 for anyone else).

    Pushes `state`, `proposals` and `step` events; a `{"type": "heartbeat"}` from the page renews the lease."""

    async def connect(self) -> None:
        from .permissions import own_live_session

        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        trajectory_id = int(self.scope["url_route"]["kwargs"]["pk"])
        session = await database_sync_to_async(own_live_session)(user, trajectory_id)
        if session is None:
            await self.close(code=4404)
            return
        from .live.sessions import group, state_of

        self.session, self.group = session, group(trajectory_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await session.arefresh_from_db()
        await self.send_json({"event": "state", "state": await database_sync_to_async(state_of)(session)})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "heartbeat":
            from .live.sessions import lease_alive

            await self.session.arefresh_from_db()
            alive = await database_sync_to_async(lease_alive)(self.session)
            await self.send_json({"event": "heartbeat", "alive": alive})

    async def live_event(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})
