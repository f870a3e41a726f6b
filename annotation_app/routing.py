"""Websocket routes (Channels)."""

from django.urls import path

from .consumers import EventsConsumer, LiveConsumer

websocket_urlpatterns = [
    path("ws/events/", EventsConsumer.as_asgi()),
    path("ws/live/<int:pk>/", LiveConsumer.as_asgi()),
]
