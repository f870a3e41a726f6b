"""Before a model is promoted its endpoint must answer as an OpenAI-compatible server that serves it; the registry
page shows each endpoint's health."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse

from flywheel.models import ModelVersion
from flywheel.serving import serving_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def server():
    """A local HTTP server answering GET /v1/models with one served model, and 500 elsewhere."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/v1/models"
            body = json.dumps({"object": "list", "data": [{"id": "tiny-uitars", "object": "model"}]}).encode()
            self.send_response(200 if ok else 500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if ok else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_model_its_endpoint_serves_can_be_promoted(server):
    assert serving_problem(ModelVersion(name="m", endpoint_url=f"{server}/v1", served_name="tiny-uitars")) is None


@pytest.mark.parametrize(
    ("endpoint", "served_name", "problem"),
    [
        ("", "", "has no endpoint URL"),
        ("{server}/v1", "other-model", "serves tiny-uitars, not other-model"),
        ("{server}/broken", "tiny-uitars", "answered 500"),
        ("http://127.0.0.1:9/v1", "tiny-uitars", "does not answer"),
    ],
)
def test_a_model_that_cannot_serve_says_why(server, endpoint, served_name, problem):
    model = ModelVersion(name="m", endpoint_url=endpoint.format(server=server), served_name=served_name)
    assert problem in serving_problem(model, timeout_s=2)


def test_the_registry_page_shows_each_endpoints_health(server, client, make_user):
    """The registry page loads each model's health after it is drawn: serving, or why not."""
    client.force_login(make_user("data_lead"))
    up = ModelVersion.objects.create(
        name="up", checkpoint_uri="/u", endpoint_url=f"{server}/v1", served_name="tiny-uitars"
    )
    down = ModelVersion.objects.create(name="down", checkpoint_uri="/d", endpoint_url="http://127.0.0.1:9/v1")
    other = ModelVersion.objects.create(name="other", checkpoint_uri="/o", endpoint_url=f"{server}/v1")
    page = client.get(reverse("flywheel-models")).content.decode()
    for model in (up, down, other):
        assert reverse("flywheel-model-health", args=[model.pk]) in page
    assert 'data-health="up"' in client.get(reverse("flywheel-model-health", args=[up.pk])).content.decode()
    answer = client.get(reverse("flywheel-model-health", args=[down.pk])).content.decode()
    assert 'data-health="down"' in answer and "does not answer" in answer
    answer = client.get(reverse("flywheel-model-health", args=[other.pk])).content.decode()
    assert "serves tiny-uitars, not other" in answer
    assert client.get(reverse("flywheel-model-health", args=[999999])).status_code == 404
