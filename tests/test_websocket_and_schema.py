"""Live page events over Channels (real Redis channel layer) and the generated OpenAPI schema."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.urls import reverse

from annotation_app.asgi import application
from annotation_app.consumers import EventsConsumer
from annotation_app.task_import import import_tasks

from .conftest import api_client_for


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_data_leads_get_pushed_an_event_when_tasks_are_imported(lead):
    communicator = WebsocketCommunicator(EventsConsumer.as_asgi(), "/ws/events/")
    communicator.scope["user"] = lead
    connected, _ = await communicator.connect()
    assert connected
    await sync_to_async(import_tasks)(b'[{"instruction": "Open the calculator."}]', "t.json")
    assert await communicator.receive_json_from(timeout=5) == {"event": "tasks_changed", "created": 1}
    await communicator.disconnect()
    # Close the worker thread's own connection, or the test database can't be dropped at the end.
    await sync_to_async(lambda: connection.close())()


@pytest.mark.asyncio
async def test_anonymous_websocket_is_closed():
    communicator = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://127.0.0.1")])
    connected, code = await communicator.connect()
    assert not connected and code == 4401


def test_openapi_schema_covers_the_api(lead):
    response = api_client_for(lead).get(reverse("schema"), {"format": "json"})
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ["/api/tasks/", "/api/tasks/import/", "/api/queue/next/", "/api/trajectories/{id}/steps/"]:
        assert path in paths
    assert "TokenAuth" in str(response.json()["components"]["securitySchemes"]) or "tokenAuth" in str(
        response.json()["components"]["securitySchemes"]
    )


def test_schema_generates_without_warnings(capsys):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")
