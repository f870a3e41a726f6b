"""Websocket for live page updates: each signed-in user joins a group per role and gets pushed events as JSON."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
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
