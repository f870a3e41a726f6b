"""Before a model is promoted its endpoint must answer as an OpenAI-compatible server that serves it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

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
